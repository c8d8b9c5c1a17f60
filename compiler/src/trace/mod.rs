//! Model -> one decode step as a flat op list.
//!
//! The builders emit each weight right before its first use and reference it by its tensor
//! name; they write no layer markers: the fusion compiler must find the layers itself.

mod builder;
mod dense;
pub mod fold;
mod hybrid;
mod unread;

pub use builder::Tracer;
pub use fold::FoldNorms;
pub use unread::{unread_tensors, unread_warning};

use crate::import::{Family, ImportError, Model};
use crate::ir::{DType, Program, VerifyError};

/// Options of the trace.
#[derive(Clone, Debug, Default)]
pub struct TraceOptions {
    /// KV-cache capacity in positions; `None` means the model's max_position_embeddings,
    /// capped at [`TraceOptions::DEFAULT_MAX_CONTEXT`].
    pub max_context: Option<usize>,
    /// The KV caches' element type: f16 (the default: half the memory, and faster on an H100
    /// at every context length measured) or f32 (keys and values kept unrounded).
    pub kv_cache: KvCache,
    /// Fold each RMSNorm weight of a dense model into the columns of the matrices that read the
    /// norm's output (`W (w ⊙ x̂) = (W · diag(w)) x̂`, computed at compile time): the attention
    /// norm into q/k/v, the MLP's into gate/up, the final norm into an lm_head of its own (one
    /// shared with the embedding stays unfolded, not to store the table twice). Each norm is
    /// left a weight of ones that the fused kernels do not load (`import::layout::folded`).
    /// On an H200 (the tied Qwen3-0.6B shape): q8_0 +3.8%, q4_0 +1.0%, bf16 +0.7%
    /// (docs/perf.md, session 36). The folded matrix is rounded to its dtype once more (bf16:
    /// as transformers rounds w ⊙ x̂), so `compile-model` folds by default only where the
    /// weights are then quantised ([`FoldNorms`]).
    pub fold_norms: bool,
}

/// The KV caches' element type ([`TraceOptions::kv_cache`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvCache {
    F32,
    /// The default: keys and values rounded to f16 as they are written.
    #[default]
    F16,
}

impl std::str::FromStr for KvCache {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" => Ok(KvCache::F32),
            "f16" => Ok(KvCache::F16),
            other => Err(format!("`{other}` is not a KV-cache type: f32 or f16")),
        }
    }
}

impl KvCache {
    /// The IR dtype of a cache of this kind.
    pub fn dtype(self) -> DType {
        match self {
            KvCache::F32 => DType::F32,
            KvCache::F16 => DType::F16,
        }
    }
}

impl TraceOptions {
    pub const DEFAULT_MAX_CONTEXT: usize = 4096;
    /// The largest `max_context`: rope turns the position into an f32, exact up to 2^24.
    /// The model's max_position_embeddings is no limit (see [`past_trained_context`]).
    pub const MAX_CONTEXT_LIMIT: usize = 1 << 24;
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error(transparent)]
    Import(#[from] ImportError),
    /// In the message, not also a `source()`: a printed chain would repeat it.
    #[error("internal error while tracing (please report): {0}")]
    Verify(VerifyError),
    #[error("--max-context {requested} must be between 1 and {limit}")]
    MaxContext { requested: usize, limit: usize },
    #[error("--kv-cache f16 needs an even head_dim (f16 caches are written two elements per word); this model's is {head_dim}: use --kv-cache f32")]
    KvCacheOddHead { head_dim: usize },
}

impl From<VerifyError> for TraceError {
    fn from(e: VerifyError) -> Self {
        TraceError::Verify(e)
    }
}

/// Refuses a `--max-context` outside 1..=[`TraceOptions::MAX_CONTEXT_LIMIT`].
pub fn check_max_context(n: usize) -> Result<usize, TraceError> {
    let limit = TraceOptions::MAX_CONTEXT_LIMIT;
    match n {
        1.. if n <= limit => Ok(n),
        _ => Err(TraceError::MaxContext {
            requested: n,
            limit,
        }),
    }
}

/// The resolved KV capacity for a model.
pub fn max_context(model: &Model, opts: &TraceOptions) -> Result<usize, TraceError> {
    match opts.max_context {
        Some(n) => check_max_context(n),
        None => Ok(model
            .config
            .max_position_embeddings
            .clamp(1, TraceOptions::DEFAULT_MAX_CONTEXT)),
    }
}

/// A warning when `--max-context` asks for more positions than the model was trained on: it
/// is allowed (the caches are only memory), but past max_position_embeddings the model's
/// output is outside what it was trained for.
pub fn past_trained_context(model: &Model, opts: &TraceOptions) -> Option<String> {
    let trained = model.config.max_position_embeddings;
    opts.max_context.filter(|&n| n > trained).map(|n| {
        format!(
            "warning: --max-context {n} exceeds the model's max_position_embeddings ({trained})"
        )
    })
}

/// Builds the verified decode step of `model`.
pub fn trace(model: &Model, opts: &TraceOptions) -> Result<Program, TraceError> {
    let capacity = max_context(model, opts)?;
    let mut t = Tracer::new(model, capacity);
    t.kv_dtype = opts.kv_cache.dtype();
    // Qwen3-Next's norms are zero-centred (1 + w) and its matvecs partly experts': unfolded.
    t.fold_norms = opts.fold_norms && model.config.family != Family::Qwen3Next;
    match model.config.family {
        Family::Llama | Family::Qwen3 => dense::trace(&mut t)?,
        Family::Qwen3Next => hybrid::trace(&mut t)?,
    }
    let p = t.finish();
    p.verify()?;
    Ok(p)
}
