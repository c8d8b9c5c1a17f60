//! `vkfuse run`: teacher-force the prompt, then decode greedily, with any backend.

use crate::metrics::RunReport;
use crate::upload::UploadDisplay;
use crate::{Backend, RunArgs};
use anyhow::{bail, Context, Result};
use std::io::Write;
use std::time::Instant;
use vkfuse_compiler::import::Model;
use vkfuse_compiler::ir::Program;
use vkfuse_compiler::lower::{self, SpirvCache};
use vkfuse_compiler::npy::{self, Array2};
use vkfuse_compiler::quant::EncodedWeights;
use vkfuse_compiler::reference::Reference;
use vkfuse_compiler::trace;
use vkfuse_runtime::schedule::{Schedule, ScheduleFile};
use vkfuse_runtime::session::{
    pipeline_cache, CacheFile, Eager, LoadOptions, Loaded, Replay, TensorBytes,
};
use vkfuse_runtime::DeviceChoice;
use vkfuse_runtime::{
    AdapterInfo, Counters, Device, Handoffs, Instance, InstanceOptions, Persistence, Requirements,
};

/// What a decode loop needs from a backend.
trait Engine {
    /// One step: `token` is the input (teacher forcing) or `None` for the device's argmax.
    fn step(&mut self, token: Option<u32>) -> Result<(Vec<f32>, u32)>;
    /// `k` greedy steps (one submit where the backend can chain them).
    fn steps(&mut self, k: u32) -> Result<Vec<(Vec<f32>, u32)>> {
        (0..k).map(|_| self.step(None)).collect()
    }
    /// `n` greedy tokens, `k` steps per submit, without their logits (which then need not
    /// leave the device); the first step consumes `first` where given.
    fn greedy_tokens(&mut self, first: Option<u32>, n: usize, k: u32) -> Result<Vec<u32>> {
        let mut ids = Vec::with_capacity(n);
        if let (Some(t), true) = (first, n > 0) {
            ids.push(self.step(Some(t))?.1);
        }
        while ids.len() < n {
            let k = k.min((n - ids.len()) as u32);
            ids.extend(self.steps(k)?.into_iter().map(|(_, t)| t));
        }
        Ok(ids)
    }
    /// Counters since the engine was opened or warmed up (zero for the reference).
    fn counters(&self) -> Counters {
        Counters::default()
    }
    /// One step that is then forgotten (the sequence starts again), so that what a device
    /// does on a pipeline's first use is not timed: lavapipe compiles its shaders then, about
    /// 20 times a warm step on the fixtures. Counters start after it. The reference has
    /// nothing to warm.
    fn warm_up(&mut self) -> Result<()> {
        Ok(())
    }
}

impl Engine for Reference<'_> {
    fn step(&mut self, token: Option<u32>) -> Result<(Vec<f32>, u32)> {
        let out = Reference::step(self, token)?;
        Ok((out.logits, out.next_token as u32))
    }
}

struct EagerEngine {
    eager: Eager,
    start: Counters,
    /// GPU time before the counters' start (the warm-up's).
    gpu_before: f64,
}

impl Engine for EagerEngine {
    fn step(&mut self, token: Option<u32>) -> Result<(Vec<f32>, u32)> {
        let out = self.eager.step(token)?;
        Ok((out.logits, out.next_token))
    }
    fn counters(&self) -> Counters {
        let mut c = self.eager.loaded().device.counters().since(&self.start);
        c.gpu_ns = self.eager.gpu_ns().map(|ns| (ns - self.gpu_before) as u64);
        c
    }
    fn warm_up(&mut self) -> Result<()> {
        self.eager.step(Some(0))?;
        self.eager.reset()?;
        self.start = self.eager.loaded().device.counters();
        self.gpu_before = self.eager.gpu_ns().unwrap_or(0.0);
        Ok(())
    }
}

struct ReplayEngine {
    replay: Replay,
    start: Counters,
    /// GPU time before the counters' start (the warm-up's).
    gpu_before: f64,
}

impl Engine for ReplayEngine {
    fn step(&mut self, token: Option<u32>) -> Result<(Vec<f32>, u32)> {
        let out = self.replay.step(token)?;
        Ok((out.logits, out.next_token))
    }
    fn steps(&mut self, k: u32) -> Result<Vec<(Vec<f32>, u32)>> {
        Ok(self
            .replay
            .steps(None, k)?
            .into_iter()
            .map(|o| (o.logits, o.next_token))
            .collect())
    }
    fn greedy_tokens(&mut self, first: Option<u32>, n: usize, k: u32) -> Result<Vec<u32>> {
        Ok(self.replay.greedy_tokens(first, n as u32, k)?)
    }
    fn counters(&self) -> Counters {
        let mut c = self.replay.loaded().device.counters().since(&self.start);
        c.gpu_ns = self.replay.gpu_ns().map(|ns| (ns - self.gpu_before) as u64);
        c
    }
    fn warm_up(&mut self) -> Result<()> {
        // A chained step: the step's kernels and the runtime's own (step_io), which a step
        // the host reads alone does not run.
        self.replay.greedy_tokens(Some(0), 1, 1)?;
        self.replay.reset()?;
        self.start = self.replay.loaded().device.counters();
        self.gpu_before = self.replay.gpu_ns().unwrap_or(0.0);
        Ok(())
    }
}

/// The note for `--persistent` (not off) where no region runs: the schedule offers none
/// (`regions` 0: a model directory's, compiled in memory unfused, never does), the device does
/// not report its compute units (`--persistent units`), or the regions bind more storage
/// buffers than the device allows a kernel.
pub fn no_region_note(
    regions: usize,
    from_directory: bool,
    persistence: Persistence,
    device: &AdapterInfo,
) {
    let why = if regions == 0 && from_directory {
        "a model directory is compiled in memory unfused, without regions (compile it with \
         compile-model, which offers them over runs of matvec levels, and run the file)"
            .to_string()
    } else if regions == 0 {
        "the schedule offers none (compile-model offers them over runs of f16 or bf16 matvec \
         levels: q8_0 and q4_0 weights leave none, nor does a chained MLP, which --no-chain \
         turns off)"
            .to_string()
    } else if persistence == Persistence::Units && device.compute_units.is_none() {
        format!(
            "the driver of {} does not report its compute units, which `--persistent units` \
             needs to be sure that every workgroup of a region runs at once (`vkfuse \
             calibrate` guesses a count for the cost model only); `--persistent 1` runs them \
             with one workgroup, and more are refused on such a device",
            device.name
        )
    } else {
        format!(
            "its regions bind more storage buffers than {} allows a kernel ({})",
            device.name, device.max_storage_buffers_per_stage
        )
    };
    eprintln!("note: --persistent: no persistent region runs: {why}");
}

/// Opens a Vulkan device (`--device`, else `VKFUSE_DEVICE`, else the best one) with what the
/// kernels need, as the embedding API's `Session` does.
pub fn open_device(choice: Option<&DeviceChoice>) -> Result<Device> {
    let instance = Instance::new(&InstanceOptions::default())?;
    let adapter = instance.choose_adapter(choice)?;
    Ok(Device::new(&instance, &adapter, &Requirements::kernels())?)
}

/// How `vkfuse run` executes: the backend, the device and replay's options.
struct EngineChoice<'a> {
    backend: Backend,
    device: Option<&'a DeviceChoice>,
    /// Tokens per submit to record ahead (replay).
    chains: &'a [u32],
    persistence: Persistence,
    handoffs: Handoffs,
    /// Whether the chains return their logits (`--logits-out`).
    logits: bool,
}

/// Loads `schedule` and opens the Vulkan executor `choice.backend` on it. Counting starts after
/// everything done once (loading, recording, descriptor writes), so the figures are per token.
fn vulkan_engine(
    choice: &EngineChoice,
    schedule: Schedule,
    weights: &dyn TensorBytes,
    pipeline_cache: Option<CacheFile>,
    from_directory: bool,
) -> Result<Box<dyn Engine>> {
    let EngineChoice {
        backend,
        device,
        chains,
        persistence,
        handoffs,
        logits,
    } = *choice;
    let device = open_device(device)?;
    let mut upload = UploadDisplay::new();
    let options = LoadOptions {
        pipeline_cache,
        progress: Some(&mut |p| upload.update(p)),
        persistence,
        handoffs,
        ..LoadOptions::default()
    };
    let regions = schedule.persistent.len();
    let loaded = Loaded::load(device.clone(), schedule, weights, options)
        .context("loading the schedule on the device")?;
    // Asked for regions that do not run: say why rather than run as `off` in silence.
    if persistence != Persistence::Off && !loaded.persistent_runs() {
        no_region_note(regions, from_directory, persistence, device.info());
    }
    if let Some(w) = loaded.pipeline_cache.warning() {
        eprintln!("{w}");
    }
    if handoffs == Handoffs::On && backend == Backend::Eager {
        eprintln!(
            "note: --handoffs on: eager puts a barrier after every dispatch; handoffs are replay's"
        );
    }
    Ok(match backend {
        Backend::Eager => {
            let eager = Eager::new(loaded)?;
            Box::new(EagerEngine {
                eager,
                start: device.counters(),
                gpu_before: 0.0,
            })
        }
        _ => {
            let mut replay = Replay::new(loaded)?;
            let most = replay.logits_steps();
            if let Some(&k) = chains.iter().find(|&&k| logits && k > most) {
                bail!(
                    "--tokens-per-submit {k} with --logits-out: one submit returns the logits of \
                     at most {most} steps with this vocabulary on this device (its \
                     maxStorageBufferRange)"
                );
            }
            for &k in chains {
                replay.prepare(k)?;
            }
            // Asked for handoffs that do not run: say why rather than run with barriers in
            // silence.
            if handoffs == Handoffs::On && replay.handed_levels() == 0 {
                let why = if replay.loaded().handoff_plan().handed_levels() == 0 {
                    "no level of this schedule has one reader of what one kernel of the level \
                     before publishes (`vkfuse inspect` lists the levels)"
                } else {
                    "ping-pong write-back keeps its barriers"
                };
                eprintln!("note: --handoffs on: no level is handed over: {why}");
            }
            Box::new(ReplayEngine {
                replay,
                start: device.counters(),
                gpu_before: 0.0,
            })
        }
    })
}

/// What `vkfuse run` decodes with: a model directory (compiled in memory) or a schedule file.
enum Source {
    Model {
        model: Box<Model>,
        program: Program,
        capacity: usize,
    },
    File(Box<ScheduleFile>),
}

impl Source {
    fn open(args: &RunArgs) -> Result<Source> {
        if args.model.is_file() {
            args.run.check_file()?;
            if args.max_context.is_some() {
                bail!("--max-context is fixed when the schedule is compiled (compile-model --max-context)");
            }
            return Ok(Source::File(Box::new(crate::options::open_to_decode(
                &args.model,
            )?)));
        }
        args.run.check_unfused()?;
        let model = crate::options::load_model(&args.model)?;
        let opts = trace::TraceOptions {
            max_context: args.max_context,
            ..Default::default()
        };
        let program = args.run.program(&model, &opts)?;
        let capacity = trace::max_context(&model, &opts)?;
        Ok(Source::Model {
            model: Box::new(model),
            program,
            capacity,
        })
    }

    fn vocab_and_capacity(&self) -> (usize, usize) {
        match self {
            Source::Model {
                model, capacity, ..
            } => (model.config.vocab_size, *capacity),
            Source::File(f) => (
                f.schedule().meta.vocab_size as usize,
                f.schedule().meta.max_context as usize,
            ),
        }
    }

    fn engine(&self, choice: &EngineChoice) -> Result<Box<dyn Engine + '_>> {
        Ok(match (self, choice.backend) {
            (Source::Model { model, program, .. }, Backend::Reference) => Box::new(
                Reference::try_owning(program, EncodedWeights::new(&model.tensors, program)?)?,
            ),
            (Source::Model { model, program, .. }, _) => {
                let meta = lower::Meta::of(model);
                let schedule = lower::lower(program, &meta, &mut SpirvCache::default())
                    .context("lowering the trace")?;
                let weights = EncodedWeights::new(&model.tensors, program)?;
                vulkan_engine(choice, schedule, &weights, None, true)?
            }
            (Source::File(_), Backend::Reference) => {
                bail!("the reference backend interprets the trace: give it the model directory, not a schedule file")
            }
            (Source::File(f), _) => {
                let schedule = f.schedule().clone();
                let cache =
                    CacheFile::beside(f.path(), pipeline_cache::schedule_checksum(&schedule));
                vulkan_engine(choice, schedule, f.weights(), Some(cache), false)
                    .with_context(|| f.path().display().to_string())?
            }
        })
    }
}

/// The positions a run of `prompt` ids and `max_new_tokens` fills, refused past the KV
/// capacity with where to raise it: a schedule file's capacity was fixed by compile-model.
pub fn positions(
    prompt: usize,
    max_new_tokens: usize,
    capacity: usize,
    schedule_file: bool,
) -> Result<usize> {
    let steps = prompt.saturating_add(max_new_tokens.saturating_sub(1));
    if steps > capacity {
        bail!(
            "{prompt} prompt id{} + {max_new_tokens} new token{} need {steps} positions, more \
             than the KV capacity of {capacity} ({})",
            if prompt == 1 { "" } else { "s" },
            if max_new_tokens == 1 { "" } else { "s" },
            if schedule_file {
                "compile-model --max-context"
            } else {
                "raise --max-context"
            }
        );
    }
    Ok(steps)
}

pub fn run(args: &RunArgs) -> Result<()> {
    if args.ids.is_empty() {
        bail!("--ids needs at least one token id");
    }
    if let Some(path) = &args.logits_out {
        crate::options::check_out_folder("--logits-out", path)?;
    }
    let source = Source::open(args)?;
    let (vocab, capacity) = source.vocab_and_capacity();
    let steps = positions(
        args.ids.len(),
        args.max_new_tokens,
        capacity,
        matches!(source, Source::File(_)),
    )?;
    if let Some(bad) = args.ids.iter().find(|&&t| t as usize >= vocab) {
        bail!("token id {bad} is outside the vocabulary of {vocab}");
    }
    let backend_kind = args.backend.unwrap_or(match source {
        Source::File(_) => Backend::Replay,
        Source::Model { .. } => Backend::Reference,
    });
    if args.tokens_per_submit == 0 || args.tokens_per_submit > 64 {
        bail!("--tokens-per-submit must be between 1 and 64");
    }
    if args.tokens_per_submit > 1 && backend_kind != Backend::Replay {
        bail!("--tokens-per-submit chains steps on the device: it needs --backend replay");
    }
    // (A schedule file with the reference backend is refused by `engine`, naming what to give.)
    if args.device.choice.is_some()
        && backend_kind == Backend::Reference
        && matches!(source, Source::Model { .. })
    {
        bail!(
            "--device picks a Vulkan device, but {}: add --backend eager or replay",
            if args.backend.is_some() {
                "the reference backend runs on the CPU"
            } else {
                "a model directory runs on the CPU reference backend unless told otherwise"
            }
        );
    }
    if args.run.persistent != Persistence::Off && backend_kind == Backend::Reference {
        bail!(
            "--persistent runs regions of a schedule on the device: the reference backend has \
             none (--backend replay or eager)"
        );
    }
    // Where only tokens are wanted, the last prompt token goes straight into the first greedy
    // chain: its step's logits would cross to the host for nothing, and a step the host waits
    // for alone costs a round trip (on an H100 ~0.5 ms more than a chained step's 0.55).
    let chain_last = args.logits_out.is_none() && args.max_new_tokens > 0;
    let (fed, last) = match chain_last {
        true => args.ids.split_at(args.ids.len() - 1),
        false => (&args.ids[..], &[][..]),
    };
    // The chain lengths the greedy loop will submit, recorded before timing starts.
    let k = args.tokens_per_submit as usize;
    let greedy = match chain_last {
        true => args.max_new_tokens,
        false => args.max_new_tokens.saturating_sub(1),
    };
    let chains = [k, greedy % k].map(|c| c as u32);
    let mut engine = source.engine(&EngineChoice {
        backend: backend_kind,
        device: args.device.choice.as_ref(),
        chains: &chains,
        persistence: args.run.persistent,
        handoffs: args.run.handoffs,
        logits: args.logits_out.is_some(),
    })?;
    let backend = format!("{backend_kind:?}").to_lowercase();
    engine.warm_up()?;

    let mut logits = Vec::with_capacity(steps * vocab);
    let mut generated = vec![];
    let start = Instant::now();
    for (i, &id) in fed.iter().enumerate() {
        let (row, next) = engine.step(Some(id))?;
        logits.extend_from_slice(&row);
        if !chain_last && i + 1 == args.ids.len() && args.max_new_tokens > 0 {
            generated.push(next);
        }
    }
    if chain_last {
        // Only the tokens are printed: greedy steps copy nothing else to the host.
        generated.extend(engine.greedy_tokens(
            last.first().copied(),
            args.max_new_tokens,
            args.tokens_per_submit,
        )?);
    }
    while generated.len() < args.max_new_tokens {
        let k = args
            .tokens_per_submit
            .min((args.max_new_tokens - generated.len()) as u32);
        for (row, next) in engine.steps(k)? {
            logits.extend_from_slice(&row);
            generated.push(next);
        }
    }
    let elapsed = start.elapsed();
    let mut counters = engine.counters();
    counters.tokens = steps as u64;
    counters.wall_ns = elapsed.as_nanos() as u64;
    let per = counters
        .per_token()
        .expect("at least one token was processed");

    if let Some(path) = &args.logits_out {
        let rows = logits.len() / vocab;
        npy::write(
            path,
            &Array2 {
                rows,
                cols: vocab,
                data: logits,
            },
        )?;
    }
    let report = {
        let mut r = RunReport::new(backend, generated.clone(), &per);
        // The reference has no recording or submit: its host time is the whole step.
        if backend_kind == Backend::Reference {
            r.host_us_per_token = elapsed.as_secs_f64() * 1e6 / steps as f64;
        }
        r
    };
    let ids: Vec<String> = generated.iter().map(u32::to_string).collect();
    // Without new tokens only the prompt went through (its logits, where asked, are the output).
    let ids = if ids.is_empty() {
        "none (--max-new-tokens 0)".to_string()
    } else {
        ids.join(",")
    };
    writeln!(std::io::stdout().lock(), "generated: {ids}")?;
    if args.json {
        writeln!(
            std::io::stdout().lock(),
            "{}",
            serde_json::to_string(&report)?
        )?;
    } else {
        writeln!(
            std::io::stdout().lock(),
            "{steps} step{} (a token through the model each: the prompt's, then every generated one \
             but the last) in {:.3} s: {:.1} tokens/s, host {:.1} us/token, {:.0} dispatches, {:.0} barriers, \
             {:.0} descriptor writes per token ({} backend{})",
            if steps == 1 { "" } else { "s" },
            elapsed.as_secs_f64(),
            report.tokens_per_s,
            report.host_us_per_token,
            report.dispatches_per_token,
            report.barriers_per_token,
            report.descriptor_writes_per_token,
            report.backend,
            match backend_kind {
                Backend::Reference => "",
                _ => ", after one warm-up step",
            }
        )?;
    }
    Ok(())
}
