//! The cost model: dispatches × per-dispatch cost, plus barriers (dependency levels) × barrier
//! cost, plus bytes moved ÷ bandwidth, with parameters per device class. Views, weight packing
//! and the code sub-languages cost nothing; every other node is one dispatch.

use super::lang::{FuseGraph, FuseLang};
use egg::{Id, Language};
use std::fmt;

/// Cost parameters of a device class: the H100's by default, or a device's own as `vkfuse
/// calibrate` measures them (a JSON file of these fields, `compile-model --device-cost FILE`).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct DeviceCost {
    /// A name for reports.
    pub name: String,
    /// µs per dispatch when dispatches overlap (no barrier between them).
    pub dispatch_us: f64,
    /// µs a dependency level costs a step beyond its work: the barrier, the drain before it and
    /// the ramp after it.
    pub barrier_us: f64,
    /// Bytes per µs of memory bandwidth.
    pub bytes_per_us: f64,
    /// Positions the KV cache holds in the estimate of attention's traffic.
    pub nominal_context: usize,
    /// Workgroups the device runs side by side (its SMs or compute units): the attention
    /// block splits the context until its heads x splits cover them twice, and for long
    /// caches up to four times ([`super::codegen::attention_splits`]).
    pub compute_units: usize,
}

/// Why a device cost file was refused.
#[derive(Debug, thiserror::Error)]
pub enum DeviceCostError {
    /// The parser's message (kept as text, not as a source, so it is printed once).
    #[error("not JSON ({0}); expected the object `vkfuse calibrate` writes")]
    Json(String),
    #[error("not a JSON object (expected the object `vkfuse calibrate` writes)")]
    NotAnObject,
    #[error("missing field `{0}`")]
    Missing(&'static str),
    #[error("unknown field `{0}` (the fields are {FIELDS})")]
    Unknown(String),
    #[error("`{field}` is {value}: it must be {want}")]
    Invalid {
        field: &'static str,
        value: String,
        want: &'static str,
    },
}

const FIELDS: &str = "name, dispatch_us, barrier_us, bytes_per_us, nominal_context, compute_units";

impl DeviceCost {
    /// An H100: dispatch ~0.2 µs, ~3 TB/s, 132 SMs (DESIGN.md's measurements), and a level
    /// boundary ~3.5 µs: not the barrier's own ~2.3 µs (DESIGN.md) but what a step saves
    /// without it, the drain before it and the ramp after it included (docs/perf.md: 3.0-4.4
    /// µs per boundary, session 13; 4.6-7 µs on the H100 with handoffs, session 15).
    pub fn h100() -> DeviceCost {
        DeviceCost {
            name: "h100".into(),
            dispatch_us: 0.2,
            barrier_us: 3.5,
            bytes_per_us: 3.0e6,
            nominal_context: 512,
            compute_units: 132,
        }
    }

    /// Parses and checks a device cost file's text (`vkfuse calibrate`'s JSON), naming the
    /// field it refuses.
    pub fn from_json(text: &str) -> Result<DeviceCost, DeviceCostError> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| DeviceCostError::Json(e.to_string()))?;
        let obj = value.as_object().ok_or(DeviceCostError::NotAnObject)?;
        if let Some(k) = obj
            .keys()
            .find(|k| !FIELDS.split(", ").any(|f| f == k.as_str()))
        {
            return Err(DeviceCostError::Unknown(k.clone()));
        }
        let get = |field: &'static str| obj.get(field).ok_or(DeviceCostError::Missing(field));
        // Ranges far beyond any device, so that no cost overflows the arithmetic it feeds
        // (a level's price times the levels, the units times four in the attention splits).
        let number = |field: &'static str, want: &'static str, range: (f64, f64)| {
            let v = get(field)?;
            match v.as_f64() {
                Some(x) if x >= range.0 && x <= range.1 => Ok(x),
                _ => Err(DeviceCostError::Invalid {
                    field,
                    value: v.to_string(),
                    want,
                }),
            }
        };
        let us = |field| number(field, "a number of µs from 0.0001 to 100000", (1e-4, 1e5));
        let count = |field: &'static str| -> Result<usize, DeviceCostError> {
            let v = get(field)?;
            match v.as_u64() {
                Some(n) if (1..=1 << 24).contains(&n) => Ok(n as usize),
                _ => Err(DeviceCostError::Invalid {
                    field,
                    value: v.to_string(),
                    want: "a whole number from 1 to 16777216",
                }),
            }
        };
        let name = get("name")?;
        Ok(DeviceCost {
            name: name
                .as_str()
                .ok_or_else(|| DeviceCostError::Invalid {
                    field: "name",
                    value: name.to_string(),
                    want: "a string",
                })?
                .to_string(),
            dispatch_us: us("dispatch_us")?,
            barrier_us: us("barrier_us")?,
            bytes_per_us: number(
                "bytes_per_us",
                "a number of bytes per µs from 1 to 10^9 (1 MB/s to 1 PB/s)",
                (1.0, 1e9),
            )?,
            nominal_context: count("nominal_context")?,
            compute_units: count("compute_units")?,
        })
    }
}

impl fmt::Display for DeviceCost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: barrier {} µs, dispatch {} µs, {:.1} GB/s, {} compute units",
            self.name,
            self.barrier_us,
            self.dispatch_us,
            self.bytes_per_us / 1e3,
            self.compute_units
        )
    }
}

impl Default for DeviceCost {
    fn default() -> Self {
        DeviceCost::h100()
    }
}

/// What a choice of nodes costs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Cost {
    pub dispatches: usize,
    /// Dependency levels (the longest chain of dispatches).
    pub levels: usize,
    pub bytes: f64,
    /// The estimate in µs.
    pub us: f64,
}

impl fmt::Display for Cost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} dispatches, {} levels, {:.1} KB, {:.2} µs",
            self.dispatches,
            self.levels,
            self.bytes / 1e3,
            self.us
        )
    }
}

fn ty_bytes(g: &FuseGraph, c: Id) -> f64 {
    g[c].data.ty.as_ref().map_or(0.0, |t| t.bytes() as f64)
}

/// Bytes of the values in an inputs list class (`cons` ... `nil`).
fn list_bytes(g: &FuseGraph, list: Id) -> f64 {
    super::rules::list_items(g, list)
        .unwrap_or_default()
        .iter()
        .map(|&e| ty_bytes(g, e))
        .sum()
}

/// Bytes a matvec-family kernel reads: weights, input, norm weight, extra inputs.
fn matvec_reads(g: &FuseGraph, w: Id, x: Id, pro: Id, ins: Id) -> f64 {
    let norm: f64 = g[pro]
        .nodes
        .iter()
        .find_map(|n| match n {
            FuseLang::Norm([nw, _]) => Some(ty_bytes(g, *nw)),
            _ => None,
        })
        .unwrap_or(0.0);
    ty_bytes(g, w) + ty_bytes(g, x) + norm + list_bytes(g, ins)
}

/// Bytes a kernel node moves (reads and writes), estimated; 0 for nodes that are no kernel.
pub fn node_bytes(g: &FuseGraph, class: Id, node: &FuseLang, dev: &DeviceCost) -> f64 {
    use FuseLang::*;
    if !node.is_kernel() {
        return 0.0;
    }
    let out = ty_bytes(g, class);
    // Attention reads K and V rows up to the position.
    let cache_read = |c: Id| {
        g[c].data.ty.as_ref().map_or(0.0, |t| {
            let d = t.shape.dims();
            if d.len() == 3 {
                (d[0] * d[1].min(dev.nominal_context) * d[2] * t.dtype.size()) as f64
            } else {
                t.bytes() as f64
            }
        })
    };
    match node {
        Mvk([_, w, x, pro, ins]) => matvec_reads(g, *w, *x, *pro, *ins) + out,
        // The tail's writes besides: the token state (the argmax's key) and the position.
        MvkStep([_, w, x, pro, ins, ..]) => matvec_reads(g, *w, *x, *pro, *ins) + out + 12.0,
        // Both matrices, and each workgroup's atomic add to every output row.
        MvChain([_, w2, _, w1, x, pro, ins]) => {
            let blocks = g[*w2]
                .data
                .ty
                .as_ref()
                .map_or(0, |t| t.shape.dims()[1] / super::codegen::ChainSpec::BLOCK);
            ty_bytes(g, *w2) + matvec_reads(g, *w1, *x, *pro, *ins) + out * blocks as f64
        }
        // The stack, the logits, the input rows and the epilogue's extra inputs.
        ExpertSumRouted([_, w, l, _, x, ins]) => {
            ty_bytes(g, *w) + ty_bytes(g, *l) + ty_bytes(g, *x) + list_bytes(g, *ins) + out
        }
        // The stack, the indices, the input rows, the weights and the extra inputs.
        ExpertSumEpi([_, w, idx, x, wts, ins]) => {
            ty_bytes(g, *w)
                + ty_bytes(g, *idx)
                + ty_bytes(g, *x)
                + ty_bytes(g, *wts)
                + list_bytes(g, *ins)
                + out
        }
        Ewk([_, ins]) => list_bytes(g, *ins) + out,
        UpdateInPlace([st, _, k, v, gg, b]) => {
            2.0 * ty_bytes(g, *st)
                + ty_bytes(g, *k)
                + ty_bytes(g, *v)
                + ty_bytes(g, *gg)
                + ty_bytes(g, *b)
        }
        AttnBlock([q, k, v, kc, vc, ..]) | AttnGated([q, k, v, kc, vc, ..]) => {
            ty_bytes(g, *q)
                + 2.0 * (ty_bytes(g, *k) + ty_bytes(g, *v))
                + cache_read(*kc)
                + cache_read(*vc)
                + out
        }
        Attention([q, kc, vc, ..]) => ty_bytes(g, *q) + cache_read(*kc) + cache_read(*vc) + out,
        KvWrite([_, x, _]) | WriteState([_, x]) => 2.0 * ty_bytes(g, *x),
        ArgmaxWrite([_, x]) | TailStep([_, x, ..]) => ty_bytes(g, *x) + 8.0,
        IncWrite(_) => 8.0,
        _ => {
            let reads: f64 = node
                .children()
                .iter()
                .filter(|c| !g[**c].nodes.iter().all(FuseLang::is_code))
                .map(|&c| ty_bytes(g, c))
                .sum();
            reads + out
        }
    }
}

/// The cost of one node on its own (its dispatch and bytes; barriers come from levels).
pub fn node_cost(g: &FuseGraph, class: Id, node: &FuseLang, dev: &DeviceCost) -> f64 {
    if node.is_kernel() {
        // The chained kernel's output is zeroed by a dispatch of its own.
        let dispatches = if matches!(node, FuseLang::MvChain(_)) {
            2.0
        } else {
            1.0
        };
        dispatches * dev.dispatch_us + node_bytes(g, class, node, dev) / dev.bytes_per_us
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn should_read_back_the_json_a_cost_writes() {
        let h100 = DeviceCost::h100();
        let text = serde_json::to_string_pretty(&h100).unwrap();
        assert_eq!(DeviceCost::from_json(&text).unwrap(), h100);
        // Every field the writer writes is one the reader knows.
        let v = serde_json::to_value(&h100).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        let mut fields: Vec<&str> = FIELDS.split(", ").collect();
        fields.sort_unstable();
        let mut keys = keys;
        keys.sort_unstable();
        assert_eq!(keys, fields);
    }

    #[test]
    fn should_name_the_field_that_a_cost_file_gets_wrong() {
        let good = serde_json::to_value(DeviceCost::h100()).unwrap();
        let with = |field: &str, value: serde_json::Value| {
            let mut v = good.clone();
            v[field] = value;
            DeviceCost::from_json(&v.to_string())
                .unwrap_err()
                .to_string()
        };
        let e = with("barrier_us", serde_json::json!(-1.0));
        assert!(e.contains("`barrier_us` is -1.0"), "{e}");
        let e = with("compute_units", serde_json::json!(0));
        assert!(e.contains("`compute_units` is 0"), "{e}");
        let e = with("compute_units", serde_json::json!(1.5));
        assert!(
            e.contains("`compute_units` is 1.5: it must be a whole"),
            "{e}"
        );
        let e = with("bytes_per_us", serde_json::json!("fast"));
        assert!(e.contains("`bytes_per_us` is \"fast\""), "{e}");
        let e = with("name", serde_json::json!(3));
        assert!(e.contains("`name` is 3"), "{e}");
        let mut missing = good.clone();
        missing.as_object_mut().unwrap().remove("dispatch_us");
        let e = DeviceCost::from_json(&missing.to_string())
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing field `dispatch_us`"), "{e}");
        let mut extra = good.clone();
        extra["barrier_ms"] = serde_json::json!(1.0);
        let e = DeviceCost::from_json(&extra.to_string())
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `barrier_ms`"), "{e}");
        let e = DeviceCost::from_json("{").unwrap_err();
        assert!(e.to_string().contains("not JSON (EOF while parsing"), "{e}");
        // The parser's message is in the text only, not repeated as a cause.
        assert!(std::error::Error::source(&e).is_none());
        let e = DeviceCost::from_json("[1]").unwrap_err().to_string();
        assert!(e.contains("not a JSON object"), "{e}");
    }
}
