//! The timeline probe (`compile-model --timeline`, `kernels/glsl/timeline.glsl`): each
//! workgroup of a wrapped kernel records when it began and when its invocation 0 was done, on
//! the device's realtime clock, into a buffer the runtime passes by address. Read back and laid
//! against the dispatches replay recorded, the records say what ran when inside a step, handoffs
//! included, where timestamps between levels see only whole levels behind barriers.
//!
//! The buffer: one counter per workgroup of every grid of every dispatch (a dispatch's own and
//! its bands' alternatives), then per counter [`TIMELINE_STEPS`] records of eight words (begin,
//! two marks, end: each the clock's low and high halves; a mark is a point of invocation 0's
//! way that the kernel names, `TIMELINE_MARK` in `common.glsl`, 0 where none). Each dispatch
//! runs its own copy of its kernel's pipeline whose constants name its own counters
//! ([`Timeline::specialize`]), so a record belongs to its dispatch whatever order the device
//! launches workgroups in; a counter's records are its dispatch's steps, in order (a barrier
//! ends every step). The records of [`TIMELINE_STEPS`] steps after [`Timeline::clear`] are kept
//! and later ones counted as dropped.

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

/// Where one grid of one dispatch keeps its counters and records.
#[derive(Clone, Copy, Debug)]
struct Slots {
    /// Its first counter (one per workgroup).
    slot: u32,
    /// Its first record ([`TIMELINE_STEPS`] per workgroup).
    record: u32,
    /// Its workgroups.
    groups: u32,
}

/// The records' buffer and where each dispatch writes.
pub struct Timeline {
    buffer: Buffer,
    address: u64,
    /// By dispatch, then grid (0: its own, 1 + i: alternative i).
    grids: Vec<Vec<Slots>>,
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
/// 1 + i: alternative i) and the kernel the grid runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepDispatch {
    /// Its index in the schedule's dispatches.
    pub dispatch: usize,
    /// Which of its grids ran ([`crate::schedule::Dispatch::grid_index_at`]).
    pub grid: usize,
    /// The kernel of that grid.
    pub kernel: KernelId,
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

impl Timeline {
    /// The buffer for `schedule`'s wrapped kernels on `device`; `None` when none is wrapped.
    /// An error when the device cannot run them.
    pub fn new(device: &Device, schedule: &Schedule) -> Result<Option<Timeline>, SessionError> {
        let Some(wrapped) = schedule.kernels.iter().find(|k| k.records_timeline()) else {
            return Ok(None);
        };
        let f = device.enabled_features();
        if !(f.shader_device_clock && f.buffer_device_address) {
            return Err(SessionError::Vulkan(Error::UnsupportedDevice {
                device: device.info().name.clone(),
                reason: format!(
                    "kernel `{}` records a timeline (compile-model --timeline), which needs the \
                     device clock (VK_KHR_shader_clock's shaderDeviceClock) and buffer device \
                     addresses (bufferDeviceAddress)",
                    wrapped.label
                ),
            }));
        }
        let (mut slot, mut record) = (0u64, 0u64);
        let mut grids = Vec::with_capacity(schedule.dispatches.len());
        for d in &schedule.dispatches {
            let sizes =
                std::iter::once(d.workgroups).chain(d.alternatives.iter().map(|a| a.workgroups));
            let mut mine = Vec::new();
            for wg in sizes {
                let groups = wg.iter().product::<u32>();
                // Checked below, with the records, against 32-bit word indices.
                mine.push(Slots {
                    slot: slot as u32,
                    record: record as u32,
                    groups,
                });
                slot += u64::from(groups);
                record += u64::from(groups) * u64::from(TIMELINE_STEPS);
            }
            grids.push(mine);
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
            grids,
            records_at: records_at as u32,
        };
        t.clear(device)?;
        Ok(Some(t))
    }

    /// `spec` with the timeline constants of `dispatch`'s grid `grid` added: the pipeline that
    /// dispatch runs on that grid writes its own counters and records.
    pub fn specialize(&self, dispatch: usize, grid: usize, spec: SpecConstants) -> SpecConstants {
        let s = self.grids[dispatch][grid];
        spec.u32(TIMELINE_SPEC_ID, self.address as u32)
            .u32(TIMELINE_SPEC_ID + 1, (self.address >> 32) as u32)
            .u32(TIMELINE_SPEC_ID + 2, s.slot)
            .u32(TIMELINE_SPEC_ID + 3, s.record)
            .u32(TIMELINE_SPEC_ID + 4, TIMELINE_STEPS)
            .u32(TIMELINE_SPEC_ID + 5, self.records_at)
    }

    /// Each dispatch's grids, its own first: (dispatch, grid) for the pipelines to create.
    pub fn grids(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.grids
            .iter()
            .enumerate()
            .flat_map(|(d, g)| (0..g.len()).map(move |i| (d, i)))
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
    /// order replay recorded them): the n-th time a dispatch ran a grid since the clear, its
    /// workgroup g's record is the n-th of that grid's counter g. An error where the records do
    /// not match (a workgroup that did not record, one that recorded more often than the steps
    /// ran it, or more steps than were kept).
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
        // Per dispatch and grid: how many of its steps the runs have taken.
        let mut taken: Vec<Vec<u32>> = self.grids.iter().map(|g| vec![0; g.len()]).collect();
        for (step, list) in steps.iter().enumerate() {
            for d in list {
                let s = self.grids[d.dispatch][d.grid];
                let n = taken[d.dispatch][d.grid];
                if n >= TIMELINE_STEPS {
                    return Err(bad(format!(
                        "dispatch {} ran more than the {TIMELINE_STEPS} steps kept",
                        d.dispatch
                    )));
                }
                let mut groups = Vec::with_capacity(s.groups as usize);
                for g in 0..s.groups {
                    let count = words[(s.slot + g) as usize];
                    if count <= n {
                        return Err(bad(format!(
                            "dispatch {} (step {step}) workgroup {g}: no record ({count} counted)",
                            d.dispatch
                        )));
                    }
                    let at = (self.records_at + RECORD_WORDS * (s.record + g * TIMELINE_STEPS + n))
                        as usize;
                    let w = &words[at..at + RECORD_WORDS as usize];
                    let clock = |i: usize| u64::from(w[i]) | (u64::from(w[i + 1]) << 32);
                    groups.push(Workgroup {
                        begin: clock(0),
                        marks: [clock(2), clock(4)],
                        end: clock(6),
                    });
                }
                taken[d.dispatch][d.grid] += 1;
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
        for (d, grids) in self.grids.iter().enumerate() {
            for (i, s) in grids.iter().enumerate() {
                for g in 0..s.groups {
                    let count = words[(s.slot + g) as usize];
                    if count != taken[d][i] {
                        return Err(bad(format!(
                            "dispatch {d} grid {i} workgroup {g}: {count} records, the steps ran \
                             it {} times",
                            taken[d][i]
                        )));
                    }
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
                })
                .collect(),
        }
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
