//! `compile-model`: turns a Hugging Face model directory into a vkfuse schedule file.

use anyhow::{bail, Context, Result};
use clap::Parser;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;
use vkfuse_compiler::lower::{self, SpirvCache};
use vkfuse_compiler::{fuse, import, trace};

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
    /// Write the unfused schedule: one dispatch per op (the eager baseline).
    #[arg(long)]
    no_fuse: bool,
    /// Give every transient value its own arena slot instead of planning reuse from liveness.
    #[arg(long)]
    no_plan: bool,
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
        eprint!("{name:<10} ...");
        let start = Instant::now();
        let out = f();
        let secs = start.elapsed().as_secs_f64();
        eprintln!(" {:.3} s", secs);
        self.times.push((name, secs));
        out
    }
}

fn run(args: Args) -> Result<()> {
    if !args.emit_trace && args.output.is_none() {
        bail!(
            "nothing to do: pass -o FILE to write a schedule, or --emit-trace to print the trace"
        );
    }
    let mut st = Stages { times: vec![] };
    let model = st.run("import", || {
        import::load(&args.model).with_context(|| format!("loading {}", args.model.display()))
    })?;
    let opts = trace::TraceOptions {
        max_context: args.max_context,
    };
    let program = st.run("trace", || {
        trace::trace(&model, &opts).context("tracing the decode step")
    })?;
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
    if !args.no_fuse {
        bail!(
            "fusion is not wired into compile-model yet: pass --no-fuse for the unfused schedule"
        );
    }
    let segmentation = st.run("discover", || Ok(fuse::discover(&program)))?;
    let meta = lower::Meta {
        architecture: model.config.architecture.clone(),
        eos_token_ids: model.config.eos_token_ids.clone(),
    };
    let (schedule, report) = st.run("lower", || {
        lower::lower_with_report(&program, &meta, &mut SpirvCache::default(), !args.no_plan)
            .context("lowering")
    })?;
    let bytes = st.run("write", || {
        schedule
            .write_file(path, &model.tensors)
            .with_context(|| format!("writing {}", path.display()))
    })?;

    let per_token_dispatches = schedule.dispatches.len();
    let templates: Vec<String> = segmentation
        .templates
        .iter()
        .enumerate()
        .map(|(t, tpl)| format!("T{t} ({} ops) x {}", tpl.len, tpl.instances.len()))
        .collect();
    println!("wrote {} ({:.2} MB)", path.display(), bytes as f64 / 1e6);
    println!("fusion:      off (--no-fuse): one dispatch per op");
    println!(
        "trace:       {} ops -> {per_token_dispatches} dispatches per token",
        program.ops.len()
    );
    println!(
        "levels:      {} ({} barriers per token in replay; eager puts one after every dispatch)",
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
    println!(
        "arena:       {} bytes (lower bound {}, naive {})",
        report.plan.arena_bytes, report.plan.lower_bound, report.plan.naive_bytes
    );
    println!("kernels:     {} pipelines", schedule.kernels.len());
    let times: Vec<String> = st
        .times
        .iter()
        .map(|(n, t)| format!("{n} {t:.3} s"))
        .collect();
    println!("time:        {}", times.join(", "));
    Ok(())
}
