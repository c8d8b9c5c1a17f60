//! The independent checker (after regalloc2's `checker.rs`): it trusts nothing the planner
//! computed except the offsets and the arena size, shares none of its code, and proves the
//! plan's safety invariants directly, pair by pair. It is quadratic on purpose: obviously correct
//! beats fast here, and a decode step has at most a few thousand transient buffers.

use super::{Plan, PlanError, Request};

/// Proves that `plan` is safe for `requests` at `align`: every offset aligned, every footprint
/// inside the arena, and no two requests that are live at the same dispatch sharing a byte.
/// Errors name the offending request(s); among several problems the first in request order is
/// reported, per-buffer problems before overlaps.
pub fn check(requests: &[Request], plan: &Plan, align: u64) -> Result<(), PlanError> {
    if !align.is_power_of_two() {
        return Err(PlanError::BadAlign { align });
    }
    if plan.offsets.len() != requests.len() || plan.requests != requests || plan.align != align {
        return Err(PlanError::NotThisInput {
            requests: requests.len(),
            offsets: plan.offsets.len(),
        });
    }
    let mut spans = Vec::with_capacity(requests.len());
    for (index, r) in requests.iter().enumerate() {
        if r.first > r.last {
            return Err(PlanError::InvertedRange {
                index,
                first: r.first,
                last: r.last,
            });
        }
        let offset = plan.offsets[index];
        if offset & (align - 1) != 0 {
            return Err(PlanError::Misaligned {
                index,
                offset,
                align,
            });
        }
        // The bytes a shader may touch: whole 32-bit words, and at least one so that a zero-byte
        // buffer still has an address no live buffer shares. u128: no overflow to reason about.
        let footprint = u128::from(r.bytes.max(1)).div_ceil(4) * 4;
        let end = u128::from(offset) + footprint;
        if end > u128::from(plan.arena_bytes) {
            let end = u64::try_from(end).unwrap_or(u64::MAX);
            return Err(PlanError::OutOfArena {
                index,
                end,
                arena_bytes: plan.arena_bytes,
            });
        }
        spans.push((u128::from(offset), end));
    }
    for (a, ra) in requests.iter().enumerate() {
        for (b, rb) in requests.iter().enumerate().skip(a + 1) {
            let dispatch = ra.first.max(rb.first);
            let (start, end) = (spans[a].0.max(spans[b].0), spans[a].1.min(spans[b].1));
            if dispatch <= ra.last.min(rb.last) && start < end {
                // Both fit inside the u64 arena, so these conversions are exact.
                let (start, end) = (start as u64, end as u64);
                return Err(PlanError::Overlap {
                    a,
                    b,
                    dispatch,
                    start,
                    end,
                });
            }
        }
    }
    Ok(())
}
