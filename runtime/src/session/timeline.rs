//! The timeline probe (`compile-model --timeline`, `kernels/glsl/timeline.glsl`): each
//! workgroup of a wrapped kernel records when it began and when its invocation 0 was done, on
//! the device's realtime clock, into a buffer the runtime passes by address. Read back and laid
//! against the dispatches replay recorded, the records say what ran when inside a step, handoffs
//! included, where timestamps between levels see only whole levels behind barriers.
//!
//! The probe's pipelines: a kernel's dispatches share one pipeline, and so one set of
//! counters, wherever a barrier separates each from the next (every layer's copy of a layer
//! kernel: one pipeline's code for all of them, as without the probe); dispatches of one kernel
//! that may run at once (in one level, as level 0's zeroing kernels are, or across handed
//! levels) get pipelines of their own. So a counter's records, taken in the order its
//! workgroups launch, belong to its dispatches in recording order. (A pipeline per dispatch
//! cost the H100's q4_0 step 30% where shared ones cost 9%: each dispatch's code was fetched
//! anew.)
//!
//! The buffer: per probe pipeline, one counter per workgroup of its largest grid, then per
//! counter `depth` records (its dispatches per step times [`TIMELINE_STEPS`]) of eight words
//! (begin and two marks, each the clock's low and high halves, a mark being a point of
//! invocation 0's way that the kernel names, `TIMELINE_MARK` in `common.glsl`, 0 where none;
//! the end's low half, its high half taken from the begin; the SM where the kernel records it).
//! The records of [`TIMELINE_STEPS`] steps after [`Timeline::clear`] are kept and later ones
//! counted as dropped.

use super::SessionError;
use crate::schedule::{KernelId, Schedule};
use crate::{Buffer, BufferKind, Device, Error, SpecConstants, Stages};

/// The specialization constant of the buffer's address (low half); the next five follow it
/// (`timeline.glsl`). A kernel declaring it is wrapped for the timeline.
pub const TIMELINE_SPEC_ID: u32 = 900;

/// Words of one record.
const RECORD_WORDS: u32 = 8;

/// Steps after [`Timeline::clear`] whose records are kept.
pub const TIMELINE_STEPS: u32 = 32;

/// Where one probe pipeline keeps its counters and records.
#[derive(Clone, Copy, Debug)]
struct Slots {
    /// Its kernel.
    kernel: KernelId,
    /// Its first counter (one per workgroup of its largest grid).
    slot: u32,
    /// Its first record.
    record: u32,
    /// Records per counter.
    depth: u32,
    /// Counters.
    groups: u32,
    /// Whether its kernel records its SM (`Kernel::records_sms`): decided by the kernel, not by
    /// the word, which a schedule compiled before the SMs were recorded fills with the end's
    /// high half.
    sms: bool,
}

/// The records' buffer, the probe's pipelines and which one each dispatch runs.
pub struct Timeline {
    buffer: Buffer,
    address: u64,
    /// The probe's pipelines (see the top).
    pipelines: Vec<Slots>,
    /// By dispatch, then grid (0: its own, 1 + i: alternative i): its probe pipeline.
    assign: Vec<Vec<usize>>,
    /// Words before the first record: the counters, padded to 16 bytes.
    records_at: u32,
}

/// When one workgroup ran, in ns on the device's realtime clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Workgroup {
    /// Its first instruction.
    pub begin: u64,
    /// Where its kernel marks them: when its input had arrived, and when its own work was
    /// done (0: the kernel marks none).
    pub marks: [u64; 2],
    /// Its invocation 0's last instruction.
    pub end: u64,
    /// The SM it ran on, where the kernel records it (`compile-model --timeline-sm`).
    pub sm: Option<u32>,
}

/// One dispatch as it ran: its workgroups, by index.
#[derive(Clone, Debug, PartialEq)]
pub struct DispatchRun {
    /// The step (0: the first after [`Timeline::clear`]).
    pub step: usize,
    /// Its index in the schedule's dispatches.
    pub dispatch: usize,
    /// The pipeline it ran (an alternative's where a band chose one).
    pub kernel: KernelId,
    /// Each workgroup's times.
    pub groups: Vec<Workgroup>,
}

impl DispatchRun {
    /// Its first workgroup's begin.
    pub fn first_begin(&self) -> u64 {
        self.groups.iter().map(|g| g.begin).min().unwrap_or(0)
    }

    /// Its last workgroup's begin.
    pub fn last_begin(&self) -> u64 {
        self.groups.iter().map(|g| g.begin).max().unwrap_or(0)
    }

    /// Its first workgroup's end.
    pub fn first_end(&self) -> u64 {
        self.groups.iter().map(|g| g.end).min().unwrap_or(0)
    }

    /// Its last workgroup's end.
    pub fn last_end(&self) -> u64 {
        self.groups.iter().map(|g| g.end).max().unwrap_or(0)
    }
}

/// A dispatch as replay records it for one step: the schedule's index, the grid (0: its own,
/// 1 + i: alternative i), the kernel the grid runs and its workgroups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepDispatch {
    /// Its index in the schedule's dispatches.
    pub dispatch: usize,
    /// Which of its grids ran ([`crate::schedule::Dispatch::grid_index_at`]).
    pub grid: usize,
    /// The kernel of that grid.
    pub kernel: KernelId,
    /// The grid's workgroups.
    pub groups: u32,
}

/// Whether `schedule`'s kernels record a timeline; an error where they do and `device` cannot
/// run them (a pipeline of them is invalid without the device clock and buffer addresses).
pub fn check_device(device: &Device, schedule: &Schedule) -> Result<bool, Error> {
    let Some(wrapped) = schedule.kernels.iter().find(|k| k.records_timeline()) else {
        return Ok(false);
    };
    let f = device.enabled_features();
    if !(f.shader_device_clock && f.buffer_device_address) {
        return Err(Error::UnsupportedDevice {
            device: device.info().name.clone(),
            reason: format!(
                "kernel `{}` records a timeline (compile-model --timeline), which needs the \
                 device clock (VK_KHR_shader_clock's shaderDeviceClock) and buffer device \
                 addresses (bufferDeviceAddress)",
                wrapped.label
            ),
        });
    }
    if !f.shader_sm_builtins {
        if let Some(k) = schedule.kernels.iter().find(|k| k.records_sms()) {
            return Err(Error::UnsupportedDevice {
                device: device.info().name.clone(),
                reason: format!(
                    "kernel `{}` records the SM each workgroup ran on (compile-model \
                     --timeline-sm), which needs NVIDIA's VK_NV_shader_sm_builtins (compile \
                     without --timeline-sm)",
                    k.label
                ),
            });
        }
    }
    Ok(true)
}

/// Readings that wrapped at 2^32 moved back into one frame. Lavapipe's realtime clock keeps
/// only 32 bits of nanoseconds (it wraps every 4.3 s), and a clock read as two 32-bit halves
/// can tear where its low half wraps between the reads: either way a reading is off by 2^32.
/// A timed run lasts far less than 2^31 ns, so each reading is taken within 2^31 of the
/// median begin, 2^32 added to all where one would fall below zero.
fn unwrap_clock(runs: &mut [DispatchRun]) {
    const HALF: i64 = 1 << 31;
    let mut begins: Vec<u64> = runs
        .iter()
        .flat_map(|r| r.groups.iter().map(|g| g.begin))
        .collect();
    if begins.is_empty() {
        return;
    }
    let mid = begins.len() / 2;
    let reference = *begins.select_nth_unstable(mid).1 as i64;
    let offset = |v: u64| {
        let d = v as i64 - reference;
        d - (d + HALF).div_euclid(2 * HALF) * (2 * HALF)
    };
    let readings = || runs.iter().flat_map(|r| r.groups.iter());
    let lowest = readings()
        .flat_map(|g| [g.begin, g.marks[0], g.marks[1], g.end])
        .filter(|&v| v != 0)
        .map(offset)
        .min()
        .unwrap_or(0);
    let base = if reference + lowest < 1 {
        reference + 2 * HALF
    } else {
        reference
    };
    let fix = |v: &mut u64| {
        // 0 is an unmarked point.
        if *v != 0 {
            *v = (base + offset(*v)) as u64;
        }
    };
    for g in runs.iter_mut().flat_map(|r| r.groups.iter_mut()) {
        fix(&mut g.begin);
        g.marks.iter_mut().for_each(fix);
        fix(&mut g.end);
    }
}

/// A probe pipeline as [`share_pipelines`] makes it: its kernel, its dispatches per step and
/// its largest grid.
type Shared = (KernelId, u32, u32);

/// The probe's pipelines for dispatches given as (level, grids: (kernel, workgroups)), in
/// recording order, with a barrier before every level but those `handed`: a dispatch's grid
/// shares the pipeline of an earlier one of its kernel where a barrier separates it from that
/// pipeline's last dispatch, else takes a new one. Returns each pipeline's (kernel, dispatches
/// per step, largest grid) and, by dispatch then grid, its pipeline.
fn share_pipelines(
    dispatches: &[(usize, Vec<(KernelId, u32)>)],
    handed: &[bool],
) -> (Vec<Shared>, Vec<Vec<usize>>) {
    // A barrier lies between levels a < b where some level in a + 1 ..= b is not handed.
    let separated =
        |a: usize, b: usize| a < b && (a + 1..=b).any(|l| !handed.get(l).copied().unwrap_or(false));
    // Per pipeline: (kernel, the level of its last dispatch, dispatches, largest grid).
    let mut made: Vec<(KernelId, usize, u32, u32)> = Vec::new();
    let mut assign = Vec::with_capacity(dispatches.len());
    for (level, grids) in dispatches {
        let mut mine = Vec::with_capacity(grids.len());
        for &(kernel, groups) in grids {
            let p = match made
                .iter()
                .position(|m| m.0 == kernel && separated(m.1, *level))
            {
                Some(p) => p,
                None => {
                    made.push((kernel, *level, 0, 0));
                    made.len() - 1
                }
            };
            let m = &mut made[p];
            m.1 = *level;
            m.2 += 1;
            m.3 = m.3.max(groups);
            mine.push(p);
        }
        assign.push(mine);
    }
    let made = made
        .into_iter()
        .map(|(k, _, uses, groups)| (k, uses, groups))
        .collect();
    (made, assign)
}

impl Timeline {
    /// The buffer for `schedule`'s wrapped kernels on `device`, replayed with a barrier before
    /// every level but those `handed` (per level; empty where handoffs are off); `None` when no
    /// kernel is wrapped. An error when the device cannot run them.
    pub fn new(
        device: &Device,
        schedule: &Schedule,
        handed: &[bool],
    ) -> Result<Option<Timeline>, SessionError> {
        if !check_device(device, schedule)? {
            return Ok(None);
        }
        let level_of = schedule.dispatch_levels();
        let grids: Vec<(usize, Vec<(KernelId, u32)>)> = schedule
            .dispatches
            .iter()
            .zip(&level_of)
            .map(|(disp, &level)| {
                let grids = std::iter::once((disp.kernel, disp.workgroups))
                    .chain(disp.alternatives.iter().map(|a| (a.kernel, a.workgroups)))
                    .map(|(k, wg)| (k, wg.iter().product::<u32>()))
                    .collect();
                (level, grids)
            })
            .collect();
        let (made, assign) = share_pipelines(&grids, handed);
        let (mut slot, mut record) = (0u64, 0u64);
        let mut pipelines = Vec::with_capacity(made.len());
        for (kernel, uses, groups) in made {
            let depth = uses * TIMELINE_STEPS;
            // Checked below, with the records, against 32-bit word indices.
            pipelines.push(Slots {
                kernel,
                slot: slot as u32,
                record: record as u32,
                depth,
                groups,
                sms: schedule.kernels[kernel.index()].records_sms(),
            });
            slot += u64::from(groups);
            record += u64::from(groups) * u64::from(depth);
        }
        let records_at = slot.div_ceil(4) * 4;
        let words = records_at + u64::from(RECORD_WORDS) * record;
        if words > u64::from(u32::MAX) {
            return Err(SessionError::Vulkan(Error::InvalidArgument(format!(
                "the timeline of {record} records does not fit 32-bit word indices"
            ))));
        }
        let buffer = device.create_buffer_labeled(
            "timeline records",
            4 * words.max(4),
            BufferKind::DeviceLocal,
        )?;
        let address = buffer
            .device_address()
            .ok_or_else(|| Error::InvalidArgument("the timeline buffer has no address".into()))?;
        let t = Timeline {
            buffer,
            address,
            pipelines,
            assign,
            records_at: records_at as u32,
        };
        t.clear(device)?;
        Ok(Some(t))
    }

    /// `spec` with probe pipeline `p`'s constants added: where it writes.
    pub fn specialize(&self, p: usize, spec: SpecConstants) -> SpecConstants {
        let s = self.pipelines[p];
        spec.u32(TIMELINE_SPEC_ID, self.address as u32)
            .u32(TIMELINE_SPEC_ID + 1, (self.address >> 32) as u32)
            .u32(TIMELINE_SPEC_ID + 2, s.slot)
            .u32(TIMELINE_SPEC_ID + 3, s.record)
            .u32(TIMELINE_SPEC_ID + 4, s.depth)
            .u32(TIMELINE_SPEC_ID + 5, self.records_at)
    }

    /// The probe's pipelines to create, by index: each one's kernel.
    pub fn pipeline_kernels(&self) -> impl Iterator<Item = KernelId> + '_ {
        self.pipelines.iter().map(|s| s.kernel)
    }

    /// The probe pipeline `dispatch` runs on its grid `grid`.
    pub fn pipeline_of(&self, dispatch: usize, grid: usize) -> usize {
        self.assign[dispatch][grid]
    }

    /// Zeroes every counter and record; later submissions' kernels see it.
    pub fn clear(&self, device: &Device) -> Result<(), SessionError> {
        let mut cmd = device.create_command_buffer()?;
        let mut rec = cmd.begin()?;
        rec.fill_buffer(&self.buffer, 0, self.buffer.size(), 0)?;
        rec.barrier(Stages::TRANSFER, Stages::COMPUTE | Stages::TRANSFER);
        rec.finish()?;
        device.submit_and_wait(&mut cmd, super::STEP_TIMEOUT)?;
        Ok(())
    }

    /// The records since [`Self::clear`], laid against `steps` (each step's dispatches in the
    /// order replay recorded them): a dispatch's workgroup g is the next record of its probe
    /// pipeline's counter g (see the top). An error where the records do not match (a
    /// workgroup that did not record, one that recorded more often than the steps ran it, or
    /// more steps than were kept).
    pub fn read(
        &self,
        device: &Device,
        steps: &[Vec<StepDispatch>],
    ) -> Result<Vec<DispatchRun>, SessionError> {
        let words: Vec<u32> =
            device.readback_pod(&self.buffer, 0, (self.buffer.size() / 4) as usize)?;
        let bad =
            |m: String| SessionError::Vulkan(Error::InvalidArgument(format!("timeline: {m}")));
        let mut runs: Vec<DispatchRun> = Vec::new();
        // Per probe pipeline and counter: the records the runs have taken.
        let mut taken: Vec<Vec<u32>> = self
            .pipelines
            .iter()
            .map(|s| vec![0; s.groups as usize])
            .collect();
        for (step, list) in steps.iter().enumerate() {
            for d in list {
                let p = self.assign[d.dispatch][d.grid];
                let s = self.pipelines[p];
                let mut groups = Vec::with_capacity(d.groups as usize);
                for g in 0..d.groups.min(s.groups) {
                    let n = taken[p][g as usize];
                    let count = words[(s.slot + g) as usize];
                    if n >= count.min(s.depth) {
                        return Err(bad(format!(
                            "dispatch {} (step {step}) workgroup {g}: no record left ({count} \
                             counted, {} kept per workgroup)",
                            d.dispatch, s.depth
                        )));
                    }
                    let at =
                        (self.records_at + RECORD_WORDS * (s.record + g * s.depth + n)) as usize;
                    let w = &words[at..at + RECORD_WORDS as usize];
                    let clock = |i: usize| u64::from(w[i]) | (u64::from(w[i + 1]) << 32);
                    let begin = clock(0);
                    // A workgroup lives far less than 2^32 ns: the end is the begin plus the
                    // low halves' difference.
                    let end = begin + u64::from(w[6].wrapping_sub(w[0]));
                    groups.push(Workgroup {
                        begin,
                        marks: [clock(2), clock(4)],
                        end,
                        sm: s.sms.then_some(w[7]),
                    });
                    taken[p][g as usize] += 1;
                }
                runs.push(DispatchRun {
                    step,
                    dispatch: d.dispatch,
                    kernel: d.kernel,
                    groups,
                });
            }
        }
        unwrap_clock(&mut runs);
        // Every record taken: nothing ran that the steps do not name.
        for (p, s) in self.pipelines.iter().enumerate() {
            for g in 0..s.groups {
                let count = words[(s.slot + g) as usize];
                if count != taken[p][g as usize] {
                    return Err(bad(format!(
                        "probe pipeline {p} workgroup {g}: {count} records, the steps ran it {} \
                         times",
                        taken[p][g as usize]
                    )));
                }
            }
        }
        Ok(runs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(groups: &[(u64, u64)]) -> DispatchRun {
        DispatchRun {
            step: 0,
            dispatch: 0,
            kernel: KernelId(0),
            groups: groups
                .iter()
                .map(|&(begin, end)| Workgroup {
                    begin,
                    marks: [0, end],
                    end,
                    sm: None,
                })
                .collect(),
        }
    }

    #[test]
    fn dispatches_of_a_kernel_share_a_pipeline_only_across_a_barrier() {
        let (a, b) = (KernelId(0), KernelId(1));
        // Levels: 0 {A, A}, 1 {B}, 2 {A} handed, 3 {A} behind a barrier, 4 {B with an
        // alternative A of 7 workgroups}.
        let dispatches = vec![
            (0, vec![(a, 4)]),
            (0, vec![(a, 2)]),
            (1, vec![(b, 3)]),
            (2, vec![(a, 5)]),
            (3, vec![(a, 1)]),
            (4, vec![(b, 3), (a, 7)]),
        ];
        let handed = [false, false, true, false, false];
        let (made, assign) = share_pipelines(&dispatches, &handed);
        // The two A of level 0 may run together: two pipelines. Level 2's A is behind level
        // 1's barrier: the first one's. Level 3's A follows level 2 behind a barrier: shared
        // again; level 4's alternative too.
        assert_eq!(
            assign,
            vec![vec![0], vec![1], vec![2], vec![0], vec![0], vec![2, 0]]
        );
        assert_eq!(made, vec![(a, 4, 7), (a, 1, 2), (b, 2, 3)]);
        // With every level handed (no barrier inside the step), every dispatch needs a pipeline
        // of its own.
        let (_, all_handed) = share_pipelines(&dispatches, &[false, true, true, true, true]);
        assert_eq!(
            all_handed,
            vec![vec![0], vec![1], vec![2], vec![3], vec![4], vec![5, 6]]
        );
    }

    #[test]
    fn readings_that_wrapped_are_moved_into_one_frame() {
        let base = 7u64 << 32;
        let mut runs = [
            run(&[(base + 10, base + 20), (base + 12, base + 22 + (1 << 32))]),
            run(&[(base + 30 - (1 << 32), base + 40)]),
        ];
        unwrap_clock(&mut runs);
        assert_eq!(runs[0].groups[1].end, base + 22);
        assert_eq!(runs[0].groups[1].marks, [0, base + 22]);
        assert_eq!(runs[1].groups[0].begin, base + 30);
        assert_eq!(runs[0].groups[0].begin, base + 10);
        // A 32-bit clock wrapping inside the run (lavapipe's): the readings after the wrap
        // follow those before it, one frame 2^32 up.
        let top = (1u64 << 32) - 100;
        let mut runs = [run(&[(top, top + 50)]), run(&[(20, 30), (40, 60)])];
        unwrap_clock(&mut runs);
        let g: Vec<(u64, u64)> = runs
            .iter()
            .flat_map(|r| r.groups.iter().map(|g| (g.begin, g.end)))
            .collect();
        assert!(g.windows(2).all(|w| w[0].1 <= w[1].0), "{g:?}");
        assert_eq!(g[1].0 - g[0].0, 120);
        assert!(g.iter().all(|&(b, _)| b > 0));
    }
}
