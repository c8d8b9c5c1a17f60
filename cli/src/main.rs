//! `vkfuse`: run a model or schedule, generate text with it, benchmark it, inspect it and its
//! kernels on a device, list devices.

mod against_plain;
mod bench;
mod calibrate;
mod decode;
mod devices;
mod generate;
mod kernels;
mod metrics;
mod options;
mod profile;
mod text;
mod timeline;
mod upload;

use anyhow::Result;
use clap::{Parser, Subcommand, ValueEnum};
use options::RunOptions;
use std::io::Write;
use std::path::PathBuf;

/// vkfuse: LLM decode with the host out of the way.
///
/// `vkfuse run` feeds prompt token ids one at a time, then decodes greedily; `vkfuse generate`
/// does the same from text to text.
#[derive(Parser)]
#[command(name = "vkfuse", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Feed token ids one at a time, then decode greedily; print the generated ids.
    ///
    /// On a Vulkan backend one step runs first and is forgotten (the sequence starts again),
    /// so that the time printed is not the driver's first use of each pipeline (lavapipe
    /// compiles its shaders then).
    Run(RunArgs),
    /// Tokenize a prompt, decode greedily and print the text as it is produced.
    Generate(generate::GenerateArgs),
    /// List the Vulkan devices with their key limits (`VKFUSE_DEVICE` or `--device` picks one).
    Devices,
    /// Decode the same tokens with every executor configuration and print one table.
    ///
    /// Columns: `K` steps per submit; `write-back` how state reaches the next step (the
    /// schedule's copies or ping-pong recordings); `persist` the persistent regions' workgroups
    /// (`N wg`, `-` none); `handoffs` the levels each step hands over instead of a barrier
    /// before them (`N lv`, `-` none: docs/architecture.md, "Handoffs"); then per token: wall
    /// time, host time, GPU time (timestamps), dispatches, barriers, descriptor writes,
    /// recordings and submits. A step the host reads alone (K=1) with handoffs has one barrier
    /// more, after emptying the handoff words.
    Bench(bench::BenchArgs),
    /// Measure this device's bandwidth, dispatch and barrier costs for the fusion compiler's
    /// cost model (`compile-model --device-cost FILE`).
    Calibrate(calibrate::CalibrateArgs),
    /// Compile a schedule file's kernels on the device and print what its driver reports of
    /// each (registers per invocation on NVIDIA; VK_KHR_pipeline_executable_properties), with
    /// its workgroup size there and the dispatches that run it.
    Kernels(kernels::KernelsArgs),
    /// Show what ran when inside replayed steps, workgroup by workgroup, from a schedule
    /// compiled with `compile-model --timeline` (each kernel records its workgroups' begin and
    /// end on the device's clock): a step dispatch by dispatch, then medians per kernel.
    Timeline(timeline::TimelineArgs),
    /// Print a schedule file (from `compile-model -o`) as readable text.
    Inspect {
        /// The schedule file.
        file: PathBuf,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// The CPU reference interpreter (f32, f64 accumulation): the oracle, not fast.
    Reference,
    /// Vulkan, eager: re-recorded every token with a descriptor write per binding and a
    /// barrier after every dispatch (the baseline).
    Eager,
    /// Vulkan, replay: descriptors written and the step recorded once; per token only a submit,
    /// barriers only between dependency levels (the default for schedule files).
    Replay,
}

#[derive(clap::Args)]
pub struct RunArgs {
    /// A Hugging Face model directory (config.json + *.safetensors), compiled in memory without
    /// fusion (one dispatch per op: the baseline), or a schedule file from `compile-model -o`
    /// (fused by default).
    pub model: PathBuf,
    /// Which executor runs the decode step (default: replay for a schedule file, reference for
    /// a model directory).
    #[arg(long, value_enum)]
    pub backend: Option<Backend>,
    /// Greedy steps recorded back to back in one submit (replay; 1 to 64), position and token
    /// chained on the device. Without --logits-out the prompt's last token is the first chain's
    /// input.
    #[arg(long, default_value_t = 1, value_name = "K")]
    pub tokens_per_submit: u32,
    /// Prompt token ids, comma-separated (e.g. 1,2,3).
    // Negative numbers reach the parser (which refuses them) instead of clap's "use '-- -1'"
    // tip, which would make the id the model path.
    #[arg(
        long,
        value_delimiter = ',',
        required = true,
        num_args = 1..,
        allow_negative_numbers = true,
        value_parser = options::parse_token_id
    )]
    pub ids: Vec<u32>,
    /// How many tokens to generate greedily after the prompt.
    // As generate's -n: a negative count reaches the parser.
    #[arg(
        long,
        default_value_t = 16,
        value_name = "N",
        allow_negative_numbers = true
    )]
    pub max_new_tokens: usize,
    /// Write the logits after every fed and generated token but the last as float32 .npy
    /// of shape [positions, vocab].
    #[arg(long, value_name = "PATH.npy")]
    pub logits_out: Option<PathBuf>,
    /// Print one JSON object (generated ids and per-token counters) as the last stdout line.
    #[arg(long)]
    pub json: bool,
    /// KV-cache capacity in tokens (default: the model's max_position_embeddings, at most 4096).
    /// For a model directory only: a schedule file's is fixed when it is compiled
    /// (compile-model --max-context).
    #[arg(long, value_name = "N")]
    pub max_context: Option<usize>,
    #[command(flatten)]
    pub device: crate::options::DeviceArg,
    #[command(flatten)]
    pub run: RunOptions,
}

fn inspect(file: &std::path::Path) -> Result<()> {
    use vkfuse_runtime::schedule::{ScheduleFile, Verify};
    let f = ScheduleFile::open_with(file, Verify::SkipWeightsChecksum)?;
    write!(std::io::stdout().lock(), "{f}")?;
    Ok(())
}

fn main() {
    let cli = Cli::parse();
    let result: Result<()> = match cli.command {
        Command::Run(args) => decode::run(&args),
        Command::Generate(args) => generate::run(&args),
        Command::Devices => devices::list(),
        Command::Bench(args) => bench::run(&args),
        Command::Calibrate(args) => calibrate::run(&args),
        Command::Kernels(args) => kernels::run(&args),
        Command::Timeline(args) => timeline::run(&args),
        Command::Inspect { file } => inspect(&file),
    };
    if let Err(e) = result {
        // A closed pipe (`vkfuse ... | head`) is the reader's choice, not a failure.
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
        {
            return;
        }
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
