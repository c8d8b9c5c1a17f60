//! `--dots`: the arithmetic of the block formats' dot products in the fused matvec kernels
//! ([`super::FuseOptions::f16_dots`]).
//!
//! In f16 (`kernels/glsl/quant.glsl`, `F16_DOTS`), a step's q8_0/q4_0 codes become f16 pairs
//! by masking them into a mantissa (no conversion), the input is paired to match, and one
//! packed multiply-add takes two weights, where f32 takes a permute, a subtraction and a
//! multiply-add per weight. Each product rounds to f16 (relative 2^-11, against the formats'
//! own 2^-8 and 2^-4); the sums stay f32. On an H200, the Qwen3-0.6B shape: q8_0 +5.0% and
//! q4_0 +6.2% tokens/s, the logits 1-2e-3 relative L2 from the f32 dots' (docs/perf.md,
//! session 38). Float weights are unaffected.

use crate::quant::WeightFormat;

/// The define that selects the f16 dots in the fused kernels' GLSL.
pub const F16_DEFINE: &str = "F16_DOTS";

/// `compile-model --dots`: which arithmetic the block formats' dots use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Dots {
    /// f16 where the matvec weights are stored as q8_0 or q4_0 (`--weights`); nothing else
    /// has block-format dots.
    // compile-model's default; the library's (`FuseOptions::f16_dots`) is f32.
    Auto,
    /// Packed f16 products (the schedule then needs a device with `shaderFloat16`).
    F16,
    /// f32 products: the kernels dequantise exactly, as the CPU reference does.
    F32,
}

impl Dots {
    /// Whether the fused kernels take their block-format dots in f16, the matvec weights
    /// stored as `weights` (`None`: as the checkpoint stores them, never a block format).
    pub fn f16(self, weights: Option<WeightFormat>) -> bool {
        match self {
            Dots::Auto => weights.is_some_and(|w| w.dtype().is_quantized()),
            Dots::F16 => true,
            Dots::F32 => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_takes_f16_for_the_block_formats_only() {
        assert!(Dots::Auto.f16(Some(WeightFormat::Q8_0)));
        assert!(Dots::Auto.f16(Some(WeightFormat::Q4_0)));
        assert!(!Dots::Auto.f16(Some(WeightFormat::BF16)));
        assert!(!Dots::Auto.f16(None));
        assert!(Dots::F16.f16(None));
        assert!(!Dots::F32.f16(Some(WeightFormat::Q4_0)));
    }
}
