//! State write-back between launches. A schedule writes a recurrent state back with a `copy`
//! dispatch (`write_state`): the new value is computed into the arena, then copied into the
//! state buffer, which the next step reads. Two strategies:
//!
//! - [`WriteBack::Copy`]: run the schedule as compiled (the copy is part of the step).
//! - [`WriteBack::PingPong`]: each copied state gets a second buffer; two recordings alternate.
//!   Even steps read state A and have the value's producer write straight into state B (the
//!   copy is dropped), odd steps read B and write A.
//!
//! [`plan`] finds the copies that can be dropped from the schedule alone. The kernel ABI says
//! binding 0 of an unfused kernel is its result (operands follow); a fused kernel's outputs are
//! not marked, so a value that a fused kernel touches keeps its copy. Everything not provably
//! safe keeps its copy: the plan is an optimisation, never a change of results.

use crate::schedule::{BufferId, BufferRole, Schedule, Slice};

/// How state written by a step reaches the next step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum WriteBack {
    /// The schedule's own copy dispatches, one recording.
    Copy,
    /// Two recordings that swap the state buffers; the copies are dropped.
    #[default]
    PingPong,
}

impl WriteBack {
    /// The name used by `vkfuse bench` and `--write-back`.
    pub fn name(self) -> &'static str {
        match self {
            WriteBack::Copy => "copy",
            WriteBack::PingPong => "ping-pong",
        }
    }
}

/// One state written back by a copy that ping-pong drops.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PingPongState {
    /// The copy dispatch (dropped from both recordings).
    pub copy: usize,
    /// The state slice the schedule reads (A).
    pub state: Slice,
    /// The same bytes in the second buffer (B): offset into [`PingPongPlan::alternate_bytes`].
    pub alternate_offset: u64,
    /// The arena slice the copy read: the producer's result.
    pub value: Slice,
    /// (dispatch, binding) pairs that bind `value` (the producer's result and its readers).
    pub value_bindings: Vec<(usize, usize)>,
    /// (dispatch, binding) pairs that bind `state` (its readers in the step).
    pub state_bindings: Vec<(usize, usize)>,
}

/// What ping-pong changes in a schedule.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PingPongPlan {
    /// The states handled, in dispatch order of their copies.
    pub states: Vec<PingPongState>,
    /// Bytes of the second state buffer.
    pub alternate_bytes: u64,
    /// Copies kept (not provably safe to drop), with the reason, for reports.
    pub kept: Vec<(usize, &'static str)>,
}

fn is_copy(s: &Schedule, d: usize) -> bool {
    let k = &s.kernels[s.dispatches[d].kernel.index()];
    k.label.starts_with("copy[") && k.bindings == 2
}

fn is_fused(s: &Schedule, d: usize) -> bool {
    s.kernels[s.dispatches[d].kernel.index()]
        .label
        .starts_with("fused_")
}

/// Finds the write-back copies ping-pong can drop; `align` is the storage-buffer offset
/// alignment the second buffer's slices need.
pub fn plan(s: &Schedule, align: u64) -> PingPongPlan {
    let level_of = s.dispatch_levels();
    let role = |b: BufferId| s.buffers[b.index()].role;
    let mut out = PingPongPlan::default();
    for c in 0..s.dispatches.len() {
        let d = &s.dispatches[c];
        if !is_copy(s, c) {
            continue;
        }
        let (state, value) = (d.bindings[0], d.bindings[1]);
        if role(state.buffer) != BufferRole::State || role(value.buffer) != BufferRole::Arena {
            continue;
        }
        match check(s, &level_of, c, state, value) {
            Ok((value_bindings, state_bindings)) => {
                let alternate_offset = out.alternate_bytes.div_ceil(align) * align;
                out.alternate_bytes = alternate_offset + state.size;
                out.states.push(PingPongState {
                    copy: c,
                    state,
                    alternate_offset,
                    value,
                    value_bindings,
                    state_bindings,
                });
            }
            Err(why) => out.kept.push((c, why)),
        }
    }
    out
}

type Bindings = Vec<(usize, usize)>;

/// Checks that copy `c` (value -> state) can be dropped: returns the bindings of the value
/// (producer and readers) and of the state.
fn check(
    s: &Schedule,
    level_of: &[usize],
    c: usize,
    state: Slice,
    value: Slice,
) -> Result<(Bindings, Bindings), &'static str> {
    if state.size != value.size {
        return Err("the copy's source and destination differ in size");
    }
    let copy_level = level_of[c];
    let touching = |d: usize, x: &Slice| -> Vec<(usize, bool)> {
        s.dispatches[d]
            .bindings
            .iter()
            .enumerate()
            .filter(|(_, b)| b.overlaps(x))
            .map(|(i, b)| (i, b == x))
            .collect()
    };
    // The producer: the last dispatch before the copy's level that touches the value's bytes
    // (the arena is planned by level, so it is the value's writer if it writes binding 0).
    let producer = (0..c)
        .rev()
        .filter(|&d| level_of[d] < copy_level)
        .find(|&d| !touching(d, &value).is_empty())
        .ok_or("no producer of the copied value")?;
    if is_fused(s, producer) || touching(producer, &value) != [(0, true)] {
        return Err("the value's producer is not an unfused kernel writing it at binding 0");
    }
    let mut value_bindings = vec![(producer, 0)];
    // Readers: dispatches after the producer up to the next writer of those bytes. Any
    // dispatch that binds the bytes other than exactly, or as a fused kernel, stops the plan.
    for (d, &level) in level_of.iter().enumerate().skip(producer + 1) {
        if d == c {
            continue;
        }
        let t = touching(d, &value);
        if t.is_empty() {
            continue;
        }
        if level > copy_level && !is_fused(s, d) && t.iter().all(|&(i, _)| i == 0) {
            break; // the next value in (part of) those bytes: written, not read
        }
        if is_fused(s, d) || t.iter().any(|&(i, exact)| i == 0 || !exact) {
            return Err("the copied value's bytes are used ambiguously");
        }
        value_bindings.extend(t.iter().map(|&(i, _)| (d, i)));
    }
    // The state: every binding of its bytes must be exact and read-only (binding > 0 of an
    // unfused kernel), so swapping the buffer swaps every access.
    let mut state_bindings = vec![];
    for (d, &level) in level_of.iter().enumerate() {
        if d == c {
            continue;
        }
        for (i, exact) in touching(d, &state) {
            if !exact || i == 0 || is_fused(s, d) {
                return Err("the state is accessed other than read whole by unfused kernels");
            }
            if level >= copy_level {
                return Err("the state is read after its copy");
            }
            state_bindings.push((d, i));
        }
    }
    Ok((value_bindings, state_bindings))
}

/// The bindings of dispatch `d` in the recording of `parity` (0 reads A and writes B, 1 the
/// reverse), or `None` for a dropped copy. `alternate` is the second buffer's id.
pub fn bindings_for(
    s: &Schedule,
    p: &PingPongPlan,
    alternate: BufferId,
    parity: usize,
    d: usize,
) -> Option<Vec<Slice>> {
    let mut b = s.dispatches[d].bindings.clone();
    for st in &p.states {
        if st.copy == d {
            return None;
        }
        let a = st.state;
        let alt = Slice {
            buffer: alternate,
            offset: st.alternate_offset,
            size: a.size,
        };
        let (read, write) = if parity == 0 { (a, alt) } else { (alt, a) };
        for &(dd, i) in &st.state_bindings {
            if dd == d {
                b[i] = read;
            }
        }
        for &(dd, i) in &st.value_bindings {
            if dd == d {
                b[i] = write;
            }
        }
    }
    Some(b)
}
