//! `vkfuse bench`: the same tokens through every executor configuration, one table.
//!
//! Each configuration decodes `--tokens` greedy tokens after a one-token prompt, after one
//! warm-up sequence (pipelines compiled, caches warm), and must produce the same tokens as the
//! others. Figures are per processed token; resetting between sequences is not counted.

use crate::metrics::RunReport;
use crate::upload::UploadDisplay;
use anyhow::{bail, Context, Result};
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;
use vkfuse_compiler::lower::{self, SpirvCache};
use vkfuse_compiler::{fuse, import, trace};
use vkfuse_runtime::schedule::{Schedule, ScheduleFile};
use vkfuse_runtime::session::{Eager, LoadOptions, Loaded, Replay, TensorBytes};
use vkfuse_runtime::Device;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// A Hugging Face model directory (compiled in memory both unfused and fused) or a schedule
    /// file (run as compiled).
    pub model: PathBuf,
    /// Greedy tokens to decode per configuration.
    #[arg(long, default_value_t = 64)]
    pub tokens: usize,
    /// The Vulkan device, by index in `vkfuse devices`.
    #[arg(long, value_name = "N")]
    pub device: Option<usize>,
    /// Print a JSON array (one object per configuration) as the last stdout line.
    #[arg(long)]
    pub json: bool,
}

#[derive(serde::Serialize)]
struct Row {
    fused: bool,
    backend: &'static str,
    tokens_per_submit: u32,
    #[serde(flatten)]
    report: RunReport,
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

/// A fresh sequence: token 1, then greedy tokens, `k` steps per submit.
fn greedy_replay(r: &mut Replay, k: u32, tokens: usize, ids: &mut Vec<u32>) -> Result<()> {
    ids.clear();
    ids.push(r.step(Some(1))?.next_token);
    ids.extend(r.greedy_tokens(None, (tokens - 1) as u32, k)?);
    Ok(())
}

/// One configuration: `k = 0` means eager.
fn measure(
    device: &Device,
    schedule: &Schedule,
    weights: &dyn TensorBytes,
    k: u32,
    tokens: usize,
) -> Result<RunReport> {
    let mut upload = UploadDisplay::new();
    let options = LoadOptions {
        pipeline_cache: None,
        progress: Some(&mut |p| upload.update(p)),
    };
    let loaded = Loaded::load(device.clone(), schedule.clone(), weights, options)?;
    let capacity = loaded.schedule.meta.max_context as usize;
    if tokens + 1 > capacity {
        bail!(
            "--tokens {tokens} needs {} positions; the schedule reserves {capacity}",
            tokens + 1
        );
    }
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
        let mut r = Replay::new(loaded)?;
        let rest = (tokens - 1) as u32;
        r.prepare(k.min(rest.max(1)))?;
        r.prepare(rest % k)?;
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
    Ok(RunReport::new(
        if k == 0 { "eager" } else { "replay" },
        ids,
        &per,
    ))
}

pub fn run(args: &BenchArgs) -> Result<()> {
    if args.tokens < 2 {
        bail!("--tokens must be at least 2");
    }
    // The schedules to compare: a model directory is compiled both ways in memory; a schedule
    // file runs as it was compiled (fused unless compile-model had --no-fuse).
    let mut schedules: Vec<(bool, Schedule)> = vec![];
    let weights: Box<dyn TensorBytes> = if args.model.is_file() {
        let (s, w) = ScheduleFile::open(&args.model)?.into_parts();
        let fused = s.kernels.iter().any(|k| k.label.starts_with("fused_"));
        schedules.push((fused, s));
        Box::new(w)
    } else {
        let model = import::load(&args.model)
            .with_context(|| format!("loading {}", args.model.display()))?;
        let program = trace::trace(&model, &trace::TraceOptions::default())?;
        let meta = lower::Meta::of(&model);
        let mut spirv = SpirvCache::default();
        schedules.push((false, lower::lower(&program, &meta, &mut spirv)?));
        let (fused, _) =
            fuse::lower_fused(&program, &meta, &mut spirv, &fuse::FuseOptions::default())?;
        schedules.push((true, fused));
        Box::new(model.tensors)
    };
    let device = crate::decode::open_device(args.device)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "device: {}", device.info().name)?;
    writeln!(
        out,
        "{} greedy tokens after a 1-token prompt, per configuration, after one warm-up run",
        args.tokens
    )?;
    let mut rows = vec![];
    for (fused, schedule) in &schedules {
        let fused = *fused;
        for k in [0u32, 1, 8] {
            let report = measure(&device, schedule, weights.as_ref(), k, args.tokens)?;
            rows.push(Row {
                fused,
                backend: if k == 0 { "eager" } else { "replay" },
                tokens_per_submit: k.max(1),
                report,
            });
        }
    }
    if rows.iter().any(|r| r.report.ids != rows[0].report.ids) {
        bail!(
            "configurations disagree on the generated tokens: {:?}",
            rows.iter().map(|r| &r.report.ids).collect::<Vec<_>>()
        );
    }
    writeln!(
        out,
        "{:<7} {:<7} {:>2} {:>10} {:>9} {:>9} {:>9} {:>10} {:>9} {:>10} {:>10} {:>8}",
        "fused",
        "backend",
        "K",
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
            "{:<7} {:<7} {:>2} {:>10.1} {:>9.3} {:>9.1} {:>9} {:>10.0} {:>9.1} {:>10.0} {:>10.3} {:>8.3}",
            if r.fused { "yes" } else { "no" },
            r.backend,
            r.tokens_per_submit,
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
    if args.json {
        writeln!(out, "{}", serde_json::to_string(&rows)?)?;
    }
    Ok(())
}
