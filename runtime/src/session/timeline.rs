//! The timeline probe (`compile-model --timeline`, `kernels/glsl/timeline.glsl`): each
//! workgroup of a wrapped kernel records when it began and when its invocation 0 was done, on
//! the device's realtime clock, into a buffer the runtime passes by address. Read back and laid
//! against the dispatches replay recorded, the records say what ran when inside a step, handoffs
//! included, where timestamps between levels see only whole levels behind barriers.
//!
//! The buffer: one counter per (kernel, workgroup) slot, then per slot `depth` records of eight
//! words (begin, two marks, end: each the clock's low and high halves; a mark is a point of
//! invocation 0's way that the kernel names, `TIMELINE_MARK` in `common.glsl`, 0 where none). A kernel's slots cover the largest
//! grid it runs on; its depth is the dispatches that may run it per step times
//! [`TIMELINE_STEPS`], so the records of that many steps after [`Timeline::clear`] are kept
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

/// Where one kernel's counters and records are.
#[derive(Clone, Copy, Debug)]
struct Slots {
    /// Its first counter.
    slot: u32,
    /// Its first record.
    record: u32,
    /// Records per slot.
    depth: u32,
    /// Slots (its largest grid).
    groups: u32,
}

/// The records' buffer and where each kernel writes.
pub struct Timeline {
    buffer: Buffer,
    address: u64,
    kernels: Vec<Slots>,
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

/// A dispatch as replay records it for one step: the schedule's index, the pipeline and its
/// workgroup count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepDispatch {
    /// Its index in the schedule's dispatches.
    pub dispatch: usize,
    /// The pipeline it runs (the band's).
    pub kernel: KernelId,
    /// Its workgroups.
    pub groups: u32,
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
        let mut groups = vec![0u32; schedule.kernels.len()];
        let mut uses = vec![0u32; schedule.kernels.len()];
        for d in &schedule.dispatches {
            let grids = std::iter::once((d.kernel, d.workgroups))
                .chain(d.alternatives.iter().map(|a| (a.kernel, a.workgroups)));
            for (k, wg) in grids {
                let n = wg.iter().product::<u32>();
                groups[k.index()] = groups[k.index()].max(n);
                uses[k.index()] += 1;
            }
        }
        let mut kernels = Vec::with_capacity(groups.len());
        let (mut slot, mut record) = (0u64, 0u64);
        for (g, u) in groups.iter().zip(&uses) {
            let depth = u * TIMELINE_STEPS;
            kernels.push(Slots {
                slot: slot as u32,
                record: record as u32,
                depth,
                groups: *g,
            });
            slot += u64::from(*g);
            record += u64::from(*g) * u64::from(depth);
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
            kernels,
            records_at: records_at as u32,
        };
        t.clear(device)?;
        Ok(Some(t))
    }

    /// `spec` with kernel `k`'s timeline constants added.
    pub fn specialize(&self, k: KernelId, spec: SpecConstants) -> SpecConstants {
        let s = self.kernels[k.index()];
        spec.u32(TIMELINE_SPEC_ID, self.address as u32)
            .u32(TIMELINE_SPEC_ID + 1, (self.address >> 32) as u32)
            .u32(TIMELINE_SPEC_ID + 2, s.slot)
            .u32(TIMELINE_SPEC_ID + 3, s.record)
            .u32(TIMELINE_SPEC_ID + 4, s.depth)
            .u32(TIMELINE_SPEC_ID + 5, self.records_at)
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
    /// order replay recorded them): a dispatch's workgroup g is the next record of its
    /// kernel's slot g, a slot's records numbered in the order its workgroups launched. So two
    /// dispatches of one pipeline that may run at once (in one level, as the zeroing kernels of
    /// level 0 do, or across a handed boundary) are told apart by launch order, which Vulkan
    /// does not promise; NVIDIA and lavapipe launch in recording order (the premise of
    /// handoffs). An error where the records do not match (a workgroup that did not record, or
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
        // Per (kernel, slot): how many of its records the runs have taken.
        let mut taken: Vec<Vec<u32>> = self
            .kernels
            .iter()
            .map(|s| vec![0; s.groups as usize])
            .collect();
        for (step, list) in steps.iter().enumerate() {
            for d in list {
                let s = self.kernels[d.kernel.index()];
                let mut groups = Vec::with_capacity(d.groups as usize);
                for g in 0..d.groups.min(s.groups) {
                    let n = &mut taken[d.kernel.index()][g as usize];
                    let count = words[(s.slot + g) as usize];
                    if *n >= count.min(s.depth) {
                        return Err(bad(format!(
                            "dispatch {} (step {step}) workgroup {g}: no record left ({count} \
                             counted, {} kept per workgroup)",
                            d.dispatch, s.depth
                        )));
                    }
                    let at =
                        (self.records_at + RECORD_WORDS * (s.record + g * s.depth + *n)) as usize;
                    let w = &words[at..at + RECORD_WORDS as usize];
                    let clock = |i: usize| u64::from(w[i]) | (u64::from(w[i + 1]) << 32);
                    groups.push(Workgroup {
                        begin: clock(0),
                        marks: [clock(2), clock(4)],
                        end: clock(6),
                    });
                    *n += 1;
                }
                runs.push(DispatchRun {
                    step,
                    dispatch: d.dispatch,
                    kernel: d.kernel,
                    groups,
                });
            }
        }
        // Every record taken: nothing ran that the steps do not name.
        for (k, s) in self.kernels.iter().enumerate() {
            for g in 0..s.groups {
                let count = words[(s.slot + g) as usize];
                if count != taken[k][g as usize] {
                    return Err(bad(format!(
                        "kernel {k} workgroup {g}: {count} records, the steps ran it {} times",
                        taken[k][g as usize]
                    )));
                }
            }
        }
        Ok(runs)
    }
}
