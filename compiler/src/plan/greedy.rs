//! The planner: greedy by size, as in TFLite's arena planner ("greedy by size for offset
//! calculation"). Buffers are placed largest first; each goes into the lowest gap left between the
//! already placed buffers whose live ranges meet its own, or above them all when no gap fits.
//! Placing large buffers first leaves small ones to fill the holes, which keeps the arena close
//! to the peak of live bytes on decode-shaped liveness (short-lived temporaries).

use super::{Plan, PlanError, Request};

/// Places every request in one arena, sharing bytes between buffers that are never live together.
pub fn plan(requests: &[Request], align: u64) -> Result<Plan, PlanError> {
    let slots = slots(requests, align)?;
    // Largest first; among equals the longer-lived first (it constrains more neighbours), then the
    // earlier born and the lower index, so the order (and so the plan) is fully determined.
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by_key(|&i| {
        let r = &requests[i];
        (
            std::cmp::Reverse(slots[i]),
            std::cmp::Reverse(r.last - r.first),
            r.first,
            i,
        )
    });
    let mut offsets = vec![0u64; requests.len()];
    let mut placed: Vec<usize> = Vec::with_capacity(requests.len());
    for &i in &order {
        // The placed buffers this one must not touch, by address.
        let mut busy: Vec<(u64, u64)> = placed
            .iter()
            .filter(|&&j| live_together(&requests[i], &requests[j]))
            .map(|&j| (offsets[j], offsets[j] + slots[j]))
            .collect();
        busy.sort_unstable();
        // First fit: the lowest gap that holds the slot, else the top of the busy ones. Every gap
        // starts at 0 or at a slot's end, both multiples of `align`. (First fit measured better
        // than TFLite's smallest-gap best fit on random and decode-shaped liveness.)
        let mut cursor = 0u64;
        for &(start, end) in &busy {
            if start >= cursor + slots[i] {
                break;
            }
            cursor = cursor.max(end);
        }
        offsets[i] = cursor;
        placed.push(i);
    }
    // Each offset is at most the highest end placed before it, so every end is at most the sum of
    // the slots placed so far: the arena never exceeds the naive one, and never overflows.
    let arena_bytes = (0..requests.len())
        .map(|i| offsets[i] + slots[i])
        .max()
        .unwrap_or(0);
    Ok(finish(requests, align, &slots, offsets, arena_bytes))
}

/// The switch that turns planning off: every buffer gets its own slot, in request order.
pub fn plan_naive(requests: &[Request], align: u64) -> Result<Plan, PlanError> {
    let slots = slots(requests, align)?;
    let mut offsets = Vec::with_capacity(requests.len());
    let mut top = 0u64;
    for &slot in &slots {
        offsets.push(top);
        top += slot; // cannot overflow: `slots` checked that the sum fits
    }
    Ok(finish(requests, align, &slots, offsets, top))
}

/// The bytes each request reserves: its footprint (bytes rounded up to whole 32-bit words, at
/// least one word) rounded up to `align`. Validates the input and that the sum of all slots (the
/// naive arena, the largest any plan can need) fits in a u64.
fn slots(requests: &[Request], align: u64) -> Result<Vec<u64>, PlanError> {
    if !align.is_power_of_two() {
        return Err(PlanError::BadAlign { align });
    }
    let unit = align.max(4); // both powers of two, so a multiple of `unit` is a multiple of each
    let mut total = 0u64;
    let mut slots = Vec::with_capacity(requests.len());
    for (index, r) in requests.iter().enumerate() {
        if r.first > r.last {
            return Err(PlanError::InvertedRange {
                index,
                first: r.first,
                last: r.last,
            });
        }
        let slot = r
            .bytes
            .max(1)
            .checked_next_multiple_of(unit)
            .ok_or(PlanError::TooLarge)?;
        total = total.checked_add(slot).ok_or(PlanError::TooLarge)?;
        slots.push(slot);
    }
    Ok(slots)
}

fn live_together(a: &Request, b: &Request) -> bool {
    a.first <= b.last && b.first <= a.last
}

fn finish(
    requests: &[Request],
    align: u64,
    slots: &[u64],
    offsets: Vec<u64>,
    arena_bytes: u64,
) -> Plan {
    Plan {
        offsets,
        arena_bytes,
        lower_bound: peak_live(requests, slots),
        naive_bytes: slots.iter().sum(),
        align,
        requests: requests.to_vec(),
    }
}

/// The maximum over dispatches of the summed slots live there: a sweep over open/close events,
/// closes first at equal times because a buffer whose `last` is t-1 is dead at t.
fn peak_live(requests: &[Request], slots: &[u64]) -> u64 {
    let mut events: Vec<(u64, bool, u64)> = Vec::with_capacity(2 * requests.len());
    for (r, &slot) in requests.iter().zip(slots) {
        events.push((u64::from(r.first), true, slot));
        events.push((u64::from(r.last) + 1, false, slot));
    }
    events.sort_unstable(); // `false` (close) sorts before `true` (open)
    let (mut live, mut peak) = (0u64, 0u64);
    for (_, open, slot) in events {
        if open {
            live += slot;
            peak = peak.max(live);
        } else {
            live -= slot;
        }
    }
    peak
}
