//! The op IR: one decode step as a flat SSA list of ops over typed values.
//!
//! Invariants (see [`Program`]): every value is defined by exactly one earlier op; types are
//! inferred from operands by [`verify::infer`] and never disagree with what a value records;
//! persistent state (KV caches, conv and recurrent state, the position, the current token) is
//! declared up front and touched only by `read_state`, `write_state` and `kv_write`, each state
//! written at most once per step. There are no layer markers: repetition is for the compiler
//! to discover. The text form ([`text`]) parses back to an equal program.

mod op;
mod program;
pub mod text;
mod types;
pub mod verify;

pub use op::OpKind;
pub use program::{Op, OpId, Program, StateDecl, StateId, StateKind, ValueId};
pub use text::{parse, ParseError};
pub use types::{DType, F32Attr, Shape, Type};
pub use verify::{VerifyError, VerifyErrorKind};
