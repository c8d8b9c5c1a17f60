//! `compile-model`: turns a Hugging Face model directory into vkfuse's decode step.

use anyhow::{Context, Result};
use clap::Parser;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use vkfuse_compiler::{import, trace};

/// Compile a Hugging Face model (config.json + *.safetensors) for vkfuse.
///
/// Supported architectures: LlamaForCausalLM, Qwen3ForCausalLM, Qwen3NextForCausalLM;
/// weights in f32, f16 or bf16.
#[derive(Parser)]
#[command(name = "compile-model", version)]
struct Args {
    /// The model directory (config.json and model.safetensors or a sharded index).
    model: PathBuf,
    /// Print the decode step's op list (the trace) as text, then a summary as `;` comments.
    #[arg(long)]
    emit_trace: bool,
    /// KV-cache capacity in tokens (default: the model's max_position_embeddings, at most 4096).
    #[arg(long, value_name = "N")]
    max_context: Option<usize>,
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

fn run(args: Args) -> Result<()> {
    let model =
        import::load(&args.model).with_context(|| format!("loading {}", args.model.display()))?;
    let opts = trace::TraceOptions {
        max_context: args.max_context,
    };
    let program = trace::trace(&model, &opts).context("tracing the decode step")?;
    if !args.emit_trace {
        anyhow::bail!(
            "nothing to do: pass --emit-trace (schedule output comes with the fusion compiler)"
        );
    }
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
    Ok(())
}
