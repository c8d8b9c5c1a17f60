//! When the trace folds norm weights into the matrices after them
//! ([`super::TraceOptions::fold_norms`]), as `compile-model --fold-norms` and the
//! model-directory commands of `vkfuse` choose it, and what a traced program folded.

use crate::import::{layout, Family, Model};
use crate::ir::{DType, OpKind, Program};
use crate::quant::WeightFormat;

/// `--fold-norms`: whether to fold each RMSNorm weight that only matvecs read into their
/// matrices' columns (Llama and Qwen3; Qwen3-Next is never folded).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum FoldNorms {
    /// Where every matrix a folded norm feeds is then stored in a block format (`--weights
    /// q8_0|q4_0`, and an input size those formats take), whose own rounding dwarfs the fold's:
    /// float matrices keep their checkpoint's values.
    #[default]
    Auto,
    /// Always (the float matrices are rounded to their dtype once more after the fold).
    On,
    /// Never.
    Off,
}

impl FoldNorms {
    /// Whether `model`, its matvec weights stored as `weights` (`None`: as the checkpoint
    /// stores them), is traced folded.
    pub fn folds(self, model: &Model, weights: Option<WeightFormat>) -> bool {
        if model.config.family == Family::Qwen3Next {
            return false;
        }
        match self {
            // Every folded matrix (q/k/v, gate/up, lm_head) has the hidden size as its input:
            // the block formats keep them all as stored where it is no multiple of a block.
            FoldNorms::Auto => {
                weights.is_some_and(|w| w.dtype().is_quantized())
                    && model.config.hidden_size.is_multiple_of(DType::BLOCK)
            }
            FoldNorms::On => true,
            FoldNorms::Off => false,
        }
    }
}

/// What a traced program folded, for reports (`None`: nothing): how many norm weights were left
/// as ones, and whether the final norm is among them (an lm_head of its own).
pub fn summary(program: &Program) -> Option<String> {
    let ones: Vec<&str> = program
        .ops
        .iter()
        .filter_map(|op| match &op.kind {
            OpKind::Weight { name } => layout::ones_of(name),
            _ => None,
        })
        .collect();
    if ones.is_empty() {
        return None;
    }
    let lm_head = ones.iter().any(|n| !n.starts_with("model.layers."));
    Some(format!(
        "{} folded into the matrices after them{}",
        ones.len(),
        if lm_head {
            ""
        } else {
            " (lm_head shares the embedding table: the final norm is not)"
        }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::import;

    fn fixture(name: &str) -> Model {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/models");
        import::load(&dir.join(name)).unwrap()
    }

    #[test]
    fn auto_folds_where_the_matrices_become_blocks() {
        let dense = fixture("llama-gqa");
        let auto = FoldNorms::Auto;
        assert!(auto.folds(&dense, Some(WeightFormat::Q8_0)));
        assert!(auto.folds(&dense, Some(WeightFormat::Q4_0)));
        assert!(!auto.folds(&dense, Some(WeightFormat::BF16)));
        assert!(!auto.folds(&dense, None));
        assert!(FoldNorms::On.folds(&dense, None));
        assert!(!FoldNorms::Off.folds(&dense, Some(WeightFormat::Q4_0)));
        // A hidden size the block formats keep as stored: its matrices stay float.
        let mut odd = fixture("llama-gqa");
        odd.config.hidden_size = 48;
        assert!(!auto.folds(&odd, Some(WeightFormat::Q8_0)));
        // Qwen3-Next: never.
        let hybrid = fixture("qwen3-next");
        assert!(!FoldNorms::On.folds(&hybrid, Some(WeightFormat::Q8_0)));
    }
}
