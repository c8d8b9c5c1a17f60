//! `vkfuse generate`: text in, text out. The prompt is tokenized with the model's tokenizer,
//! fed one id per step, then greedy tokens are decoded on the device through the embedding
//! API (`vkfuse_runtime::Session`) and their text printed as each arrives.

use crate::metrics::RunReport;
use crate::options::RunOptions;
use crate::text::Text;
use crate::upload::UploadDisplay;
use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;
use vkfuse_compiler::lower::{self, SpirvCache};
use vkfuse_compiler::quant::EncodedWeights;
use vkfuse_compiler::trace;
use vkfuse_runtime::schedule::Schedule;
use vkfuse_runtime::session::TensorBytes;
use vkfuse_runtime::session::{pipeline_cache, CacheFile, LoadOptions, Persistence};
use vkfuse_runtime::{Backend, Session, SessionOptions};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GenerateBackend {
    /// Descriptors written and the step recorded once; per token only a submit.
    Replay,
    /// Re-recorded every token, a barrier after every dispatch (the baseline).
    Eager,
}

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["prompt", "ids"])))]
pub struct GenerateArgs {
    /// A schedule file from `compile-model -o` (the tokenizer it recorded is used), or a
    /// Hugging Face model directory, compiled in memory unfused (its tokenizer.json is used).
    pub model: PathBuf,
    /// The prompt, tokenized with the model's tokenizer.
    #[arg(long)]
    pub prompt: Option<String>,
    /// Prompt token ids instead of text, comma-separated (e.g. 1,2,3). Without a tokenizer
    /// the output is ids too.
    // Negative numbers reach the parser, as for `run --ids`.
    #[arg(
        long,
        value_delimiter = ',',
        num_args = 1..,
        allow_negative_numbers = true,
        value_parser = crate::options::parse_token_id
    )]
    pub ids: Option<Vec<u32>>,
    /// The most tokens to generate.
    // A negative count reaches the parser (a clear "invalid digit"), not clap's "use '-- -1'"
    // tip, which would make it the model path.
    #[arg(
        short = 'n',
        long = "max-new-tokens",
        default_value_t = 64,
        value_name = "N",
        allow_negative_numbers = true
    )]
    pub max_new_tokens: usize,
    /// Go on past an end-of-sequence id (the schedule's eos ids) up to N tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Which executor runs the decode step.
    #[arg(long, value_enum, default_value_t = GenerateBackend::Replay)]
    pub backend: GenerateBackend,
    /// Greedy steps recorded back to back in one submit (replay; 1 to 64).
    #[arg(long, default_value_t = 1, value_name = "K")]
    pub tokens_per_submit: u32,
    #[command(flatten)]
    pub device: crate::options::DeviceArg,
    /// KV-cache capacity in tokens, for a model directory (default: the model's
    /// max_position_embeddings, at most 4096).
    #[arg(long, value_name = "N")]
    pub max_context: Option<usize>,
    /// Print one JSON object (prompt ids, generated ids and text, per-token counters) as the
    /// last stdout line.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub run: RunOptions,
}

/// `vkfuse generate --json`: the keys of `vkfuse run --json`, and the prompt and text.
#[derive(Serialize)]
struct GenerateReport {
    prompt_ids: Vec<u32>,
    /// The generated text (special tokens left out); `null` without a tokenizer.
    text: Option<String>,
    /// Whether generation ended at an end-of-sequence id before N tokens.
    stopped_at_eos: bool,
    #[serde(flatten)]
    run: RunReport,
}

pub fn run(args: &GenerateArgs) -> Result<()> {
    // Everything a user can get wrong is checked before the model is loaded on the device.
    let opts = SessionOptions {
        device: args.device.choice.clone(),
        backend: match args.backend {
            GenerateBackend::Replay => Backend::Replay,
            GenerateBackend::Eager => Backend::Eager,
        },
        tokens_per_submit: args.tokens_per_submit,
        validation: false,
        pipeline_cache: true,
        persistence: args.run.persistent,
        handoffs: args.run.handoffs,
    };
    if args.tokens_per_submit == 0 || args.tokens_per_submit > 64 {
        bail!("--tokens-per-submit must be between 1 and 64");
    }
    if args.tokens_per_submit > 1 && args.backend != GenerateBackend::Replay {
        bail!("--tokens-per-submit chains steps on the device: it needs --backend replay");
    }
    let (schedule, weights, origin) = open(args)?;
    // A tokenizer that does not load (compile-model refuses one that is not JSON and warns of
    // one without a `model` object, but keeps it) is needed for a prompt's text; for ids it
    // only turns the generated ids into text, which are then printed as numbers instead.
    let text = match &schedule.meta.tokenizer {
        Some(json) => match Text::from_json(json, &origin) {
            Ok(text) => Some(text),
            Err(e) if args.prompt.is_some() => {
                bail!("{e}: give the prompt as token ids with --ids")
            }
            Err(e) => {
                eprintln!("warning: {e}: the generated ids are printed as numbers");
                None
            }
        },
        None => None,
    };
    let prompt = match (&args.prompt, &args.ids, &text) {
        (Some(prompt), _, Some(text)) => {
            let ids = text.encode(prompt)?;
            if ids.is_empty() && prompt.is_empty() {
                bail!("the prompt is empty: it gives no token ids");
            }
            if ids.is_empty() {
                bail!(
                    "the tokenizer gives no token ids for the prompt {prompt:?} (its vocabulary \
                     covers none of it): give ids with --ids instead"
                );
            }
            ids
        }
        (Some(_), _, None) if args.model.is_file() => bail!(
            "{origin} has no tokenizer (compile-model records MODEL/tokenizer.json when the \
             model directory has one): give the prompt as token ids with --ids"
        ),
        (Some(_), _, None) => {
            bail!("{origin} has no tokenizer.json: give the prompt as token ids with --ids")
        }
        (None, Some(ids), _) if ids.is_empty() => bail!("--ids needs at least one token id"),
        (None, Some(ids), _) => ids.clone(),
        (None, None, _) => bail!("give a prompt: --prompt TEXT or --ids 1,2,3"),
    };
    let meta = &schedule.meta;
    if let Some(bad) = prompt.iter().find(|&&t| t >= meta.vocab_size) {
        // From --prompt the id is the tokenizer's: a tokenizer.json of another model.
        let from = if args.prompt.is_some() {
            " (the tokenizer gave it for the prompt: is its tokenizer.json the model's?)"
        } else {
            ""
        };
        bail!(
            "token id {bad} is outside the vocabulary of {}{from}",
            meta.vocab_size
        );
    }
    crate::decode::positions(
        prompt.len(),
        args.max_new_tokens,
        meta.max_context as usize,
        args.model.is_file(),
    )?;

    // A schedule file keeps its compiled pipelines beside it (or in the user's cache folder).
    let cache = args
        .model
        .is_file()
        .then(|| CacheFile::beside(&args.model, pipeline_cache::schedule_checksum(&schedule)));
    let mut upload = UploadDisplay::new();
    let load = LoadOptions {
        pipeline_cache: cache,
        progress: Some(&mut |p| upload.update(p)),
        persistence: args.run.persistent,
        handoffs: args.run.handoffs,
        ..LoadOptions::default()
    };
    let regions = schedule.persistent.len();
    let mut session = Session::load_with(schedule, weights.as_ref(), &opts, load)
        .with_context(|| format!("loading {} on the device", args.model.display()))?;
    // As `run` and `bench` say it (decode.rs): regions asked for that do not run.
    if args.run.persistent != Persistence::Off && !session.persistent_runs() {
        let from_directory = !args.model.is_file();
        crate::decode::no_region_note(
            regions,
            from_directory,
            args.run.persistent,
            session.device().info(),
        );
    }
    if let Some(w) = session.pipeline_cache().warning() {
        eprintln!("{w}");
    }
    drop(weights);
    let eos = session.meta().eos_token_ids.clone();
    // As `run` does (decode.rs): the figures printed at the end leave a first step's one-time
    // costs out (lavapipe compiling the shaders on their first use).
    session.warm_up()?;
    session.feed(&prompt)?;

    let mut out = std::io::stdout().lock();
    let mut stream = text.as_ref().map(Text::stream);
    let mut ids = vec![];
    // Bytes of text printed: none for ids the tokenizer has no text for is worth a note.
    let mut printed = 0;
    let mut generated = session.generate(args.max_new_tokens);
    if !args.ignore_eos {
        generated = generated.stop_at_eos();
    }
    for id in generated {
        let id = id?;
        match &mut stream {
            Some(s) => {
                let piece = s.push(id)?;
                printed += piece.len();
                write!(out, "{piece}")?
            }
            None if ids.is_empty() => write!(out, "{id}")?,
            None => write!(out, ",{id}")?,
        }
        out.flush()?;
        ids.push(id);
    }
    if let Some(s) = &mut stream {
        let piece = s.finish()?;
        printed += piece.len();
        write!(out, "{piece}")?;
    }
    writeln!(out)?;
    out.flush()?;
    if stream.is_some() && printed == 0 && !ids.is_empty() {
        eprintln!(
            "note: the tokenizer has no text for any of the {} generated ids (`--json` lists \
             them)",
            ids.len()
        );
    }

    let stopped_at_eos = ids.last().is_some_and(|t| eos.contains(t)) && !args.ignore_eos;
    let counters = session.counters();
    let per = counters
        .per_token()
        .context("no step was run (the prompt has at least one id)")?;
    let backend = format!("{:?}", args.backend).to_lowercase();
    if args.json {
        let report = GenerateReport {
            prompt_ids: prompt,
            text: text.as_ref().map(|t| t.decode(&ids)).transpose()?,
            stopped_at_eos,
            run: RunReport::new(backend, ids, &per),
        };
        writeln!(out, "{}", serde_json::to_string(&report)?)?;
    } else {
        eprintln!(
            "[{} prompt + {} generated tokens{}: {:.1} tokens/s, host {:.1} us/token, {:.0} \
             dispatches, {:.0} barriers, {:.2} submits per token ({backend} backend, after one \
             warm-up step)]",
            prompt.len(),
            ids.len(),
            if stopped_at_eos {
                ", stopped at eos"
            } else {
                ""
            },
            per.tokens_per_s.unwrap_or(0.0),
            per.host_us_per_token,
            per.dispatches_per_token,
            per.barriers_per_token,
            per.submits_per_token,
        );
    }
    Ok(())
}

/// The schedule and its weights: a schedule file as compiled, or a model directory lowered
/// unfused in memory; and a name for the source in errors.
fn open(args: &GenerateArgs) -> Result<(Schedule, Box<dyn TensorBytes>, String)> {
    let origin = args.model.display().to_string();
    if args.model.is_file() {
        args.run.check_file()?;
        if args.max_context.is_some() {
            bail!(
                "--max-context is fixed when the schedule is compiled (compile-model --max-context)"
            );
        }
        let (schedule, weights) = crate::options::open_to_decode(&args.model)?.into_parts();
        return Ok((schedule, Box::new(weights), origin));
    }
    args.run.check_unfused()?;
    let model = crate::options::load_model(&args.model)?;
    let opts = trace::TraceOptions {
        max_context: args.max_context,
        ..Default::default()
    };
    let program = args.run.program(&model, &opts)?;
    let schedule = lower::lower(
        &program,
        &lower::Meta::of(&model),
        &mut SpirvCache::default(),
    )
    .context("lowering the trace")?;
    let weights = EncodedWeights::new(model.tensors, &program)?;
    Ok((schedule, Box::new(weights), origin))
}
