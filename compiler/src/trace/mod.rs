//! Model -> one decode step as a flat op list.
//!
//! The builders emit each weight right before its first use and reference it by its tensor
//! name; they write no layer markers: the fusion compiler must find the layers itself.

mod builder;
mod dense;
mod hybrid;

pub use builder::Tracer;

use crate::import::{Family, ImportError, Model};
use crate::ir::{Program, VerifyError};

/// Options of the trace.
#[derive(Clone, Debug, Default)]
pub struct TraceOptions {
    /// KV-cache capacity in positions; `None` means the model's max_position_embeddings,
    /// capped at [`TraceOptions::DEFAULT_MAX_CONTEXT`].
    pub max_context: Option<usize>,
}

impl TraceOptions {
    pub const DEFAULT_MAX_CONTEXT: usize = 4096;
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error(transparent)]
    Import(#[from] ImportError),
    #[error("internal error while tracing (please report): {0}")]
    Verify(#[from] VerifyError),
    #[error("--max-context {requested} must be between 1 and {limit}")]
    MaxContext { requested: usize, limit: usize },
}

/// The resolved KV capacity for a model.
pub fn max_context(model: &Model, opts: &TraceOptions) -> Result<usize, TraceError> {
    let limit = model.config.max_position_embeddings.max(1);
    match opts.max_context {
        Some(n) if n == 0 || n > (1 << 24) => Err(TraceError::MaxContext {
            requested: n,
            limit,
        }),
        Some(n) => Ok(n),
        None => Ok(limit.min(TraceOptions::DEFAULT_MAX_CONTEXT)),
    }
}

/// Builds the verified decode step of `model`.
pub fn trace(model: &Model, opts: &TraceOptions) -> Result<Program, TraceError> {
    let capacity = max_context(model, opts)?;
    let mut t = Tracer::new(model, capacity);
    match model.config.family {
        Family::Llama | Family::Qwen3 => dense::trace(&mut t)?,
        Family::Qwen3Next => hybrid::trace(&mut t)?,
    }
    let p = t.finish();
    p.verify()?;
    Ok(p)
}
