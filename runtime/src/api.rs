//! The embedding API: a schedule file in, greedy tokens out, in a few calls.
//!
//! A [`Session`] is a compiled model loaded on one device with one executor: it feeds prompt
//! ids ([`Session::feed`], teacher forcing, one step per id), streams greedy tokens
//! ([`Session::generate`], an iterator; the device picks each token, the host only submits)
//! and reports what the host asked of the GPU ([`Session::counters`]). It is a thin layer over
//! [`Loaded`], [`Replay`] and [`Eager`], which remain available for finer control.
//!
//! ```no_run
//! use vkfuse_runtime::{Session, SessionOptions};
//!
//! # fn main() -> Result<(), vkfuse_runtime::SessionError> {
//! // A schedule file from `compile-model MODEL -o qwen3.vkf`; replay on the best device.
//! let mut session = Session::open("qwen3.vkf", &SessionOptions::default())?;
//! let last = session.feed(&[1, 2, 3])?; // the prompt, one step per id
//! println!("logits after the prompt: {} values", last.logits.len());
//! for id in session.generate(16).stop_at_eos() {
//!     print!("{} ", id?); // as soon as the device has produced it
//! }
//! let per = session.counters().per_token().expect("tokens were run");
//! println!("\n{:.1} host µs, {} submits per token", per.host_us_per_token, per.submits_per_token);
//! # Ok(()) }
//! ```
//!
//! Text in and out is the caller's: the schedule carries the model's `tokenizer.json`
//! ([`Session::tokenizer_json`]) for a tokenizer library to load (`vkfuse generate` uses the
//! `tokenizers` crate). A runnable program: `runtime/examples/embed.rs`.

use std::collections::VecDeque;
use std::path::Path;
use std::time::Instant;

use crate::schedule::{ModelMeta, Schedule, ScheduleFile};
use crate::session::pipeline_cache;
use crate::session::{
    CacheFile, CacheStatus, Eager, LoadOptions, Loaded, Persistence, Replay, SessionError,
    StepOutput, TensorBytes, MAX_TOKENS_PER_SUBMIT,
};
use crate::{Counters, Device, Handoffs, Instance, InstanceOptions, Requirements};

/// The device `options` names, with the validation layer if asked for.
fn open_device(options: &SessionOptions) -> Result<Device, SessionError> {
    let instance = Instance::new(&InstanceOptions {
        validation: options.validation,
        ..InstanceOptions::default()
    })?;
    let adapter = instance.choose_adapter(options.device.as_ref())?;
    Ok(Device::new(&instance, &adapter, &Requirements::kernels())?)
}

/// Which executor runs the decode step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Backend {
    /// Descriptors written and the step recorded once; per token only a submit (the default).
    #[default]
    Replay,
    /// Re-recorded every token with a descriptor write per binding and a barrier after every
    /// dispatch: the baseline speed claims are measured against.
    Eager,
}

/// How to open a [`Session`].
#[derive(Clone, Debug)]
pub struct SessionOptions {
    /// The Vulkan device, by index (as `vkfuse devices` lists them) or part of its name (errors
    /// name it `--device`, the CLI's flag); `None`: `VKFUSE_DEVICE`, else the first discrete
    /// GPU, then integrated, then CPU.
    pub device: Option<crate::DeviceChoice>,
    /// The executor.
    pub backend: Backend,
    /// Greedy steps chained on the device in one submit (replay only), 1 to
    /// [`MAX_TOKENS_PER_SUBMIT`]. With more than 1, [`Session::generate`] may compute up to
    /// this many tokens minus one ahead of what was read (see there).
    pub tokens_per_submit: u32,
    /// Turn the Vulkan validation layer on (also on with `VKFUSE_VALIDATION=1`).
    pub validation: bool,
    /// Keep the driver's compiled pipelines in a file beside the schedule (or in the user's
    /// cache folder) so the next [`Session::open`] of it skips shader compilation.
    pub pipeline_cache: bool,
    /// Whether the schedule's persistent regions run (off by default: slower on the H100).
    pub persistence: Persistence,
    /// Whether replay hands levels over through flagged words instead of barriers ([`Handoffs`]).
    pub handoffs: Handoffs,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            device: None,
            backend: Backend::Replay,
            tokens_per_submit: 1,
            validation: false,
            pipeline_cache: true,
            persistence: Persistence::Off,
            handoffs: Handoffs::Auto,
        }
    }
}

impl SessionOptions {
    /// The options' own consistency, checked before anything is opened.
    fn check(&self) -> Result<(), SessionError> {
        let k = self.tokens_per_submit;
        if k == 0 || k > MAX_TOKENS_PER_SUBMIT {
            return Err(SessionError::Request(format!(
                "tokens per submit must be in 1..={MAX_TOKENS_PER_SUBMIT}, not {k}"
            )));
        }
        if k > 1 && self.backend != Backend::Replay {
            return Err(SessionError::Request(
                "tokens per submit > 1 chains steps on the device: it needs the replay backend"
                    .into(),
            ));
        }
        Ok(())
    }
}

enum Executor {
    Replay(Replay),
    Eager(Eager),
}

impl Executor {
    fn loaded(&self) -> &Loaded {
        match self {
            Executor::Replay(r) => r.loaded(),
            Executor::Eager(e) => e.loaded(),
        }
    }
}

/// A compiled model on a device, ready to decode. See the [module docs](self).
pub struct Session {
    exec: Executor,
    tokens_per_submit: u32,
    /// Device counters when the session was ready: everything done once is before it.
    start: Counters,
    /// Steps run and the wall time spent in them.
    steps: u64,
    wall_ns: u64,
    /// The executor's GPU time before the counters' start (a warm-up step's).
    gpu_before: f64,
    /// Greedy tokens computed but not yet read, oldest first. The last is the device's next
    /// input (not yet in the KV cache); any before it were computed ahead and are.
    pending: VecDeque<u32>,
    /// Whether a step has run in this sequence (generation continues from one).
    started: bool,
}

impl Session {
    /// Opens the schedule file at `path` (every check of [`ScheduleFile::open`]), opens the
    /// device `options` names and loads the schedule on it: buffers, weights, pipelines,
    /// descriptors and recordings are created here, once.
    pub fn open(path: impl AsRef<Path>, options: &SessionOptions) -> Result<Session, SessionError> {
        options.check()?;
        let path = path.as_ref();
        let (schedule, weights) = ScheduleFile::open(path)?.into_parts();
        let cache = options
            .pipeline_cache
            .then(|| CacheFile::beside(path, pipeline_cache::schedule_checksum(&schedule)));
        let device = open_device(options)?;
        Session::start(
            device,
            schedule,
            &weights,
            options,
            LoadOptions {
                pipeline_cache: cache,
                progress: None,
                persistence: options.persistence,
                handoffs: options.handoffs,
                ..LoadOptions::default()
            },
        )
    }

    /// [`Self::open`] for a schedule in memory (e.g. compiled by `vkfuse-compiler` without a
    /// file) and its weights; its pipeline cache goes to the user's cache folder.
    pub fn load(
        schedule: Schedule,
        weights: &dyn TensorBytes,
        options: &SessionOptions,
    ) -> Result<Session, SessionError> {
        options.check()?;
        let cache = options
            .pipeline_cache
            .then(|| CacheFile::in_user_cache(pipeline_cache::schedule_checksum(&schedule)))
            .flatten();
        let device = open_device(options)?;
        Session::start(
            device,
            schedule,
            weights,
            options,
            LoadOptions {
                pipeline_cache: cache,
                progress: None,
                persistence: options.persistence,
                handoffs: options.handoffs,
                ..LoadOptions::default()
            },
        )
    }

    /// [`Self::load`] with the pipeline cache file given (`load.pipeline_cache`, `None`: none,
    /// whatever `options.pipeline_cache` says) and a weight-upload progress callback
    /// (`load.progress`, called after each tensor: large models take seconds to upload).
    pub fn load_with(
        schedule: Schedule,
        weights: &dyn TensorBytes,
        options: &SessionOptions,
        load: LoadOptions<'_>,
    ) -> Result<Session, SessionError> {
        options.check()?;
        let device = open_device(options)?;
        let load = LoadOptions {
            persistence: options.persistence,
            handoffs: options.handoffs,
            ..load
        };
        Session::start(device, schedule, weights, options, load)
    }

    /// [`Self::load`] on a device the caller opened (`options.device` and
    /// `options.validation` are not used; no pipeline cache file).
    pub fn on_device(
        device: Device,
        schedule: Schedule,
        weights: &dyn TensorBytes,
        options: &SessionOptions,
    ) -> Result<Session, SessionError> {
        options.check()?;
        let load = LoadOptions {
            persistence: options.persistence,
            handoffs: options.handoffs,
            ..LoadOptions::default()
        };
        Session::start(device, schedule, weights, options, load)
    }

    fn start(
        device: Device,
        schedule: Schedule,
        weights: &dyn TensorBytes,
        options: &SessionOptions,
        load: LoadOptions<'_>,
    ) -> Result<Session, SessionError> {
        let k = options.tokens_per_submit;
        let loaded = Loaded::load(device, schedule, weights, load)?;
        let exec = match options.backend {
            Backend::Replay => {
                let mut replay = Replay::new(loaded)?;
                if k > 1 {
                    replay.prepare(k)?;
                }
                Executor::Replay(replay)
            }
            Backend::Eager => Executor::Eager(Eager::new(loaded)?),
        };
        let start = exec.loaded().device.counters();
        Ok(Session {
            exec,
            tokens_per_submit: k,
            start,
            steps: 0,
            wall_ns: 0,
            gpu_before: 0.0,
            pending: VecDeque::new(),
            started: false,
        })
    }

    /// What happened to the pipeline cache file at load (used, written, or ignored with a
    /// warning to show).
    pub fn pipeline_cache(&self) -> &CacheStatus {
        &self.exec.loaded().pipeline_cache
    }

    /// The model's facts: architecture, vocabulary size, KV capacity, EOS ids, tokenizer.
    pub fn meta(&self) -> &ModelMeta {
        &self.exec.loaded().schedule.meta
    }

    /// The model's `tokenizer.json` as the schedule recorded it, if it has one.
    pub fn tokenizer_json(&self) -> Option<&str> {
        self.meta().tokenizer.as_deref()
    }

    /// The device the session runs on (its [`Device::validation_log`], its name).
    pub fn device(&self) -> &Device {
        &self.exec.loaded().device
    }

    /// Whether any of the schedule's persistent regions runs on this device.
    pub fn persistent_runs(&self) -> bool {
        self.exec.loaded().persistent_runs()
    }

    /// The executor.
    pub fn backend(&self) -> Backend {
        match self.exec {
            Executor::Replay(_) => Backend::Replay,
            Executor::Eager(_) => Backend::Eager,
        }
    }

    /// Tokens in the KV cache: the position the next step runs at.
    pub fn position(&self) -> Result<u32, SessionError> {
        self.exec.loaded().position()
    }

    /// Feeds `ids` one step each (teacher forcing) and returns the last step's output: its
    /// logits and the greedy next token, which [`Self::generate`] yields first. Feeding after
    /// a generation continues the sequence (the unread greedy token is dropped); a host-side
    /// sampler feeds its pick one id at a time.
    ///
    /// Errors: an empty `ids`, an id outside the vocabulary, a full context, or unread tokens
    /// computed ahead ([`SessionError::RanAhead`]). Nothing is run when the context cannot
    /// hold all of `ids`.
    ///
    /// ```no_run
    /// # use vkfuse_runtime::{Session, SessionOptions};
    /// # fn main() -> Result<(), vkfuse_runtime::SessionError> {
    /// # let mut session = Session::open("qwen3.vkf", &SessionOptions::default())?;
    /// // A host-side sampler: pick from the logits, feed the pick, repeat.
    /// let pick = |logits: &[f32]| {
    ///     let best = logits.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1));
    ///     best.map_or(0, |(i, _)| i as u32)
    /// };
    /// let mut out = session.feed(&[1, 2, 3])?;
    /// for _ in 0..8 {
    ///     let id = pick(&out.logits);
    ///     out = session.feed(&[id])?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn feed(&mut self, ids: &[u32]) -> Result<StepOutput, SessionError> {
        let Some((&last, _)) = ids.split_last() else {
            return Err(SessionError::Request("feed needs at least one id".into()));
        };
        if self.pending.len() > 1 {
            return Err(SessionError::RanAhead {
                tokens: self.pending.len() - 1,
            });
        }
        let meta = self.meta();
        let (vocab, capacity) = (meta.vocab_size, meta.max_context);
        if let Some(&token) = ids.iter().find(|&&t| t >= vocab) {
            return Err(SessionError::TokenOutOfRange { token, vocab });
        }
        let position = self.position()?;
        if u64::from(position) + ids.len() as u64 > u64::from(capacity) {
            return Err(SessionError::ContextFull {
                position: position.saturating_add(ids.len() as u32 - 1),
                capacity,
            });
        }
        self.pending.clear();
        for &id in &ids[..ids.len() - 1] {
            self.run_step(Some(id))?;
        }
        let out = self.run_step(Some(last))?;
        self.pending.push_back(out.next_token);
        self.started = true;
        Ok(out)
    }

    /// Up to `n` greedy tokens, each yielded as soon as it is read back. The first is the one
    /// the last fed id produced (no step is run for it); each later one costs one step, and
    /// with `tokens_per_submit` K, one submit per K steps. Dropping the iterator early stops
    /// decoding; [`Generate::stop_at_eos`] ends after an EOS id.
    ///
    /// With K > 1, a chain is never longer than the tokens still asked for, so
    /// `generate(n)` runs exactly the steps it yields; but one cut short (`stop_at_eos`, a
    /// `break`) leaves up to K − 1 tokens computed ahead: the next `generate` yields them
    /// first, and [`Self::feed`] refuses to run until they are read or the session is
    /// [`reset`](Self::reset).
    pub fn generate(&mut self, n: usize) -> Generate<'_> {
        Generate {
            session: self,
            left: n,
            stop_at_eos: false,
            done: false,
        }
    }

    /// Runs one step (on token 0) and starts a new sequence, the counters starting after it:
    /// what only a first step costs (lavapipe compiles each shader on its first use) is paid
    /// here rather than in the first tokens a caller times. Refused once a sequence has
    /// started, since it resets it.
    pub fn warm_up(&mut self) -> Result<(), SessionError> {
        if self.started || self.position()? != 0 {
            return Err(SessionError::Request(
                "warm_up runs before the first feed: it resets the sequence".into(),
            ));
        }
        self.run_step(Some(0))?;
        self.reset()?;
        self.start = self.device().counters();
        self.steps = 0;
        self.wall_ns = 0;
        self.gpu_before = match &self.exec {
            Executor::Replay(r) => r.gpu_ns(),
            Executor::Eager(e) => e.gpu_ns(),
        }
        .unwrap_or(0.0);
        Ok(())
    }

    /// Starts a new sequence: position 0, state zeroed, nothing pending. Counters go on.
    pub fn reset(&mut self) -> Result<(), SessionError> {
        match &mut self.exec {
            Executor::Replay(r) => r.reset()?,
            Executor::Eager(e) => e.reset()?,
        }
        self.pending.clear();
        self.started = false;
        Ok(())
    }

    /// What the session asked of the GPU since it opened (loading excluded): the device's
    /// counts (every session on the same device adds to them), `tokens` = steps run,
    /// `wall_ns` = wall time inside those steps, `gpu_ns` where the device has timestamps.
    /// [`Counters::per_token`] gives the per-token figures `vkfuse run --json` prints.
    pub fn counters(&self) -> Counters {
        let mut c = self.device().counters().since(&self.start);
        c.gpu_ns = match &self.exec {
            Executor::Replay(r) => r.gpu_ns(),
            Executor::Eager(e) => e.gpu_ns(),
        }
        .map(|ns| (ns - self.gpu_before) as u64);
        c.tokens = self.steps;
        c.wall_ns = self.wall_ns;
        c
    }

    fn run_step(&mut self, token: Option<u32>) -> Result<StepOutput, SessionError> {
        let t0 = Instant::now();
        let out = match &mut self.exec {
            Executor::Replay(r) => r.step(token),
            Executor::Eager(e) => e.step(token),
        };
        self.wall_ns += t0.elapsed().as_nanos() as u64;
        self.steps += 1;
        out
    }

    /// The next greedy token, running up to `horizon` chained steps when none is pending.
    fn next_greedy(&mut self, horizon: usize) -> Result<u32, SessionError> {
        if let Some(t) = self.pending.pop_front() {
            return Ok(t);
        }
        if !self.started {
            return Err(SessionError::Request(
                "generate continues a sequence: feed at least one prompt id first".into(),
            ));
        }
        // The device's token buffer holds the last token read: the next step's input.
        let room = self
            .meta()
            .max_context
            .saturating_sub(self.position()?)
            .max(1);
        let k = (self.tokens_per_submit as usize)
            .min(horizon)
            .min(room as usize) as u32;
        match &mut self.exec {
            Executor::Replay(r) if k > 1 => {
                let t0 = Instant::now();
                // Greedy tokens only: no logits cross to the host.
                let tokens = r.greedy_tokens(None, k, k);
                self.wall_ns += t0.elapsed().as_nanos() as u64;
                self.pending.extend(tokens?);
                self.steps += u64::from(k);
            }
            _ => {
                let out = self.run_step(None)?;
                self.pending.push_back(out.next_token);
            }
        }
        Ok(self.pending.pop_front().expect("a step produced a token"))
    }
}

/// Greedy tokens from [`Session::generate`], streamed as the device produces them.
pub struct Generate<'s> {
    session: &'s mut Session,
    left: usize,
    stop_at_eos: bool,
    done: bool,
}

impl Generate<'_> {
    /// End after yielding an id of the model's [`ModelMeta::eos_token_ids`].
    pub fn stop_at_eos(mut self) -> Self {
        self.stop_at_eos = true;
        self
    }

    /// The session, to read its counters or position between tokens.
    pub fn session(&self) -> &Session {
        self.session
    }
}

impl Iterator for Generate<'_> {
    type Item = Result<u32, SessionError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done || self.left == 0 {
            return None;
        }
        match self.session.next_greedy(self.left) {
            Ok(id) => {
                self.left -= 1;
                if self.stop_at_eos && self.session.meta().eos_token_ids.contains(&id) {
                    self.done = true;
                }
                Some(Ok(id))
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        if self.done {
            (0, Some(0))
        } else {
            (0, Some(self.left))
        }
    }
}
