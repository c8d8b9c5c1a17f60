//! Regions: dispatches grouped into dependency levels, so that a barrier is needed only
//! between levels, not after every dispatch.
//!
//! Two dispatches conflict when one writes bytes the other reads or writes (RAW, WAR, WAW on
//! overlapping ranges of the same buffer). Each dispatch goes to the earliest level after every
//! earlier dispatch it conflicts with (as soon as possible); dispatches of one level touch
//! disjoint data and may run concurrently. Dispatches are then ordered by level, keeping program
//! order inside a level, so the result is deterministic.

use std::fmt;
use vkfuse_runtime::schedule::Slice;

/// What a dispatch touches.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Access {
    pub reads: Vec<Slice>,
    pub writes: Vec<Slice>,
}

impl Access {
    /// Whether running `self` and `later` without a barrier between them could race.
    pub fn conflicts(&self, later: &Access) -> bool {
        let hits = |xs: &[Slice], ys: &[Slice]| xs.iter().any(|x| ys.iter().any(|y| x.overlaps(y)));
        hits(&self.writes, &later.reads)
            || hits(&self.writes, &later.writes)
            || hits(&self.reads, &later.writes)
    }
}

/// The dispatches in execution order, split into levels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Regions {
    /// `order[k]` is the program index of the k-th dispatch to run.
    pub order: Vec<usize>,
    /// Ranges of `order` that share a level.
    pub levels: Vec<std::ops::Range<u32>>,
    /// The level of each dispatch, by program index.
    pub level_of: Vec<u32>,
}

/// Levels for `accesses` in program order.
pub fn regions(accesses: &[Access]) -> Regions {
    let mut level_of = vec![0u32; accesses.len()];
    for j in 0..accesses.len() {
        level_of[j] = (0..j)
            .filter(|&i| accesses[i].conflicts(&accesses[j]))
            .map(|i| level_of[i] + 1)
            .max()
            .unwrap_or(0);
    }
    let mut order: Vec<usize> = (0..accesses.len()).collect();
    order.sort_by_key(|&i| (level_of[i], i));
    let mut levels = vec![];
    let mut start = 0u32;
    for k in 1..=order.len() {
        if k == order.len() || level_of[order[k]] != level_of[order[k - 1]] {
            levels.push(start..k as u32);
            start = k as u32;
        }
    }
    Regions {
        order,
        levels,
        level_of,
    }
}

/// One barrier per level: each dispatch in its own level.
pub fn serial(n: usize) -> Regions {
    Regions {
        order: (0..n).collect(),
        levels: (0..n as u32).map(|i| i..i + 1).collect(),
        level_of: (0..n as u32).collect(),
    }
}

impl fmt::Display for Regions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} dispatches in {} levels ({} barriers)",
            self.order.len(),
            self.levels.len(),
            self.levels.len().saturating_sub(1)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use vkfuse_runtime::schedule::BufferId;

    fn s(buffer: u32, offset: u64, size: u64) -> Slice {
        Slice {
            buffer: BufferId(buffer),
            offset,
            size,
        }
    }

    #[test]
    fn independent_matvecs_share_a_level_and_their_consumer_waits() {
        // q, k, v read x and write disjoint outputs; attention reads all three.
        let x = s(0, 0, 64);
        let (q, k, v) = (s(0, 256, 64), s(0, 512, 64), s(0, 768, 64));
        let acc = |r: Vec<Slice>, w: Slice| Access {
            reads: r,
            writes: vec![w],
        };
        let r = regions(&[
            acc(vec![x], q),
            acc(vec![x], k),
            acc(vec![x], v),
            acc(vec![q, k, v], s(0, 1024, 64)),
        ]);
        assert_eq!(r.levels, vec![0..3, 3..4]);
    }

    #[test]
    fn a_write_after_read_needs_a_barrier() {
        let a = s(1, 0, 16);
        let r = regions(&[
            Access {
                reads: vec![a],
                writes: vec![s(1, 32, 16)],
            },
            Access {
                reads: vec![],
                writes: vec![a],
            },
        ]);
        assert_eq!(r.level_of, vec![0, 1]);
    }

    fn arb_access() -> impl Strategy<Value = Access> {
        let slice = (0u32..2, 0u64..8, 1u64..3).prop_map(|(b, o, n)| s(b, o * 16, n * 16));
        (
            prop::collection::vec(slice.clone(), 0..3),
            prop::collection::vec(slice, 0..2),
        )
            .prop_map(|(reads, writes)| Access { reads, writes })
    }

    proptest! {
        #[test]
        fn every_conflicting_pair_is_separated_by_a_barrier(accs in prop::collection::vec(arb_access(), 0..40)) {
            let r = regions(&accs);
            let mut pos = vec![0; accs.len()];
            for (k, &i) in r.order.iter().enumerate() { pos[i] = k; }
            let level_at = |k: usize| r.levels.iter().position(|l| l.contains(&(k as u32))).unwrap();
            for j in 0..accs.len() {
                for i in 0..j {
                    if accs[i].conflicts(&accs[j]) {
                        // i runs in an earlier level than j, so a barrier lies between them.
                        prop_assert!(level_at(pos[i]) < level_at(pos[j]));
                    }
                }
            }
            // Levels cover the dispatches in order.
            let covered: u32 = r.levels.iter().map(|l| l.end - l.start).sum();
            prop_assert_eq!(covered as usize, accs.len());
        }
    }
}
