//! Rotary position embedding: how `transformers` resolves it from config.json, and its inverse
//! frequencies computed with the same f32 arithmetic.
//!
//! Resolution (transformers 5.x `convert_rope_params_to_dict` / `standardize_rope_params`):
//! the parameter dict is the legacy `rope_scaling` dict when that is a non-empty object, else
//! `rope_parameters`, else empty. Each key is read from that dict first, then from the top
//! level of config.json, then defaults: `rope_theta = 10000`, `rope_type = "default"` (legacy
//! key `type` accepted), `partial_rotary_factor` unset (1.0) except for Qwen3-Next (0.25).
//! The default RoPE of Llama and Qwen3 ignores `partial_rotary_factor`; Qwen3-Next's default
//! and the scaled types (`linear`, `llama3`) apply it: `rotary_dim = int(head_dim * factor)`.

use std::fmt;

use serde_json::Map;

use super::config::Family;
use super::error::ImportError;
use super::fields::Fields;

/// RoPE as the model applies it: half-split (NeoX) rotation of the first `rotary_dim` dims of
/// each head.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeConfig {
    /// The base (`rope_theta`).
    pub theta: f32,
    /// Rotated dims per head; even, at most `head_dim`. `inv_freq()` has `rotary_dim / 2` entries.
    pub rotary_dim: usize,
    pub scaling: RopeScaling,
}

/// The frequency scaling (`rope_type`).
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// `rope_type: "default"`.
    None,
    /// `rope_type: "llama3"` (Llama 3.1+ long-context scaling).
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position_embeddings: usize,
    },
    /// `rope_type: "linear"`: every frequency divided by `factor`.
    Linear { factor: f32 },
}

/// The RoPE types vkfuse reads, for messages (the trace decodes the default only).
const SUPPORTED_TYPES: &str = "vkfuse reads default, linear and llama3, and decodes default only";

/// Per-layer-type keys that would mean a nested `rope_parameters` (one dict per layer type).
const LAYER_TYPE_KEYS: [&str; 4] = [
    "full_attention",
    "linear_attention",
    "sliding_attention",
    "chunked_attention",
];

/// `base^e` in f32. torch computes `base ** (arange / dim)` as an f32 power of f32 operands; we
/// take the correctly rounded result (f64 power rounded once to f32), which torch's
/// vectorised `powf` (1 ulp bound) returns in all but rare ties.
fn powf(base: f32, e: f32) -> f32 {
    (f64::from(base)).powf(f64::from(e)) as f32
}

impl RopeConfig {
    /// The inverse frequencies, `rotary_dim / 2` of them, exactly as transformers computes them
    /// in f32 (semantics §3.2, §3.3): `inv_freq[i] = 1 / theta^(f32(2i) / f32(rotary_dim))`,
    /// then the scaling.
    pub fn inv_freq(&self) -> Vec<f32> {
        let dim = self.rotary_dim as f32;
        let base: Vec<f32> = (0..self.rotary_dim)
            .step_by(2)
            .map(|i| 1.0f32 / powf(self.theta, i as f32 / dim))
            .collect();
        match self.scaling {
            RopeScaling::None => base,
            RopeScaling::Linear { factor } => base.into_iter().map(|f| f / factor).collect(),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                // Python-float scalars meet f32 tensors: each scalar is rounded to f32 and the
                // arithmetic is f32, in the order written in `_compute_llama3_parameters`.
                let old = original_max_position_embeddings as f64;
                let low_freq_wavelen = (old / f64::from(low_freq_factor)) as f32;
                let high_freq_wavelen = (old / f64::from(high_freq_factor)) as f32;
                let two_pi = (2.0 * std::f64::consts::PI) as f32;
                let span = (f64::from(high_freq_factor) - f64::from(low_freq_factor)) as f32;
                let old = old as f32;
                base.into_iter()
                    .map(|f| {
                        let wavelen = two_pi / f;
                        let llama = if wavelen > low_freq_wavelen {
                            f / factor
                        } else {
                            f
                        };
                        let smooth = (old / wavelen - low_freq_factor) / span;
                        let smoothed = (1.0 - smooth) * llama / factor + smooth * llama;
                        // torch: `~(wavelen < high) * ~(wavelen > low)`, kept literal so that
                        // a NaN compares the way it does there.
                        #[allow(clippy::neg_cmp_op_on_partial_ord)]
                        let medium =
                            !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
                        if medium {
                            smoothed
                        } else {
                            llama
                        }
                    })
                    .collect()
            }
        }
    }

    /// Resolves RoPE from config.json's top-level object (see the module doc).
    pub(crate) fn resolve(
        top: Fields<'_>,
        family: Family,
        head_dim: usize,
        max_position_embeddings: usize,
    ) -> Result<RopeConfig, ImportError> {
        let legacy = top.object_opt("rope_scaling")?.filter(|m| !m.is_empty());
        let (dict, prefix) = match legacy {
            Some(m) => (Some(m), "rope_scaling."),
            None => (top.object_opt("rope_parameters")?, "rope_parameters."),
        };
        let empty = Map::new();
        let p = Fields::new(top.file(), dict.unwrap_or(&empty), prefix);
        if let Some(key) = LAYER_TYPE_KEYS
            .iter()
            .find(|k| p.object_opt(k).ok().flatten().is_some())
        {
            return Err(ImportError::Unsupported {
                file: top.file().to_path_buf(),
                field: p.path(key),
                message: "RoPE parameters given per layer type are not supported (these models use one set)".into(),
            });
        }

        let theta = match p.number_opt("rope_theta", true)? {
            Some(t) => t,
            None => top.number_opt("rope_theta", true)?.unwrap_or(10_000.0),
        };
        let (type_key, rope_type) = match p.str_opt("rope_type")? {
            Some(t) => ("rope_type", t),
            None => ("type", p.str_opt("type")?.unwrap_or("default")),
        };
        let scaling = match rope_type {
            "default" => RopeScaling::None,
            "linear" => RopeScaling::Linear {
                factor: p.positive_number("factor")? as f32,
            },
            "llama3" => {
                let factor = p.positive_number("factor")? as f32;
                let low = p.positive_number("low_freq_factor")? as f32;
                let high = p.positive_number("high_freq_factor")? as f32;
                if high <= low {
                    return Err(ImportError::Inconsistent {
                        file: top.file().to_path_buf(),
                        message: format!(
                            "{} ({high}) must be greater than {} ({low})",
                            p.path("high_freq_factor"),
                            p.path("low_freq_factor")
                        ),
                    });
                }
                // transformers gives a top-level original_max_position_embeddings priority.
                let key = "original_max_position_embeddings";
                let original = match top.positive_opt(key)? {
                    Some(n) => n,
                    None => p.positive_opt(key)?.unwrap_or(max_position_embeddings),
                };
                RopeScaling::Llama3 {
                    factor,
                    low_freq_factor: low,
                    high_freq_factor: high,
                    original_max_position_embeddings: original,
                }
            }
            other => {
                return Err(ImportError::Unsupported {
                    file: top.file().to_path_buf(),
                    field: p.path(type_key),
                    message: format!("RoPE type \"{other}\" is not supported ({SUPPORTED_TYPES})"),
                })
            }
        };

        let partial = match p.number_opt("partial_rotary_factor", true)? {
            Some(x) => Some(x),
            None => top.number_opt("partial_rotary_factor", true)?,
        };
        let partial = partial.or((family == Family::Qwen3Next).then_some(0.25));
        let applies_partial = family == Family::Qwen3Next || scaling != RopeScaling::None;
        let rotary_dim = if applies_partial {
            // Python: int(head_dim * partial_rotary_factor), a float product truncated.
            (head_dim as f64 * partial.unwrap_or(1.0)).floor() as usize
        } else {
            head_dim
        };
        if rotary_dim == 0 || rotary_dim % 2 != 0 || rotary_dim > head_dim {
            // Name the factor only where it applies: the default RoPE of Llama and Qwen3
            // rotates the whole head whatever config.json says.
            let what = if applies_partial {
                format!(
                    "the rotary dimension int(head_dim {head_dim} * partial_rotary_factor {}) = {rotary_dim}",
                    partial.unwrap_or(1.0)
                )
            } else {
                format!("the rotary dimension (the whole head_dim) {rotary_dim}")
            };
            return Err(ImportError::Inconsistent {
                file: top.file().to_path_buf(),
                message: format!("{what} must be even, positive and at most head_dim"),
            });
        }
        Ok(RopeConfig {
            theta: theta as f32,
            rotary_dim,
            scaling,
        })
    }
}

impl fmt::Display for RopeConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RoPE theta {} on {} dims", self.theta, self.rotary_dim)?;
        match self.scaling {
            RopeScaling::None => Ok(()),
            RopeScaling::Linear { factor } => write!(f, " (linear scaling x{factor})"),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                write!(
                    f,
                    " (llama3 scaling x{factor}, low {low_freq_factor}, high {high_freq_factor}, \
                     original context {original_max_position_embeddings})"
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use std::path::Path;

    fn resolve(json: &str, family: Family, head_dim: usize) -> Result<RopeConfig, ImportError> {
        let v: Value = serde_json::from_str(json).expect("test JSON");
        let obj = v.as_object().expect("object");
        RopeConfig::resolve(
            Fields::new(Path::new("config.json"), obj, ""),
            family,
            head_dim,
            2048,
        )
    }

    #[test]
    fn default_inv_freq_is_one_over_theta_to_the_2i_over_dim() {
        let r = RopeConfig {
            theta: 10000.0,
            rotary_dim: 4,
            scaling: RopeScaling::None,
        };
        assert_eq!(r.inv_freq(), vec![1.0, 0.01]);
        let r = RopeConfig {
            theta: 10000.0,
            rotary_dim: 64,
            scaling: RopeScaling::None,
        };
        let f = r.inv_freq();
        assert_eq!(f.len(), 32);
        for (i, x) in f.iter().enumerate() {
            let want = 1.0 / 10000f64.powf(2.0 * i as f64 / 64.0);
            assert!(
                (f64::from(*x) - want).abs() <= want * 1e-6,
                "{i}: {x} vs {want}"
            );
        }
    }

    #[test]
    fn linear_scaling_divides_every_frequency() {
        let base = RopeConfig {
            theta: 10000.0,
            rotary_dim: 8,
            scaling: RopeScaling::None,
        }
        .inv_freq();
        let lin = RopeConfig {
            theta: 10000.0,
            rotary_dim: 8,
            scaling: RopeScaling::Linear { factor: 4.0 },
        }
        .inv_freq();
        for (b, l) in base.iter().zip(&lin) {
            assert_eq!(b / 4.0, *l);
        }
    }

    #[test]
    fn llama3_scaling_keeps_high_divides_low_and_blends_medium_frequencies() {
        let scaling = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        };
        let r = RopeConfig {
            theta: 500000.0,
            rotary_dim: 128,
            scaling,
        };
        let base = RopeConfig {
            scaling: RopeScaling::None,
            ..r.clone()
        }
        .inv_freq();
        let got = r.inv_freq();
        let (mut kept, mut divided, mut blended) = (0, 0, 0);
        for (b, g) in base.iter().zip(&got) {
            let wavelen = 2.0 * std::f32::consts::PI / b;
            if wavelen < 8192.0 / 4.0 {
                assert_eq!(g, b);
                kept += 1;
            } else if wavelen > 8192.0 {
                assert_eq!(*g, b / 8.0);
                divided += 1;
            } else {
                assert!(
                    *g < *b && *g > b / 8.0 * 0.999,
                    "{g} not between {b}/8 and {b}"
                );
                blended += 1;
            }
        }
        assert!(
            kept > 0 && divided > 0 && blended > 0,
            "{kept} {divided} {blended}"
        );
    }

    #[test]
    fn theta_comes_from_rope_parameters_then_top_level_then_default() {
        let both = r#"{"rope_theta": 5.0, "rope_parameters": {"rope_theta": 7.0}}"#;
        assert_eq!(
            resolve(both, Family::Llama, 8).map(|r| r.theta).ok(),
            Some(7.0)
        );
        let top = r#"{"rope_theta": 5.0, "rope_parameters": null}"#;
        assert_eq!(
            resolve(top, Family::Llama, 8).map(|r| r.theta).ok(),
            Some(5.0)
        );
        assert_eq!(
            resolve("{}", Family::Llama, 8).map(|r| r.theta).ok(),
            Some(10000.0)
        );
    }

    #[test]
    fn legacy_rope_scaling_dict_with_type_key_is_read() {
        let j = r#"{"rope_theta": 500000.0, "rope_scaling": {"type": "linear", "factor": 2.0}}"#;
        let r = resolve(j, Family::Llama, 8).expect("resolves");
        assert_eq!(r.theta, 500000.0);
        assert_eq!(r.scaling, RopeScaling::Linear { factor: 2.0 });
    }

    #[test]
    fn llama3_original_context_defaults_to_max_position_embeddings() {
        let j = r#"{"rope_parameters": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4}}"#;
        let r = resolve(j, Family::Llama, 8).expect("resolves");
        assert_eq!(
            r.scaling,
            RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 2048
            }
        );
    }

    #[test]
    fn partial_rotary_factor_applies_to_qwen3_next_and_scaled_types_only() {
        let j = r#"{"partial_rotary_factor": 0.5}"#;
        assert_eq!(
            resolve(j, Family::Llama, 16).map(|r| r.rotary_dim).ok(),
            Some(16)
        );
        assert_eq!(
            resolve(j, Family::Qwen3, 16).map(|r| r.rotary_dim).ok(),
            Some(16)
        );
        assert_eq!(
            resolve(j, Family::Qwen3Next, 16).map(|r| r.rotary_dim).ok(),
            Some(8)
        );
        assert_eq!(
            resolve("{}", Family::Qwen3Next, 256)
                .map(|r| r.rotary_dim)
                .ok(),
            Some(64)
        );
        let lin = r#"{"partial_rotary_factor": 0.5, "rope_parameters": {"rope_type": "linear", "factor": 2}}"#;
        assert_eq!(
            resolve(lin, Family::Llama, 16).map(|r| r.rotary_dim).ok(),
            Some(8)
        );
    }

    #[test]
    fn unknown_rope_type_is_unsupported_and_names_the_field() {
        let j = r#"{"rope_parameters": {"rope_type": "yarn", "factor": 4}}"#;
        let e = resolve(j, Family::Llama, 8).expect_err("yarn is not implemented");
        let text = e.to_string();
        assert!(
            text.contains("rope_parameters.rope_type") && text.contains("yarn"),
            "{text}"
        );
    }

    #[test]
    fn an_odd_head_is_reported_without_a_factor_the_family_ignores() {
        let e =
            resolve(r#"{"partial_rotary_factor": 0.4}"#, Family::Qwen3, 15).expect_err("15 is odd");
        let text = e.to_string();
        assert!(
            text.contains("(the whole head_dim) 15") && !text.contains("partial_rotary_factor"),
            "{text}"
        );
    }

    #[test]
    fn odd_rotary_dim_is_inconsistent() {
        let e = resolve(r#"{"partial_rotary_factor": 0.3}"#, Family::Qwen3Next, 10)
            .expect_err("3 is odd");
        assert!(matches!(e, ImportError::Inconsistent { .. }), "{e}");
    }
}
