//! The eager baseline, what ggml-vulkan does: per token, re-record the whole step, write a
//! descriptor set for every dispatch, put a barrier after every dispatch, submit and wait.
//! Neither artificially slow nor secretly cached: pipelines and buffers are created once, as
//! any real backend does; everything per-dispatch is redone per token.

use super::{Loaded, SessionError, StepOutput, STEP_TIMEOUT};
use crate::{CommandBuffer, DescriptorPool, DescriptorSet, TimestampPool};

/// Runs a loaded schedule eagerly.
pub struct Eager {
    loaded: Loaded,
    /// Keeps the sets' pool alive.
    _pool: DescriptorPool,
    /// One set per dispatch, rewritten every token (as a descriptor-set ring would be).
    sets: Vec<DescriptorSet>,
    cmd: CommandBuffer,
    timestamps: Option<TimestampPool>,
    gpu_ns: f64,
}

impl Eager {
    /// Prepares per-token resources (a descriptor pool sized for one token's dispatches).
    pub fn new(loaded: Loaded) -> Result<Eager, SessionError> {
        let s = &loaded.schedule;
        let sets = s.dispatches.len() as u32;
        let bindings: u32 = s.dispatches.iter().map(|d| d.bindings.len() as u32).sum();
        let pool = loaded.device.create_descriptor_pool(sets, bindings)?;
        let sets = s
            .dispatches
            .iter()
            .map(|d| pool.allocate(&loaded.pipelines[d.kernel.index()]))
            .collect::<Result<Vec<_>, _>>()?;
        let cmd = loaded.device.create_command_buffer()?;
        let timestamps = loaded.device.create_timestamp_pool(2)?;
        Ok(Eager {
            loaded,
            _pool: pool,
            sets,
            cmd,
            timestamps,
            gpu_ns: 0.0,
        })
    }

    /// The loaded schedule.
    pub fn loaded(&self) -> &Loaded {
        &self.loaded
    }

    /// Starts a new sequence.
    pub fn reset(&mut self) -> Result<(), SessionError> {
        self.loaded.reset()
    }

    /// GPU nanoseconds of all steps so far, or `None` without timestamps.
    pub fn gpu_ns(&self) -> Option<f64> {
        self.timestamps.as_ref().map(|_| self.gpu_ns)
    }

    /// Runs one step. `token` is the input (teacher forcing); `None` feeds the previous
    /// step's device-side argmax.
    pub fn step(&mut self, token: Option<u32>) -> Result<StepOutput, SessionError> {
        // Each dispatch on its grid for this position, as replay runs it.
        let position = self.loaded.prepare_step(token)?;
        let l = &self.loaded;
        let mut rec = self.cmd.begin()?;
        if let Some(ts) = &self.timestamps {
            rec.reset_timestamps(ts)?;
            rec.write_timestamp(ts, 0)?;
        }
        let n = l.schedule.dispatches.len();
        for (k, (d, set)) in l.schedule.dispatches.iter().zip(&self.sets).enumerate() {
            let (_, groups) = d.grid_at(position);
            let pipeline = l.dispatch_pipeline(k, position);
            let bindings = l.bindings(d);
            l.device.write_descriptors(set, &bindings)?;
            rec.bind_pipeline(pipeline)?;
            rec.bind_descriptor_set(set)?;
            l.bind_handoff(&mut rec, k, false)?;
            if !d.push_constants.is_empty() {
                rec.push_constants(0, &d.push_constants)?;
            }
            rec.dispatch(groups[0], groups[1], groups[2])?;
            // After the last dispatch, the output copy's barrier takes the place of this one.
            if k + 1 == n {
                l.record_output(&mut rec)?;
            } else {
                rec.compute_barrier();
            }
        }
        if let Some(ts) = &self.timestamps {
            rec.write_timestamp(ts, 1)?;
        }
        rec.finish()?;
        l.device.submit_and_wait(&mut self.cmd, STEP_TIMEOUT)?;
        if let Some(ts) = &self.timestamps {
            self.gpu_ns += ts.elapsed_ns(0, 1)?.unwrap_or(0.0);
        }
        self.loaded.read_output()
    }
}
