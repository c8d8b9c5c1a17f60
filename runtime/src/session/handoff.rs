//! Replay's handoff plan: which dependency levels are recorded with no pipeline barrier before
//! them because the level before hands its output over through flagged words
//! (`kernels/glsl/handoff.glsl`), and each dispatch's handoff push constants.
//!
//! Level i (never level 0 or 1: level 0 runs beside the previous step's fill of the words) is
//! handed when:
//! - exactly one of its dispatches, the consumer, has a role whose read bindings overlap what
//!   the levels since the last barrier write, and all of them lie inside binding 0 of one
//!   publishing dispatch of level i - 1, the producer (so the consumer reads all of them as
//!   words);
//! - nothing else of level i touches what those levels write, and nothing level i writes is
//!   touched by them (bindings read as words excepted). The levels since the last barrier, not
//!   only the one before, because with no barrier between them they all may still run.
//!
//! A dispatch whose module declares itself unordered ([`UNORDERED_SPEC_ID`]: an L2 prefetch,
//! which discards what it reads and writes only a sink nothing reads) counts in neither: a
//! prefetch of the K/V caches an attention block writes, a level or two before it, leaves the
//! block's level handed over.
//!
//! The plan is computed once per schedule from what each dispatch's module declares (its role)
//! and may write (its SPIR-V); replay uses it where the device runs handoffs.

use crate::schedule::{Schedule, Slice};
use crate::{HandoffPush, HandoffRole};

/// The specialization constant whose default, where not 0, declares a kernel unordered: its
/// accesses need no order against any other dispatch's (kernels/glsl/prefetch.comp). Honoured
/// only for a kernel without a handoff role that may write its binding 0 alone (the sink).
pub const UNORDERED_SPEC_ID: u32 = 191;

/// What replay needs to know of one dispatch's kernel.
#[derive(Clone, Debug, Default)]
pub struct Access {
    /// Its handoff role, if its module declares one.
    pub role: Option<HandoffRole>,
    /// The set-0 bindings it may write (bit b: binding b).
    pub written: u64,
    /// Whether its module declares it unordered ([`UNORDERED_SPEC_ID`]) and may write its
    /// binding 0 alone, with no handoff role.
    pub unordered: bool,
}

/// Which levels are handed over and the push constants that do it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HandoffPlan {
    /// Per level: recorded with no barrier before it.
    pub handed: Vec<bool>,
    /// Per dispatch: its handoff push constants ([`HandoffPush::NONE`] where it takes no part).
    pub push: Vec<HandoffPush>,
    /// Words the producers' regions take (each rounded up to 64 words).
    pub words: u32,
}

impl HandoffPlan {
    /// Levels handed over.
    pub fn handed_levels(&self) -> usize {
        self.handed.iter().filter(|&&h| h).count()
    }
}

/// What each dispatch's kernel declares and may write, read from its SPIR-V (what the runtime's
/// pipelines read at creation; `vkfuse inspect` needs no device for it).
pub fn accesses(schedule: &Schedule) -> Vec<Access> {
    let per_kernel: Vec<Access> = schedule
        .kernels
        .iter()
        .map(|k| {
            let (role, written) = (k.handoff_role(), k.written_bindings());
            // Honoured only where it can hold: a kernel that writes past its sink (binding 0)
            // or takes part in handoffs orders something.
            let unordered = k.unordered() && written & !1 == 0 && role.is_none();
            Access {
                role,
                written,
                unordered,
            }
        })
        .collect();
    schedule
        .dispatches
        .iter()
        .map(|d| {
            per_kernel
                .get(d.kernel.index())
                .cloned()
                .unwrap_or_default()
        })
        .collect()
}

fn written(access: &Access, j: usize) -> bool {
    j < 64 && access.written & (1 << j) != 0
}

/// The plan for `schedule` whose dispatch k's kernel is described by `access[k]`. A schedule
/// that does not validate (`vkfuse inspect` dumps those too) gets no handoff at all.
pub fn plan(schedule: &Schedule, access: &[Access]) -> HandoffPlan {
    let s = schedule;
    let n = s.dispatches.len();
    let valid = access.len() == n
        && s.levels
            .iter()
            .all(|l| l.start <= l.end && l.end as usize <= n);
    if !valid {
        return HandoffPlan {
            handed: vec![false; s.levels.len()],
            push: vec![HandoffPush::NONE; n],
            words: 0,
        };
    }
    let mut out = HandoffPlan {
        handed: vec![false; s.levels.len()],
        push: vec![HandoffPush::NONE; s.dispatches.len()],
        words: 0,
    };
    // What the levels since the last barrier access in place, and write.
    let mut touched: Vec<Slice> = Vec::new();
    let mut wrote: Vec<Slice> = Vec::new();
    for (i, level) in s.levels.iter().enumerate() {
        let ids: Vec<usize> = level.clone().map(|k| k as usize).collect();
        let handed = i >= 2 && try_hand(s, access, &mut out, i, &ids, &touched, &wrote);
        if !handed {
            touched.clear();
            wrote.clear();
        }
        for &k in ids.iter().filter(|&&k| !access[k].unordered) {
            let d = &s.dispatches[k];
            let a = &access[k];
            let words_read = out.push[k].in_at[0] != HandoffPush::NONE_AT;
            for (j, sl) in d.bindings.iter().enumerate() {
                let by_words = words_read
                    && a.role
                        .as_ref()
                        .is_some_and(|r| r.reads.contains(&(j as u32)));
                if !by_words {
                    touched.push(*sl);
                }
                if written(a, j) {
                    wrote.push(*sl);
                }
            }
        }
    }
    out
}

/// Hands level `i` (dispatches `ids`) over from level i - 1 if the rules above allow, filling
/// in `out`'s push constants and regions.
fn try_hand(
    s: &Schedule,
    access: &[Access],
    out: &mut HandoffPlan,
    i: usize,
    ids: &[usize],
    touched: &[Slice],
    wrote: &[Slice],
) -> bool {
    let hits = |sl: &Slice, set: &[Slice]| set.iter().any(|x| x.overlaps(sl));
    // The consumer: the one dispatch whose role's reads meet what was written.
    let consumers: Vec<usize> = ids
        .iter()
        .copied()
        .filter(|&k| {
            access[k].role.as_ref().is_some_and(|r| {
                r.reads.iter().any(|&j| {
                    s.dispatches[k]
                        .bindings
                        .get(j as usize)
                        .is_some_and(|sl| hits(sl, wrote))
                })
            })
        })
        .collect();
    let [c] = consumers[..] else {
        return false;
    };
    let role = access[c].role.as_ref().expect("filtered");
    let cd = &s.dispatches[c];
    // The producer: a publishing dispatch of level i - 1 whose binding 0 holds every read.
    let prev = s.levels[i - 1].clone().map(|k| k as usize);
    let reads: Option<Vec<Slice>> = role
        .reads
        .iter()
        .map(|&j| cd.bindings.get(j as usize).copied())
        .collect();
    let Some(reads) = reads else {
        return false;
    };
    let inside = |y: &Slice, sl: &Slice| {
        sl.buffer == y.buffer
            && sl.offset >= y.offset
            && sl.offset + sl.size <= y.offset + y.size
            && (sl.offset - y.offset) % 4 == 0
    };
    let producers: Vec<usize> = prev
        .filter(|&p| {
            access[p].role.as_ref().is_some_and(|r| r.publishes)
                && s.dispatches[p]
                    .bindings
                    .first()
                    .is_some_and(|y| reads.iter().all(|sl| inside(y, sl)))
        })
        .collect();
    let [p] = producers[..] else {
        return false;
    };
    // Hazards: nothing of this level but the consumer's reads meets the levels since the
    // barrier.
    for &k in ids.iter().filter(|&&k| !access[k].unordered) {
        let d = &s.dispatches[k];
        for (j, sl) in d.bindings.iter().enumerate() {
            if k == c && role.reads.contains(&(j as u32)) {
                continue;
            }
            let clash = if written(&access[k], j) {
                hits(sl, touched) || hits(sl, wrote)
            } else {
                hits(sl, wrote)
            };
            if clash {
                return false;
            }
        }
    }
    // The producer's region (shared by every consumer it has, though it has one level after).
    let y = s.dispatches[p].bindings[0];
    if out.push[p].out_at == HandoffPush::NONE_AT {
        let Ok(size) = u32::try_from(y.size / 4) else {
            return false;
        };
        out.push[p].out_at = out.words;
        out.words = out.words.saturating_add(size.div_ceil(64) * 64);
    }
    let at = out.push[p].out_at;
    for (slot, sl) in reads.iter().enumerate() {
        out.push[c].in_at[slot] = at + ((sl.offset - y.offset) / 4) as u32;
    }
    out.handed[i] = true;
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{
        BufferDecl, BufferId, BufferRole, Dispatch, Io, KernelId, ModelMeta, TokenEncoding,
    };

    fn sl(offset: u64, size: u64) -> Slice {
        Slice {
            buffer: BufferId(0),
            offset,
            size,
        }
    }

    /// A schedule of one dispatch per level with these bindings (kernels are not read).
    fn schedule(levels: Vec<Vec<Slice>>) -> Schedule {
        let n = levels.len() as u32;
        Schedule {
            meta: ModelMeta::for_tests(),
            buffers: vec![BufferDecl {
                label: "arena".into(),
                size: 16384,
                role: BufferRole::Arena,
            }],
            weights: vec![],
            kernels: vec![],
            dispatches: levels
                .into_iter()
                .enumerate()
                .map(|(i, bindings)| Dispatch {
                    kernel: KernelId(0),
                    bindings,
                    push_constants: vec![],
                    workgroups: [1, 1, 1],
                    label: format!("d{i}"),
                    alternatives: vec![],
                    ops: vec![],
                })
                .collect(),
            levels: (0..n).map(|i| i..i + 1).collect(),
            io: Io {
                token: sl(0, 4),
                token_encoding: TokenEncoding::Index,
                position: sl(0, 4),
                logits: sl(0, 4),
            },
            persistent: vec![],
        }
    }

    fn matvec() -> Access {
        Access {
            role: Some(HandoffRole::from_bits((1 << 2) | (1 << 31))),
            written: 1,
            unordered: false,
        }
    }

    fn attention() -> Access {
        Access {
            role: Some(HandoffRole::from_bits(0b1110 | (1 << 31))),
            written: 1 | (1 << 4),
            unordered: false,
        }
    }

    fn plain() -> Access {
        Access {
            role: None,
            written: 1,
            unordered: false,
        }
    }

    /// `plain()` declared unordered (prefetch.comp).
    fn prefetch() -> Access {
        Access {
            unordered: true,
            ..plain()
        }
    }

    /// Level 0: embedding into 0..64; 1: a q/k/v matvec reads it and writes 256..448; 2: the
    /// attention block reads q, k and v inside that, writes 512..576 and a cache at 4096;
    /// 3: o_proj reads 512..576 and writes `o_proj`.
    fn layer(o_proj: Slice) -> Schedule {
        schedule(vec![
            vec![sl(0, 64)],
            vec![sl(256, 192), sl(8192, 64), sl(0, 64)],
            vec![
                sl(512, 64),
                sl(256, 64),
                sl(320, 64),
                sl(384, 64),
                sl(4096, 64),
            ],
            vec![o_proj, sl(8192, 64), sl(512, 64)],
        ])
    }

    #[test]
    fn a_matvec_hands_q_k_v_to_attention_then_attention_to_a_matvec() {
        let access = [plain(), matvec(), attention(), matvec()];
        let p = plan(&layer(sl(640, 64)), &access);
        assert_eq!(p.handed, vec![false, false, true, true]);
        assert_eq!(p.push[1].out_at, 0);
        assert_eq!(p.push[2].in_at, [0, 16, 32]);
        // The attention's region follows the matvec's 48 words, rounded up to 64.
        assert_eq!(p.push[2].out_at, 64);
        assert_eq!(p.push[3].in_at[0], 64);
        assert_eq!(p.push[3].out_at, HandoffPush::NONE_AT);
        assert_eq!(p.words, 128);
    }

    #[test]
    fn a_write_over_what_a_running_level_touches_keeps_the_barrier() {
        let access = [plain(), matvec(), attention(), matvec()];
        // o_proj writing over q (256..320): the attention reads q as words, but the q/k/v
        // matvec, with no barrier after it either, may still be writing there.
        assert_eq!(
            plan(&layer(sl(256, 64)), &access).handed,
            vec![false, false, true, false]
        );
        // o_proj writing over the attention's cache, which the attention writes.
        assert_eq!(
            plan(&layer(sl(4096, 64)), &access).handed,
            vec![false, false, true, false]
        );
    }

    #[test]
    fn an_invalid_schedule_gets_no_handoff() {
        let mut s = layer(sl(640, 64));
        s.levels.push(4..6);
        let access = [plain(), matvec(), attention(), matvec()];
        let p = plan(&s, &access);
        assert_eq!(p.handed_levels(), 0);
        assert_eq!(p.push.len(), 4);
        assert_eq!(plan(&layer(sl(640, 64)), &access[..3]).handed_levels(), 0);
    }

    #[test]
    fn reads_outside_the_producer_or_a_plain_producer_keep_the_barrier() {
        // The consumer reads 0..64, which level 1 wrote but not as its binding 0.
        let s = schedule(vec![
            vec![sl(1024, 64)],
            vec![sl(256, 64), sl(8192, 64), sl(1024, 64)],
            vec![sl(512, 64), sl(8192, 64), sl(256, 32)],
        ]);
        assert_eq!(
            plan(&s, &[plain(), plain(), matvec()]).handed,
            vec![false; 3]
        );
        assert_eq!(
            plan(&s, &[plain(), matvec(), matvec()]).handed,
            vec![false, false, true]
        );
        // Level 1 is never handed (level 0 runs beside the fill).
        let s = schedule(vec![
            vec![sl(256, 64), sl(8192, 64), sl(1024, 64)],
            vec![sl(512, 64), sl(8192, 64), sl(256, 64)],
        ]);
        assert_eq!(plan(&s, &[matvec(), matvec()]).handed, vec![false, false]);
    }

    /// `layer` with one more dispatch in `level`, after its dispatch: a sink at 12288 and the
    /// attention's cache at 4096 read.
    fn layer_with_cache_reader(level: usize) -> Schedule {
        let mut s = layer(sl(640, 64));
        let mut reader = s.dispatches[0].clone();
        reader.bindings = vec![sl(12288, 4), sl(4096, 64)];
        s.dispatches.insert(level + 1, reader);
        s.levels = (0..4)
            .map(|i| {
                let (a, b) = (i as u32, u32::from(i >= level));
                let start = a + u32::from(i > level);
                start..a + 1 + b
            })
            .collect();
        s
    }

    #[test]
    fn an_unordered_reader_of_what_a_level_writes_keeps_it_handed() {
        // A K/V prefetch beside q/k/v reads the cache the attention level writes: declared
        // unordered it counts in no hazard; a plain kernel reading it keeps the barrier.
        let s = layer_with_cache_reader(1);
        assert_eq!(s.levels, vec![0..1, 1..3, 3..4, 4..5]);
        let access = [plain(), matvec(), prefetch(), attention(), matvec()];
        assert_eq!(plan(&s, &access).handed, vec![false, false, true, true]);
        let access = [plain(), matvec(), plain(), attention(), matvec()];
        assert_eq!(plan(&s, &access).handed, vec![false, false, false, true]);
        // The same in the consumer's own level.
        let s = layer_with_cache_reader(2);
        assert_eq!(s.levels, vec![0..1, 1..2, 2..4, 4..5]);
        let access = [plain(), matvec(), attention(), prefetch(), matvec()];
        assert_eq!(plan(&s, &access).handed, vec![false, false, true, true]);
    }
}
