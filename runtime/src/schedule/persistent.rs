//! Applying persistent regions: the step with each region's levels replaced by its one
//! dispatch. A pure rewrite of the schedule, so that every executor (eager, replay, profiles,
//! ping-pong state) runs the result as it runs any schedule.

use super::{Dispatch, Schedule};

impl Schedule {
    /// The step with every persistent region applied, each dispatched over at most `groups`
    /// workgroups (its widest level may need fewer). `groups` must not exceed what the device
    /// keeps resident at once: the grid barrier waits for every workgroup, and one that is
    /// never scheduled deadlocks the dispatch. Regions binding more than `max_bindings`
    /// buffers stay as levels. Without regions (or with `groups` 0), the schedule is returned
    /// as it is, regions dropped.
    pub fn with_persistent(mut self, groups: u32, max_bindings: u32) -> Schedule {
        let regions = std::mem::take(&mut self.persistent);
        if regions.is_empty() || groups == 0 {
            return self;
        }
        let dispatches = std::mem::take(&mut self.dispatches);
        let levels = std::mem::take(&mut self.levels);
        let mut regions = regions.into_iter().peekable();
        let mut level = 0u32;
        while (level as usize) < levels.len() {
            let start = self.dispatches.len() as u32;
            match regions.next_if(|r| r.levels.start == level) {
                Some(r) if r.dispatch.bindings.len() as u32 <= max_bindings => {
                    let mut d: Dispatch = r.dispatch;
                    d.workgroups = [d.workgroups[0].clamp(1, groups), 1, 1];
                    self.dispatches.push(d);
                    level = r.levels.end;
                }
                // Too many bindings for the device: its levels run as they are.
                Some(_) => continue,
                None => {
                    let range = levels[level as usize].clone();
                    self.dispatches
                        .extend_from_slice(&dispatches[range.start as usize..range.end as usize]);
                    level += 1;
                }
            }
            self.levels.push(start..self.dispatches.len() as u32);
        }
        self
    }

    /// Dependency levels per step once the regions are applied (pipeline barriers + 1).
    pub fn levels_with_persistent(&self) -> usize {
        self.levels.len()
            - self
                .persistent
                .iter()
                .map(|r| (r.levels.end - r.levels.start) as usize - 1)
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::super::{
        BufferDecl, BufferId, BufferRole, Io, KernelDecl, KernelId, ModelMeta, Persistent, Slice,
        TokenEncoding,
    };
    use super::*;

    fn slice(offset: u64) -> Slice {
        Slice {
            buffer: BufferId(0),
            offset,
            size: 4,
        }
    }

    fn dispatch(kernel: u32, bindings: usize, label: &str) -> Dispatch {
        Dispatch {
            kernel: KernelId(kernel),
            bindings: (0..bindings as u64).map(|i| slice(256 * i)).collect(),
            push_constants: vec![],
            workgroups: [64, 1, 1],
            label: label.into(),
            alternatives: vec![],
            ops: vec![],
        }
    }

    /// Five levels (d0 | d1 d2 | d3 | d4 | d5) and a region over levels 1..4.
    fn schedule(region_bindings: usize) -> Schedule {
        let kernel = |bindings| KernelDecl {
            label: "k".into(),
            spirv: vec![],
            bindings,
            push_constant_bytes: 0,
            spec_constants: vec![],
            subgroups: None,
        };
        Schedule {
            meta: ModelMeta::for_tests(),
            buffers: vec![BufferDecl {
                label: "io".into(),
                size: 4096,
                role: BufferRole::Io,
            }],
            weights: vec![],
            kernels: vec![kernel(2), kernel(region_bindings as u32)],
            dispatches: (0..6).map(|i| dispatch(0, 2, &format!("d{i}"))).collect(),
            levels: vec![0..1, 1..3, 3..4, 4..5, 5..6],
            io: Io {
                token: slice(0),
                token_encoding: TokenEncoding::Index,
                position: slice(0),
                logits: slice(0),
            },
            persistent: vec![Persistent {
                levels: 1..4,
                dispatch: Dispatch {
                    workgroups: [40, 1, 1],
                    ..dispatch(1, region_bindings, "region")
                },
            }],
        }
    }

    fn labels(s: &Schedule) -> Vec<Vec<&str>> {
        s.levels
            .iter()
            .map(|l| {
                s.dispatches[l.start as usize..l.end as usize]
                    .iter()
                    .map(|d| d.label.as_str())
                    .collect()
            })
            .collect()
    }

    #[test]
    fn a_region_replaces_its_levels_by_one_dispatch() {
        let s = schedule(9);
        s.validate().unwrap();
        assert_eq!(s.levels_with_persistent(), 3);
        let p = s.clone().with_persistent(132, 64);
        p.validate().unwrap();
        assert_eq!(labels(&p), [vec!["d0"], vec!["region"], vec!["d5"]]);
        // At most the widest level's workgroups, at most the device's.
        assert_eq!(p.dispatches[1].workgroups, [40, 1, 1]);
        assert_eq!(
            s.clone().with_persistent(8, 64).dispatches[1].workgroups,
            [8, 1, 1]
        );
        assert!(p.persistent.is_empty());
    }

    #[test]
    fn off_or_too_many_bindings_keeps_the_levels() {
        let s = schedule(9);
        for p in [
            s.clone().with_persistent(0, 64),
            s.clone().with_persistent(132, 8),
        ] {
            assert_eq!(p.dispatches, s.dispatches);
            assert_eq!(p.levels, s.levels);
            assert!(p.persistent.is_empty());
        }
    }

    #[test]
    fn validation_names_a_bad_region() {
        let mut s = schedule(9);
        s.persistent[0].levels = 4..5;
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("persistent region 0"), "{e}");
        let mut s = schedule(9);
        s.persistent[0].dispatch.bindings.pop();
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("persistent region 0 (region)"), "{e}");
    }
}
