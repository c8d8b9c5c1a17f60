//! `vkfuse bench MODEL --profile`, second table: each fused kernel timed against the plain
//! kernels it replaces (issue 7: "fused kernels lose nothing against the plain ones").
//!
//! Both schedules of the same trace run with every dispatch in a level of its own (a barrier
//! before each, no handoffs, no persistent regions), so a timestamp after each level times
//! each kernel alone in a real step: its weights, its inputs, the caches as the step leaves
//! them. A dispatch's [`Dispatch::ops`] name the trace's ops it computes, the same ids in both
//! schedules, so a fused kernel's plain counterpart is the unfused dispatches of its ops. The
//! fused step runs without its L2 prefetch dispatches here: they would read the next fused
//! matvecs' weights into the cache ahead of them, and the plain step has none. Its other work
//! that no op names (zeroing the chained MLP's sums) is a row of its own, counted in the total.
//!
//! The two steps are timed in turns, 8 of each, both loaded and warmed up first
//! ([`crate::profile::warm_up`]), so that the device's clocks, which drift with its load,
//! are the same for both sides (one timed after the other, a kernel read up to 1.7x apart
//! from one table to the next on an H200: docs/perf.md, session 59). That holds both sets of
//! weights on the device at once; where the second does not load, each step is timed alone
//! after its own warm-up, one after the other, and the table says so.
//!
//! Each kernel's time includes the barrier before it, so the plain side pays one barrier per
//! kernel, as eager runs it. The "kernels only" columns take that out: they subtract, from
//! every dispatch, the cheapest dispatch of the plain step (a barrier and a launch of almost no
//! work), which is an upper bound of what a barrier alone costs there.

use anyhow::{Context, Result};
use std::collections::HashMap;
use std::io::Write;
use vkfuse_runtime::schedule::{Dispatch, Schedule};
use vkfuse_runtime::session::{LoadOptions, Loaded, Replay, TensorBytes};
use vkfuse_runtime::{Device, Handoffs, Persistence};

/// One fused kernel (all its dispatches in the step) against the plain dispatches of its ops.
#[derive(Debug, PartialEq)]
pub struct KernelRow {
    /// The first dispatch's label, without its op list.
    pub label: String,
    /// Its dispatches in the step (one per layer for a layer's kernel).
    pub instances: usize,
    /// Plain dispatches per instance (the mean, where instances differ).
    pub plain_dispatches: f64,
    /// Mean ns per instance, fused and plain (the plain dispatches of its ops summed).
    pub fused_ns: f64,
    pub plain_ns: f64,
}

/// Pairs every dispatch of `fused` whose kernel is a fused one (`fused_*`) with the dispatches
/// of `plain` computing its ops, one row per fused kernel, in step order. `fused_ns[d]` and
/// `plain_ns[d]` are dispatch d's times. A plain dispatch of an op no fused kernel covers is
/// left out (the fused step computes it another way or not at all).
pub fn pair(
    fused: &Schedule,
    fused_ns: &[f64],
    plain: &Schedule,
    plain_ns: &[f64],
) -> Vec<KernelRow> {
    let by_op: HashMap<u32, usize> = plain
        .dispatches
        .iter()
        .enumerate()
        .flat_map(|(i, d)| d.ops.iter().map(move |&o| (o, i)))
        .collect();
    // By kernel, in the order the kernels first run.
    let mut rows: Vec<KernelRow> = vec![];
    let mut row_of: HashMap<u32, usize> = HashMap::new();
    for (d, &t) in fused.dispatches.iter().zip(fused_ns) {
        if !fused.kernels[d.kernel.index()].label.starts_with("fused_") {
            continue;
        }
        // The plain dispatches of its ops, each once (should one compute several of them).
        let mut matched: Vec<usize> = d.ops.iter().filter_map(|o| by_op.get(o).copied()).collect();
        matched.sort_unstable();
        matched.dedup();
        if matched.is_empty() {
            continue;
        }
        let r = *row_of.entry(d.kernel.0).or_insert_with(|| {
            rows.push(KernelRow {
                label: description(d),
                instances: 0,
                plain_dispatches: 0.0,
                fused_ns: 0.0,
                plain_ns: 0.0,
            });
            rows.len() - 1
        });
        let row = &mut rows[r];
        row.instances += 1;
        row.plain_dispatches += matched.len() as f64;
        row.fused_ns += t;
        row.plain_ns += matched.iter().map(|&i| plain_ns[i]).sum::<f64>();
    }
    for r in &mut rows {
        let n = r.instances as f64;
        r.plain_dispatches /= n;
        r.fused_ns /= n;
        r.plain_ns /= n;
    }
    rows
}

/// Whether a dispatch only reads weights into the L2 cache (`fuse::prefetch`): it writes
/// nothing any other dispatch reads, so a step without it computes the same.
fn is_prefetch(s: &Schedule, d: &Dispatch) -> bool {
    s.kernels[d.kernel.index()].label.starts_with("prefetch[")
}

/// A dispatch's label without the op list fused labels end with (`... (#5 #7)`), which
/// differs from layer to layer.
fn description(d: &Dispatch) -> String {
    let text = match d.label.rfind(" (#") {
        Some(at) => &d.label[..at],
        None => &d.label,
    };
    crate::profile::shortened(text, 56)
}

/// `schedule` loaded to run one dispatch per level, as both sides are timed.
fn replay_per_level(
    device: &Device,
    schedule: &Schedule,
    weights: &dyn TensorBytes,
) -> Result<Replay> {
    let loaded = Loaded::load(
        device.clone(),
        schedule.one_dispatch_per_level(),
        weights,
        LoadOptions {
            pipeline_cache: None,
            progress: None,
            persistence: Persistence::Off,
            handoffs: Handoffs::Off,
            ..LoadOptions::default()
        },
    )?;
    Ok(Replay::new(loaded)?)
}

/// Each dispatch's mean ns in both steps.
struct Timed {
    fused: Vec<f64>,
    plain: Vec<f64>,
    /// Greedy steps timed (as clamped to both schedules' capacity).
    steps: u32,
}

/// Each dispatch's mean ns over `steps` greedy steps of each replay, their steps timed in
/// turns of 8 (the fused step first in every other turn, so that neither always finds the
/// other's data in the caches) after both are warmed up; `None` where the device has no
/// timestamp queries.
fn dispatch_times(fused: &mut Replay, plain: &mut Replay, steps: u32) -> Result<Option<Timed>> {
    let steps = crate::profile::profiled_steps(fused, steps)
        .min(crate::profile::profiled_steps(plain, steps));
    if !crate::profile::warm_up(fused)? || !crate::profile::warm_up(plain)? {
        return Ok(None);
    }
    let replays = [fused, plain];
    let mut sums: [Vec<f64>; 2] = [vec![], vec![]];
    let mut done = 0;
    while done < steps {
        let turn = (steps - done).min(8);
        let order = if (done / 8) % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let ns = replays[i]
                .profile_levels(turn)?
                .context("the device has no timestamp queries")?;
            sums[i].resize(ns.len(), 0.0);
            for (s, t) in sums[i].iter_mut().zip(ns) {
                *s += t * f64::from(turn);
            }
        }
        done += turn;
    }
    let [fused, plain] = sums.map(|s| s.into_iter().map(|t| t / f64::from(steps)).collect());
    Ok(Some(Timed {
        fused,
        plain,
        steps,
    }))
}

/// As [`dispatch_times`], where both steps' weights do not fit the device at once: each step
/// loaded, warmed up and timed alone, one after the other.
fn dispatch_times_alone(
    device: &Device,
    fused: &Schedule,
    plain: &Schedule,
    weights: &dyn TensorBytes,
    steps: u32,
) -> Result<Option<Timed>> {
    let alone = |schedule: &Schedule| -> Result<Option<(Vec<f64>, u32)>> {
        let mut replay = replay_per_level(device, schedule, weights)?;
        let steps = crate::profile::profiled_steps(&replay, steps);
        Ok(crate::profile::level_times(&mut replay, steps)?.map(|ns| (ns, steps)))
    };
    let Some((fused, fused_steps)) = alone(fused)? else {
        return Ok(None);
    };
    let Some((plain, plain_steps)) = alone(plain)? else {
        return Ok(None);
    };
    Ok(Some(Timed {
        fused,
        plain,
        steps: fused_steps.min(plain_steps),
    }))
}

/// Times both schedules one dispatch per level and prints the table.
pub fn print(
    out: &mut dyn Write,
    device: &Device,
    fused: &Schedule,
    plain: &Schedule,
    weights: &dyn TensorBytes,
    steps: u32,
) -> Result<()> {
    if device.info().timestamp_valid_bits == 0 {
        writeln!(
            out,
            "fused against plain: the device has no timestamp queries"
        )?;
        return Ok(());
    }
    let fused = Schedule {
        dispatches: fused
            .dispatches
            .iter()
            .filter(|d| !is_prefetch(fused, d))
            .cloned()
            .collect(),
        ..fused.clone()
    };
    let mut fused_replay = replay_per_level(device, &fused, weights)?;
    let timed = match replay_per_level(device, plain, weights) {
        Ok(mut plain_replay) => dispatch_times(&mut fused_replay, &mut plain_replay, steps)?,
        Err(e) => {
            drop(fused_replay);
            writeln!(
                out,
                "\nnote: the plain step did not load beside the fused one ({e:#}): the two are \
                 timed one after the other, each after its own warm-up"
            )?;
            dispatch_times_alone(device, &fused, plain, weights, steps)?
        }
    };
    let Some(Timed {
        fused: fused_ns,
        plain: plain_ns,
        steps,
    }) = timed
    else {
        writeln!(
            out,
            "fused against plain: the device has no timestamp queries"
        )?;
        return Ok(());
    };
    let rows = pair(&fused, &fused_ns, plain, &plain_ns);
    // The cheapest plain dispatch: a barrier and a launch of almost no work.
    let floor = plain_ns.iter().copied().fold(f64::INFINITY, f64::min);
    let floor = if floor.is_finite() { floor } else { 0.0 };
    writeln!(
        out,
        "\nfused kernels against the plain kernels of their ops: both schedules one dispatch per \
         level (a barrier before each, no handoffs; the fused step without its L2 prefetch), \
         mean of {steps} greedy steps, the two steps timed in turns after a warm-up; a kernel's µs include its barrier; \"kernels only\" takes \
         {:.2} µs (the cheapest plain dispatch: a barrier and a near-empty launch) from every \
         dispatch",
        floor / 1e3
    )?;
    if rows.is_empty() {
        writeln!(out, "no fused kernels in this step")?;
        return Ok(());
    }
    writeln!(
        out,
        "{:<56} {:>4} {:>6} {:>10} {:>10} {:>7} {:>13}",
        "fused kernel", "n", "plain", "fused µs", "plain µs", "ratio", "kernels only"
    )?;
    let (mut fused_sum, mut plain_sum) = (0.0, 0.0);
    let (mut fused_only, mut plain_only) = (0.0, 0.0);
    for r in &rows {
        let n = r.instances as f64;
        let f_only = (r.fused_ns - floor).max(0.0);
        let p_only = (r.plain_ns - r.plain_dispatches * floor).max(0.0);
        fused_sum += n * r.fused_ns;
        plain_sum += n * r.plain_ns;
        fused_only += n * f_only;
        plain_only += n * p_only;
        writeln!(
            out,
            "{:<56} {:>4} {:>6.1} {:>10.2} {:>10.2} {:>7.2} {:>13}",
            r.label,
            r.instances,
            r.plain_dispatches,
            r.fused_ns / 1e3,
            r.plain_ns / 1e3,
            r.fused_ns / r.plain_ns.max(1e-9),
            ratio(f_only, p_only)
        )?;
    }
    // The fused step's work that no op names (zeroing the chains' sums): the fused side's
    // cost, with no plain counterpart.
    let extra: Vec<f64> = fused
        .dispatches
        .iter()
        .zip(&fused_ns)
        .filter(|(d, _)| d.ops.is_empty())
        .map(|(_, &t)| t)
        .collect();
    if !extra.is_empty() {
        let t: f64 = extra.iter().sum();
        let t_only: f64 = extra.iter().map(|t| (t - floor).max(0.0)).sum();
        fused_sum += t;
        fused_only += t_only;
        writeln!(
            out,
            "{:<56} {:>4} {:>6} {:>10.2} {:>10} {:>7} {:>13}",
            "(fused only: zeroing, no op of the trace)",
            extra.len(),
            "-",
            t / 1e3 / extra.len() as f64,
            "-",
            "-",
            "-"
        )?;
    }
    writeln!(
        out,
        "all fused kernels: {:.1} µs against {:.1} µs plain per step (ratio {:.2}; kernels only \
         {})",
        fused_sum / 1e3,
        plain_sum / 1e3,
        fused_sum / plain_sum.max(1e-9),
        ratio(fused_only, plain_only)
    )?;
    Ok(())
}

/// `a / b` to two places, or `-` where the plain side is all barrier.
fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}", a / b)
    } else {
        "-".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vkfuse_runtime::schedule::{
        BufferId, Io, KernelDecl, KernelId, ModelMeta, Schedule, Slice, TokenEncoding,
    };

    fn kernel(label: &str) -> KernelDecl {
        KernelDecl {
            label: label.into(),
            spirv: vec![],
            bindings: 0,
            push_constant_bytes: 0,
            spec_constants: vec![],
            subgroups: None,
        }
    }

    fn dispatch(kernel: u32, label: &str, ops: &[u32]) -> Dispatch {
        Dispatch {
            kernel: KernelId(kernel),
            bindings: vec![],
            push_constants: vec![],
            workgroups: [1, 1, 1],
            label: label.into(),
            alternatives: vec![],
            ops: ops.to_vec(),
        }
    }

    fn schedule(kernels: Vec<KernelDecl>, dispatches: Vec<Dispatch>) -> Schedule {
        let s = Slice {
            buffer: BufferId(0),
            offset: 0,
            size: 4,
        };
        Schedule {
            meta: ModelMeta {
                architecture: "t".into(),
                vocab_size: 1,
                max_context: 8,
                eos_token_ids: vec![],
                tokenizer: None,
            },
            buffers: vec![],
            weights: vec![],
            kernels,
            levels: (0..dispatches.len() as u32).map(|d| d..d + 1).collect(),
            dispatches,
            io: Io {
                token: s,
                token_encoding: TokenEncoding::Index,
                position: s,
                logits: s,
            },
            persistent: vec![],
        }
    }

    #[test]
    fn should_pair_each_fused_kernel_with_the_plain_dispatches_of_its_ops() {
        // Two layers of a fused norm+matvec kernel (ops 1,2 and 5,6), a plain embedding kept
        // as it is, and a zeroing dispatch with no ops.
        let fused = schedule(
            vec![
                kernel("embedding[]"),
                kernel("fused_matvec[]"),
                kernel("zero[]"),
            ],
            vec![
                dispatch(0, "embedding %0", &[0]),
                dispatch(2, "zero", &[]),
                dispatch(1, "matvec norm (#1 #2)", &[1, 2]),
                dispatch(1, "matvec norm (#5 #6)", &[5, 6]),
            ],
        );
        let plain = schedule(
            vec![
                kernel("embedding[]"),
                kernel("rms_norm[]"),
                kernel("matvec[]"),
            ],
            vec![
                dispatch(0, "embedding", &[0]),
                dispatch(1, "rms_norm", &[1]),
                dispatch(2, "matvec", &[2]),
                dispatch(1, "rms_norm", &[5]),
                dispatch(2, "matvec", &[6]),
                // An op of the plain step no fused kernel covers: not counted.
                dispatch(2, "matvec", &[9]),
            ],
        );
        let rows = pair(
            &fused,
            &[1.0, 1.0, 10.0, 14.0],
            &plain,
            &[1.0, 3.0, 9.0, 5.0, 11.0, 100.0],
        );
        assert_eq!(
            rows,
            vec![KernelRow {
                label: "matvec norm".into(),
                instances: 2,
                plain_dispatches: 2.0,
                fused_ns: 12.0,
                plain_ns: 14.0,
            }]
        );
    }
}
