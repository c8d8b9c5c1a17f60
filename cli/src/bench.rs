//! `vkfuse bench`: the same tokens through every executor configuration, one table.
//!
//! Each configuration decodes `--tokens` greedy tokens after a one-token prompt, after one
//! warm-up sequence (pipelines compiled, caches warm), and must produce the same tokens as the
//! others. Figures are per processed token; resetting between sequences is not counted.

use crate::metrics::RunReport;
use crate::options::RunOptions;
use crate::upload::UploadDisplay;
use anyhow::{bail, Context, Result};
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;
use vkfuse_compiler::lower::{self, SpirvCache};
use vkfuse_compiler::quant::EncodedWeights;
use vkfuse_compiler::{fuse, trace};
use vkfuse_runtime::schedule::Schedule;
use vkfuse_runtime::session::{
    handoff, writeback, Eager, LoadOptions, Loaded, Replay, SessionError, TensorBytes, WriteBack,
};
use vkfuse_runtime::{Device, Handoffs, Persistence};

#[derive(clap::Args)]
pub struct BenchArgs {
    /// A Hugging Face model directory (compiled in memory both unfused and fused, as
    /// compile-model compiles it by default) or a schedule file (run as compiled).
    pub model: PathBuf,
    /// Greedy tokens to decode per configuration.
    #[arg(long, default_value_t = 64)]
    pub tokens: usize,
    /// KV-cache capacity in tokens (default: the model's max_position_embeddings, at most 4096).
    /// For a model directory only: a schedule file's is fixed when it is compiled
    /// (compile-model --max-context).
    #[arg(long, value_name = "N")]
    pub max_context: Option<usize>,
    #[command(flatten)]
    pub device: crate::options::DeviceArg,
    /// Print a JSON array (one object per configuration) as the last stdout line.
    #[arg(long)]
    pub json: bool,
    /// Also time every dependency level of the fused replay step (a separate recording with a
    /// timestamp after each level) and print where the step's GPU time goes; for a model
    /// directory, also each fused kernel against the plain kernels of its ops (both schedules
    /// timed one dispatch per level, in turns, both loaded at once where the device holds both
    /// sets of weights). Each profiled schedule first steps for 1.5 s untimed (0.1 s on a CPU
    /// device), so that a GPU that lowered its clocks while idle is timed at its working ones.
    #[arg(long)]
    pub profile: bool,
    /// Profiled steps to average (at least 1).
    #[arg(
        long,
        default_value_t = 64,
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub profile_steps: u32,
    #[command(flatten)]
    pub run: RunOptions,
}

#[derive(serde::Serialize)]
struct Row {
    fused: bool,
    /// The table's; the JSON's is the report's (the same word: one `backend` key).
    #[serde(skip)]
    backend: &'static str,
    tokens_per_submit: u32,
    /// How state reaches the next step: the schedule's copies or ping-pong recordings
    /// (`-` for eager, which always runs the copies).
    write_back: &'static str,
    /// Workgroups of the persistent regions (0: none run).
    persistent_groups: u32,
    /// Levels handed over per step instead of a barrier before them (0: none).
    handed_levels: usize,
    #[serde(flatten)]
    report: RunReport,
}

/// One configuration of the table.
#[derive(Clone, Copy)]
struct Config {
    /// Steps per submit; 0 means eager.
    k: u32,
    write_back: WriteBack,
    persistence: Persistence,
    handoffs: Handoffs,
}

/// A fresh sequence: token 1, then greedy tokens, one step per submit, re-recorded each time.
fn greedy_eager(e: &mut Eager, tokens: usize, ids: &mut Vec<u32>) -> Result<()> {
    ids.clear();
    ids.push(e.step(Some(1))?.next_token);
    while ids.len() < tokens {
        ids.push(e.step(None)?.next_token);
    }
    Ok(())
}

/// A fresh sequence: token 1, then greedy tokens, `k` steps per submit, token 1 consumed by
/// the first chain (no step the host waits for alone).
fn greedy_replay(r: &mut Replay, k: u32, tokens: usize, ids: &mut Vec<u32>) -> Result<()> {
    ids.clear();
    ids.extend(r.greedy_tokens(Some(1), tokens as u32, k)?);
    Ok(())
}

/// Loads `schedule` (the weights upload shown when large).
fn load(
    device: &Device,
    schedule: &Schedule,
    weights: &dyn TensorBytes,
    persistence: Persistence,
    handoffs: Handoffs,
) -> Result<Loaded> {
    let mut upload = UploadDisplay::new();
    let options = LoadOptions {
        pipeline_cache: None,
        progress: Some(&mut |p| upload.update(p)),
        persistence,
        handoffs,
        ..LoadOptions::default()
    };
    Ok(Loaded::load(
        device.clone(),
        schedule.clone(),
        weights,
        options,
    )?)
}

/// One configuration; returns its report, the write-back it ran with and the levels it handed
/// over per step.
fn measure(
    device: &Device,
    schedule: &Schedule,
    weights: &dyn TensorBytes,
    config: Config,
    tokens: usize,
) -> Result<(RunReport, &'static str, usize)> {
    let k = config.k;
    let mut write_back = "-";
    let loaded = load(
        device,
        schedule,
        weights,
        config.persistence,
        config.handoffs,
    )?;
    let mut handed = 0;
    let mut ids = vec![];
    let counters = if k == 0 {
        let mut e = Eager::new(loaded)?;
        greedy_eager(&mut e, tokens, &mut ids)?; // warm-up
        e.reset()?; // a new sequence; not per-token work
        let (start, gpu0, t) = (device.counters(), e.gpu_ns().unwrap_or(0.0), Instant::now());
        greedy_eager(&mut e, tokens, &mut ids)?;
        let mut c = device.counters().since(&start);
        c.wall_ns = t.elapsed().as_nanos() as u64;
        c.gpu_ns = e.gpu_ns().map(|g| (g - gpu0) as u64);
        c
    } else {
        let mut r = Replay::with_write_back(loaded, config.write_back)?;
        write_back = effective(&r);
        handed = r.handed_levels();
        let all = tokens as u32;
        r.prepare(k.min(all.max(1)))?;
        r.prepare(all % k)?;
        greedy_replay(&mut r, k, tokens, &mut ids)?; // warm-up
        r.reset()?; // a new sequence; not per-token work
        let (start, gpu0, t) = (device.counters(), r.gpu_ns().unwrap_or(0.0), Instant::now());
        greedy_replay(&mut r, k, tokens, &mut ids)?;
        let mut c = device.counters().since(&start);
        c.wall_ns = t.elapsed().as_nanos() as u64;
        c.gpu_ns = r.gpu_ns().map(|g| (g - gpu0) as u64);
        c
    };
    let mut c = counters;
    c.tokens = tokens as u64;
    let per = c.per_token().context("no tokens")?;
    let report = RunReport::new(if k == 0 { "eager" } else { "replay" }, ids, &per);
    Ok((report, write_back, handed))
}

/// The write-back a replay really runs with (ping-pong only where the schedule copies state).
fn effective(r: &Replay) -> &'static str {
    if r.ping_pong_plan().states.is_empty() {
        WriteBack::Copy.name()
    } else {
        WriteBack::PingPong.name()
    }
}

/// Whether ping-pong changes anything in `schedule` (else one write-back row is enough).
fn has_ping_pong(device: &Device, schedule: &Schedule) -> bool {
    !writeback::plan(schedule, device.storage_offset_alignment())
        .states
        .is_empty()
}

pub fn run(args: &BenchArgs) -> Result<()> {
    bench(args).map_err(|e| directory_fix(e, args))
}

/// A model directory's schedules are compiled here, so where a kernel needs what the device
/// lacks, the fix is this command's `--dots` where that avoids it; compile-model's other flags
/// (`--no-chain`, `--no-argmax-in-matvec`) this command does not take.
fn directory_fix(e: anyhow::Error, args: &BenchArgs) -> anyhow::Error {
    if args.model.is_file() {
        return e;
    }
    match e.downcast_ref::<SessionError>() {
        Some(SessionError::KernelNeeds {
            device,
            kernel,
            needs,
            avoid: Some(flag),
        }) => {
            let fix = match (flag.starts_with("--dots"), args.run.dots.is_some()) {
                (true, true) => format!("run this command with `{flag}` in place of its --dots"),
                (true, false) => format!("add `{flag}` to this command"),
                (false, _) => format!(
                    "this command compiles a model directory with compile-model's defaults: \
                     compile it with `compile-model {} {flag} -o FILE` (and the same \
                     --weights, --fold-norms, --dots and --max-context) and bench FILE",
                    args.model.display()
                ),
            };
            anyhow::anyhow!(
                "device {device:?} cannot be used: kernel `{kernel}` needs {needs}; {fix}"
            )
        }
        _ => e,
    }
}

fn bench(args: &BenchArgs) -> Result<()> {
    if args.tokens < 2 {
        bail!("--tokens must be at least 2");
    }
    // The schedules to compare: a model directory is compiled both ways in memory; a schedule
    // file runs as it was compiled (fused unless compile-model had --no-fuse).
    let mut schedules: Vec<(bool, Schedule)> = vec![];
    let weights: Box<dyn TensorBytes> = if args.model.is_file() {
        args.run.check_file()?;
        if args.max_context.is_some() {
            bail!("--max-context is fixed when the schedule is compiled (compile-model --max-context)");
        }
        let (s, w) = crate::options::open_to_decode(&args.model)?.into_parts();
        let fused = s.kernels.iter().any(|k| k.label.starts_with("fused_"));
        schedules.push((fused, s));
        Box::new(w)
    } else {
        let model = crate::options::load_model(&args.model)?;
        let trace_opts = trace::TraceOptions {
            max_context: args.max_context,
            ..Default::default()
        };
        let program = args.run.program(&model, &trace_opts)?;
        let meta = lower::Meta::of(&model);
        let mut spirv = SpirvCache::default();
        schedules.push((false, lower::lower(&program, &meta, &mut spirv)?));
        let dots = args.run.dots.unwrap_or(fuse::Dots::Auto);
        let opts = fuse::FuseOptions {
            f16_dots: dots.f16(args.run.weights),
            int8_chain: dots.int8_chain(args.run.weights),
            ..Default::default()
        };
        let (fused, _) = fuse::lower_fused(&program, &meta, &mut spirv, &opts)?;
        schedules.push((true, fused));
        Box::new(EncodedWeights::new(model.tensors, &program)?)
    };
    // Before the device and the table's header, so that the error stands alone.
    for (_, schedule) in &schedules {
        let capacity = schedule.meta.max_context as usize;
        // A one-token prompt, then tokens - 1 more steps: one position per token.
        if args.tokens > capacity {
            let tokens = args.tokens;
            let raise = match (args.model.is_file(), args.max_context) {
                (true, _) => "compile-model --max-context sets it".to_string(),
                (false, Some(n)) => format!("--max-context {n} sets it"),
                (false, None) => format!(
                    "a model directory reserves its config's max_position_embeddings, at most \
                     {} unless --max-context says otherwise",
                    trace::TraceOptions::DEFAULT_MAX_CONTEXT
                ),
            };
            bail!(
                "--tokens {tokens} needs {tokens} positions; the schedule reserves {capacity} \
                 ({raise})"
            );
        }
    }
    let device = args.device.open()?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "device: {}", device.info().name)?;
    writeln!(
        out,
        "{} greedy tokens after a 1-token prompt, per configuration, after one warm-up run",
        args.tokens
    )?;
    // Only fused kernels take them (compile-model --dots).
    let int8 = schedules
        .iter()
        .any(|(_, s)| s.integer_dot_kernel().is_some());
    if int8 {
        writeln!(
            out,
            "the fused kernels take their q8_0/q4_0 dots in f16, the chained MLPs' in int8 (--dots)"
        )?;
    } else if schedules.iter().any(|(_, s)| s.float16_kernel().is_some()) {
        writeln!(
            out,
            "the fused kernels take their q8_0/q4_0 dots in f16 (--dots)"
        )?;
    }
    let mut rows = vec![];
    for (fused, schedule) in &schedules {
        let fused = *fused;
        let mut configs: Vec<Config> = [0u32, 1, 8]
            .map(|k| Config {
                k,
                write_back: WriteBack::default(),
                persistence: args.run.persistent,
                handoffs: args.run.handoffs,
            })
            .to_vec();
        // With persistent regions running, the replay rows without them too.
        let groups = |p: Persistence| {
            if schedule.persistent.is_empty() {
                0
            } else {
                p.groups(device.info())
            }
        };
        if groups(args.run.persistent) > 0 {
            configs.extend([1u32, 8].map(|k| Config {
                k,
                write_back: WriteBack::default(),
                persistence: Persistence::Off,
                handoffs: args.run.handoffs,
            }));
        }
        // With handoffs running, the fused replay rows without them too (where the schedule
        // hands a level over at all: else both rows would run the same barriers).
        let plan = handoff::plan(schedule, &handoff::accesses(schedule));
        // (Unfused kernels never take a handoff role: nothing to say about them.)
        if fused && args.run.handoffs == Handoffs::On && plan.handed_levels() == 0 {
            eprintln!(
                "note: --handoffs on: no level of the fused schedule is handed over: none has \
                 one reader of what one kernel of the level before publishes (`vkfuse inspect` \
                 lists the levels), so it runs once, with its barriers"
            );
        }
        if fused && args.run.handoffs.enabled(device.info()) && plan.handed_levels() > 0 {
            configs.extend([1u32, 8].map(|k| Config {
                k,
                write_back: WriteBack::default(),
                persistence: args.run.persistent,
                handoffs: Handoffs::Off,
            }));
        }
        // With state copied back, the other write-back too (same tokens, both timed).
        if has_ping_pong(&device, schedule) {
            let other = match WriteBack::default() {
                WriteBack::Copy => WriteBack::PingPong,
                WriteBack::PingPong => WriteBack::Copy,
            };
            configs.extend([1u32, 8].map(|k| Config {
                k,
                write_back: other,
                persistence: args.run.persistent,
                handoffs: args.run.handoffs,
            }));
        }
        for config in configs {
            let (report, write_back, handed_levels) =
                measure(&device, schedule, weights.as_ref(), config, args.tokens)?;
            rows.push(Row {
                fused,
                backend: if config.k == 0 { "eager" } else { "replay" },
                tokens_per_submit: config.k.max(1),
                write_back,
                persistent_groups: groups(config.persistence),
                handed_levels,
                report,
            });
        }
    }
    writeln!(
        out,
        "{:<7} {:<7} {:>2} {:<10} {:>7} {:>8} {:>10} {:>9} {:>9} {:>9} {:>10} {:>9} {:>10} {:>10} {:>8}",
        "fused",
        "backend",
        "K",
        "write-back",
        "persist",
        "handoffs",
        "tokens/s",
        "ms/token",
        "host µs",
        "GPU µs",
        "dispatches",
        "barriers",
        "desc.wr.",
        "recordings",
        "submits"
    )?;
    for r in &rows {
        let p = &r.report;
        writeln!(
            out,
            "{:<7} {:<7} {:>2} {:<10} {:>7} {:>8} {:>10.1} {:>9.3} {:>9.1} {:>9} {:>10.0} {:>9.1} {:>10.0} {:>10.3} {:>8.3}",
            if r.fused { "yes" } else { "no" },
            r.backend,
            r.tokens_per_submit,
            r.write_back,
            match r.persistent_groups {
                0 => "-".to_string(),
                g => format!("{g} wg"),
            },
            match r.handed_levels {
                0 => "-".to_string(),
                n => format!("{n} lv"),
            },
            p.tokens_per_s,
            1e3 / p.tokens_per_s.max(1e-9),
            p.host_us_per_token,
            p.gpu_us_per_token.map_or("-".into(), |g| format!("{g:.1}")),
            p.dispatches_per_token,
            p.barriers_per_token,
            p.descriptor_writes_per_token,
            p.recordings_per_token,
            p.submits_per_token
        )?;
    }
    // After the table, so that a disagreement still shows what each configuration measured,
    // and named by row and first differing token (whole token lists buried the figures).
    let leeway = |fused: bool| {
        schedules
            .iter()
            .find(|(f, _)| *f == fused)
            .map_or(Leeway::default(), |(_, s)| Leeway::of(s))
    };
    let (faults, explained) = partings(&rows, leeway);
    if !faults.is_empty() {
        bail!(
            "configurations disagree on the generated tokens (each row against its schedule's \
             first, the fused schedule's first against the unfused one's): {}",
            faults.join(", ")
        );
    }
    if !explained.is_empty() {
        // Not a failure: the suites compare these kernels' logits, teacher-forced.
        let l = leeway(true);
        let mut why = vec![];
        if l.f16_dots && schedules.len() > 1 {
            why.push(if int8 {
                "take f16 dots (int8 in the chained MLPs) where the unfused ones take f32"
            } else {
                "take f16 dots where the unfused ones take f32"
            });
        }
        if l.atomics {
            why.push("sum with float atomics, whose order varies from run to run");
        }
        let why = format!("the fused kernels {}", why.join(", and "));
        eprintln!(
            "note: tokens part at {}: {why}, so a near-tie of the logits can pick another \
             token (random-weight models have many)",
            explained.join(", ")
        );
    }
    if args.profile {
        // The fused schedule where there is one (the configuration that matters).
        let (_, schedule) = schedules
            .iter()
            .find(|(fused, _)| *fused)
            .unwrap_or(&schedules[0]);
        let loaded = load(
            &device,
            schedule,
            weights.as_ref(),
            args.run.persistent,
            args.run.handoffs,
        )?;
        let mut replay = Replay::new(loaded)?;
        crate::profile::print(&mut out, &mut replay, args.profile_steps)?;
        drop(replay);
        // A model directory was compiled both ways, unfused first.
        match schedules.as_slice() {
            [(false, plain), (true, fused)] => crate::against_plain::print(
                &mut out,
                &device,
                fused,
                plain,
                weights.as_ref(),
                args.profile_steps,
            )?,
            _ => writeln!(
                out,
                "\nfused kernels against plain ones: give a model directory (bench compiles it \
                 both ways; a schedule file holds one)"
            )?,
        }
    }
    if args.json {
        writeln!(out, "{}", serde_json::to_string(&rows)?)?;
    }
    Ok(())
}

/// Rows parting before this token mean a fault whatever the schedules: a wrong kernel or
/// recording changes the tokens at once, and a near-tie this early is rare.
const EARLIEST_PART: usize = 16;

/// Why a fused schedule's rows may pick other tokens than the rows they are compared with,
/// without a fault.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Leeway {
    /// A kernel sums with float atomics, whose order varies from run to run: from
    /// [`EARLIEST_PART`] on, a near-tie of the logits can go either way.
    atomics: bool,
    /// The fused schedule takes f16 dots where the unfused one takes f32 (other roundings):
    /// its first row may part from the unfused first row anywhere.
    f16_dots: bool,
}

impl Leeway {
    fn of(schedule: &Schedule) -> Leeway {
        Leeway {
            atomics: schedule.float_atomic_kernel().is_some(),
            f16_dots: schedule.float16_kernel().is_some(),
        }
    }
}

/// The rows whose tokens part from those they are compared with, as "row N from token I"
/// (rows counted from 1 as printed, I the first differing index): faults, then those the
/// schedules' leeway explains. Each row is compared with its own schedule's first row, and the
/// fused schedule's first row with the unfused one's (where both ran); `leeway(fused)` is the
/// schedule's.
fn partings(rows: &[Row], leeway: impl Fn(bool) -> Leeway) -> (Vec<String>, Vec<String>) {
    let first_of = |fused: bool| rows.iter().position(|r| r.fused == fused);
    let (mut faults, mut explained) = (vec![], vec![]);
    for (i, r) in rows.iter().enumerate() {
        let own = first_of(r.fused).unwrap_or(i);
        // A schedule's first row against the other schedule's, where that ran first.
        let (against, across) = match first_of(!r.fused) {
            Some(o) if own == i && o < i => (o, true),
            _ => (own, false),
        };
        let (got, want) = (&r.report.ids, &rows[against].report.ids);
        let Some(at) = got
            .iter()
            .zip(want)
            .position(|(a, b)| a != b)
            .or((got.len() != want.len()).then(|| got.len().min(want.len())))
        else {
            continue;
        };
        let l = leeway(r.fused);
        let noise = (across && l.f16_dots) || (l.atomics && at >= EARLIEST_PART);
        let what = format!("row {} from token {at}", i + 1);
        if noise {
            explained.push(what);
        } else {
            faults.push(what);
        }
    }
    (faults, explained)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(ids: &[u32]) -> Row {
        Row {
            fused: true,
            backend: "replay",
            tokens_per_submit: 8,
            write_back: "copy",
            persistent_groups: 0,
            handed_levels: 0,
            report: RunReport {
                backend: "replay".into(),
                ids: ids.to_vec(),
                tokens_per_s: 1.0,
                host_us_per_token: 0.0,
                gpu_us_per_token: None,
                dispatches_per_token: 0.0,
                barriers_per_token: 0.0,
                descriptor_writes_per_token: 0.0,
                recordings_per_token: 0.0,
                submits_per_token: 0.0,
            },
        }
    }

    #[test]
    fn should_name_each_parting_row_and_its_first_differing_token() {
        let rows = [
            row(&[1, 2, 3]),
            row(&[1, 2, 3]),
            row(&[1, 9, 3]),
            row(&[1, 2]),
        ];
        let none = |_| Leeway::default();
        assert_eq!(
            partings(&rows, none).0,
            ["row 3 from token 1", "row 4 from token 2"]
        );
        assert_eq!(partings(&rows[..2], none), (vec![], vec![]));
        assert_eq!(partings(&[], none), (vec![], vec![]));
    }

    #[test]
    fn float_atomics_explain_late_partings_only() {
        let ids: Vec<u32> = (0..64).collect();
        let mut late = ids.clone();
        late[EARLIEST_PART] = 999;
        let mut early = ids.clone();
        early[EARLIEST_PART - 1] = 999;
        let rows = [row(&ids), row(&late), row(&early)];
        let atomics = |_| Leeway {
            atomics: true,
            f16_dots: false,
        };
        assert_eq!(
            partings(&rows, atomics),
            (
                vec!["row 3 from token 15".to_string()],
                vec!["row 2 from token 16".to_string()]
            )
        );
    }

    #[test]
    fn f16_dots_explain_the_fused_first_row_against_the_unfused_one_only() {
        let mut unfused = row(&[1, 2, 3]);
        unfused.fused = false;
        // The fused schedule's first row parts from the unfused one at once (other roundings);
        // its other rows are held to that first fused row, exactly.
        let rows = [unfused, row(&[1, 5, 6]), row(&[1, 5, 6]), row(&[1, 5, 7])];
        let f16 = |fused: bool| Leeway {
            atomics: false,
            f16_dots: fused,
        };
        assert_eq!(
            partings(&rows, f16),
            (
                vec!["row 4 from token 2".to_string()],
                vec!["row 2 from token 1".to_string()]
            )
        );
        // Without f16 dots the same parting is a fault.
        let plain = |_| Leeway::default();
        assert_eq!(partings(&rows, plain).0.len(), 2);
    }
}
