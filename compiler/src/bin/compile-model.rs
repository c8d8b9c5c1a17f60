//! `compile-model`: turns a Hugging Face model directory into a vkfuse schedule file.

use anyhow::{bail, Context, Result};
use clap::Parser;
use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use vkfuse_compiler::kernels::timeline::Records;
use vkfuse_compiler::lower::{self, SpirvCache};
use vkfuse_compiler::{fuse, import, quant, trace};
use vkfuse_runtime::schedule::BufferRole;
use vkfuse_runtime::session::Progress;

/// Compile a Hugging Face model (config.json + *.safetensors) into a vkfuse schedule.
///
/// Supported architectures: LlamaForCausalLM, Qwen3ForCausalLM, Qwen3NextForCausalLM;
/// weights in f32, f16 or bf16. The schedule file holds the kernels (SPIR-V), the static buffer
/// plan, the dispatches grouped into dependency levels, and the weights; `vkfuse run FILE`
/// decodes with it and `vkfuse inspect FILE` prints it.
#[derive(Parser)]
#[command(name = "compile-model", version)]
struct Args {
    /// The model directory (config.json and model.safetensors or a sharded index).
    model: PathBuf,
    /// Write the schedule to this file (e.g. model.vkf).
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Print the decode step's op list (the trace) as text, then a summary as `;` comments.
    #[arg(long)]
    emit_trace: bool,
    /// KV-cache capacity in tokens (default: the model's max_position_embeddings, at most 4096).
    #[arg(long, value_name = "N")]
    max_context: Option<usize>,
    /// The KV caches' element type: f16 or f32.
    ///
    /// f16: keys and values rounded to f16 as they are written (half the memory and the bytes
    /// attention reads; on an H100 +1.4% tokens/s at 256 tokens and +5.8% at 3000 over f32,
    /// docs/perf.md). f32: unrounded (the logits move by about f16's rounding between the
    /// two).
    #[arg(long, value_name = "TYPE", default_value = "f16")]
    kv_cache: trace::KvCache,
    /// Fold RMSNorm weights into the matrices after them at compile time: auto, on or off.
    ///
    /// Fold the RMSNorm weight before each group of matvecs into those matrices' columns at
    /// compile time (`W · diag(w)`, rounded to the weights' dtype or quantised after the fold):
    /// the attention norm into q/k/v, the MLP's into gate/up, the final norm into an lm_head
    /// not shared with the embedding table, so that those fused matvecs load no norm weight
    /// (Qwen3's q_norm/k_norm come after their matvecs: not folded). `auto` (the default)
    /// folds where those matrices are then stored as q8_0 or q4_0, whose own rounding dwarfs
    /// the fold's (an H200, the Qwen3-0.6B shape: q8_0 +3.8%, q4_0 +1.0%, docs/perf.md session
    /// 36); float matrices keep their checkpoint's values unless `on` (bf16 +0.7% there, and
    /// up to 8e-3 relative L2 of the logits on the bf16 fixtures). `--fold-norms` alone is
    /// `on`. Llama and Qwen3; a Qwen3-Next model is never folded.
    #[arg(long, value_name = "WHEN", value_enum, default_value_t = trace::FoldNorms::Auto,
          num_args = 0..=1, default_missing_value = "on")]
    fold_norms: trace::FoldNorms,
    /// The arithmetic of the q8_0/q4_0 dot products: auto, int8, f16 or f32.
    ///
    /// The arithmetic of the fused kernels' q8_0/q4_0 dot products: `f16` (packed f16
    /// products, f32 sums: one multiply-add per two weights; on an H200, the Qwen3-0.6B shape:
    /// q8_0 +5.0% and q4_0 +6.2% tokens/s, the logits 1-2e-3 relative L2 from f32's, where
    /// q8_0 itself is 1.3-3.8e-2 from the unquantised fixtures; docs/perf.md session 38;
    /// the device needs `shaderFloat16`), `int8` (f16, and the chained MLP's dots as packed
    /// int8 products of its input quantised per block of 32, ggml's q8_1 route: on an H200
    /// q8_0 +4.8% and q4_0 +4.0% more, the logits ~1e-2 from f32's; docs/perf.md session 52;
    /// the device needs `shaderIntegerDotProduct` too) or `f32` (exact dequantisation, as the
    /// CPU reference computes). `auto` (the default) is int8 where `--weights` is q8_0 or
    /// q4_0. Float weights and the unfused schedule (`--no-fuse`) always take f32 (`--no-fuse`
    /// with `--dots f16` or `int8` is refused).
    #[arg(long, value_name = "TYPE", value_enum, default_value_t = fuse::Dots::Auto)]
    dots: fuse::Dots,
    /// Write the unfused schedule: one dispatch per op (the eager baseline).
    #[arg(long)]
    no_fuse: bool,
    /// Give every transient value its own arena slot instead of planning reuse from liveness.
    #[arg(long)]
    no_plan: bool,
    /// Workgroups per query head of the attention block (1 to 64; default from the shapes).
    ///
    /// Workgroups per query head of the fused attention block, each over a chunk of the context
    /// (1: one workgroup walks the whole context). Default: chosen from the shapes and the
    /// device's compute units (`--device-cost`; else an H100's 132): about two workgroups per
    /// compute unit over all heads, at most 16 and at least 256 KiB of f32 K and V per split
    /// at a full cache; where that gives 16, one split per 128 slots up to four per compute
    /// unit and 32 (Qwen3-0.6B at `--max-context 4096`: 32, which the bands below run as 16
    /// below position 2048). 1 to 64.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64))]
    attention_splits: Option<u32>,
    /// Workgroup size of the attention block (a tuning knob).
    ///
    /// Workgroup size of the fused attention block (a power of two up to 1024, raised to the
    /// head dim where smaller). Default: 8 invocations per head element (64..1024), 4 when the
    /// block is split. A tuning knob.
    #[arg(long, value_name = "N")]
    attention_wg: Option<u32>,
    /// The attention block's grids for short positions, `BELOW:SPLITSxWG,...` or `none`.
    ///
    /// Other grids of the attention block for short positions, as `BELOW:SPLITSxWG,...`
    /// (ascending positions; each band's grid serves the positions below its bound, the
    /// block's own grid every position past the last) or `none`. Every grid computes the same
    /// values up to f32 rounding; replay records the step once per band and runs each chain of
    /// steps on the band of its last step. A band needs a split block with at least its splits
    /// (else an error). Default by the matvec weights' format, as measured on an H100, on the
    /// block's own workgroup size (512 on Qwen3-0.6B's heads of 128):
    /// `256:4x512,384:6x512,512:8x512,2048:16x512` for f16 and bf16, and for q8_0 and q4_0 the
    /// same with `768:12x512` before the last and, on a block of more than 4 splits,
    /// `64:4x256` first (half the block's workgroup; measured on an H200); none otherwise. Of
    /// the defaults, those with more splits than the block's and trailing ones on its own grid
    /// are left out.
    #[arg(long, value_name = "BANDS", value_parser = parse_bands)]
    attention_bands: Option<Bands>,
    /// MiB of the next levels' weights read into L2 beside attention and linear-attention
    /// levels (0: none).
    ///
    /// MiB of the next matvec levels' weights to read into the L2 cache beside each level that
    /// streams none of its own and holds an attention block or a linear-attention step, so
    /// those matvecs hit L2 (0: none).
    /// Default by the matvec weights' format, as measured on an H100: 14 for q8_0 beside its
    /// attention bands (a layer's o_proj, MLP and the next q/k/v's first part), else 12; 12
    /// for q4_0 (all of those); 14 for f16/bf16 (o_proj, the MLP's down and half the next
    /// q/k/v, leaving out the gate/up that the chained MLP kernel loads itself); 8 for f32.
    /// More slows the attention block beside it. The norm weights of those levels are read
    /// past it (unless it is 0).
    #[arg(long, value_name = "MIB")]
    prefetch_mib: Option<u64>,
    /// Slots per kv head of the K/V caches read into L2 before each attention block (0: none).
    ///
    /// Slots per kv head of each attention block's K and V caches to read into the L2 cache a
    /// level or two before the block (up to the step's position; 0: none), so that the first
    /// K/V tile it loads at its start hits L2. Default by the matvec weights' format, as
    /// measured on an H200 with Qwen3-0.6B's shape: 768 for q8_0, first in the level before
    /// the block's q/k/v (in a dense layer the previous layer's MLP: +1.2% tokens/s at 256
    /// tokens), and for f16/bf16, last in the q/k/v's level (+1.3%); none for q4_0 (it lost
    /// 0.2-4.2%) and f32; none where the model is too small for the default weight prefetch
    /// (whatever --prefetch-mib says). A number keeps the format's place, or the q/k/v's level
    /// where the format has none; a block whose level there streams no weights gets none
    /// (Qwen3-Next's blocks under the q/k/v's level, whose slices come first; a dense model's
    /// first block under q8_0's place, the embedding's level).
    #[arg(long, value_name = "SLOTS", conflicts_with = "no_fuse")]
    prefetch_kv: Option<u32>,
    /// Keep SwiGLU's down in a level of its own (for devices without float atomics).
    ///
    /// Keep a matvec fed by another matvec kernel (SwiGLU's down after gate/up) in a level of
    /// its own instead of chaining both into one kernel. The chained kernel adds partial sums
    /// with float atomics, which the device must offer (`shaderBufferFloat32AtomicAdd`,
    /// VK_EXT_shader_atomic_float: NVIDIA, AMD and lavapipe do); without it, use this.
    #[arg(long)]
    no_chain: bool,
    /// Keep the argmax in a level of its own (for devices without 64-bit atomics).
    ///
    /// Keep the step's tail (the argmax that picks the next token, the position advance) in a
    /// level of its own instead of folding it into the matvec that computes the logits. The
    /// folded kernel picks the token with a 64-bit atomicMax, which the device must offer
    /// (`shaderInt64` and `shaderBufferInt64Atomics`: NVIDIA, AMD, Intel and lavapipe do);
    /// without them, use this.
    #[arg(long)]
    no_argmax_in_matvec: bool,
    /// The device costs fusion minimises, from `vkfuse calibrate -o FILE` (default: an H100's).
    ///
    /// The device costs fusion minimises and the attention block's splits follow: a JSON file
    /// that `vkfuse calibrate -o FILE` writes on the target device (its bandwidth, dispatch
    /// cost and the cost of a boundary between streaming levels as measured, which is below
    /// what a boundary costs a decode step: 2.4 against 3.5 µs on an H100; its compute units
    /// as the driver reports them). Default: an H100's, from docs/perf.md's measurements.
    #[arg(long, value_name = "FILE", conflicts_with = "no_fuse")]
    device_cost: Option<PathBuf>,
    /// Timing probes, never for use: reduce these fused kernels to their input wait and output.
    ///
    /// Timing probes, never for use: reduce these fused kernels, in every layer, to their
    /// input wait and output (`matvec`: q/k/v, and lm_head under --no-argmax-in-matvec;
    /// `wide-matvec`: o_proj; `attention`;
    /// `attention-combine`: split 0's partial as the output; `chain`: the MLP), keeping every
    /// level, handoff and barrier (but no persistent regions are offered). The step's time
    /// against the unablated schedule's is what that work costs the step as it runs. The
    /// tokens are wrong by design; vkfuse warns when it loads such a file.
    #[arg(
        long,
        value_name = "KERNELS",
        value_delimiter = ',',
        conflicts_with = "no_fuse"
    )]
    ablate: Vec<fuse::ablate::Ablate>,
    /// A timing probe, never for use: record when each workgroup ran, for `vkfuse timeline`.
    ///
    /// A timing probe, never for use: every kernel also records when each of its workgroups
    /// began and ended on the device's realtime clock, for `vkfuse timeline FILE` to show what
    /// ran when inside a replayed step (handoffs included). The tokens are as without it; the
    /// step is slower (2-10% on an H100: a record per workgroup and the clock reads, which
    /// also stretch what they mark). Needs a device with VK_KHR_shader_clock's device clock
    /// and buffer device addresses.
    #[arg(long)]
    timeline: bool,
    /// With --timeline: also record the SM each workgroup ran on (NVIDIA only).
    ///
    /// With --timeline: each workgroup's record also names the SM it ran on (`gl_SMIDNV`), so
    /// that `vkfuse timeline` can say what held the SMs a late workgroup waited for. Needs a
    /// device with VK_NV_shader_sm_builtins (NVIDIA's).
    #[arg(long, requires = "timeline")]
    timeline_sm: bool,
    /// Print why each fusion was taken or refused, per template, with the ops each kernel covers.
    #[arg(long)]
    explain: bool,
    /// Store the matvec weights as f16, bf16, q8_0 or q4_0 (default: the checkpoint's dtypes).
    ///
    /// Store the matvec weights (projections, lm_head; the embedding table when lm_head shares
    /// it; Qwen3-Next's experts) as f16, bf16, or ggml's block formats q8_0 / q4_0 (32 weights
    /// and an f16 scale per block, quantised here, dequantised in the matvec's inner loop).
    /// Norm weights and other vectors stay as stored (q8_0/q4_0 fold the norm weights into the
    /// matrices by default: `--fold-norms`); so do, for q8_0/q4_0, matrices whose input size is
    /// not a multiple of 32. Default: the checkpoint's dtypes.
    #[arg(long, value_name = "FORMAT")]
    weights: Option<quant::WeightFormat>,
}

/// The device costs of `--device-cost FILE`, else the H100's.
fn device_cost(path: Option<&std::path::Path>) -> Result<fuse::cost::DeviceCost> {
    let Some(path) = path else {
        return Ok(fuse::cost::DeviceCost::default());
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the device cost file {}", path.display()))?;
    fuse::cost::DeviceCost::from_json(&text)
        .with_context(|| format!("the device cost file {}", path.display()))
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        // A closed pipe (`compile-model ... | head`) is the reader's choice, not a failure.
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
        {
            return;
        }
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// Prints each stage's name, then its time when it ends (to stderr: stdout may be a trace).
struct Stages {
    times: Vec<(&'static str, f64)>,
}

impl Stages {
    fn run<T>(&mut self, name: &'static str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        // The name first, so that a long stage shows what it is waiting on.
        eprint!("{name:<10} ...");
        let start = Instant::now();
        let out = f();
        let secs = start.elapsed().as_secs_f64();
        if out.is_err() {
            // No time for a stage that failed: it would read as a success above the error.
            eprintln!(" failed");
            return out;
        }
        eprintln!(" {:.3} s", secs);
        self.times.push((name, secs));
        out
    }
}

/// A long stage's progress on a terminal, after its name (`write      ... 1.23 / 4.50 GB (27%)`,
/// redrawn at most every 100 ms, the line as it was once done, for [`Stages`] to end with the
/// stage's time): converting and writing a model of tens of GB takes minutes. Elsewhere (a
/// log, a pipe) nothing, so that each stage stays one line.
struct StageProgress {
    name: &'static str,
    tty: bool,
    drawn: Option<Instant>,
}

impl StageProgress {
    fn new(name: &'static str) -> StageProgress {
        StageProgress {
            name,
            tty: std::io::stderr().is_terminal(),
            drawn: None,
        }
    }

    /// The stage's line as it was before any progress, where some was drawn.
    fn clear(&mut self) {
        if self.drawn.take().is_some() {
            eprint!("\r{:<10} ...\x1b[K", self.name);
        }
    }

    fn update(&mut self, p: Progress) {
        if !self.tty {
            return;
        }
        let name = self.name;
        if p.done >= p.total {
            self.clear();
            return;
        }
        if self
            .drawn
            .is_some_and(|t| t.elapsed() < Duration::from_millis(100))
        {
            return;
        }
        eprint!(
            "\r{name:<10} ... {:.2} / {:.2} GB ({:.0}%)\x1b[K",
            p.done as f64 / 1e9,
            p.total as f64 / 1e9,
            100.0 * p.done as f64 / p.total.max(1) as f64
        );
        self.drawn = Some(Instant::now());
    }
}

/// Refuses an output that is one of the model's own files (its checkpoint, config or tokenizer:
/// the schedule would replace the input it was compiled from) or a new checkpoint file beside
/// them (the next import of the folder would read the schedule as one).
fn refuse_model_file(out: &Path, model: &Path) -> Result<()> {
    let (Some(name), Ok(model)) = (out.file_name(), std::fs::canonicalize(model)) else {
        return Ok(());
    };
    // The file -o names (through a link where it is one), or where a new one would go.
    let at = std::fs::canonicalize(out).ok().or_else(|| {
        let folder = match out.parent().filter(|p| !p.as_os_str().is_empty()) {
            Some(p) => std::fs::canonicalize(p),
            None => std::env::current_dir(),
        };
        folder.ok().map(|f| f.join(name))
    });
    let Some(at) = at.filter(|at| at.parent() == Some(model.as_path())) else {
        return Ok(());
    };
    let ext = at.extension().and_then(|e| e.to_str()).unwrap_or("");
    if at.exists() && (ext == "safetensors" || ext == "json") {
        bail!(
            "-o {}: that is one of the model's own files (in {}), which the schedule would \
             replace: give another path, such as a .vkf file",
            out.display(),
            model.display()
        );
    }
    if ext == "safetensors" {
        bail!(
            "-o {}: a .safetensors file in the model's folder {} would be read as part of its \
             checkpoint next time: give another path, such as a .vkf file",
            out.display(),
            model.display()
        );
    }
    Ok(())
}

fn run(args: Args) -> Result<()> {
    if !args.emit_trace && args.output.is_none() {
        let explain = if args.explain {
            " (--explain prints its reasons as it writes one)"
        } else {
            ""
        };
        bail!(
            "nothing to do: pass -o FILE to write a schedule{explain}, or --emit-trace to print \
             the trace"
        );
    }
    // Before the compile, not after it: the folder the schedule goes to must exist and take a
    // file, and the path must not be a device or the like, which the final rename would replace.
    if let Some(out) = &args.output {
        vkfuse_runtime::schedule::check_output(out).context("-o")?;
        refuse_model_file(out, &args.model)?;
    }
    // Before the import (a large model's takes long), and without the trace's context.
    if let Some(n) = args.max_context {
        trace::check_max_context(n)?;
    }
    // An explicit f16 the unfused kernels cannot honour: refused, not quietly computed in f32.
    if args.no_fuse && matches!(args.dots, fuse::Dots::F16 | fuse::Dots::Int8) {
        let dots = if args.dots == fuse::Dots::F16 {
            "f16"
        } else {
            "int8"
        };
        bail!(
            "--dots {dots} applies to fused schedules, and --no-fuse writes the unfused one, \
             whose kernels dequantise in f32: drop --no-fuse, or drop --dots"
        );
    }
    if let Some(wg) = args.attention_wg {
        if !wg.is_power_of_two() || !(4..=1024).contains(&wg) {
            bail!("--attention-wg {wg}: a power of two from 4 to 1024");
        }
    }
    // Before the import and trace, which take long on a large model.
    let device = device_cost(args.device_cost.as_deref())?;
    let mut st = Stages { times: vec![] };
    let model = st.run("import", || {
        import::load(&args.model).with_context(|| format!("loading {}", args.model.display()))
    })?;
    for w in model.warnings() {
        eprintln!("warning: {w}");
    }
    let opts = trace::TraceOptions {
        max_context: args.max_context,
        kv_cache: args.kv_cache,
        fold_norms: args.fold_norms.folds(&model, args.weights),
    };
    let mut program = st.run("trace", || {
        trace::trace(&model, &opts).context("tracing the decode step")
    })?;
    let folded = trace::fold::summary(&program).unwrap_or_else(|| {
        let why = if model.config.family == import::Family::Qwen3Next {
            "Qwen3-Next's norms are zero-centred"
        } else if args.fold_norms == trace::FoldNorms::Off {
            "--fold-norms=off"
        } else {
            "auto folds where the matrices are stored as q8_0 or q4_0; --fold-norms=on folds \
             these"
        };
        format!("not folded ({why})")
    });
    if let Some(warning) = trace::unread_warning(&model, &program) {
        eprintln!("warning: {warning}");
    }
    if let Some(warning) = trace::past_trained_context(&model, &opts) {
        eprintln!("{warning}");
    }
    if args.fold_norms == trace::FoldNorms::On && model.config.family == import::Family::Qwen3Next {
        eprintln!(
            "note: --fold-norms folds Llama and Qwen3 models only: this {} is traced unfolded",
            model.config.architecture
        );
    }
    if model.tokenizer.is_none() {
        eprintln!(
            "note: {} has no {}: the schedule decodes token ids only (`vkfuse generate --ids`, \
             not --prompt)",
            args.model.display(),
            import::TOKENIZER_FILE
        );
    }
    let conversion = match args.weights {
        Some(format) => {
            Some(quant::convert(&mut program, format).context("converting the weights' format")?)
        }
        None => None,
    };
    if args.emit_trace {
        let mut out = std::io::stdout().lock();
        write!(out, "{program}")?;
        let mut by_kind: BTreeMap<&str, usize> = BTreeMap::new();
        for op in &program.ops {
            *by_kind.entry(op.kind.name()).or_default() += 1;
        }
        let capacity = trace::max_context(&model, &opts)?;
        writeln!(
            out,
            "; summary: {} ops, {} values, {} states",
            program.ops.len(),
            program.values.len(),
            program.states.len()
        )?;
        for (kind, n) in &by_kind {
            writeln!(out, ";   {kind:<20} {n}")?;
        }
        writeln!(
            out,
            "; parameters: {} ({:.2} MB in the checkpoint)",
            model.tensors.total_params(),
            model.tensors.total_bytes() as f64 / 1e6
        )?;
        writeln!(
            out,
            "; state at --max-context {capacity}: {:.2} MB",
            program.state_bytes() as f64 / 1e6
        )?;
    }
    let Some(path) = &args.output else {
        return Ok(());
    };
    let segmentation = st.run("discover", || Ok(fuse::discover(&program)))?;
    let meta = lower::Meta::of(&model);
    let mut spirv = match (args.timeline, args.timeline_sm) {
        (true, false) => SpirvCache::timeline(Records::Times),
        (true, true) => SpirvCache::timeline(Records::TimesAndSms),
        (false, _) => SpirvCache::default(),
    };
    // The costs fusion minimises (an unfused schedule has none).
    let cost_line = (!args.no_fuse).then(|| device.to_string());
    let (schedule, fusion, plan) = if args.no_fuse {
        let (s, r) = st.run("lower", || {
            lower::lower_with_report(&program, &meta, &mut spirv, !args.no_plan).context("lowering")
        })?;
        (s, None, Some(r.plan))
    } else {
        let opts = fuse::FuseOptions {
            plan_memory: !args.no_plan,
            attention_splits: args.attention_splits.map(|n| n as usize),
            attention_wg: args.attention_wg,
            attention_bands: args.attention_bands.clone().map(|b| b.0),
            chain: !args.no_chain,
            argmax_in_matvec: !args.no_argmax_in_matvec,
            prefetch: args.prefetch_mib.map(|m| fuse::prefetch::Prefetch {
                budget: m.saturating_mul(1 << 20),
                ..fuse::prefetch::Prefetch::for_program(&program, false)
            }),
            kv_prefetch: args.prefetch_kv.map(|slots| fuse::kv_prefetch::KvPrefetch {
                slots,
                ..fuse::kv_prefetch::KvPrefetch::for_program(&program)
            }),
            device,
            ablate: args.ablate.clone(),
            f16_dots: args.dots.f16(args.weights),
            int8_chain: args.dots.int8_chain(args.weights),
            ..Default::default()
        };
        let (s, r) = st.run("fuse", || {
            fuse::lower_fused(&program, &meta, &mut spirv, &opts).context("fusing and lowering")
        })?;
        let plan = r.plan.clone();
        (s, Some(r), plan)
    };
    let bytes = st.run("write", || {
        let weights = quant::EncodedWeights::new(&model.tensors, &program)
            .context("converting the weights")?;
        let mut shown = StageProgress::new("write");
        let written = schedule.write_file_reporting(path, &weights, &mut |p| shown.update(p));
        if written.is_err() {
            shown.clear();
        }
        written.with_context(|| format!("writing {}", path.display()))
    })?;

    let templates: Vec<String> = segmentation
        .templates
        .iter()
        .enumerate()
        .map(|(t, tpl)| format!("T{t} ({} ops) x {}", tpl.len, tpl.instances.len()))
        .collect();
    println!("wrote {} ({:.2} MB)", path.display(), bytes as f64 / 1e6);
    match &fusion {
        None => println!("fusion:      off (--no-fuse): one dispatch per op"),
        Some(r) => {
            let per: Vec<String> = r
                .per_template()
                .iter()
                .map(|(t, k, n)| format!("{t} {k} dispatches x {n}"))
                .collect();
            println!(
                "fusion:      on ({} unfused dispatches before): {}",
                r.unfused_dispatches,
                per.join(", ")
            );
        }
    }
    if let Some(c) = &cost_line {
        println!("costs of:    {c}");
    }
    println!(
        "trace:       {} ops -> {} dispatches per token",
        program.ops.len(),
        schedule.dispatches.len()
    );
    println!(
        "levels:      {} ({} barriers between them per token in replay, fewer where it hands \
         levels over (`vkfuse inspect` lists them), besides those around each step's token \
         and logits going to the host; eager puts one after every dispatch)",
        schedule.levels.len(),
        schedule.levels.len().saturating_sub(1)
    );
    println!(
        "templates:   {}",
        if templates.is_empty() {
            "none found".into()
        } else {
            templates.join(", ")
        }
    );
    match &plan {
        Some(plan) => println!(
            "arena:       {} bytes (lower bound {}, naive {})",
            plan.arena_bytes, plan.lower_bound, plan.naive_bytes
        ),
        None => {
            let arena = schedule
                .buffers
                .iter()
                .find(|b| b.role == BufferRole::Arena)
                .map_or(0, |b| b.size);
            println!("arena:       {arena} bytes")
        }
    }
    println!("kernels:     {} pipelines", schedule.kernels.len());
    if let Some(c) = &conversion {
        println!("weights:     {}", c.summary());
    }
    println!("norms:       {}", folded);
    // From the kernels: `--dots f16` changes nothing where no matvec reads a block format.
    let blocks = args.weights.is_some_and(|w| w.dtype().is_quantized());
    println!(
        "dots:        {}",
        if schedule.integer_dot_kernel().is_some() {
            "int8 products in the chained MLPs (their input quantised per block of 32), f16 \
             products and f32 sums in the other block-format matvecs (the device needs \
             shaderIntegerDotProduct and shaderFloat16; --dots f16 or f32 computes closer)"
        } else if schedule.float16_kernel().is_some() && args.dots.int8_chain(args.weights) {
            // int8 asked for (or auto), but no chained MLP to take it.
            "f16 products, f32 sums in the block-format matvecs; no chained MLP to take int8 \
             ones (--no-chain, or MLPs whose inner rows are not whole blocks of 32, or MoE \
             experts: --explain says which) (the device needs shaderFloat16; --dots f32 \
             computes them exactly)"
        } else if schedule.float16_kernel().is_some() {
            "f16 products, f32 sums in the block-format matvecs (the device needs \
             shaderFloat16; --dots f32 computes them exactly)"
        } else if !blocks {
            "no block-format matvecs (--dots applies to --weights q8_0 and q4_0)"
        } else if args.no_fuse {
            "f32 (the unfused kernels dequantise exactly; --dots applies to fused schedules)"
        } else {
            "f32 (exact dequantisation)"
        }
    );
    let times: Vec<String> = st
        .times
        .iter()
        .map(|(n, t)| format!("{n} {t:.3} s"))
        .collect();
    println!("time:        {}", times.join(", "));
    if let (true, Some(r)) = (args.explain, &fusion) {
        println!("\n{r}");
    }
    if let (true, Some(c)) = (args.explain, &conversion) {
        println!("\n{c}");
    }
    Ok(())
}

/// `--attention-bands`, parsed (a newtype: clap takes a `Vec` for a repeated argument).
#[derive(Clone, Debug)]
struct Bands(Vec<fuse::bands::AttentionBand>);

fn parse_bands(text: &str) -> Result<Bands, fuse::bands::BandsParseError> {
    fuse::bands::parse(text).map(Bands)
}
