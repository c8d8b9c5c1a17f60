//! config.json -> [`ModelConfig`], with transformers' defaults per model family.
//!
//! Required (transformers' defaults for these describe one particular published model, so a
//! config without them almost surely does not describe its weights): `architectures`,
//! `vocab_size`, `hidden_size`, `intermediate_size`, `num_hidden_layers`,
//! `num_attention_heads`; for Qwen3-Next also the `linear_*` head counts and dims and
//! `num_experts` (and, when it is > 0, the expert sizes and `num_experts_per_tok`).
//!
//! Everything else takes the default of the family's config class in transformers 5.x
//! (semantics §1.1, §2, §5.1), including the surprising ones:
//!
//! | field | Llama | Qwen3 | Qwen3-Next |
//! |---|---|---|---|
//! | `head_dim` absent | hidden / heads | **128** | **256** |
//! | `num_key_value_heads` absent | heads | **32** (null: heads) | **2** |
//! | `max_position_embeddings` | 2048 | 32768 | 32768 |
//! | `bos_token_id` / `eos_token_id` | 1 / 2 | none | none |
//!
//! `rms_norm_eps` 1e-6, no biases and untied embeddings in all three. Qwen3 and Qwen3-Next have
//! no `mlp_bias` field (their MLPs have no bias). `dtype` wins over the legacy `torch_dtype`.
//! `generation_config.json`'s `eos_token_id`, where the directory has one, is added after
//! config.json's ([`ModelConfig::add_generation_eos`]).

use std::fmt;
use std::path::Path;

use serde_json::Value;

use super::error::ImportError;
use super::fields::{show, Fields};
use super::hybrid::{HybridConfig, LayerType};
use super::rope::RopeConfig;
use crate::ir::DType;

type R<T> = Result<T, ImportError>;

/// The model families vkfuse implements, one per `architectures[0]` class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Llama,
    Qwen3,
    Qwen3Next,
}

impl Family {
    /// Every family.
    pub const ALL: [Family; 3] = [Family::Llama, Family::Qwen3, Family::Qwen3Next];

    /// The supported `architectures[0]` values.
    pub const ARCHITECTURES: &'static [&'static str] = &[
        "LlamaForCausalLM",
        "Qwen3ForCausalLM",
        "Qwen3NextForCausalLM",
    ];

    pub fn from_architecture(arch: &str) -> Option<Family> {
        match arch {
            "LlamaForCausalLM" => Some(Family::Llama),
            "Qwen3ForCausalLM" => Some(Family::Qwen3),
            "Qwen3NextForCausalLM" => Some(Family::Qwen3Next),
            _ => None,
        }
    }

    /// The transformers class name.
    pub fn architecture(self) -> &'static str {
        match self {
            Family::Llama => "LlamaForCausalLM",
            Family::Qwen3 => "Qwen3ForCausalLM",
            Family::Qwen3Next => "Qwen3NextForCausalLM",
        }
    }

    /// The transformers `model_type`.
    pub fn name(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Qwen3 => "qwen3",
            Family::Qwen3Next => "qwen3_next",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A model's config.json, resolved: every default applied, every derived size computed,
/// every cross-field constraint checked.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub family: Family,
    /// `architectures[0]`, e.g. `"Qwen3ForCausalLM"`.
    pub architecture: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// `num_hidden_layers`.
    pub num_layers: usize,
    pub num_attention_heads: usize,
    /// `num_key_value_heads`; divides `num_attention_heads`.
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// The dense MLP's size (for Qwen3-Next, only dense-MLP layers use it).
    pub intermediate_size: usize,
    pub rms_norm_eps: f32,
    pub rope: RopeConfig,
    pub tie_word_embeddings: bool,
    pub attention_bias: bool,
    /// Always false for Qwen3 and Qwen3-Next.
    pub mlp_bias: bool,
    pub max_position_embeddings: usize,
    /// `eos_token_id`: an int, a list or null (empty).
    pub eos_token_ids: Vec<u32>,
    pub bos_token_id: Option<u32>,
    /// `dtype` (5.x) or `torch_dtype`; `None` if absent.
    pub dtype: Option<DType>,
    /// `Some` exactly for Qwen3-Next.
    pub hybrid: Option<HybridConfig>,
}

impl ModelConfig {
    /// Reads and resolves `path` (a config.json).
    pub fn from_file(path: &Path) -> R<ModelConfig> {
        let text = std::fs::read_to_string(path).map_err(ImportError::io(path))?;
        ModelConfig::from_json(&text, path)
    }

    /// Resolves config.json's text; `file` names it in errors.
    pub fn from_json(text: &str, file: &Path) -> R<ModelConfig> {
        let root: Value = serde_json::from_str(text).map_err(|e| ImportError::json(file, &e))?;
        let obj = top_object(&root, file)?;
        parse(Fields::new(file, obj, ""))
    }

    /// Adds `generation_config.json`'s `eos_token_id` (an int, a list or null) after config.json's
    /// own, where the directory has that file: transformers' generate stops at those, and
    /// instruct checkpoints often name their end-of-turn token there only (Llama 3's
    /// `<|eot_id|>`). A file that is not JSON, or an id past the vocabulary, is an error naming
    /// the file.
    pub fn add_generation_eos(&mut self, file: &Path) -> R<()> {
        let text = match std::fs::read_to_string(file) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(ImportError::io(file)(e)),
        };
        let root: Value = serde_json::from_str(&text).map_err(|e| ImportError::json(file, &e))?;
        let obj = top_object(&root, file)?;
        let f = Fields::new(file, obj, "");
        for id in f.token_ids_opt("eos_token_id")?.unwrap_or_default() {
            if id as usize >= self.vocab_size {
                return Err(inconsistent(
                    &f,
                    format!(
                        "eos_token_id {id} is outside the vocabulary of {} (config.json's \
                         vocab_size)",
                        self.vocab_size
                    ),
                ));
            }
            if !self.eos_token_ids.contains(&id) {
                self.eos_token_ids.push(id);
            }
        }
        Ok(())
    }

    /// The number of layers of each type: `(linear attention, full attention)`; all layers are
    /// full attention for Llama and Qwen3.
    pub fn layer_counts(&self) -> (usize, usize) {
        match &self.hybrid {
            None => (0, self.num_layers),
            Some(h) => {
                let full = h
                    .layer_types
                    .iter()
                    .filter(|&&t| t == LayerType::FullAttention)
                    .count();
                (h.layer_types.len() - full, full)
            }
        }
    }
}

/// A JSON file's top-level object; `file` names it in the error.
fn top_object<'a>(root: &'a Value, file: &Path) -> R<&'a serde_json::Map<String, Value>> {
    root.as_object().ok_or_else(|| ImportError::BadJson {
        file: file.to_path_buf(),
        line: 1,
        column: 1,
        message: format!("expected an object at the top level, found {}", show(root)),
    })
}

fn inconsistent(f: &Fields<'_>, message: String) -> ImportError {
    ImportError::Inconsistent {
        file: f.file().to_path_buf(),
        message,
    }
}

fn unsupported(f: &Fields<'_>, field: &str, message: String) -> ImportError {
    ImportError::Unsupported {
        file: f.file().to_path_buf(),
        field: field.into(),
        message,
    }
}

fn architecture(f: &Fields<'_>) -> R<(Family, String)> {
    let what = "a non-empty list naming the model class, e.g. [\"LlamaForCausalLM\"]";
    let Some(list) = f.get("architectures") else {
        return Err(f.missing("architectures", what));
    };
    let Some(first) = list.as_array().and_then(|l| l.first()) else {
        return Err(f.bad(
            "architectures",
            format!("expected {what}, found {}", show(list)),
        ));
    };
    let Some(arch) = first.as_str() else {
        return Err(f.bad(
            "architectures",
            format!("expected {what}, found {}", show(list)),
        ));
    };
    let Some(family) = Family::from_architecture(arch) else {
        return Err(ImportError::UnsupportedArchitecture {
            file: f.file().to_path_buf(),
            found: arch.to_string(),
            supported: Family::ARCHITECTURES,
        });
    };
    // transformers' Auto classes build the model that model_type names, and vkfuse the class
    // architectures[0] names: where both are supported families and disagree, the decode
    // would not be transformers', so neither is guessed. Another model_type (a family vkfuse
    // does not know) is left to the trace, whose unread-tensor warning names what differs.
    let model_type = f.str_opt("model_type")?;
    let other = Family::ALL
        .into_iter()
        .find(|o| Some(o.name()) == model_type && *o != family);
    if let Some(other) = other {
        return Err(f.bad(
            "model_type",
            format!(
                "\"{other}\" names {} but architectures[0] is {arch}: transformers builds the \
                 model model_type names, vkfuse the class architectures names; make them agree",
                other.architecture()
            ),
        ));
    }
    Ok((family, arch.to_string()))
}

/// `dtype`, else `torch_dtype`: `"float32"`, `"float16"`, `"bfloat16"` (`torch.` prefix and the
/// aliases `float`/`half` accepted).
fn dtype(f: &Fields<'_>) -> R<Option<DType>> {
    let key = if f.get("dtype").is_some() {
        "dtype"
    } else {
        "torch_dtype"
    };
    let Some(name) = f.str_opt(key)? else {
        return Ok(None);
    };
    match name.strip_prefix("torch.").unwrap_or(name) {
        "float32" | "float" => Ok(Some(DType::F32)),
        "float16" | "half" => Ok(Some(DType::F16)),
        "bfloat16" => Ok(Some(DType::BF16)),
        other => Err(unsupported(
            f,
            key,
            format!(
                "model dtype \"{other}\" is not supported (supported: float32, float16, bfloat16)"
            ),
        )),
    }
}

/// `head_dim`, with the family's default when absent.
fn head_dim(f: &Fields<'_>, family: Family, hidden: usize, heads: usize) -> R<usize> {
    if let Some(d) = f.positive_opt("head_dim")? {
        return Ok(d);
    }
    match family {
        // LlamaConfig.__post_init__: None -> hidden_size // num_attention_heads.
        Family::Llama => Ok(hidden / heads),
        // Qwen3Config / Qwen3NextConfig declare `head_dim: int = 128 / 256`; an explicit null
        // would reach the attention module as None and fail there.
        Family::Qwen3 | Family::Qwen3Next if f.is_null("head_dim") => Err(f.bad(
            "head_dim",
            format!(
                "expected a positive integer, found null ({} does not derive head_dim; omit it for the default {})",
                family.architecture(),
                if family == Family::Qwen3 { 128 } else { 256 }
            ),
        )),
        Family::Qwen3 => Ok(128),
        Family::Qwen3Next => Ok(256),
    }
}

/// `num_key_value_heads`, with the family's default when absent.
fn kv_heads(f: &Fields<'_>, family: Family, heads: usize) -> R<usize> {
    let key = "num_key_value_heads";
    if let Some(n) = f.positive_opt(key)? {
        return Ok(n);
    }
    let null = f.is_null(key);
    match family {
        Family::Llama => Ok(heads),
        Family::Qwen3 => Ok(if null { heads } else { 32 }),
        Family::Qwen3Next if null => Err(f.bad(key, "expected a positive integer, found null")),
        Family::Qwen3Next => Ok(2),
    }
}

/// Qwen3's optional sliding-window attention, which vkfuse does not implement: refuse any
/// layer that transformers would make a sliding-window layer.
fn check_qwen3_layers(f: &Fields<'_>, num_layers: usize) -> R<()> {
    if let Some(items) = f.array_opt("layer_types")? {
        if items.len() != num_layers {
            return Err(inconsistent(
                f,
                format!(
                    "layer_types has {} entries but num_hidden_layers is {num_layers}",
                    items.len()
                ),
            ));
        }
        for (i, item) in items.iter().enumerate() {
            match item.as_str() {
                Some("full_attention") => {}
                Some(other) => {
                    return Err(unsupported(
                        f,
                        "layer_types",
                        format!(
                            "layer {i} has type \"{other}\"; only \"full_attention\" is supported"
                        ),
                    ))
                }
                None => {
                    return Err(f.bad(
                        "layer_types",
                        format!("expected a list of strings, found {}", show(item)),
                    ))
                }
            }
        }
        return Ok(());
    }
    let sliding = f.bool_or("use_sliding_window", false)?;
    let max_window_layers = f.count_opt("max_window_layers")?.unwrap_or(28);
    if sliding && max_window_layers < num_layers {
        return Err(unsupported(
            f,
            "use_sliding_window",
            format!("sliding-window attention (layers {max_window_layers}..{num_layers}) is not supported"),
        ));
    }
    Ok(())
}

fn parse(f: Fields<'_>) -> R<ModelConfig> {
    let (family, architecture) = architecture(&f)?;

    // A pre-quantised checkpoint (GPTQ, AWQ, FP8, bitsandbytes...): transformers dequantises
    // or quantises it on load by the method named here, which vkfuse does not implement.
    // Refused by name, not later as a missing `*.weight` tensor (their matrices are stored as
    // `qweight`, scales and zeros) or a decode that differs from transformers'.
    if let Some(q) = f.get("quantization_config") {
        let method = q
            .get("quant_method")
            .and_then(|m| m.as_str())
            .map(|m| format!(" (quant_method \"{m}\")"))
            .unwrap_or_default();
        return Err(unsupported(
            &f,
            "quantization_config",
            format!(
                "a pre-quantised checkpoint{method} is not supported: vkfuse reads f32, f16 and \
                 bf16 weights and quantises them itself (compile-model --weights q8_0 or q4_0)"
            ),
        ));
    }

    if let Some(act) = f.str_opt("hidden_act")? {
        if act != "silu" && act != "swish" {
            return Err(unsupported(
                &f,
                "hidden_act",
                format!("activation \"{act}\" is not supported (only silu)"),
            ));
        }
    }

    let vocab_size = f.positive("vocab_size")?;
    let hidden_size = f.positive("hidden_size")?;
    let intermediate_size = f.positive("intermediate_size")?;
    let num_layers = f.positive("num_hidden_layers")?;
    let num_attention_heads = f.positive("num_attention_heads")?;
    if family == Family::Llama && hidden_size % num_attention_heads != 0 {
        // LlamaConfig.validate_architecture.
        return Err(inconsistent(
            &f,
            format!("hidden_size ({hidden_size}) is not a multiple of num_attention_heads ({num_attention_heads})"),
        ));
    }
    let head_dim = head_dim(&f, family, hidden_size, num_attention_heads)?;
    let num_kv_heads = kv_heads(&f, family, num_attention_heads)?;
    if num_attention_heads % num_kv_heads != 0 {
        // A default the user did not write is named as one (Qwen3's 32 surprises).
        let unset = !f.has("num_key_value_heads");
        return Err(inconsistent(
            &f,
            format!(
                "num_attention_heads ({num_attention_heads}) is not a multiple of num_key_value_heads ({num_kv_heads}{})",
                if unset {
                    format!(": {}'s default, since config.json does not set it", family.architecture())
                } else {
                    String::new()
                }
            ),
        ));
    }

    let rms_norm_eps = f.number_opt("rms_norm_eps", false)?.unwrap_or(1e-6) as f32;
    let default_max_positions = if family == Family::Llama { 2048 } else { 32768 };
    let max_position_embeddings =
        f.positive_or("max_position_embeddings", default_max_positions)?;
    let rope = RopeConfig::resolve(f, family, head_dim, max_position_embeddings)?;

    let tie_word_embeddings = f.bool_or("tie_word_embeddings", false)?;
    let attention_bias = f.bool_or("attention_bias", false)?;
    let mlp_bias = family == Family::Llama && f.bool_or("mlp_bias", false)?;

    let (bos_default, eos_default) = match family {
        Family::Llama => (Some(1), vec![2]),
        Family::Qwen3 | Family::Qwen3Next => (None, vec![]),
    };
    let explicit_null = |key: &str| f.is_null(key);
    let bos_token_id = match f.token_id_opt("bos_token_id")? {
        Some(id) => Some(id),
        None if explicit_null("bos_token_id") => None,
        None => bos_default,
    };
    let eos_token_ids = match f.token_ids_opt("eos_token_id")? {
        Some(ids) => ids,
        None if explicit_null("eos_token_id") => vec![],
        None => eos_default,
    };
    // An id past the vocabulary could never be generated (eos) or embedded (bos): a config
    // that names one does not describe these weights.
    for (key, id) in bos_token_id
        .iter()
        .map(|&id| ("bos_token_id", id))
        .chain(eos_token_ids.iter().map(|&id| ("eos_token_id", id)))
    {
        if id as usize >= vocab_size {
            return Err(inconsistent(
                &f,
                format!("{key} {id} is outside the vocabulary of {vocab_size} (vocab_size)"),
            ));
        }
    }
    let dtype = dtype(&f)?;

    let hybrid = match family {
        Family::Qwen3Next => Some(HybridConfig::parse(f, num_layers)?),
        Family::Qwen3 => {
            check_qwen3_layers(&f, num_layers)?;
            None
        }
        Family::Llama => None,
    };

    Ok(ModelConfig {
        family,
        architecture,
        vocab_size,
        hidden_size,
        num_layers,
        num_attention_heads,
        num_kv_heads,
        head_dim,
        intermediate_size,
        rms_norm_eps,
        rope,
        tie_word_embeddings,
        attention_bias,
        mlp_bias,
        max_position_embeddings,
        eos_token_ids,
        bos_token_id,
        dtype,
        hybrid,
    })
}

/// One paragraph for the CLI, e.g. `LlamaForCausalLM: 2 layers, hidden 96, vocab 1000, bf16.
/// Attention: 6 query / 2 KV heads of dim 16, RoPE theta 500000 on 16 dims. MLP: SwiGLU 200.
/// RMSNorm eps 1e-5; untied embeddings; up to 512 positions; bos 1, eos [2].`
impl fmt::Display for ModelConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} layers", self.architecture, self.num_layers)?;
        if let Some(h) = &self.hybrid {
            let (linear, full) = self.layer_counts();
            if self.num_layers <= 64 {
                write!(f, " ({}", h.pattern())?;
            } else {
                write!(f, " (")?;
            }
            write!(
                f,
                "{}{linear} Gated DeltaNet, {full} full attention)",
                if self.num_layers <= 64 { ": " } else { "" }
            )?;
        }
        let dtype = self.dtype.map_or("dtype unset", DType::name);
        write!(
            f,
            ", hidden {}, vocab {}, {dtype}. ",
            self.hidden_size, self.vocab_size
        )?;

        write!(
            f,
            "Attention: {} query / {} KV heads of dim {}",
            self.num_attention_heads, self.num_kv_heads, self.head_dim
        )?;
        match self.family {
            Family::Llama => {}
            Family::Qwen3 => write!(f, ", QK-norm")?,
            Family::Qwen3Next => write!(f, ", output gate, QK-norm")?,
        }
        if self.attention_bias {
            write!(f, ", q/k/v/o bias")?;
        }
        write!(f, ", {}. ", self.rope)?;

        if let Some(h) = &self.hybrid {
            write!(
                f,
                "Gated DeltaNet: {} key heads of {}, {} value heads of {}, conv kernel {}. ",
                h.linear_num_key_heads,
                h.linear_key_head_dim,
                h.linear_num_value_heads,
                h.linear_value_head_dim,
                h.linear_conv_kernel_dim
            )?;
            let moe = (0..self.num_layers).filter(|&l| h.is_moe_layer(l)).count();
            write!(f, "MLP: ")?;
            if moe > 0 {
                write!(
                    f,
                    "{moe} MoE layers of {} experts, top {}{}, expert size {}, shared expert {}",
                    h.num_experts,
                    h.num_experts_per_tok,
                    if h.norm_topk_prob {
                        " (renormalised)"
                    } else {
                        ""
                    },
                    h.moe_intermediate_size,
                    h.shared_expert_intermediate_size
                )?;
            }
            if moe < self.num_layers {
                let sep = if moe > 0 { "; " } else { "" };
                write!(
                    f,
                    "{sep}{} dense SwiGLU layers of {}",
                    self.num_layers - moe,
                    self.intermediate_size
                )?;
            }
            write!(f, ". ")?;
        } else {
            write!(
                f,
                "MLP: SwiGLU {}{}. ",
                self.intermediate_size,
                if self.mlp_bias { " with bias" } else { "" }
            )?;
        }

        let tie = if self.tie_word_embeddings {
            "tied"
        } else {
            "untied"
        };
        write!(
            f,
            "RMSNorm eps {:e}; {tie} embeddings; up to {} positions",
            self.rms_norm_eps, self.max_position_embeddings
        )?;
        if let Some(bos) = self.bos_token_id {
            write!(f, "; bos {bos}")?;
        }
        if !self.eos_token_ids.is_empty() {
            write!(f, "; eos {:?}", self.eos_token_ids)?;
        }
        write!(f, ".")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> R<ModelConfig> {
        ModelConfig::from_json(json, Path::new("m/config.json"))
    }

    const LLAMA: &str = r#"{"architectures": ["LlamaForCausalLM"], "vocab_size": 1000, "hidden_size": 96,
        "intermediate_size": 200, "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "torch_dtype": "bfloat16"}"#;

    #[test]
    fn llama_defaults_follow_llama_config() {
        let c = parse(LLAMA).expect("parses");
        assert_eq!(c.family, Family::Llama);
        assert_eq!(c.head_dim, 16);
        assert_eq!(c.rope.rotary_dim, 16);
        assert_eq!(c.rope.theta, 500000.0);
        assert_eq!(c.max_position_embeddings, 2048);
        assert_eq!(
            (c.bos_token_id, c.eos_token_ids.clone()),
            (Some(1), vec![2])
        );
        assert_eq!(c.dtype, Some(DType::BF16));
        assert_eq!(c.rms_norm_eps, 1e-5);
        assert!(!c.tie_word_embeddings && !c.attention_bias && !c.mlp_bias);
        assert!(c.hybrid.is_none());
    }

    #[test]
    fn qwen3_head_dim_defaults_to_128_and_kv_heads_to_32() {
        let j = r#"{"architectures": ["Qwen3ForCausalLM"], "vocab_size": 10, "hidden_size": 64,
            "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 64, "mlp_bias": true}"#;
        let c = parse(j).expect("parses");
        assert_eq!(
            (c.head_dim, c.num_kv_heads, c.rope.rotary_dim),
            (128, 32, 128)
        );
        assert!(!c.mlp_bias, "Qwen3 has no mlp_bias");
        assert_eq!(
            (
                c.bos_token_id,
                c.eos_token_ids.len(),
                c.max_position_embeddings
            ),
            (None, 0, 32768)
        );
    }

    #[test]
    fn qwen3_null_kv_heads_means_attention_heads_but_null_head_dim_is_an_error() {
        let base = r#""architectures": ["Qwen3ForCausalLM"], "vocab_size": 10, "hidden_size": 64,
            "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4"#;
        let c = parse(&format!("{{{base}, \"num_key_value_heads\": null}}")).expect("parses");
        assert_eq!(c.num_kv_heads, 4);
        let e = parse(&format!("{{{base}, \"head_dim\": null}}")).expect_err("null head_dim");
        assert!(e.to_string().contains("\"head_dim\""), "{e}");
    }

    #[test]
    fn qwen3_sliding_window_is_refused() {
        let j = r#"{"architectures": ["Qwen3ForCausalLM"], "vocab_size": 10, "hidden_size": 64,
            "intermediate_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4, "head_dim": 16,
            "num_key_value_heads": 4, "use_sliding_window": true, "max_window_layers": 2}"#;
        let e = parse(j).expect_err("sliding window");
        assert!(
            matches!(&e, ImportError::Unsupported { field, .. } if field == "use_sliding_window"),
            "{e}"
        );
    }

    #[test]
    fn dtype_wins_over_torch_dtype() {
        let j = LLAMA.replace("\"torch_dtype\"", "\"dtype\": \"float16\", \"torch_dtype\"");
        assert_eq!(parse(&j).expect("parses").dtype, Some(DType::F16));
        let j = LLAMA.replace("\"torch_dtype\": \"bfloat16\"", "\"dtype\": \"int8\"");
        let e = parse(&j).expect_err("int8");
        assert!(
            matches!(&e, ImportError::Unsupported { field, .. } if field == "dtype"),
            "{e}"
        );
    }

    #[test]
    fn token_ids_past_the_vocabulary_are_refused() {
        let base = r#""architectures": ["Qwen3ForCausalLM"], "vocab_size": 10, "hidden_size": 64,
            "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
            "num_key_value_heads": 4, "head_dim": 16"#;
        let ok = parse(&format!("{{{base}, \"eos_token_id\": [3, 9]}}"));
        assert!(ok.is_ok(), "{:?}", ok.err());
        for (field, json) in [
            ("eos_token_id", "\"eos_token_id\": [3, 10]"),
            ("bos_token_id", "\"bos_token_id\": 12"),
        ] {
            let e = parse(&format!("{{{base}, {json}}}")).expect_err(field);
            assert!(
                matches!(&e, ImportError::Inconsistent { .. }) && e.to_string().contains(field),
                "{e}"
            );
        }
    }

    #[test]
    fn top_level_array_is_bad_json() {
        assert!(matches!(parse("[1, 2]"), Err(ImportError::BadJson { .. })));
    }

    #[test]
    fn activation_other_than_silu_is_unsupported() {
        let j = LLAMA.replace(
            "\"rms_norm_eps\"",
            "\"hidden_act\": \"gelu\", \"rms_norm_eps\"",
        );
        let e = parse(&j).expect_err("gelu");
        assert!(
            e.to_string().contains("hidden_act") && e.to_string().contains("gelu"),
            "{e}"
        );
    }

    #[test]
    fn summary_is_one_paragraph() {
        let c = parse(LLAMA).expect("parses");
        let s = c.to_string();
        assert!(!s.contains('\n'));
        assert_eq!(
            s,
            "LlamaForCausalLM: 2 layers, hidden 96, vocab 1000, bf16. Attention: 6 query / 2 KV heads of dim 16, \
             RoPE theta 500000 on 16 dims. MLP: SwiGLU 200. RMSNorm eps 1e-5; untied embeddings; up to 2048 \
             positions; bos 1; eos [2]."
        );
    }
}
