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
//!
//! In int8 (`I8_CHAIN`, the chained MLP's dots only: its gate/up and its down projection),
//! ggml's q8_1 route: the kernel quantises its input to int8 per block of 32 (the block's
//! largest |x| maps to 127) and a step is two packed 4x8-bit integer dot products (SPIR-V's
//! `OpSDot`), q8_0's codes as they are, q4_0's nibbles as n - 8, then one multiply by the two
//! scales. The chain's dots were the arithmetic left on the step's path (the f16 dots' mask,
//! subtraction, multiply-adds and conversions: with them free the step ran 7% faster). On an
//! H200, the Qwen3-0.6B shape: q8_0 +4.8% and q4_0 +4.0% tokens/s over the f16 dots, the
//! fixtures' logits ~1e-2 relative L2 from the f32 dots' (docs/perf.md, session 52).

use crate::quant::WeightFormat;

/// The define that selects the f16 dots in the fused kernels' GLSL.
pub const F16_DEFINE: &str = "F16_DOTS";
/// The define that selects the chained MLP's int8 dots.
pub const I8_CHAIN_DEFINE: &str = "I8_CHAIN";

/// The defines of the fused kernels for these choices ([`super::FuseOptions`]).
pub fn defines(f16_dots: bool, int8_chain: bool) -> &'static str {
    match (f16_dots, int8_chain) {
        (true, true) => "F16_DOTS,I8_CHAIN",
        (true, false) => F16_DEFINE,
        (false, true) => I8_CHAIN_DEFINE,
        (false, false) => "",
    }
}

/// `compile-model --dots`: which arithmetic the block formats' dots use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Dots {
    /// int8 in the chained MLPs and f16 in the other fused matvecs where the matvec weights
    /// are stored as q8_0 or q4_0 (`--weights`); nothing else has block-format dots.
    // compile-model's default; the library's (`FuseOptions::f16_dots`, `int8_chain`) is f32.
    Auto,
    /// The chained MLP's dots as packed int8 products of its quantised input, the other
    /// fused matvecs' as f16 ones (the schedule then needs a device with
    /// `shaderIntegerDotProduct` and `shaderFloat16`).
    Int8,
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
            Dots::Int8 | Dots::F16 => true,
            Dots::F32 => false,
        }
    }

    /// Whether the chained MLP takes its block-format dots in int8.
    pub fn int8_chain(self, weights: Option<WeightFormat>) -> bool {
        match self {
            Dots::Auto => weights.is_some_and(|w| w.dtype().is_quantized()),
            Dots::Int8 => true,
            Dots::F16 | Dots::F32 => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_takes_int8_chains_and_f16_for_the_block_formats_only() {
        for dots in [Dots::Auto, Dots::Int8] {
            assert!(dots.f16(Some(WeightFormat::Q8_0)));
            assert!(dots.int8_chain(Some(WeightFormat::Q4_0)));
        }
        assert!(Dots::Auto.f16(Some(WeightFormat::Q4_0)));
        assert!(Dots::Auto.int8_chain(Some(WeightFormat::Q8_0)));
        assert!(!Dots::Auto.f16(Some(WeightFormat::BF16)));
        assert!(!Dots::Auto.int8_chain(Some(WeightFormat::BF16)));
        assert!(!Dots::Auto.f16(None));
        assert!(!Dots::Auto.int8_chain(None));
        assert!(Dots::F16.f16(None));
        assert!(!Dots::F16.int8_chain(Some(WeightFormat::Q4_0)));
        assert!(!Dots::F32.f16(Some(WeightFormat::Q4_0)));
        assert!(!Dots::F32.int8_chain(Some(WeightFormat::Q4_0)));
        assert_eq!(defines(true, true), "F16_DOTS,I8_CHAIN");
        assert_eq!(defines(false, false), "");
    }
}
