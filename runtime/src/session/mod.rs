//! Running a schedule: [`Loaded`] creates every Vulkan object once (buffers, weights, pipelines);
//! executors drive it one step at a time. [`Eager`] re-records every token (the baseline);
//! [`Replay`] records once and only submits per token.

mod eager;
pub mod handoff;
pub mod pipeline_cache;
mod replay;
mod step_io;
pub mod timeline;
pub mod writeback;

pub use eager::Eager;
pub use pipeline_cache::{CacheFile, CacheStatus};
pub use replay::{Replay, MAX_TOKENS_PER_SUBMIT};
pub use writeback::WriteBack;

use crate::schedule::{BufferRole, Schedule, ScheduleError, ScheduleFileError};
use crate::{Buffer, BufferKind, Device, Error, Feature, Pipeline, Stages};
use std::borrow::Cow;
use std::time::Duration;

/// How long a step may take before the device is declared hung.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// Where the weight bytes of a schedule come from (a checkpoint, or a schedule file).
pub trait TensorBytes {
    /// The raw little-endian bytes of `tensor`, exactly as the kernels read them: borrowed where
    /// they lie in memory (a memory-mapped file), made on each call where a source derives them
    /// (a conversion to a block format), so that a writer or an upload holds one such tensor at
    /// a time, not a model's worth.
    fn tensor_bytes(&self, tensor: &str) -> std::result::Result<Cow<'_, [u8]>, String>;

    /// How many bytes [`Self::tensor_bytes`] gives for `tensor`, without making them where a
    /// source can tell (the default makes them).
    fn tensor_len(&self, tensor: &str) -> std::result::Result<u64, String> {
        self.tensor_bytes(tensor).map(|b| b.len() as u64)
    }

    /// [`Self::tensor_bytes`] of `tensor`, refused unless they are the `len` bytes a schedule
    /// expects of it.
    fn tensor_bytes_sized(
        &self,
        tensor: &str,
        len: u64,
    ) -> std::result::Result<Cow<'_, [u8]>, String> {
        let bytes = self.tensor_bytes(tensor)?;
        if bytes.len() as u64 != len {
            return Err(format!("{} bytes, the schedule expects {len}", bytes.len()));
        }
        Ok(bytes)
    }
}

/// Why a schedule could not be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The schedule itself is malformed.
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    /// Vulkan failed (out of memory, device lost, timeout, ...).
    #[error(transparent)]
    Vulkan(#[from] Error),
    /// The driver could not build a kernel's pipeline (its SPIR-V damaged past the file's
    /// checksums, or a driver fault): which kernel.
    #[error("kernel {kernel} `{label}`: {source}")]
    Kernel {
        /// The kernel.
        kernel: crate::schedule::KernelId,
        /// Its label.
        label: String,
        /// What the driver said.
        source: Error,
    },
    /// A weight's bytes are missing or of the wrong size.
    #[error("weight `{tensor}`: {message}")]
    Weight {
        /// The tensor.
        tensor: String,
        /// What is wrong.
        message: String,
    },
    /// The sequence would pass the KV capacity the schedule reserved.
    #[error(
        "the context is full: position {position} is past the KV capacity of {capacity} tokens \
         (compile with a larger --max-context)"
    )]
    ContextFull {
        /// The position that was asked for.
        position: u32,
        /// The schedule's max context.
        capacity: u32,
    },
    /// A token id outside the vocabulary.
    #[error("token id {token} is outside the vocabulary of {vocab}")]
    TokenOutOfRange {
        /// The id.
        token: u32,
        /// The vocabulary size.
        vocab: u32,
    },
    /// The schedule file could not be opened, verified or decoded.
    #[error(transparent)]
    File(#[from] ScheduleFileError),
    /// A request the session cannot serve as asked (an option out of range, generating before
    /// any prompt id, an empty prompt).
    #[error("{0}")]
    Request(String),
    /// Ids were fed while greedy tokens computed ahead (several per submit) were still unread:
    /// the KV cache already holds them, so what was fed would not follow the tokens read.
    #[error(
        "{tokens} greedy token(s) were computed ahead of what was read (tokens per submit > 1); \
         read them with generate() or reset() before feeding more ids"
    )]
    RanAhead {
        /// Tokens already in the KV cache but not yet read.
        tokens: usize,
    },
    /// A kernel needs what the device lacks (a feature, or subgroups wide enough): `avoid` is
    /// the compile-model flag whose schedule does without it, where one does (a caller that
    /// compiles the schedule itself, as `vkfuse bench` a model directory, names its own).
    #[error(
        "device {device:?} cannot be used: kernel `{kernel}` needs {needs}{}",
        avoid.map(|flag| format!("; compile the model with `compile-model {flag}`")).unwrap_or_default()
    )]
    KernelNeeds {
        /// The device's name.
        device: String,
        /// The kernel's label.
        kernel: String,
        /// What it needs.
        needs: String,
        /// The compile-model flag that avoids it.
        avoid: Option<&'static str>,
    },
}

/// What one step produced.
#[derive(Clone, Debug)]
pub struct StepOutput {
    /// The logits of the step.
    pub logits: Vec<f32>,
    /// The greedy next token chosen on the device (the next step's input unless overridden).
    pub next_token: u32,
}

/// Progress of the weights' upload (or of a schedule file's write): bytes done of the total.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    /// Bytes uploaded (written) so far.
    pub done: u64,
    /// Bytes to upload (write).
    pub total: u64,
}

/// Options of [`Loaded::load`].
#[derive(Default)]
pub struct LoadOptions<'a> {
    /// Where to keep the driver's compiled pipelines between runs (none: compile every time).
    pub pipeline_cache: Option<CacheFile>,
    /// Called after each weight upload (for a progress display).
    pub progress: Option<&'a mut dyn FnMut(Progress)>,
    /// Whether the schedule's persistent regions run.
    pub persistence: Persistence,
    /// Whether replay hands levels over through flagged words instead of barriers.
    pub handoffs: Handoffs,
    /// The most bytes one weights buffer may hold (`None`: the most the device makes one
    /// buffer); a schedule's weights past it are cut into pages ([`Schedule::with_weight_pages`]).
    pub weight_page_bytes: Option<u64>,
}

/// Whether replay records a level with no pipeline barrier before it where the level before
/// hands its output over through flagged words (`kernels/glsl/handoff.glsl`,
/// [`handoff::plan`]). A waiting consumer only waits on producers that have launched where the
/// driver launches a dispatch's workgroups after every workgroup of the dispatches recorded
/// before it, which Vulkan does not promise: `Auto` turns handoffs on only on NVIDIA, where that
/// was measured to hold and to pay (docs/perf.md, session 14: +7..11% on the H100).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Handoffs {
    /// On for NVIDIA devices, off elsewhere.
    #[default]
    Auto,
    /// On wherever the plan finds a level to hand over (lavapipe runs dispatches one after the
    /// other, so there it changes the barriers and the attention bands' combine, whose highest
    /// split then waits inside its dispatch for the others: what the tests run). Elsewhere than
    /// NVIDIA it relies on the order of launch between dispatches, and for those bands on room
    /// for more of a dispatch's workgroups than heads, which nothing promises
    /// (kernels/glsl/handoff.glsl).
    On,
    /// A barrier between every two levels.
    Off,
}

impl Handoffs {
    /// Whether handoffs run on `info`'s device.
    pub fn enabled(self, info: &crate::AdapterInfo) -> bool {
        const NVIDIA: u32 = 0x10de;
        match self {
            Handoffs::Auto => info.vendor_id == NVIDIA,
            Handoffs::On => true,
            Handoffs::Off => false,
        }
    }
}

impl std::str::FromStr for Handoffs {
    type Err = String;
    /// `auto`, `on` or `off`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Handoffs::Auto),
            "on" => Ok(Handoffs::On),
            "off" => Ok(Handoffs::Off),
            _ => Err(format!("`{s}`: expected auto, on or off")),
        }
    }
}

/// Whether a schedule's persistent regions replace the levels they stand for. Their grid
/// barrier waits for every workgroup of the dispatch, so it needs them all resident at once:
/// more workgroups than the device holds deadlock.
///
/// Off by default: on the H100 the regions measured slower than the levels they replace
/// (docs/perf.md, 2026-11-21: 696 vs 832 tokens/s), so no device turns them on by itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Persistence {
    /// The levels as they are, a pipeline barrier between each.
    #[default]
    Off,
    /// One workgroup per compute unit where the driver reports its units (NVIDIA, AMD); off
    /// elsewhere (lavapipe runs workgroups a few at a time, not all at once).
    Units,
    /// Exactly this many workgroups (at most each region's widest level): tests run regions
    /// with 1 on lavapipe, measurements compare counts. More than one is refused at load on a
    /// device that does not report its compute units (lavapipe).
    Groups(u32),
}

impl Persistence {
    /// The workgroups a region gets on `info`'s device (0: regions off).
    pub fn groups(self, info: &crate::AdapterInfo) -> u32 {
        match self {
            Persistence::Off => 0,
            Persistence::Units => info.compute_units.unwrap_or(0),
            Persistence::Groups(n) => n,
        }
    }
}

impl std::str::FromStr for Persistence {
    type Err = String;
    /// `off`, `units`, or a workgroup count.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(Persistence::Off),
            "units" => Ok(Persistence::Units),
            n => n
                .parse::<u32>()
                .ok()
                .filter(|&n| n > 0)
                .map(Persistence::Groups)
                .ok_or_else(|| format!("`{s}`: expected off, units or a workgroup count > 0")),
        }
    }
}

/// A schedule with every object created: buffers (weights uploaded, state zeroed), pipelines.
pub struct Loaded {
    /// The device everything lives on.
    pub device: Device,
    /// The schedule, validated.
    pub schedule: Schedule,
    /// By `BufferId`.
    pub buffers: Vec<Buffer>,
    /// By `KernelId`.
    pub pipelines: Vec<Pipeline>,
    /// What happened to the pipeline cache file.
    pub pipeline_cache: CacheStatus,
    /// Host memory the step's token (at 0) and logits (at 256) are copied to at its end: the
    /// host reads them here, never from the I/O buffer, which may be device memory.
    output: Buffer,
    /// Replay's handoffs: the plan (empty when they are off on this device) and the words
    /// every pipeline with a handoff role binds (None: no kernel has one).
    handoff_plan: handoff::HandoffPlan,
    handoff_words: Option<crate::HandoffWords>,
    /// The timeline probe's records, where the schedule's kernels write them.
    timeline: Option<timeline::Timeline>,
    /// Under the timeline probe, its pipelines (`Timeline::pipeline_of`): the kernels' with
    /// the records' constants. Empty otherwise.
    probe_pipelines: Vec<Pipeline>,
    /// Whether any persistent region runs (the options asked for them, the schedule offers
    /// them and the device takes them).
    persistent_runs: bool,
}

impl Loaded {
    /// [`Self::load`] without a pipeline cache file or progress display.
    pub fn new(
        device: Device,
        schedule: Schedule,
        weights: &dyn TensorBytes,
    ) -> Result<Loaded, SessionError> {
        Loaded::load(device, schedule, weights, LoadOptions::default())
    }

    /// Validates `schedule`, checks it fits the device, creates its buffers and pipelines,
    /// uploads the weights and zeroes state and I/O.
    pub fn load(
        device: Device,
        schedule: Schedule,
        weights: &dyn TensorBytes,
        mut options: LoadOptions<'_>,
    ) -> Result<Loaded, SessionError> {
        schedule.validate()?;
        // What a kernel needs, and the compile-model flag that avoids it (if any does).
        let needs = [
            (
                schedule.float_atomic_kernel(),
                Feature::BufferFloat32AtomicAdd,
                Some("--no-chain"),
            ),
            (
                schedule.int64_atomic_kernel(),
                Feature::BufferInt64Atomics,
                Some("--no-argmax-in-matvec"),
            ),
            (schedule.shuffle_kernel(), Feature::SubgroupShuffle, None),
            (
                schedule.float16_kernel(),
                Feature::ShaderFloat16,
                Some("--dots f32"),
            ),
            (
                schedule.integer_dot_kernel(),
                Feature::IntegerDotProduct,
                Some("--dots f16"),
            ),
        ];
        for (kernel, feature, avoid) in needs {
            if let Some(k) = kernel.filter(|_| !device.info().supports(feature)) {
                return Err(SessionError::KernelNeeds {
                    device: device.info().name.clone(),
                    kernel: k.label.clone(),
                    needs: feature.to_string(),
                    avoid,
                });
            }
        }
        // The int8 dots' blocks of 32 inputs are staged by 8 neighbouring invocations of one
        // subgroup, which agree on the block's largest by shuffles (fused_chain.glsl's QI_IN).
        let subgroup = device.info().subgroup_size;
        if let Some(k) = schedule.integer_dot_kernel().filter(|_| subgroup < 8) {
            return Err(SessionError::KernelNeeds {
                device: device.info().name.clone(),
                kernel: k.label.clone(),
                needs: format!(
                    "subgroups of 8 or more (it quantises blocks of 32 inputs across 8 \
                     invocations of one), and this device's subgroups hold {subgroup}"
                ),
                avoid: Some("--dots f16"),
            });
        }
        // A grid barrier waits for every workgroup of its dispatch: a device that does not say
        // how many it keeps resident (lavapipe runs a few at a time, one per thread) can hang
        // on more than one, and lavapipe's atomic loads let waiters pass early besides: wrong
        // tokens, silently (docs/perf.md). One workgroup never waits.
        if let Persistence::Groups(n @ 2..) = options.persistence {
            if device.info().compute_units.is_none() && !schedule.persistent.is_empty() {
                return Err(SessionError::Vulkan(Error::UnsupportedDevice {
                    device: device.info().name.clone(),
                    reason: format!(
                        "persistent regions with {n} workgroups need them all resident at \
                         once, and this device does not report its compute units: use \
                         `--persistent off` or 1"
                    ),
                }));
            }
        }
        // Weights past what one buffer may hold here go to more buffers, before the regions
        // (whose dispatches bind them) are applied.
        let info = device.info();
        // 2 MiB under the device's limit: the driver may round a buffer's memory up to a
        // large page.
        let page = options.weight_page_bytes.unwrap_or_else(|| {
            let most = info.max_memory_allocation_size.min(info.max_buffer_size);
            most.saturating_sub(2 << 20) / crate::schedule::PAGE_ALIGN * crate::schedule::PAGE_ALIGN
        });
        let schedule = schedule
            .with_weight_pages(page)
            .map_err(|e| piece_too_large(e, info))?;
        let groups = options.persistence.groups(info);
        let levels = schedule.levels.len();
        let schedule =
            schedule.with_persistent(groups, device.info().max_storage_buffers_per_stage);
        // A region replaces its levels by one.
        let persistent_runs = schedule.levels.len() < levels;
        let total: u64 = schedule.buffers.iter().map(|b| b.size).sum();
        device.check_fits(total)?;
        check_binding_ranges(&schedule, &device)?;
        let mut buffers = Vec::with_capacity(schedule.buffers.len());
        let io_kind = io_buffer_kind();
        for b in &schedule.buffers {
            let kind = if b.role == BufferRole::Io {
                io_kind
            } else {
                BufferKind::DeviceLocal
            };
            buffers.push(device.create_buffer_labeled(&b.label, b.size.max(4), kind)?);
        }
        let mut progress = Progress {
            done: 0,
            total: schedule.weights.iter().map(|w| w.dst.size).sum(),
        };
        for w in &schedule.weights {
            let bytes = weights
                .tensor_bytes_sized(&w.tensor, w.dst.size)
                .map_err(|message| SessionError::Weight {
                    tensor: w.tensor.clone(),
                    message,
                })?;
            device.upload(&mut buffers[w.dst.buffer.index()], w.dst.offset, &bytes)?;
            progress.done += w.dst.size;
            if let Some(report) = options.progress.as_mut() {
                report(progress);
            }
        }
        let handoff_plan = if options.handoffs.enabled(device.info()) {
            handoff::plan(&schedule, &handoff::accesses(&schedule))
        } else {
            handoff::HandoffPlan::default()
        };
        let timeline = timeline::Timeline::new(&device, &schedule, &handoff_plan.handed)?;
        let (pipelines, pipeline_cache) =
            create_pipelines(&device, &schedule, options.pipeline_cache.as_ref())?;
        let mut probe_pipelines = Vec::new();
        if let Some(t) = &timeline {
            for (p, kernel) in t.pipeline_kernels().enumerate() {
                let k = &schedule.kernels[kernel.index()];
                let pipeline = kernel_pipeline(&device, k, None, false, Some((t, p)))
                    .map_err(|source| kernel_error(kernel.index(), k, source))?;
                probe_pipelines.push(pipeline);
            }
        }
        let output = device.create_buffer_labeled(
            "step output",
            256 + schedule.io.logits.size,
            BufferKind::Readback,
        )?;
        let handoff_words = match pipelines.iter().find(|p| p.handoff_role().is_some()) {
            Some(p) => Some(crate::HandoffWords::new(&device, p, handoff_plan.words)?),
            None => None,
        };
        let mut loaded = Loaded {
            device,
            schedule,
            buffers,
            pipelines,
            pipeline_cache,
            output,
            handoff_plan,
            handoff_words,
            timeline,
            probe_pipelines,
            persistent_runs,
        };
        loaded.reset()?;
        Ok(loaded)
    }

    /// Starts a new sequence: state and I/O buffers back to zero (position 0, token 0).
    pub fn reset(&mut self) -> Result<(), SessionError> {
        let mut cmd = self.device.create_command_buffer()?;
        let mut rec = cmd.begin()?;
        for (b, decl) in self.buffers.iter().zip(&self.schedule.buffers) {
            if matches!(decl.role, BufferRole::State | BufferRole::Io) {
                rec.fill_buffer(b, 0, b.size(), 0)?;
            }
        }
        self.record_handoff_fill(&mut rec)?;
        // The fence makes the fills visible to the host only; the next submission's first level
        // has no barrier before it.
        rec.barrier(Stages::TRANSFER, Stages::COMPUTE);
        rec.finish()?;
        self.device.submit_and_wait(&mut cmd, STEP_TIMEOUT)?;
        // A fresh token state holds token 0 in either encoding (the key's is not all zeros).
        self.write_token(0)
    }

    /// Writes `token` as the next step's input, in the schedule's token encoding.
    fn write_token(&mut self, token: u32) -> Result<(), SessionError> {
        let (s, encoding) = (self.schedule.io.token, self.schedule.io.token_encoding);
        let words = encoding.encode(token);
        self.buffers[s.buffer.index()]
            .write_pod(s.offset, &words[..(encoding.bytes() / 4) as usize])?;
        Ok(())
    }

    /// The pipeline dispatch `d` runs at `position`: its grid's kernel's, or under the timeline
    /// probe the probe pipeline that writes the dispatch's records.
    pub fn dispatch_pipeline(&self, d: usize, position: u32) -> &Pipeline {
        let disp = &self.schedule.dispatches[d];
        match &self.timeline {
            Some(t) => &self.probe_pipelines[t.pipeline_of(d, disp.grid_index_at(position))],
            None => &self.pipelines[disp.grid_at(position).0.index()],
        }
    }

    /// The timeline probe's records (`compile-model --timeline`), if the schedule writes any.
    pub fn timeline(&self) -> Option<&timeline::Timeline> {
        self.timeline.as_ref()
    }

    /// Whether any of the schedule's persistent regions runs on this device.
    pub fn persistent_runs(&self) -> bool {
        self.persistent_runs
    }

    /// Replay's handoff plan on this device (no level handed where handoffs are off).
    pub fn handoff_plan(&self) -> &handoff::HandoffPlan {
        &self.handoff_plan
    }

    /// The handoff words every pipeline with a handoff role binds (None: no kernel has one).
    pub fn handoff_words(&self) -> Option<&crate::HandoffWords> {
        self.handoff_words.as_ref()
    }

    /// Binds the handoff words for dispatch `k` of the bound pipeline (when it has a role):
    /// its planned push constants with `handoffs`, else none.
    pub(crate) fn bind_handoff(
        &self,
        rec: &mut crate::CommandRecorder<'_>,
        k: usize,
        handoffs: bool,
    ) -> Result<(), SessionError> {
        if let Some(w) = &self.handoff_words {
            let push = match handoffs {
                true => self.handoff_plan.push[k],
                false => crate::HandoffPush::NONE,
            };
            w.bind(rec, push)?;
        }
        Ok(())
    }

    /// Fills the planned handoff words with [`crate::HANDOFF_EMPTY`] (nothing without a plan):
    /// the step after must not read the last one's words.
    pub(crate) fn record_handoff_fill(
        &self,
        rec: &mut crate::CommandRecorder<'_>,
    ) -> Result<(), SessionError> {
        if let (Some(w), true) = (&self.handoff_words, self.handoff_plan.words > 0) {
            let bytes = 4 * u64::from(self.handoff_plan.words);
            rec.fill_buffer(w.buffer(), 0, bytes, crate::HANDOFF_EMPTY)?;
        }
        Ok(())
    }

    /// The descriptor writes of dispatch `d`: its slices bound at bindings 0.. of set 0.
    pub(crate) fn bindings(&self, d: &crate::schedule::Dispatch) -> Vec<crate::BufferBinding<'_>> {
        d.bindings
            .iter()
            .enumerate()
            .map(|(i, s)| crate::BufferBinding {
                binding: i as u32,
                buffer: &self.buffers[s.buffer.index()],
                offset: s.offset,
                range: s.size,
            })
            .collect()
    }

    fn io_buffer(&self) -> &Buffer {
        &self.buffers[self.schedule.io.token.buffer.index()]
    }

    /// Ends a step's recording: the step's token and logits copied to host memory for
    /// [`Self::read_output`], visible to the host after the fence. (One barrier serves the
    /// copy and the next submission's reads; one more makes the copy visible to the host.)
    pub fn record_output(&self, rec: &mut crate::CommandRecorder<'_>) -> Result<(), SessionError> {
        let io = &self.schedule.io;
        rec.barrier(Stages::COMPUTE, Stages::COMPUTE | Stages::TRANSFER);
        rec.copy_buffer(self.io_buffer(), io.token.offset, &self.output, 0, 4)?;
        rec.copy_buffer(
            self.io_buffer(),
            io.logits.offset,
            &self.output,
            256,
            io.logits.size,
        )?;
        rec.barrier(Stages::TRANSFER, Stages::TRANSFER | Stages::HOST);
        Ok(())
    }

    /// The workgroup size kernel `k`'s pipeline was created with (its specialization constant
    /// 0): chosen at load from the device's subgroup width where the schedule leaves it open
    /// ([`crate::schedule::KernelDecl::subgroups`]), else the compiled one.
    pub fn workgroup_size(&self, k: crate::schedule::KernelId) -> Option<u32> {
        self.pipelines[k.index()].spec_constants().get_u32(0)
    }

    /// The position the next step will run at (read from the device-written I/O buffer).
    pub fn position(&self) -> Result<u32, SessionError> {
        let p = self.schedule.io.position;
        Ok(self.buffers[p.buffer.index()].read_pod::<i32>(p.offset, 1)?[0] as u32)
    }

    /// Checks a step at the current position fits the KV capacity, and writes `token` (when
    /// given) as the step's input; returns that position.
    pub fn prepare_step(&mut self, token: Option<u32>) -> Result<u32, SessionError> {
        let (position, capacity) = (self.position()?, self.schedule.meta.max_context);
        if position >= capacity {
            return Err(SessionError::ContextFull { position, capacity });
        }
        if let Some(t) = token {
            let vocab = self.schedule.meta.vocab_size;
            if t >= vocab {
                return Err(SessionError::TokenOutOfRange { token: t, vocab });
            }
            self.write_token(t)?;
        }
        Ok(position)
    }

    /// The logits and next token of the step that just finished (recorded with
    /// [`Self::record_output`]).
    pub fn read_output(&self) -> Result<StepOutput, SessionError> {
        let vocab = self.schedule.meta.vocab_size as usize;
        let logits = self.output.read_pod::<f32>(256, vocab)?;
        let next = self.output.read_pod::<u32>(0, 1)?[0];
        Ok(StepOutput {
            logits,
            next_token: self.schedule.io.token_encoding.decode(next),
        })
    }
}

/// The error of weights that one buffer cannot hold even cut into pages.
fn piece_too_large(e: crate::schedule::PieceTooLarge, info: &crate::AdapterInfo) -> SessionError {
    let what = match &e.tensors[..] {
        [] => "a range of weights that no tensor fills".to_string(),
        [one] => format!("`{one}`"),
        [first, ..] => format!("`{first}` and {} more tensors", e.tensors.len() - 1),
    };
    SessionError::Vulkan(Error::UnsupportedDevice {
        device: info.name.clone(),
        reason: format!(
            "{what}, read by one binding, take {} bytes, more than one buffer may hold here \
             ({} bytes); `--weights q8_0` or `q4_0`, of compile-model or of run and bench on a \
             model directory, stores most matrices in about half or a quarter of 16-bit \
             floats' bytes",
            e.bytes, e.limit
        ),
    })
}

/// Every binding within what one descriptor may cover (`maxStorageBufferRange`), named before
/// any buffer is made: a KV cache of a long `--max-context` or a large weight matrix would
/// otherwise fail at its descriptor write with the bare limit.
fn check_binding_ranges(schedule: &Schedule, device: &Device) -> Result<(), SessionError> {
    let max = u64::from(device.info().max_storage_buffer_range);
    for d in &schedule.dispatches {
        for (i, s) in d.bindings.iter().enumerate() {
            if s.size <= max {
                continue;
            }
            let buffer = schedule.buffer(s.buffer);
            let fix = match buffer.role {
                BufferRole::State => {
                    ": a KV cache that long needs a smaller compile-model --max-context".into()
                }
                BufferRole::Weights => {
                    // The tensor (or tensors) uploaded where the binding lies.
                    let end = s.offset + s.size;
                    let names: Vec<&str> = schedule
                        .weights
                        .iter()
                        .filter(|w| w.dst.buffer == s.buffer)
                        .filter(|w| w.dst.offset < end && s.offset < w.dst.offset + w.dst.size)
                        .map(|w| w.tensor.as_str())
                        .collect();
                    let what = match names[..] {
                        [] => "that matrix is".to_string(),
                        [one] => format!("`{one}` is"),
                        [first, ..] => {
                            format!("`{first}` and {} more tensors are", names.len() - 1)
                        }
                    };
                    format!(
                        ": {what} too large for this device (`--weights q8_0` or `q4_0`, of \
                         compile-model or of run and bench on a model directory, stores most \
                         matrices in about half or a quarter of 16-bit floats' bytes; an untied \
                         embedding table and vectors stay as stored)"
                    )
                }
                _ => String::new(),
            };
            return Err(SessionError::Vulkan(Error::UnsupportedDevice {
                device: device.info().name.clone(),
                reason: format!(
                    "`{}` binds {} bytes of its {} buffer at binding {i}, more than one binding \
                     may cover here (maxStorageBufferRange {max}){fix}",
                    d.label,
                    s.size,
                    buffer.role.name(),
                ),
            }));
        }
    }
    Ok(())
}

/// The memory of the I/O buffer (token, position, logits), which the step's kernels write and
/// read every token: host-visible device memory where the device offers it (ReBAR; else host
/// memory), so lm_head and argmax do not cross the bus; the host only writes a token and reads
/// the position there (4 bytes), and reads outputs from host memory they are copied to.
/// `VKFUSE_IO_MEMORY=host` puts it in host memory instead (an A/B knob for benchmarks).
fn io_buffer_kind() -> BufferKind {
    match std::env::var("VKFUSE_IO_MEMORY").as_deref() {
        Ok("host") => BufferKind::Readback,
        _ => BufferKind::Upload,
    }
}

/// The pipeline of kernel `k` on `device` (its specialization there:
/// [`crate::schedule::KernelDecl::specialization`]), through `cache` where given, with the
/// driver's statistics kept where asked and offered ([`Pipeline::statistics`]).
pub fn kernel_pipeline(
    device: &Device,
    k: &crate::schedule::KernelDecl,
    cache: Option<&crate::PipelineCache>,
    capture_statistics: bool,
    timeline: Option<(&timeline::Timeline, usize)>,
) -> Result<Pipeline, Error> {
    let mut spec = k.specialization(device.info());
    if let Some((t, p)) = timeline {
        spec = t.specialize(p, spec);
    }
    device.create_pipeline_with(&crate::PipelineDesc {
        label: &k.label,
        spirv: &k.spirv,
        entry_point: "main",
        spec_constants: &spec,
        n_bindings: k.bindings,
        push_constant_bytes: k.push_constant_bytes,
        cache,
        capture_statistics,
    })
}

/// [`SessionError::Kernel`] for kernel `i` of a schedule.
fn kernel_error(i: usize, k: &crate::schedule::KernelDecl, source: Error) -> SessionError {
    SessionError::Kernel {
        kernel: crate::schedule::KernelId(i as u32),
        label: k.label.clone(),
        source,
    }
}

/// Creates the schedule's pipelines, through the cache file when one is given.
fn create_pipelines(
    device: &Device,
    schedule: &Schedule,
    file: Option<&CacheFile>,
) -> Result<(Vec<Pipeline>, CacheStatus), SessionError> {
    use pipeline_cache::DeviceKey;
    let key = DeviceKey::of(device.info());
    let checksum = pipeline_cache::schedule_checksum(schedule);
    let (mut status, initial) = match file {
        None => (CacheStatus::Off, None),
        Some(f) => match f.read(&key, checksum) {
            (Some(path), Ok(Some(data))) => (CacheStatus::Used(path), Some(data)),
            (Some(path), Err(warning)) => (CacheStatus::Ignored { path, warning }, None),
            _ => (CacheStatus::Written(f.primary.clone()), None),
        },
    };
    // A cache the driver refuses is no reason to fail: compile without it.
    let cache = match file {
        None => None,
        Some(_) => match device.create_pipeline_cache(initial.as_deref().unwrap_or(&[])) {
            Ok(c) => Some(c),
            Err(e) => {
                let path = file.map(|f| f.primary.clone()).unwrap_or_default();
                status = CacheStatus::Ignored {
                    path,
                    warning: format!("the driver refused it: {e}"),
                };
                None
            }
        },
    };
    let mut pipelines = Vec::with_capacity(schedule.kernels.len());
    // A timeline probe's kernels built here have no records' address: they record nothing
    // (the dispatches run the probe's pipelines, `Loaded::dispatch_pipeline`).
    for (i, k) in schedule.kernels.iter().enumerate() {
        let pipeline = kernel_pipeline(device, k, cache.as_ref(), false, None)
            .map_err(|source| kernel_error(i, k, source))?;
        pipelines.push(pipeline);
    }
    // Written when the file was missing, stale or damaged (the warning stays reported).
    if let (Some(f), Some(c)) = (file, &cache) {
        if !matches!(status, CacheStatus::Used(_)) {
            let written = c
                .data()
                .map_err(|e| e.to_string())
                .and_then(|data| f.write(&key, checksum, &data));
            match (written, &status) {
                (Ok(path), CacheStatus::Written(_)) => status = CacheStatus::Written(path),
                // The file that could not be read was not replaced either (a folder, say):
                // the warning says where the cache went instead.
                (
                    Ok(path),
                    CacheStatus::Ignored {
                        path: unread,
                        warning,
                    },
                ) if path != *unread => {
                    status = CacheStatus::Ignored {
                        path: unread.clone(),
                        warning: format!("{warning}; written to {} instead", path.display()),
                    }
                }
                (Ok(_), _) => {}
                (Err(warning), _) => {
                    status = CacheStatus::Ignored {
                        path: f.primary.clone(),
                        warning,
                    }
                }
            }
        }
    }
    Ok((pipelines, status))
}
