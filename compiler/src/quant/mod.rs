//! Weight formats chosen at compile time (`compile-model --weights f16|bf16|q8_0|q4_0`).
//!
//! [`convert`] retypes the weights of the matvecs (and the embedding table when lm_head shares
//! it) in a traced program; [`EncodedWeights`] then gives their bytes in the new format, to
//! the schedule writer and the executors ([`TensorBytes`](vkfuse_runtime::session::TensorBytes))
//! and to the CPU reference interpreter, which dequantises the same bytes
//! ([`WeightSource`](crate::reference::WeightSource)). [`blocks`] holds ggml's q8_0 and q4_0
//! arithmetic and vkfuse's row layout of them.

pub mod blocks;
mod convert;
mod encoded;

pub use convert::{convert, ConversionReport, Kept, WeightFormat};
pub use encoded::EncodedWeights;
