//! The static buffer plan: every transient buffer of one decode step gets a fixed offset in ONE
//! arena, chosen once at compile time from liveness, so that replay binds the same addresses on
//! every token and the arena is close to the peak of live bytes rather than their sum.
//!
//! A [`Request`] is live from the dispatch that writes it (`first`) to the last dispatch that reads
//! it (`last`), both inclusive: a dispatch's output never aliases one of its own inputs, even one
//! that dies at that dispatch.
//!
//! Invariants of a [`Plan`] made by [`plan`] or [`plan_naive`] (and proved by [`check`], which
//! shares no code with the planner):
//! - `offsets[i]` belongs to `requests[i]` and is a multiple of `align`;
//! - every buffer's footprint (its bytes rounded up to 4, at least 4: shaders address storage
//!   buffers in 32-bit words, and a zero-byte buffer must still have an address of its own) lies
//!   inside `0..arena_bytes`;
//! - two requests whose live ranges intersect have disjoint footprints;
//! - `lower_bound <= arena_bytes <= naive_bytes`: the arena is never worse than giving every
//!   buffer its own slot, and never better than the peak of live slot sizes;
//! - the plan is a function of its input: no hashing, ties broken by request index, so the same
//!   requests give the same plan byte for byte.

mod check;
mod greedy;
mod report;

pub use check::check;
pub use greedy::{plan, plan_naive};

/// One transient buffer to place: live from the dispatch `first` (its writer) to `last` (its
/// last reader), inclusive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub bytes: u64,
    pub first: u32,
    pub last: u32,
}

/// Where every request lives in the arena, with what the report needs to judge it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// `offsets[i]` is the byte offset of `requests[i]` in the arena.
    pub offsets: Vec<u64>,
    /// The arena's size: the end of the highest slot.
    pub arena_bytes: u64,
    /// Peak live bytes: the maximum over dispatches of the summed slot sizes live there. No plan
    /// with these slot sizes can use a smaller arena.
    pub lower_bound: u64,
    /// The arena without planning: the sum of all slot sizes.
    pub naive_bytes: u64,
    /// The alignment the plan was made for.
    pub align: u64,
    /// A copy of the requests the plan was made for, for the report; [`check`] verifies the plan
    /// against the caller's requests and rejects a plan made for others.
    pub requests: Vec<Request>,
}

/// Why a plan cannot be made, or why [`check`] rejects one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("alignment {align} is not a power of two")]
    BadAlign { align: u64 },
    #[error("request {index} is live from dispatch {first} to {last}: its last reader comes before its writer")]
    InvertedRange { index: usize, first: u32, last: u32 },
    #[error("the requests' sizes overflow a 64-bit arena")]
    TooLarge,
    #[error("the plan was made for other requests or another alignment ({offsets} offsets for {requests} requests)")]
    NotThisInput { requests: usize, offsets: usize },
    #[error("request {index} sits at offset {offset}, not a multiple of {align}")]
    Misaligned {
        index: usize,
        offset: u64,
        align: u64,
    },
    #[error("request {index} ends at byte {end}, past the arena's {arena_bytes} bytes")]
    OutOfArena {
        index: usize,
        end: u64,
        arena_bytes: u64,
    },
    #[error("requests {a} and {b} are both live at dispatch {dispatch} and overlap in bytes {start}..{end}")]
    Overlap {
        a: usize,
        b: usize,
        dispatch: u32,
        start: u64,
        end: u64,
    },
}

impl PlanError {
    /// The requests this error names (none for errors about the whole input).
    pub fn requests(&self) -> Vec<usize> {
        match *self {
            PlanError::InvertedRange { index, .. }
            | PlanError::Misaligned { index, .. }
            | PlanError::OutOfArena { index, .. } => vec![index],
            PlanError::Overlap { a, b, .. } => vec![a, b],
            PlanError::BadAlign { .. } | PlanError::TooLarge | PlanError::NotThisInput { .. } => {
                vec![]
            }
        }
    }
}
