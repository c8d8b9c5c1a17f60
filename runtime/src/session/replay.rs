//! Replay: everything per-dispatch is done once. Descriptor sets are written at load, the step
//! is recorded once with a barrier only between dependency levels, and per token the host only
//! submits. The position advances on the device (the step's own `write_state`), the next token
//! is the device-side argmax unless the host writes one, and state written back inside the step
//! is read by the next.
//!
//! With K tokens per submit, K steps are recorded back to back in one command buffer; after
//! each, the produced token and logits are copied into a host-visible ring, so the host reads
//! all K results after a single wait.

use super::{Loaded, SessionError, StepOutput, STEP_TIMEOUT};
use crate::{
    Buffer, BufferKind, CommandBuffer, CommandRecorder, DescriptorPool, DescriptorSet, Stages,
    TimestampPool,
};
use std::collections::BTreeMap;

/// Runs a loaded schedule by replaying pre-recorded command buffers.
pub struct Replay {
    loaded: Loaded,
    /// Keeps the sets' pool alive.
    _pool: DescriptorPool,
    sets: Vec<DescriptorSet>,
    /// One step, for host-fed tokens and single greedy steps.
    single: CommandBuffer,
    /// K chained greedy steps, by K, recorded on first use.
    chains: BTreeMap<u32, CommandBuffer>,
    /// Host-visible ring: per chained step, the token (4 bytes, padded to 256) then the logits.
    ring: Buffer,
    ring_stride: u64,
    timestamps: Option<TimestampPool>,
    gpu_ns: f64,
}

/// The most steps one submit may chain.
pub const MAX_TOKENS_PER_SUBMIT: u32 = 64;

impl Replay {
    /// Writes every descriptor set and records the single step, once.
    pub fn new(loaded: Loaded) -> Result<Replay, SessionError> {
        let s = &loaded.schedule;
        let bindings: u32 = s.dispatches.iter().map(|d| d.bindings.len() as u32).sum();
        let pool = loaded
            .device
            .create_descriptor_pool(s.dispatches.len() as u32, bindings)?;
        let mut sets = Vec::with_capacity(s.dispatches.len());
        for d in &s.dispatches {
            let set = pool.allocate(&loaded.pipelines[d.kernel.index()])?;
            loaded.device.write_descriptors(&set, &loaded.bindings(d))?;
            sets.push(set);
        }
        let vocab_bytes = 4 * u64::from(s.meta.vocab_size);
        let ring_stride = 256 + vocab_bytes.div_ceil(256) * 256;
        let ring = loaded.device.create_buffer_labeled(
            "replay ring",
            ring_stride * u64::from(MAX_TOKENS_PER_SUBMIT),
            BufferKind::Readback,
        )?;
        let timestamps = loaded.device.create_timestamp_pool(2)?;
        let mut replay = Replay {
            single: loaded.device.create_command_buffer()?,
            loaded,
            _pool: pool,
            sets,
            chains: BTreeMap::new(),
            ring,
            ring_stride,
            timestamps,
            gpu_ns: 0.0,
        };
        let mut cmd = replay.loaded.device.create_command_buffer()?;
        replay.record(&mut cmd, 1, false)?;
        replay.single = cmd;
        Ok(replay)
    }

    /// The loaded schedule.
    pub fn loaded(&self) -> &Loaded {
        &self.loaded
    }

    /// Starts a new sequence.
    pub fn reset(&mut self) -> Result<(), SessionError> {
        self.loaded.reset()
    }

    /// GPU nanoseconds of all submits so far, or `None` without timestamps.
    pub fn gpu_ns(&self) -> Option<f64> {
        self.timestamps.as_ref().map(|_| self.gpu_ns)
    }

    /// Records `steps` steps; with `ring`, each step's token and logits are copied to the ring.
    fn record(&self, cmd: &mut CommandBuffer, steps: u32, ring: bool) -> Result<(), SessionError> {
        let l = &self.loaded;
        let s = &l.schedule;
        let mut rec = cmd.begin()?;
        if let Some(ts) = &self.timestamps {
            rec.reset_timestamps(ts)?;
            rec.write_timestamp(ts, 0)?;
        }
        for k in 0..steps {
            self.record_step(&mut rec)?;
            if ring {
                rec.barrier(Stages::COMPUTE, Stages::TRANSFER);
                let io = &s.io;
                let dst = u64::from(k) * self.ring_stride;
                let io_buf = &l.buffers[io.token.buffer.index()];
                rec.copy_buffer(io_buf, io.token.offset, &self.ring, dst, 4)?;
                rec.copy_buffer(
                    io_buf,
                    io.logits.offset,
                    &self.ring,
                    dst + 256,
                    io.logits.size,
                )?;
                // The next step overwrites what was just copied, and the host reads the ring.
                rec.barrier(Stages::TRANSFER, Stages::COMPUTE | Stages::HOST);
            } else if k + 1 < steps {
                rec.compute_barrier();
            }
        }
        if !ring {
            rec.barrier(Stages::COMPUTE, Stages::COMPUTE | Stages::HOST);
        }
        if let Some(ts) = &self.timestamps {
            rec.write_timestamp(ts, 1)?;
        }
        rec.finish()?;
        Ok(())
    }

    /// One step: the levels in order, a barrier between consecutive levels only.
    fn record_step(&self, rec: &mut CommandRecorder<'_>) -> Result<(), SessionError> {
        let l = &self.loaded;
        let s = &l.schedule;
        for (i, level) in s.levels.iter().enumerate() {
            if i > 0 {
                rec.compute_barrier();
            }
            for k in level.clone() {
                let d = &s.dispatches[k as usize];
                rec.bind_pipeline(&l.pipelines[d.kernel.index()])?;
                rec.bind_descriptor_set(&self.sets[k as usize])?;
                if !d.push_constants.is_empty() {
                    rec.push_constants(0, &d.push_constants)?;
                }
                rec.dispatch(d.workgroups[0], d.workgroups[1], d.workgroups[2])?;
            }
        }
        Ok(())
    }

    fn add_gpu_time(&mut self) -> Result<(), SessionError> {
        if let Some(ts) = &self.timestamps {
            self.gpu_ns += ts.elapsed_ns(0, 1)?.unwrap_or(0.0);
        }
        Ok(())
    }

    /// Records the chain of `k` steps now (it is otherwise recorded on first use), so that
    /// nothing is recorded while tokens are being timed.
    pub fn prepare(&mut self, k: u32) -> Result<(), SessionError> {
        if k == 0 || k > MAX_TOKENS_PER_SUBMIT || self.chains.contains_key(&k) {
            return Ok(());
        }
        let mut cmd = self.loaded.device.create_command_buffer()?;
        self.record(&mut cmd, k, true)?;
        self.chains.insert(k, cmd);
        Ok(())
    }

    /// Runs one step: `token` is the input (teacher forcing); `None` feeds the previous step's
    /// device-side argmax. The host does nothing but write the token (if any) and submit.
    pub fn step(&mut self, token: Option<u32>) -> Result<StepOutput, SessionError> {
        self.loaded.prepare_step(token)?;
        self.loaded
            .device
            .submit_and_wait(&mut self.single, STEP_TIMEOUT)?;
        self.add_gpu_time()?;
        self.loaded.read_output()
    }

    /// Runs `k` greedy steps in one submit (the first consumes `first` if given, each later one
    /// the previous argmax) and returns every step's output.
    pub fn steps(&mut self, first: Option<u32>, k: u32) -> Result<Vec<StepOutput>, SessionError> {
        if k == 0 || k > MAX_TOKENS_PER_SUBMIT {
            return Err(SessionError::Vulkan(crate::Error::InvalidArgument(
                format!("tokens per submit must be in 1..={MAX_TOKENS_PER_SUBMIT}, not {k}"),
            )));
        }
        self.loaded.prepare_step(first)?;
        let (position, capacity) = (
            self.loaded.position()?,
            self.loaded.schedule.meta.max_context,
        );
        if position + k > capacity {
            return Err(SessionError::ContextFull {
                position: position + k - 1,
                capacity,
            });
        }
        self.prepare(k)?;
        let cmd = self.chains.get_mut(&k).expect("recorded above");
        self.loaded.device.submit_and_wait(cmd, STEP_TIMEOUT)?;
        self.add_gpu_time()?;
        let vocab = self.loaded.schedule.meta.vocab_size as usize;
        (0..u64::from(k))
            .map(|i| {
                let base = i * self.ring_stride;
                let next = self.ring.read_pod::<i32>(base, 1)?[0] as u32;
                let logits = self.ring.read_pod::<f32>(base + 256, vocab)?;
                Ok(StepOutput {
                    logits,
                    next_token: next,
                })
            })
            .collect()
    }
}
