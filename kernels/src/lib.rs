//! The GLSL kernels of vkfuse: one compute shader per kernel (`glsl/<name>.comp`) and the
//! headers they `#include` (`glsl/<name>.glsl`), exposed by name as text.
//!
//! The compiler (`vkfuse_compiler::kernels`) picks a kernel per op, sets its defines and
//! specialization constants, and turns it into SPIR-V with shaderc; the runtime only ever sees
//! SPIR-V. Each kernel's header comment states its bindings, defines, specialization constants
//! and dispatch geometry; `common.glsl` states the conventions they share (buffer layout of
//! f16/bf16, the `DTYPE_<binding>` defines, 2-D splitting of large dispatches).

macro_rules! sources {
    ($ext:literal: $($name:literal),* $(,)?) => {
        &[$(($name, include_str!(concat!("../glsl/", $name, $ext)))),*]
    };
}

/// Every kernel, as (name, GLSL source); the name is the file's stem.
pub const KERNELS: &[(&str, &str)] = sources!(".comp":
    "argmax",
    "attention",
    "binary",
    "causal_conv1d",
    "concat",
    "conv_shift",
    "copy",
    "delta_rule_readout",
    "delta_rule_update",
    "embedding",
    "expert_matvec",
    "gated_rms_norm",
    "gather",
    "increment",
    "kv_write",
    "l2_norm",
    "matvec",
    "prefetch",
    "rms_norm",
    "rope",
    "slice",
    "softmax",
    "step_io",
    "sum",
    "top_k",
    "unary",
);

/// The shared headers, as (file name as written in `#include "..."`, source).
pub const HEADERS: &[(&str, &str)] = &[
    ("common.glsl", include_str!("../glsl/common.glsl")),
    ("reduce.glsl", include_str!("../glsl/reduce.glsl")),
    ("wg_sum2.glsl", include_str!("../glsl/wg_sum2.glsl")),
    ("argbest.glsl", include_str!("../glsl/argbest.glsl")),
    ("matvec_core.glsl", include_str!("../glsl/matvec_core.glsl")),
    ("quant.glsl", include_str!("../glsl/quant.glsl")),
    (
        "norm_weights.glsl",
        include_str!("../glsl/norm_weights.glsl"),
    ),
    ("kv_cache.glsl", include_str!("../glsl/kv_cache.glsl")),
    ("handoff.glsl", include_str!("../glsl/handoff.glsl")),
    ("timeline.glsl", include_str!("../glsl/timeline.glsl")),
    // Anchors of the fused kernels: the compiler generates the sources that include them.
    (
        "fused_matvec.glsl",
        include_str!("../glsl/fused_matvec.glsl"),
    ),
    ("fused_chain.glsl", include_str!("../glsl/fused_chain.glsl")),
    ("matvec_rows.glsl", include_str!("../glsl/matvec_rows.glsl")),
    ("matvec_step.glsl", include_str!("../glsl/matvec_step.glsl")),
    ("persistent.glsl", include_str!("../glsl/persistent.glsl")),
    (
        "persistent_matvec.glsl",
        include_str!("../glsl/persistent_matvec.glsl"),
    ),
    (
        "fused_attention.glsl",
        include_str!("../glsl/fused_attention.glsl"),
    ),
    (
        "attend_subgroups.glsl",
        include_str!("../glsl/attend_subgroups.glsl"),
    ),
    (
        "fused_argmax.glsl",
        include_str!("../glsl/fused_argmax.glsl"),
    ),
    ("fused_rope.glsl", include_str!("../glsl/fused_rope.glsl")),
    (
        "fused_epilogue.glsl",
        include_str!("../glsl/fused_epilogue.glsl"),
    ),
    (
        "fused_elementwise.glsl",
        include_str!("../glsl/fused_elementwise.glsl"),
    ),
    ("fused_gdn.glsl", include_str!("../glsl/fused_gdn.glsl")),
    ("fused_route.glsl", include_str!("../glsl/fused_route.glsl")),
    ("route_pick.glsl", include_str!("../glsl/route_pick.glsl")),
    ("expert_dots.glsl", include_str!("../glsl/expert_dots.glsl")),
    (
        "fused_expert_glu.glsl",
        include_str!("../glsl/fused_expert_glu.glsl"),
    ),
    (
        "fused_expert_sum.glsl",
        include_str!("../glsl/fused_expert_sum.glsl"),
    ),
];

/// The GLSL source of kernel `name`.
pub fn source(name: &str) -> Option<&'static str> {
    KERNELS.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}

/// The source of header `name` (e.g. `"common.glsl"`).
pub fn header(name: &str) -> Option<&'static str> {
    HEADERS.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}

/// Maximum rotary half-dimension the rope kernel takes as specialization constants.
pub const ROPE_MAX_HALF: usize = 128;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_glsl_file_is_listed() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/glsl");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .expect("glsl folder")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        on_disk.sort();
        let mut listed: Vec<String> = KERNELS
            .iter()
            .map(|(n, _)| format!("{n}.comp"))
            .chain(HEADERS.iter().map(|(n, _)| n.to_string()))
            .collect();
        listed.sort();
        assert_eq!(on_disk, listed);
    }

    #[test]
    fn kernels_are_found_by_name() {
        assert!(source("matvec").is_some_and(|s| s.contains("#include \"matvec_core.glsl\"")));
        assert!(header("common.glsl").is_some());
        assert!(source("nope").is_none());
    }
}
