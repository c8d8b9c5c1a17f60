//! `vkfuse bench --profile`: where the fused replay step's GPU time goes, per dependency level
//! (a level's dispatches run together; the barrier before it is counted with it), from a
//! separate recording with a timestamp after every level, so the timed recordings carry none.

use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};
use vkfuse_runtime::session::Replay;
use vkfuse_runtime::DeviceType;

/// How long the device is kept stepping before any step is timed. An idle GPU lowers its
/// clocks, and loading a schedule leaves it idle for its upload: an H200 sampled by
/// nvidia-smi every 250 ms sat at 345-800 MHz after one and at 1980 MHz under steady work, and
/// a step and 8 profiled steps of warm-up left the timed ones at whatever clock it had reached
/// (the same kernel read 1.7x slower from one table to the next: docs/perf.md, session 59).
/// Vulkan on the CPU (lavapipe, the test suite's) has no such clocks to raise: its pipelines
/// and caches warm in a few steps.
const WARM_UP: Duration = Duration::from_millis(1500);
const WARM_UP_CPU: Duration = Duration::from_millis(100);

/// `steps` within what the schedule's KV capacity lets a sequence run after its first token.
pub fn profiled_steps(replay: &Replay, steps: u32) -> u32 {
    let capacity = replay.loaded().schedule.meta.max_context;
    steps.clamp(1, capacity.saturating_sub(2).max(1))
}

/// Steps `replay` through profiled steps (pipelines, caches, the device's clocks) for at least
/// [`WARM_UP`] ([`WARM_UP_CPU`] on the CPU), starting the sequence again wherever its KV
/// capacity ends it, then leaves it at a new sequence's token 1, where the timed steps begin.
/// False where the device has no timestamp queries (nothing is run).
pub fn warm_up(replay: &mut Replay) -> Result<bool> {
    if !replay.loaded().device.info().timestamps() {
        return Ok(false);
    }
    let capacity = profiled_steps(replay, u32::MAX);
    let least = match replay.loaded().device.info().device_type {
        DeviceType::Cpu => WARM_UP_CPU,
        _ => WARM_UP,
    };
    let start = Instant::now();
    'warm: loop {
        replay.reset()?;
        replay.step(Some(1))?;
        let mut done = 0;
        while done < capacity {
            let chunk = (capacity - done).min(8);
            if replay.profile_levels(chunk)?.is_none() {
                return Ok(false);
            }
            done += chunk;
            if start.elapsed() >= least {
                break 'warm;
            }
        }
    }
    replay.reset()?;
    replay.step(Some(1))?;
    Ok(true)
}

/// The mean ns of each level over `steps` greedy steps after token 1, after a warm-up
/// ([`warm_up`]); `None` where the device has no timestamp queries.
pub fn level_times(replay: &mut Replay, steps: u32) -> Result<Option<Vec<f64>>> {
    if !warm_up(replay)? {
        return Ok(None);
    }
    Ok(replay.profile_levels(steps)?)
}

/// `text` cut to at most `max` characters, ending in `...` where cut (labels in tables).
pub fn shortened(text: &str, max: usize) -> String {
    if text.chars().count() > max {
        text.chars().take(max - 3).collect::<String>() + "..."
    } else {
        text.to_string()
    }
}

/// The kernel family of a kernel label (`fused_matvec[...]` -> `fused_matvec`).
fn family(label: &str) -> &str {
    label.split('[').next().unwrap_or(label)
}

/// Profiles `steps` greedy steps (after a warm-up) and prints the per-level table and a summary
/// by kernel family.
pub fn print(out: &mut dyn Write, replay: &mut Replay, steps: u32) -> Result<()> {
    let steps = profiled_steps(replay, steps);
    let Some(ns) = level_times(replay, steps)? else {
        writeln!(out, "profile: the device has no timestamp queries")?;
        return Ok(());
    };
    let s = &replay.loaded().schedule;
    // Copies ping-pong dropped are not in the recording.
    let dropped: Vec<usize> = replay
        .ping_pong_plan()
        .states
        .iter()
        .map(|st| st.copy)
        .collect();
    let total: f64 = ns.iter().sum();
    writeln!(
        out,
        "\nprofile: fused replay ({}), mean of {steps} greedy steps, a timestamp after each of \
         {} levels; a level's time includes the barrier before it (every level has one here: \
         handoffs do not run while profiling){}",
        // What runs: ping-pong only changes schedules that copy state back.
        if dropped.is_empty() {
            "write-back as compiled"
        } else {
            "ping-pong write-back"
        },
        s.levels.len(),
        // Each step on its position's grids: the mean mixes the bands the steps fall in.
        match s.bands() {
            b if b.is_empty() => String::new(),
            b => format!(
                "; positions 1..={steps}, each on its band's attention grids (bounds {b:?})"
            ),
        }
    )?;
    writeln!(
        out,
        "{:>5} {:>4} {:>9} {:>6}  kernels",
        "level", "n", "µs", "%"
    )?;
    let mut by_family: BTreeMap<String, (usize, f64)> = BTreeMap::new();
    for (i, (range, t)) in s.levels.iter().zip(&ns).enumerate() {
        let ds: Vec<_> = range
            .clone()
            .filter(|d| !dropped.contains(&(*d as usize)))
            .map(|d| &s.dispatches[d as usize])
            .collect();
        let names: Vec<String> = ds.iter().map(|d| shortened(&d.label, 60)).collect();
        for d in &ds {
            let f = family(&s.kernels[d.kernel.index()].label).to_string();
            let e = by_family.entry(f).or_default();
            e.0 += 1;
            e.1 += t / ds.len() as f64;
        }
        writeln!(
            out,
            "{i:>5} {:>4} {:>9.2} {:>6.2}  {}",
            ds.len(),
            t / 1e3,
            100.0 * t / total.max(1e-9),
            names.join(" | ")
        )?;
    }
    writeln!(
        out,
        "step: {:.1} µs in {} levels ({} dispatches)",
        total / 1e3,
        s.levels.len(),
        s.dispatches.len() - dropped.len()
    )?;
    writeln!(
        out,
        "by kernel (a level's time split evenly among its dispatches):"
    )?;
    let mut fams: Vec<_> = by_family.into_iter().collect();
    fams.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
    for (f, (n, t)) in fams {
        writeln!(
            out,
            "  {f:<20} {n:>5} dispatches {:>9.1} µs {:>6.2}%",
            t / 1e3,
            100.0 * t / total.max(1e-9)
        )
        .context("writing the profile")?;
    }
    Ok(())
}
