//! Replay: everything per-dispatch is done once. Descriptor sets are written at load, the step
//! is recorded once with a barrier only between dependency levels, and per token the host only
//! submits. The position advances on the device (the step's own `write_state`), the next token
//! is the device-side argmax unless the host writes one, and state is written back between
//! launches as [`WriteBack`] says (the schedule's copies, or two recordings that swap the
//! state buffers).
//!
//! With K tokens per submit, K steps are recorded back to back in one command buffer; after
//! each, the produced token (and, only when asked for, the logits) is copied into a
//! host-visible ring by a compute dispatch that also empties the handoff words (`step_io`),
//! so the host reads all K results after a single wait. Greedy decoding
//! keeps two chains in flight ([`Replay::greedy_tokens`]): the next chain is queued before the
//! previous one is read, so the GPU never waits for the host between chains.
//!
//! Where dispatches have alternative grids for short positions ([`Dispatch::alternatives`]),
//! every recording exists once per band of positions ([`Schedule::bands`]), and the host, which
//! knows the position of every step it submits, submits the one for the band of the chain's
//! last step (every grid is correct at every position: a chain that starts in an earlier band
//! only runs a few steps on a grid meant for longer contexts).
//!
//! [`Dispatch::alternatives`]: crate::schedule::Dispatch::alternatives
//! [`Schedule::bands`]: crate::schedule::Schedule::bands

use super::step_io::{Run, StepIo};
use super::timeline::{DispatchRun, StepDispatch, TIMELINE_STEPS};
use super::writeback::{self, PingPongPlan, WriteBack};
use super::{Loaded, SessionError, StepOutput, STEP_TIMEOUT};
use crate::schedule::{BufferId, Schedule, Slice};
use crate::{
    Buffer, BufferBinding, BufferKind, CommandBuffer, CommandRecorder, DescriptorPool,
    DescriptorSet, Stages, TimestampPool,
};
use std::collections::{BTreeMap, VecDeque};

/// The most steps one submit may chain.
pub const MAX_TOKENS_PER_SUBMIT: u32 = 64;

/// Greedy chains in flight at once (ring slots for tokens).
const IN_FLIGHT: usize = 2;

/// What a chain copies to the host after each step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Out {
    /// Token and logits, into the logits ring.
    Logits,
    /// The token only, into slot `n` of the token ring.
    Tokens(usize),
}

impl Out {
    /// The timestamp pool the chain writes (chains in flight together need their own).
    fn timestamps(self) -> usize {
        match self {
            Out::Logits => 0,
            Out::Tokens(slot) => 1 + slot,
        }
    }
}

/// A recorded chain: steps, what it copies out, the parity of its first step, and the band of
/// positions whose grids it runs.
type ChainKey = (u32, Out, usize, usize);

/// A recording that writes a timestamp pool: a single step (by band and parity) or a chain.
#[derive(Clone, Copy, Debug)]
enum PoolUser {
    Single(usize, usize),
    Chain(ChainKey),
}

/// Runs a loaded schedule by replaying pre-recorded command buffers.
pub struct Replay {
    loaded: Loaded,
    /// Keeps the sets' pool alive.
    _pool: DescriptorPool,
    sets: Vec<DescriptorSet>,
    /// By parity, then dispatch: the index of the set to bind (`None`: a copy ping-pong
    /// dropped).
    set_of: Vec<Vec<Option<usize>>>,
    write_back: WriteBack,
    plan: PingPongPlan,
    /// Ping-pong's second state buffer (B).
    alternate: Option<Buffer>,
    /// Recordings that alternate: 2 with ping-pong state, else 1.
    parities: usize,
    /// The parity of the next step.
    parity: usize,
    /// The bounds of the bands of positions ([`Schedule::bands`]; empty: one band).
    bands: Vec<u32>,
    /// One step, by band then parity, for host-fed tokens and single greedy steps.
    single: Vec<Vec<CommandBuffer>>,
    /// Chains recorded so far.
    chains: BTreeMap<ChainKey, CommandBuffer>,
    /// Per chained step, the token (4 bytes, padded to 256) then the logits.
    logits_ring: Buffer,
    logits_stride: u64,
    /// The steps whose logits the ring holds: the most per submit that returns logits.
    logits_slots: u32,
    /// `IN_FLIGHT` slots of `MAX_TOKENS_PER_SUBMIT` tokens.
    token_ring: Buffer,
    /// Fills the handoff words and copies each chained step's outputs to a ring (set 0: the
    /// logits ring, 1: the token ring).
    step_io: Box<StepIo>,
    /// Per [`Out::timestamps`] index.
    timestamps: Vec<Option<TimestampPool>>,
    /// Whether the host resets those pools before each submission that writes them (where the
    /// device has `hostQueryReset`) rather than the recordings: a reset recorded at the start
    /// of each chain cost the H100 0.4-1% (docs/perf.md, session 25).
    host_reset: bool,
    /// Per timestamp pool, the recording submitted last that writes it.
    last_user: Vec<Option<PoolUser>>,
    /// Per-level profiling recordings, by band and parity, recorded on first use.
    profiles: BTreeMap<(usize, usize), (CommandBuffer, TimestampPool)>,
    gpu_ns: f64,
}

/// Bytes of one token-ring slot.
const TOKEN_SLOT: u64 = 4 * MAX_TOKENS_PER_SUBMIT as u64;

impl Replay {
    /// [`Self::with_write_back`] with the default strategy.
    pub fn new(loaded: Loaded) -> Result<Replay, SessionError> {
        Replay::with_write_back(loaded, WriteBack::default())
    }

    /// Writes every descriptor set and records the single step, once.
    pub fn with_write_back(loaded: Loaded, write_back: WriteBack) -> Result<Replay, SessionError> {
        let s = &loaded.schedule;
        let plan = match write_back {
            WriteBack::PingPong => writeback::plan(s, loaded.device.storage_offset_alignment()),
            WriteBack::Copy => PingPongPlan::default(),
        };
        let parities = if plan.states.is_empty() { 1 } else { 2 };
        let alternate_id = BufferId(s.buffers.len() as u32);
        let alternate = if parities == 2 {
            Some(loaded.device.create_buffer_labeled(
                "ping-pong state",
                plan.alternate_bytes,
                BufferKind::DeviceLocal,
            )?)
        } else {
            None
        };
        let bindings_of = |parity: usize, d: usize| -> Option<Vec<Slice>> {
            if parities == 1 {
                Some(s.dispatches[d].bindings.clone())
            } else {
                writeback::bindings_for(s, &plan, alternate_id, parity, d)
            }
        };
        let mut layouts = vec![];
        for parity in 0..parities {
            for d in 0..s.dispatches.len() {
                let b = bindings_of(parity, d);
                if parity == 0 || b != bindings_of(0, d) {
                    layouts.push((parity, d, b));
                }
            }
        }
        let n_sets = layouts.iter().filter(|l| l.2.is_some()).count() as u32;
        let n_bindings: u32 = layouts
            .iter()
            .filter_map(|l| l.2.as_ref())
            .map(|b| b.len() as u32)
            .sum();
        let pool = loaded.device.create_descriptor_pool(n_sets, n_bindings)?;
        let resolve = |slice: &Slice| -> &Buffer {
            match &alternate {
                Some(a) if slice.buffer == alternate_id => a,
                _ => &loaded.buffers[slice.buffer.index()],
            }
        };
        let mut set_of: Vec<Vec<Option<usize>>> = vec![vec![None; s.dispatches.len()]; parities];
        let mut sets = vec![];
        for (parity, d, b) in &layouts {
            let Some(b) = b else { continue };
            let set = pool.allocate(&loaded.pipelines[s.dispatches[*d].kernel.index()])?;
            let writes: Vec<BufferBinding<'_>> = b
                .iter()
                .enumerate()
                .map(|(i, slice)| BufferBinding {
                    binding: i as u32,
                    buffer: resolve(slice),
                    offset: slice.offset,
                    range: slice.size,
                })
                .collect();
            loaded.device.write_descriptors(&set, &writes)?;
            set_of[*parity][*d] = Some(sets.len());
            sets.push(set);
        }
        // Parity 1 shares every set that does not change.
        if let [even, odd] = &mut set_of[..] {
            for (d, (o, e)) in odd.iter_mut().zip(even.iter()).enumerate() {
                if o.is_none() && bindings_of(1, d).is_some() {
                    *o = *e;
                }
            }
        }
        let vocab_bytes = 4 * u64::from(s.meta.vocab_size);
        let logits_stride = 256 + vocab_bytes.div_ceil(256) * 256;
        // As many steps' logits as one binding may cover (a vocabulary past ~500k on a device
        // whose maxStorageBufferRange is 128 MiB holds fewer than 64).
        let max_range = u64::from(loaded.device.info().max_storage_buffer_range);
        let logits_slots = (max_range / logits_stride).clamp(1, u64::from(MAX_TOKENS_PER_SUBMIT));
        let logits_ring = loaded.device.create_buffer_labeled(
            "replay logits ring",
            logits_stride * logits_slots,
            BufferKind::Readback,
        )?;
        let token_ring = loaded.device.create_buffer_labeled(
            "replay token ring",
            TOKEN_SLOT * IN_FLIGHT as u64,
            BufferKind::Readback,
        )?;
        let io = &s.io;
        // One buffer holds both (`Schedule::validate`).
        let (t, l) = (&io.token, &io.logits);
        let io_range = t.offset.min(l.offset)..(t.offset + t.size).max(l.offset + l.size);
        let words = loaded.handoff_words().and_then(|w| {
            let n = loaded.handoff_plan().words;
            (n > 0).then(|| (w.buffer(), n))
        });
        // Boxed: `Replay` stays about `Eager`'s size (api.rs holds either).
        let step_io = Box::new(StepIo::new(
            &loaded.device,
            &loaded.buffers[io.token.buffer.index()],
            io_range,
            words,
            &[&logits_ring, &token_ring],
        )?);
        let timestamps = (0..=IN_FLIGHT)
            .map(|_| loaded.device.create_timestamp_pool(2))
            .collect::<Result<Vec<_>, _>>()?;
        let host_reset = loaded.device.enabled_features().host_query_reset;
        let bands = s.bands();
        let mut replay = Replay {
            single: vec![],
            bands,
            loaded,
            _pool: pool,
            sets,
            set_of,
            write_back,
            plan,
            alternate,
            parities,
            parity: 0,
            chains: BTreeMap::new(),
            logits_ring,
            logits_stride,
            logits_slots: logits_slots as u32,
            token_ring,
            step_io,
            last_user: vec![None; timestamps.len()],
            timestamps,
            host_reset,
            profiles: BTreeMap::new(),
            gpu_ns: 0.0,
        };
        for band in 0..=replay.bands.len() {
            let mut by_parity = vec![];
            for parity in 0..parities {
                let mut cmd = replay.loaded.device.create_command_buffer()?;
                replay.record_single(&mut cmd, parity, band)?;
                by_parity.push(cmd);
            }
            replay.single.push(by_parity);
        }
        replay.reset_alternate()?;
        Ok(replay)
    }

    /// The loaded schedule.
    pub fn loaded(&self) -> &Loaded {
        &self.loaded
    }

    /// The write-back strategy asked for.
    pub fn write_back(&self) -> WriteBack {
        self.write_back
    }

    /// What ping-pong changed (empty with [`WriteBack::Copy`] or without copied state).
    pub fn ping_pong_plan(&self) -> &PingPongPlan {
        &self.plan
    }

    /// The most steps one submit returns the logits of ([`Self::steps`]): 64, fewer where a
    /// vocabulary's logits for 64 steps pass what one binding covers.
    pub fn logits_steps(&self) -> u32 {
        self.logits_slots
    }

    /// Starts a new sequence.
    pub fn reset(&mut self) -> Result<(), SessionError> {
        self.loaded.reset()?;
        self.reset_alternate()
    }

    fn reset_alternate(&mut self) -> Result<(), SessionError> {
        self.parity = 0;
        if let Some(a) = &self.alternate {
            let mut cmd = self.loaded.device.create_command_buffer()?;
            let mut rec = cmd.begin()?;
            rec.fill_buffer(a, 0, a.size(), 0)?;
            rec.barrier(Stages::TRANSFER, Stages::COMPUTE);
            rec.finish()?;
            self.loaded.device.submit_and_wait(&mut cmd, STEP_TIMEOUT)?;
        }
        Ok(())
    }

    /// GPU nanoseconds of all submits so far, or `None` without timestamps.
    pub fn gpu_ns(&self) -> Option<f64> {
        self.timestamps[0].as_ref().map(|_| self.gpu_ns)
    }

    /// The band of the step at `position`.
    fn band_at(&self, position: u32) -> usize {
        Schedule::band_of(&self.bands, position)
    }

    /// One step whose results the host reads from the I/O buffer.
    fn record_single(
        &self,
        cmd: &mut CommandBuffer,
        parity: usize,
        band: usize,
    ) -> Result<(), SessionError> {
        let mut rec = cmd.begin()?;
        if let Some(ts) = &self.timestamps[0] {
            if !self.host_reset {
                rec.reset_timestamps(ts)?;
            }
            rec.write_timestamp(ts, 0)?;
        }
        self.record_step(&mut rec, parity, band, false, None)?;
        self.loaded.record_output(&mut rec)?;
        if self.handoffs(None) {
            // The next step's words start empty; its first barrier waits for compute only, so
            // this one makes the fill visible to it.
            self.loaded.record_handoff_fill(&mut rec)?;
            rec.barrier(Stages::TRANSFER, Stages::COMPUTE);
        }
        if let Some(ts) = &self.timestamps[0] {
            rec.write_timestamp(ts, 1)?;
        }
        rec.finish()?;
        Ok(())
    }

    /// Records a chain of `steps` steps starting at `parity`; after each, its token (and its
    /// logits for [`Out::Logits`]) is copied to the ring.
    fn record_chain(
        &self,
        cmd: &mut CommandBuffer,
        (steps, out, parity, band): ChainKey,
    ) -> Result<(), SessionError> {
        let s = &self.loaded.schedule;
        let io = &s.io;
        let ts = &self.timestamps[out.timestamps()];
        let mut rec = cmd.begin()?;
        if let Some(ts) = ts {
            if !self.host_reset {
                rec.reset_timestamps(ts)?;
            }
            rec.write_timestamp(ts, 0)?;
        }
        for k in 0..steps {
            let parity = (parity + k as usize) % self.parities;
            self.record_step(&mut rec, parity, band, k > 0, None)?;
            // One barrier serves both the dispatch below and the next step (which reads what
            // this one wrote); the next step's first barrier waits for it before it writes the
            // token again or publishes a word.
            rec.barrier(Stages::COMPUTE, Stages::COMPUTE | Stages::TRANSFER);
            // The next step's handoff words start empty, and this step's outputs go to the
            // ring, in one compute dispatch (`step_io`).
            let (ring, dst, logits) = match out {
                Out::Logits => {
                    let dst = u64::from(k) * self.logits_stride;
                    let logits = Run {
                        src: io.logits.offset,
                        dst: dst + 256,
                        bytes: io.logits.size,
                    };
                    (0, dst, Some(logits))
                }
                Out::Tokens(slot) => (1, slot as u64 * TOKEN_SLOT + 4 * u64::from(k), None),
            };
            let token = Run {
                src: io.token.offset,
                dst,
                bytes: 4,
            };
            self.step_io
                .record(&mut rec, ring, self.handoffs(None), token, logits)?;
        }
        // The host reads the ring; the next submission reads the token and overwrites the ring.
        rec.barrier(
            Stages::COMPUTE | Stages::TRANSFER,
            Stages::COMPUTE | Stages::TRANSFER | Stages::HOST,
        );
        if let Some(ts) = ts {
            rec.write_timestamp(ts, 1)?;
        }
        rec.finish()?;
        Ok(())
    }

    /// Levels each step hands over instead of a barrier before them (0: handoffs do not run).
    pub fn handed_levels(&self) -> usize {
        match self.handoffs(None) {
            true => self.loaded.handoff_plan().handed_levels(),
            false => 0,
        }
    }

    /// Whether steps recorded for `profile` hand levels over: where the plan hands any, with
    /// one parity (ping-pong's would need a plan per parity's bindings), never when profiling
    /// (every level then ends at a timestamp).
    fn handoffs(&self, profile: Option<&TimestampPool>) -> bool {
        profile.is_none() && self.parities == 1 && self.loaded.handoff_plan().handed_levels() > 0
    }

    /// One step: the levels in order, a barrier between consecutive levels only, except
    /// before a level the one before hands its output to (`session::handoff`), each dispatch
    /// on its grid for `band`. After the step before's `step_io` dispatch (`after_copy`), the
    /// first barrier also waits for it (it reads the token this step's last level writes).
    /// With `profile`, timestamp `i + 1` is written after level `i`.
    fn record_step(
        &self,
        rec: &mut CommandRecorder<'_>,
        parity: usize,
        band: usize,
        after_copy: bool,
        profile: Option<&TimestampPool>,
    ) -> Result<(), SessionError> {
        let l = &self.loaded;
        let s = &l.schedule;
        let set_of = &self.set_of[parity];
        let mut first_barrier = true;
        // A step of one level has no inner barrier: wait for the step_io dispatch before it.
        if after_copy && s.levels.len() < 2 {
            rec.barrier(Stages::COMPUTE | Stages::TRANSFER, Stages::COMPUTE);
            first_barrier = false;
        }
        let handoffs = self.handoffs(profile);
        let position = Schedule::band_position(&self.bands, band);
        let mut emitted = 0;
        // The level emitted last.
        let mut last = None;
        for (i, level) in s.levels.iter().enumerate() {
            let live: Vec<u32> = level
                .clone()
                .filter(|&k| set_of[k as usize].is_some())
                .collect();
            // A level left empty (only a dropped copy) needs no barrier of its own.
            if !live.is_empty() {
                // Handed over only from the very level before (the plan's premise).
                let handed = handoffs && l.handoff_plan().handed[i] && last == Some(i - 1);
                if emitted > 0 && !handed {
                    let from = if after_copy && first_barrier {
                        Stages::COMPUTE | Stages::TRANSFER
                    } else {
                        Stages::COMPUTE
                    };
                    rec.barrier(from, Stages::COMPUTE);
                    first_barrier = false;
                }
                for k in live {
                    let d = &s.dispatches[k as usize];
                    let set = &self.sets[set_of[k as usize].expect("filtered above")];
                    // An alternative binds as the dispatch does (`Schedule::validate`), so the
                    // set written for the dispatch's own pipeline serves it.
                    let (_, groups) = d.grid_at(position);
                    rec.bind_pipeline(l.dispatch_pipeline(k as usize, position))?;
                    rec.bind_descriptor_set(set)?;
                    l.bind_handoff(rec, k as usize, handoffs)?;
                    if !d.push_constants.is_empty() {
                        rec.push_constants(0, &d.push_constants)?;
                    }
                    rec.dispatch(groups[0], groups[1], groups[2])?;
                }
                emitted += 1;
                last = Some(i);
            }
            if let Some(ts) = profile {
                rec.write_timestamp(ts, i as u32 + 1)?;
            }
        }
        Ok(())
    }

    /// Resets timestamp pool `pool` from the host where [`Replay::host_reset`] (the recordings
    /// then reset nothing), before `user` is submitted: refused while the recording that last
    /// wrote the pool still runs (a step that did not finish in time), which resetting would
    /// race.
    fn reset_timestamps(&mut self, pool: usize, user: PoolUser) -> Result<(), SessionError> {
        if let (true, Some(ts)) = (self.host_reset, &self.timestamps[pool]) {
            let last = match self.last_user[pool] {
                Some(PoolUser::Single(band, parity)) => Some(&self.single[band][parity]),
                Some(PoolUser::Chain(key)) => self.chains.get(&key),
                None => None,
            };
            if let Some(cmd) = last {
                if cmd.is_pending()? {
                    return Err(SessionError::Vulkan(crate::Error::InUse(
                        "the timestamps of a step that did not finish",
                    )));
                }
            }
            ts.reset_on_host();
        }
        self.last_user[pool] = Some(user);
        Ok(())
    }

    fn add_gpu_time(&mut self, pool: usize) -> Result<(), SessionError> {
        if let Some(ts) = &self.timestamps[pool] {
            self.gpu_ns += ts.elapsed_ns(0, 1)?.unwrap_or(0.0);
        }
        Ok(())
    }

    /// Records the chains of `k` steps now (they are otherwise recorded on first use), so that
    /// nothing is recorded while tokens are being timed: with and without logits, for each
    /// token-ring slot and ping-pong parity.
    pub fn prepare(&mut self, k: u32) -> Result<(), SessionError> {
        if k == 0 || k > MAX_TOKENS_PER_SUBMIT {
            return Ok(());
        }
        for band in 0..=self.bands.len() {
            for parity in 0..self.parities {
                if k <= self.logits_slots {
                    self.record_once((k, Out::Logits, parity, band))?;
                }
                for slot in 0..IN_FLIGHT {
                    self.record_once((k, Out::Tokens(slot), parity, band))?;
                }
            }
        }
        Ok(())
    }

    /// Records the chain `key` if it was not yet.
    fn record_once(&mut self, key: ChainKey) -> Result<(), SessionError> {
        if !self.chains.contains_key(&key) {
            let mut cmd = self.loaded.device.create_command_buffer()?;
            self.record_chain(&mut cmd, key)?;
            self.chains.insert(key, cmd);
        }
        Ok(())
    }

    /// Runs one step: `token` is the input (teacher forcing); `None` feeds the previous step's
    /// device-side argmax. The host does nothing but write the token (if any) and submit.
    pub fn step(&mut self, token: Option<u32>) -> Result<StepOutput, SessionError> {
        let position = self.loaded.prepare_step(token)?;
        let parity = self.parity;
        let band = self.band_at(position);
        self.reset_timestamps(0, PoolUser::Single(band, parity))?;
        self.loaded
            .device
            .submit_and_wait(&mut self.single[band][parity], STEP_TIMEOUT)?;
        self.parity = (parity + 1) % self.parities;
        self.add_gpu_time(0)?;
        self.loaded.read_output()
    }

    /// Checks `k` (steps in one submit) and that `n` steps from here fit the KV capacity;
    /// writes `first` as the first step's input if given; returns the first step's position.
    fn check_greedy(&mut self, first: Option<u32>, k: u32, n: u32) -> Result<u32, SessionError> {
        if k == 0 || k > MAX_TOKENS_PER_SUBMIT {
            return Err(SessionError::Vulkan(crate::Error::InvalidArgument(
                format!("tokens per submit must be in 1..={MAX_TOKENS_PER_SUBMIT}, not {k}"),
            )));
        }
        let (position, capacity) = (
            self.loaded.prepare_step(first)?,
            self.loaded.schedule.meta.max_context,
        );
        if u64::from(position) + u64::from(n) > u64::from(capacity) {
            return Err(SessionError::ContextFull {
                position: position.saturating_add(n.saturating_sub(1)),
                capacity,
            });
        }
        Ok(position)
    }

    /// Runs `k` greedy steps in one submit (the first consumes `first` if given, each later one
    /// the previous argmax) and returns every step's output, logits included (each step's
    /// logits are copied out: use [`Self::greedy_tokens`] when only the tokens are needed).
    pub fn steps(&mut self, first: Option<u32>, k: u32) -> Result<Vec<StepOutput>, SessionError> {
        if k > self.logits_slots && k <= MAX_TOKENS_PER_SUBMIT {
            return Err(SessionError::Vulkan(crate::Error::InvalidArgument(
                format!(
                    "{k} steps' logits in one submit take {} bytes, past this device's \
                 maxStorageBufferRange ({} bytes): at most {} steps per submit return their \
                 logits with this vocabulary (greedy tokens alone take up to \
                 {MAX_TOKENS_PER_SUBMIT})",
                    u64::from(k) * self.logits_stride,
                    self.loaded.device.info().max_storage_buffer_range,
                    self.logits_slots
                ),
            )));
        }
        let position = self.check_greedy(first, k, k)?;
        let parity = self.parity;
        let band = self.band_at(position + (k - 1));
        let key = (k, Out::Logits, parity, band);
        self.record_once(key)?;
        self.reset_timestamps(key.1.timestamps(), PoolUser::Chain(key))?;
        let cmd = self.chains.get_mut(&key).expect("recorded above");
        self.loaded.device.submit_and_wait(cmd, STEP_TIMEOUT)?;
        self.parity = (parity + k as usize) % self.parities;
        self.add_gpu_time(0)?;
        let vocab = self.loaded.schedule.meta.vocab_size as usize;
        let encoding = self.loaded.schedule.io.token_encoding;
        (0..u64::from(k))
            .map(|i| {
                let base = i * self.logits_stride;
                let next = self.logits_ring.read_pod::<u32>(base, 1)?[0];
                let logits = self.logits_ring.read_pod::<f32>(base + 256, vocab)?;
                Ok(StepOutput {
                    logits,
                    next_token: encoding.decode(next),
                })
            })
            .collect()
    }

    /// Runs `n` greedy steps (the first consumes `first` if given, each later one the previous
    /// argmax), `k` per submit, and returns only their tokens: no logits cross to the host.
    /// Two chains are in flight at once, so the GPU never idles while the host reads.
    pub fn greedy_tokens(
        &mut self,
        first: Option<u32>,
        n: u32,
        k: u32,
    ) -> Result<Vec<u32>, SessionError> {
        if n == 0 {
            // Not even `first` is consumed.
            return Ok(Vec::new());
        }
        // Fits u32: check_greedy bounds position + n by the capacity.
        let mut position = self.check_greedy(first, k, n)?;
        let mut tokens = Vec::with_capacity(n as usize);
        let mut in_flight: VecDeque<ChainKey> = VecDeque::new();
        let (mut left, mut slot) = (n, 0);
        let result = (|| {
            while left > 0 || !in_flight.is_empty() {
                while in_flight.len() < IN_FLIGHT && left > 0 {
                    let steps = k.min(left);
                    let band = self.band_at(position + (steps - 1));
                    let key = (steps, Out::Tokens(slot), self.parity, band);
                    self.record_once(key)?;
                    // The chain that used this slot's pool last was waited for and read.
                    self.reset_timestamps(key.1.timestamps(), PoolUser::Chain(key))?;
                    let cmd = self.chains.get_mut(&key).expect("recorded above");
                    self.loaded.device.submit(cmd)?;
                    in_flight.push_back(key);
                    self.parity = (self.parity + key.0 as usize) % self.parities;
                    left -= key.0;
                    position += key.0;
                    slot = (slot + 1) % IN_FLIGHT;
                }
                let key = in_flight.pop_front().expect("one is in flight");
                self.chains
                    .get_mut(&key)
                    .expect("submitted above")
                    .wait(STEP_TIMEOUT)?;
                self.add_gpu_time(key.1.timestamps())?;
                let Out::Tokens(s) = key.1 else {
                    unreachable!("token chains only")
                };
                let got = self
                    .token_ring
                    .read_pod::<u32>(s as u64 * TOKEN_SLOT, key.0 as usize)?;
                let encoding = self.loaded.schedule.io.token_encoding;
                tokens.extend(got.into_iter().map(|t| encoding.decode(t)));
            }
            Ok(())
        })();
        if result.is_err() {
            // Nothing may still run when the error is returned.
            for key in in_flight {
                if let Some(cmd) = self.chains.get_mut(&key) {
                    let _ = cmd.wait(STEP_TIMEOUT);
                }
            }
        }
        result.map(|()| tokens)
    }

    /// The dispatches one step records at `parity` on `band`'s grids, in recording order
    /// (what [`Self::record_step`] emits; copies that ping-pong dropped are not there).
    fn step_dispatches(&self, parity: usize, band: usize) -> Vec<StepDispatch> {
        let s = &self.loaded.schedule;
        let position = Schedule::band_position(&self.bands, band);
        s.levels
            .iter()
            .flat_map(|level| level.clone())
            .filter(|&d| self.set_of[parity][d as usize].is_some())
            .map(|d| {
                let disp = &s.dispatches[d as usize];
                let (kernel, groups) = disp.grid_at(position);
                StepDispatch {
                    dispatch: d as usize,
                    grid: disp.grid_index_at(position),
                    kernel,
                    groups: groups.iter().product(),
                }
            })
            .collect()
    }

    /// Runs `n` greedy steps as [`Self::greedy_tokens`] does (`k` per submit), with the
    /// timeline probe's records cleared before them, and returns their tokens and what each
    /// of their dispatches ran when (`compile-model --timeline`; an error for a schedule
    /// without it, or for more than [`TIMELINE_STEPS`] steps).
    pub fn timeline(
        &mut self,
        first: Option<u32>,
        n: u32,
        k: u32,
    ) -> Result<(Vec<u32>, Vec<DispatchRun>), SessionError> {
        let bad = |m: String| SessionError::Vulkan(crate::Error::InvalidArgument(m));
        if self.loaded.timeline().is_none() {
            return Err(bad(
                "the schedule records no timeline: compile it with `compile-model --timeline`"
                    .into(),
            ));
        }
        if n == 0 || n > TIMELINE_STEPS || k == 0 {
            return Err(bad(format!(
                "a timeline covers 1..={TIMELINE_STEPS} steps, not {n}, at least 1 per submit"
            )));
        }
        // The steps as greedy_tokens submits them: chains of k, each on the band of its
        // last step's position.
        let mut position = self.loaded.position()?;
        let mut parity = self.parity;
        let mut steps = Vec::with_capacity(n as usize);
        let mut left = n;
        while left > 0 {
            let chain = k.min(left);
            let band = self.band_at(position + (chain - 1));
            for _ in 0..chain {
                steps.push(self.step_dispatches(parity, band));
                parity = (parity + 1) % self.parities;
            }
            position += chain;
            left -= chain;
        }
        let timeline = self.loaded.timeline().expect("checked above");
        timeline.clear(&self.loaded.device)?;
        let tokens = self.greedy_tokens(first, n, k)?;
        let timeline = self.loaded.timeline().expect("checked above");
        let runs = timeline.read(&self.loaded.device, &steps)?;
        Ok((tokens, runs))
    }

    /// Runs `runs` greedy steps, each in a separate profiling recording with a timestamp after
    /// every dependency level (so the normal recordings carry none), and returns the mean
    /// nanoseconds per level (barrier before it included), or `None` without timestamps.
    pub fn profile_levels(&mut self, runs: u32) -> Result<Option<Vec<f64>>, SessionError> {
        let levels = self.loaded.schedule.levels.len();
        let mut sum = vec![0.0; levels];
        for _ in 0..runs {
            let parity = self.parity;
            let position = self.loaded.prepare_step(None)?;
            let band = self.band_at(position);
            if !self.profiles.contains_key(&(band, parity)) {
                let Some(ts) = self
                    .loaded
                    .device
                    .create_timestamp_pool(levels as u32 + 1)?
                else {
                    return Ok(None);
                };
                let mut cmd = self.loaded.device.create_command_buffer()?;
                let mut rec = cmd.begin()?;
                rec.reset_timestamps(&ts)?;
                rec.write_timestamp(&ts, 0)?;
                self.record_step(&mut rec, parity, band, false, Some(&ts))?;
                rec.barrier(Stages::COMPUTE, Stages::COMPUTE | Stages::HOST);
                rec.finish()?;
                self.profiles.insert((band, parity), (cmd, ts));
            }
            let (cmd, ts) = self
                .profiles
                .get_mut(&(band, parity))
                .expect("recorded above");
            self.loaded.device.submit_and_wait(cmd, STEP_TIMEOUT)?;
            self.parity = (parity + 1) % self.parities;
            for (i, s) in sum.iter_mut().enumerate() {
                *s += ts.elapsed_ns(i as u32, i as u32 + 1)?.unwrap_or(0.0);
            }
        }
        Ok(Some(
            sum.into_iter()
                .map(|s| s / f64::from(runs.max(1)))
                .collect(),
        ))
    }
}
