//! `compile-model --ablate`: timing probes, never for use. Each ablation reduces one kind of
//! fused kernel, in every layer, to its input wait and its output (or the attention block's
//! combine to split 0's own partial), keeping the levels, the handoffs and the barriers as
//! they are. Run against the unablated schedule, the step's time says what that kernel's work
//! costs the step as it really runs, handoffs included, where the per-level profile must run
//! every level behind a barrier (docs/perf.md, session 21). The tokens are wrong by design:
//! the kernels' labels say `ablated`, and `vkfuse` warns when it loads such a schedule.

use super::codegen::Generated;
use std::str::FromStr;

/// What to reduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ablate {
    /// Fused matvec kernels but the one that picks the next token (a dense layer's q/k/v; and
    /// lm_head too under `--no-argmax-in-matvec`, where a tail kernel picks the token).
    Matvec,
    /// Wide matvec kernels (a dense layer's o_proj, handed the attention block's output).
    WideMatvec,
    /// The attention block, to its handoff hop (q/k/v words in, y words out).
    Attention,
    /// The attention block's combine of its splits: split 0 publishes its own partial.
    AttentionCombine,
    /// The chained MLP, to its input wait and the residual add.
    Chain,
}

impl Ablate {
    const NAMES: [(&'static str, Ablate); 5] = [
        ("matvec", Ablate::Matvec),
        ("wide-matvec", Ablate::WideMatvec),
        ("attention", Ablate::Attention),
        ("attention-combine", Ablate::AttentionCombine),
        ("chain", Ablate::Chain),
    ];

    /// The define that the kernel's GLSL reads.
    fn define(self) -> &'static str {
        match self {
            Ablate::AttentionCombine => "ABLATE_COMBINE",
            _ => "ABLATE_EMPTY",
        }
    }

    /// Whether it applies to `generated` (by its kernel label).
    fn applies(self, generated: &Generated) -> bool {
        let l = &generated.label;
        match self {
            Ablate::Matvec => l.starts_with("fused_matvec[") && !l.starts_with("fused_matvec[wide"),
            Ablate::WideMatvec => l.starts_with("fused_matvec[wide"),
            Ablate::Attention | Ablate::AttentionCombine => l.starts_with("fused_attention["),
            Ablate::Chain => l.starts_with("fused_chain["),
        }
    }
}

impl FromStr for Ablate {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ablate::NAMES
            .iter()
            .find(|(n, _)| *n == s)
            .map(|(_, a)| *a)
            .ok_or_else(|| {
                let names: Vec<&str> = Ablate::NAMES.iter().map(|(n, _)| *n).collect();
                format!("`{s}`: the ablations are {}", names.join(", "))
            })
    }
}

/// The marker in an ablated kernel's label.
pub const MARK: &str = "+ablated";

/// `generated` with the ablations of `what` that apply to it (never the matvec that picks the
/// token, `argmax-in-matvec`: the step must still advance).
pub fn apply(what: &[Ablate], mut generated: Generated) -> Generated {
    let step = generated.source.contains("#define STEP 1");
    let defines: Vec<&str> = what
        .iter()
        .filter(|a| a.applies(&generated) && !step)
        .map(|a| a.define())
        .collect();
    if defines.is_empty() {
        return generated;
    }
    // After the `#version` line, which must come first.
    let at = generated.source.find('\n').map_or(0, |i| i + 1);
    let lines: String = defines.iter().map(|d| format!("#define {d} 1\n")).collect();
    generated.source.insert_str(at, &lines);
    generated.label.push_str(MARK);
    generated
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generated(label: &str, source: &str) -> Generated {
        Generated {
            label: label.into(),
            source: source.into(),
            spec_constants: vec![],
            workgroups: [1, 1, 1],
            bindings: 1,
        }
    }

    #[test]
    fn should_mark_and_define_only_the_kernels_named() {
        let chain = generated("fused_chain[x]", "#version 450\nbody\n");
        let g = apply(&[Ablate::Chain], chain.clone());
        assert_eq!(g.source, "#version 450\n#define ABLATE_EMPTY 1\nbody\n");
        assert_eq!(g.label, "fused_chain[x]+ablated");
        assert_eq!(apply(&[Ablate::Attention], chain.clone()), chain);
        let wide = generated("fused_matvec[wide 16: x]", "#version 450\n");
        assert_eq!(apply(&[Ablate::Matvec], wide.clone()), wide);
        assert!(apply(&[Ablate::WideMatvec], wide).label.ends_with(MARK));
        // The logits' matvec keeps the step going.
        let lm = generated("fused_matvec[x]", "#version 450\n#define STEP 1\n");
        assert_eq!(apply(&[Ablate::Matvec], lm.clone()), lm);
        assert_eq!(
            "attention-combine".parse::<Ablate>(),
            Ok(Ablate::AttentionCombine)
        );
        assert!("mlp"
            .parse::<Ablate>()
            .unwrap_err()
            .contains("the ablations are"));
    }
}
