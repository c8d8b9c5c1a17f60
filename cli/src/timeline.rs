//! `vkfuse timeline FILE`: what ran when inside replayed steps, workgroup by workgroup, from a
//! schedule compiled with `compile-model --timeline` (each kernel records its workgroups' begin
//! and end on the device's realtime clock: `kernels/glsl/timeline.glsl`). Timestamps between
//! levels (`vkfuse bench --profile`) need a barrier before each level; this sees the handed
//! levels overlap as they run.

use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use vkfuse_runtime::session::timeline::{DispatchRun, TIMELINE_STEPS};
use vkfuse_runtime::session::{LoadOptions, Loaded, Replay};
use vkfuse_runtime::Handoffs;

#[derive(clap::Args)]
pub struct TimelineArgs {
    /// A schedule file compiled with `compile-model --timeline`.
    pub file: PathBuf,
    /// The position of the first timed step (at least 1): the steps before it run untimed,
    /// greedily after token 1 (the context the timed steps attend over).
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..))]
    pub position: u32,
    /// Steps to time (1 to 32, in chains of --tokens-per-submit, as `vkfuse run` submits them).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=TIMELINE_STEPS as i64))]
    pub steps: u32,
    /// Steps per submit.
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub tokens_per_submit: u32,
    /// Which timed step to print dispatch by dispatch, from 0 (default: the middle of the
    /// first chain).
    #[arg(long, value_name = "I")]
    pub show_step: Option<usize>,
    /// Levels handed over instead of a barrier before them, as `vkfuse run --handoffs`.
    #[arg(long, default_value = "auto", value_name = "auto|on|off")]
    pub handoffs: Handoffs,
    /// Also write every workgroup's record as JSON: an array of dispatches, each with its step,
    /// dispatch index, level, label, kernel, [begin, mark 0, mark 1, end] ns per workgroup (a
    /// mark is 0 where the kernel names none) and, from `compile-model --timeline-sm`, each
    /// workgroup's SM. Named as `run --logits-out` is: `--json`
    /// elsewhere prints to stdout (`--json FILE`, its old name, still works).
    #[arg(long = "json-out", alias = "json", value_name = "FILE")]
    pub json_out: Option<PathBuf>,
    #[command(flatten)]
    pub device: crate::options::DeviceArg,
}

#[derive(serde::Serialize)]
struct JsonRun<'a> {
    step: usize,
    dispatch: usize,
    level: usize,
    label: &'a str,
    kernel: &'a str,
    groups: Vec<[u64; 4]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sms: Option<Vec<u32>>,
}

pub fn run(args: &TimelineArgs) -> Result<()> {
    if let Some(path) = &args.json_out {
        crate::options::check_out_folder("--json-out", path)?;
    }
    let file = crate::options::open_schedule(&args.file)?;
    let schedule = file.schedule().clone();
    if !schedule.kernels.iter().any(|k| k.records_timeline()) {
        bail!(
            "{} records no timeline: compile it with `compile-model --timeline`",
            args.file.display()
        );
    }
    if let Some(i) = args.show_step.filter(|&i| i >= args.steps as usize) {
        bail!(
            "--show-step {i}: the timed steps are 0 to {} (--steps {})",
            args.steps - 1,
            args.steps
        );
    }
    let capacity = schedule.meta.max_context;
    if u64::from(args.position) + u64::from(args.steps) > u64::from(capacity) {
        bail!(
            "--position {} plus --steps {} passes the schedule's KV capacity of {capacity} tokens \
             (pass a lower --position or fewer --steps, or compile with a larger --max-context)",
            args.position,
            args.steps
        );
    }
    let device = args.device.open()?;
    let options = LoadOptions {
        handoffs: args.handoffs,
        ..LoadOptions::default()
    };
    let loaded = Loaded::load(device.clone(), schedule, file.weights(), options)
        .with_context(|| format!("loading {} on the device", args.file.display()))?;
    let mut replay = Replay::new(loaded)?;
    let k = args.tokens_per_submit;
    // Warm-up to the position (pipelines, caches), then the timed steps.
    replay.step(Some(1))?;
    if args.position > 1 {
        replay.greedy_tokens(None, args.position - 1, k)?;
    }
    let gpu0 = replay.gpu_ns();
    let (_, runs) = replay.timeline(None, args.steps, k)?;
    // The clock's units are the driver's: the records' span against the submits' timestamps.
    let gpu = replay.gpu_ns().zip(gpu0).map(|(a, b)| a - b);
    let s = &replay.loaded().schedule;
    let level_of = s.dispatch_levels();
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "timeline of {} on {}: {} step{} from position {}, {k} per submit, {} levels handed \
         over per step; µs on the device's realtime clock",
        args.file.display(),
        device.info().name,
        args.steps,
        if args.steps == 1 { "" } else { "s" },
        args.position,
        replay.handed_levels()
    )?;
    let show = args.show_step.unwrap_or((k.min(args.steps) / 2) as usize);
    print_step(&mut out, &runs, show, s, &level_of)?;
    print_late(&mut out, &runs, show, s)?;
    print_summary(&mut out, &runs, s)?;
    let span = |f: fn(&DispatchRun) -> u64| runs.iter().map(f);
    let first = span(DispatchRun::first_begin).min().unwrap_or(0);
    let last = span(DispatchRun::last_end).max().unwrap_or(0);
    match gpu {
        Some(g) if g > 0.0 => {
            let records = (last - first) as f64;
            // The records lie inside the submits, which also hold the chains' gaps: a few
            // percent apart where the table reads the clock in its own units (ns), more where
            // the host is slow between submits (lavapipe on a loaded machine fell below 0.8
            // once). A clock read in another's units is off by its tick's factor: a tick under
            // 0.95 ns (a GHz counter) or of 2 ns and more falls outside these bounds, µs by a
            // thousand; a tick of 1-2 ns would not be told from ns.
            let verdict = if (0.5..=1.05).contains(&(records / g)) {
                "about 1 : 1, so the table's µs are the device's"
            } else {
                "far from 1 : 1: the table reads the clock as ns, and its units are another's"
            };
            writeln!(
                out,
                "clock check: the records span {:.1} µs, the submits' timestamps {:.1} µs: \
                 {verdict}",
                records / 1e3,
                g / 1e3
            )?
        }
        _ => writeln!(
            out,
            "clock check: the device has no timestamps to check the clock by"
        )?,
    }
    if let Some(path) = &args.json_out {
        let json: Vec<JsonRun> = runs
            .iter()
            .map(|r| JsonRun {
                step: r.step,
                dispatch: r.dispatch,
                level: level_of[r.dispatch],
                label: &s.dispatches[r.dispatch].label,
                kernel: &s.kernels[r.kernel.index()].label,
                groups: r
                    .groups
                    .iter()
                    .map(|g| [g.begin, g.marks[0], g.marks[1], g.end])
                    .collect(),
                sms: r.groups.iter().map(|g| g.sm).collect(),
            })
            .collect();
        std::fs::write(path, serde_json::to_string(&json)?)
            .with_context(|| format!("writing {}", path.display()))?;
        writeln!(
            out,
            "\nwrote every workgroup's record to {}",
            path.display()
        )?;
    }
    Ok(())
}

/// The step's dispatches in order: when the first and the last workgroup began and ended,
/// from the step's first begin, and the gap from the previous dispatch's last end to this one's
/// first begin (negative: they overlapped).
fn print_step(
    out: &mut dyn Write,
    runs: &[DispatchRun],
    step: usize,
    s: &vkfuse_runtime::schedule::Schedule,
    level_of: &[usize],
) -> Result<()> {
    let mine: Vec<&DispatchRun> = runs.iter().filter(|r| r.step == step).collect();
    let Some(t0) = mine.iter().map(|r| r.first_begin()).min() else {
        return Ok(());
    };
    let us = |t: u64| (t as f64 - t0 as f64) / 1e3;
    writeln!(
        out,
        "\nstep {step}, dispatch by dispatch (begin/end of its first and last workgroups):"
    )?;
    writeln!(
        out,
        "{:>4} {:>5} {:<44} {:>6} {:>8} {:>8} {:>8} {:>8} {:>7}",
        "#", "level", "dispatch", "groups", "begin", "last beg", "1st end", "end", "gap"
    )?;
    let mut prev_end: Option<u64> = None;
    for r in &mine {
        let gap = prev_end.map_or(String::from("-"), |e| {
            format!("{:+.2}", (r.first_begin() as f64 - e as f64) / 1e3)
        });
        writeln!(
            out,
            "{:>4} {:>5} {:<44} {:>6} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>7}",
            r.dispatch,
            level_of[r.dispatch],
            crate::profile::shortened(&s.dispatches[r.dispatch].label, 44),
            r.groups.len(),
            us(r.first_begin()),
            us(r.last_begin()),
            us(r.first_end()),
            us(r.last_end()),
            gap
        )?;
        prev_end = Some(r.last_end());
    }
    let end = mine.iter().map(|r| r.last_end()).max().unwrap_or(t0);
    writeln!(
        out,
        "step {step}: {:.2} µs from first begin to last end",
        us(end)
    )?;
    Ok(())
}

/// Workgroups that begin this long after their dispatch's first are late ([`late_workgroups`]).
const LATE_NS: u64 = 1000;

/// One dispatch's late workgroups ([`late_workgroups`]).
#[derive(Debug, PartialEq)]
struct Late {
    dispatch: usize,
    /// Its workgroups, and the SMs they ran on.
    groups: usize,
    sms: usize,
    /// Its workgroups that began [`LATE_NS`] or more after its first.
    late: usize,
    /// For the late ones with an SM: the dispatch whose workgroup last ended on that SM before
    /// each began (None: none in the step), with how many, most first.
    after: Vec<(Option<usize>, usize)>,
}

/// The late workgroups of each dispatch of `step` (those of `runs` whose SMs are recorded), and
/// what last ran on their SMs before them; dispatches with none late are left out.
fn late_workgroups(runs: &[DispatchRun], step: usize) -> Vec<Late> {
    let mine: Vec<&DispatchRun> = runs.iter().filter(|r| r.step == step).collect();
    // Every workgroup's end on each SM, in order (lm_head alone has ~19k workgroups: one sort,
    // then a binary search per late workgroup).
    let mut ends: BTreeMap<u32, Vec<(u64, usize)>> = BTreeMap::new();
    for o in &mine {
        for w in &o.groups {
            if let Some(sm) = w.sm {
                ends.entry(sm).or_default().push((w.end, o.dispatch));
            }
        }
    }
    for v in ends.values_mut() {
        v.sort_unstable();
    }
    let mut rows = vec![];
    for r in &mine {
        let first = r.first_begin();
        let sms: std::collections::BTreeSet<u32> = r.groups.iter().filter_map(|g| g.sm).collect();
        let mut after: BTreeMap<Option<usize>, usize> = BTreeMap::new();
        let mut late = 0;
        for g in r.groups.iter().filter(|g| g.begin >= first + LATE_NS) {
            late += 1;
            let Some(sm) = g.sm else { continue };
            // The latest end on this SM at or before this workgroup's begin.
            let last = ends.get(&sm).and_then(|v| {
                let i = v.partition_point(|&(end, _)| end <= g.begin);
                i.checked_sub(1).map(|i| v[i].1)
            });
            *after.entry(last).or_default() += 1;
        }
        if late == 0 {
            continue;
        }
        let mut after: Vec<(Option<usize>, usize)> = after.into_iter().collect();
        after.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        rows.push(Late {
            dispatch: r.dispatch,
            groups: r.groups.len(),
            sms: sms.len(),
            late,
            after,
        });
    }
    rows
}

/// Where the kernels record their SMs (`compile-model --timeline-sm`): in `step`, each
/// dispatch's late workgroups by what last ran on their SMs before them ([`late_workgroups`]).
fn print_late(
    out: &mut dyn Write,
    runs: &[DispatchRun],
    step: usize,
    s: &vkfuse_runtime::schedule::Schedule,
) -> Result<()> {
    if !runs
        .iter()
        .any(|r| r.step == step && r.groups.iter().any(|g| g.sm.is_some()))
    {
        return Ok(());
    }
    writeln!(
        out,
        "\nstep {step}, workgroups that began {:.1} µs or more after their dispatch's first, \
         by what ran last on their SM before them (SMs: how many the dispatch ran on):",
        LATE_NS as f64 / 1e3
    )?;
    writeln!(
        out,
        "{:>4} {:<44} {:>6} {:>5} {:>5}  before the late ones",
        "#", "dispatch", "groups", "SMs", "late"
    )?;
    for row in late_workgroups(runs, step) {
        let list: Vec<String> = row
            .after
            .iter()
            .map(|(d, c)| match d {
                Some(d) => format!(
                    "{c} after #{d} {}",
                    crate::profile::shortened(&s.dispatches[*d].label, 28)
                ),
                None => format!("{c} after nothing in the step"),
            })
            .collect();
        writeln!(
            out,
            "{:>4} {:<44} {:>6} {:>5} {:>5}  {}",
            row.dispatch,
            crate::profile::shortened(&s.dispatches[row.dispatch].label, 44),
            row.groups,
            row.sms,
            row.late,
            list.join(", ")
        )?;
    }
    Ok(())
}

/// Per kernel, medians over every timed instance: its span (first begin to last end), the
/// spread of its workgroups' begins, the median workgroup's own time, and the gap from the
/// dispatch before it in the step; where the kernel marks them, a workgroup's wait (begin to
/// its input's arrival), work (to its own work done) and rest (to its end); then the steps'
/// spans.
fn print_summary(
    out: &mut dyn Write,
    runs: &[DispatchRun],
    s: &vkfuse_runtime::schedule::Schedule,
) -> Result<()> {
    #[derive(Default)]
    struct Acc {
        span: Vec<f64>,
        launch: Vec<f64>,
        own: Vec<f64>,
        gap: Vec<f64>,
        wait: Vec<f64>,
        work: Vec<f64>,
        rest: Vec<f64>,
        groups: usize,
    }
    let mut by: BTreeMap<usize, Acc> = BTreeMap::new();
    let mut steps: BTreeMap<usize, (u64, u64)> = BTreeMap::new();
    for (i, r) in runs.iter().enumerate() {
        let a = by.entry(r.kernel.index()).or_default();
        a.span
            .push((r.last_end() as f64 - r.first_begin() as f64) / 1e3);
        a.launch
            .push((r.last_begin() as f64 - r.first_begin() as f64) / 1e3);
        let us = |a: u64, b: u64| (b as f64 - a as f64) / 1e3;
        let mut own: Vec<f64> = r.groups.iter().map(|g| us(g.begin, g.end)).collect();
        a.own.push(median(&mut own));
        let marked: Vec<_> = r
            .groups
            .iter()
            .filter(|g| g.marks[0] > 0 && g.marks[1] > 0)
            .collect();
        if !marked.is_empty() {
            let mut wait: Vec<f64> = marked.iter().map(|g| us(g.begin, g.marks[0])).collect();
            let mut work: Vec<f64> = marked.iter().map(|g| us(g.marks[0], g.marks[1])).collect();
            let mut rest: Vec<f64> = marked.iter().map(|g| us(g.marks[1], g.end)).collect();
            a.wait.push(median(&mut wait));
            a.work.push(median(&mut work));
            a.rest.push(median(&mut rest));
        }
        a.groups = a.groups.max(r.groups.len());
        if i > 0 && runs[i - 1].step == r.step {
            a.gap
                .push((r.first_begin() as f64 - runs[i - 1].last_end() as f64) / 1e3);
        }
        let e = steps.entry(r.step).or_insert((u64::MAX, 0));
        e.0 = e.0.min(r.first_begin());
        e.1 = e.1.max(r.last_end());
    }
    writeln!(
        out,
        "\nper kernel, medians over its timed dispatches (µs): span = first begin to last end, \
         launch = first to last begin, own = a workgroup's begin to end, gap = from the \
         previous dispatch's last end; where the kernel marks them, a workgroup's wait (to its \
         input's arrival), work (to its own work done) and rest (to its end)"
    )?;
    writeln!(
        out,
        "{:<60} {:>5} {:>6} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7}",
        "kernel", "runs", "groups", "span", "launch", "own", "gap", "wait", "work", "rest"
    )?;
    for (k, mut a) in by {
        let gap = if a.gap.is_empty() {
            "-".to_string()
        } else {
            format!("{:+.2}", median(&mut a.gap))
        };
        let marked = |v: &mut Vec<f64>| match v.is_empty() {
            true => "-".to_string(),
            false => format!("{:.2}", median(v)),
        };
        writeln!(
            out,
            "{:<60} {:>5} {:>6} {:>7.2} {:>7.2} {:>7.2} {:>7} {:>7} {:>7} {:>7}",
            crate::profile::shortened(&s.kernels[k].label, 60),
            a.span.len(),
            a.groups,
            median(&mut a.span),
            median(&mut a.launch),
            median(&mut a.own),
            gap,
            marked(&mut a.wait),
            marked(&mut a.work),
            marked(&mut a.rest)
        )?;
    }
    let mut spans: Vec<f64> = steps
        .values()
        .map(|(b, e)| (*e as f64 - *b as f64) / 1e3)
        .collect();
    writeln!(
        out,
        "steps: median {:.2} µs from a step's first begin to its last end ({} steps)",
        median(&mut spans),
        spans.len()
    )?;
    Ok(())
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::*;
    use vkfuse_runtime::schedule::KernelId;
    use vkfuse_runtime::session::timeline::Workgroup;

    fn run(step: usize, dispatch: usize, groups: &[(u64, u64, u32)]) -> DispatchRun {
        DispatchRun {
            step,
            dispatch,
            kernel: KernelId(0),
            groups: groups
                .iter()
                .map(|&(begin, end, sm)| Workgroup {
                    begin,
                    marks: [0, 0],
                    end,
                    sm: Some(sm),
                })
                .collect(),
        }
    }

    #[test]
    fn late_workgroups_are_named_by_what_last_ended_on_their_sm_before_them() {
        let runs = vec![
            // Dispatch 0 on SMs 0 and 1 (ending at 5 and 3 µs), dispatch 1 on SM 2 (ending at
            // 8 µs) and SM 0 (ending at 9 µs, after the late workgroup there began).
            run(0, 0, &[(0, 5_000, 0), (0, 3_000, 1)]),
            run(0, 1, &[(100, 8_000, 2), (200, 9_000, 0)]),
            // Dispatch 2: one on time, three late: on SM 0 after dispatch 0's (ended 5, not
            // dispatch 1's, which ends later), on SM 2 after dispatch 1's, on SM 1 after 0's.
            run(
                0,
                2,
                &[
                    (1_000, 1_500, 3),
                    (6_000, 7_000, 0),
                    (8_500, 9_500, 2),
                    (4_000, 4_500, 1),
                ],
            ),
            // Another step is not looked at.
            run(1, 2, &[(0, 10, 0), (50_000, 60_000, 0)]),
        ];
        let rows = late_workgroups(&runs, 0);
        assert_eq!(
            rows,
            vec![Late {
                dispatch: 2,
                groups: 4,
                sms: 4,
                late: 3,
                after: vec![(Some(0), 2), (Some(1), 1)],
            }]
        );
        // A late workgroup on an SM where nothing ended before it.
        let runs = vec![run(0, 0, &[(0, 10, 0), (2_000, 3_000, 1)])];
        assert_eq!(late_workgroups(&runs, 0)[0].after, vec![(None, 1)]);
    }
}
