//! The timeline probe (`compile-model --timeline`, `kernels/glsl/timeline.glsl`,
//! `session::timeline`): every kernel of the fused schedule wrapped so that each workgroup
//! records its begin and end on the device's clock.
//!
//! 1. The wrapped schedule still decodes transformers' greedy tokens (the kernels compute what
//!    they did), with and without handoffs, validation clean; its attention block has a band
//!    whose bound the timed chains cross, and the records show each step on the grid its chain
//!    ran.
//! 2. What it records is what ran: every workgroup of every dispatch of every timed step has
//!    exactly one record (`Timeline::read` refuses a missing or a surplus one), each ends
//!    after it began with its marks between, the attention block and the chained MLP mark
//!    their way, and the Vulkan barrier between two levels shows: no workgroup of a level
//!    begins before every workgroup of the level before has ended (lavapipe's realtime clock
//!    is the host's monotonic one). A step begins after the step before it ended.
//! 3. A schedule without the probe is refused by name, and so are more steps than are kept.

use vkfuse_compiler::fuse::bands::AttentionBand;
use vkfuse_compiler::fuse::{lower_fused, FuseOptions};
use vkfuse_compiler::lower::{Meta, SpirvCache};
use vkfuse_compiler::{import, trace};
use vkfuse_runtime::session::timeline::{DispatchRun, TIMELINE_STEPS};
use vkfuse_runtime::session::{Handoffs, Loaded, Replay};
use vkfuse_tests::{expected, fixture_dir, fused_schedule, loaded_with_handoffs, validated_device};

const NAME: &str = "qwen3-tied";

fn timed_replay(device: &vkfuse_runtime::Device, handoffs: Handoffs, opts: &FuseOptions) -> Replay {
    let model = import::load(&fixture_dir(NAME)).unwrap();
    let program = trace::trace(&model, &trace::TraceOptions::default()).unwrap();
    let (schedule, _) = lower_fused(
        &program,
        &Meta::of(&model),
        &mut SpirvCache::timeline(vkfuse_compiler::kernels::timeline::Records::Times),
        opts,
    )
    .unwrap();
    assert!(schedule.kernels.iter().all(|k| k.records_timeline()));
    Replay::new(loaded_with_handoffs(
        device,
        schedule,
        &model.tensors,
        handoffs,
    ))
    .unwrap()
}

/// Checks 2 above on `runs` of `steps` steps of `replay`'s schedule; `barriers` where no level
/// was handed over.
fn check_runs(what: &str, replay: &Replay, runs: &[DispatchRun], steps: usize, barriers: bool) {
    let s = &replay.loaded().schedule;
    let level_of = s.dispatch_levels();
    assert_eq!(runs.len(), steps * s.dispatches.len(), "{what}: dispatches");
    for r in runs {
        let d = &s.dispatches[r.dispatch];
        // The grid of the kernel it ran (a band's alternative or its own).
        let grid = d
            .alternatives
            .iter()
            .find(|a| a.kernel == r.kernel)
            .map_or(d.workgroups, |a| a.workgroups);
        assert_eq!(
            r.groups.len() as u32,
            grid.iter().product::<u32>(),
            "{what}: dispatch {} groups",
            r.dispatch
        );
        for (g, w) in r.groups.iter().enumerate() {
            // Marks, where the kernel sets them, fall between its begin and end, in order.
            let mut points = vec![w.begin];
            points.extend(w.marks.iter().filter(|&&m| m > 0));
            points.push(w.end);
            assert!(
                w.begin > 0 && points.windows(2).all(|p| p[0] <= p[1]),
                "{what}: dispatch {} group {g}: {w:?}",
                r.dispatch
            );
        }
    }
    // The kernels that mark their way do in every run (the attention block's splits that work,
    // every chained MLP workgroup).
    for r in runs {
        let label = &s.kernels[r.kernel.index()].label;
        if label.starts_with("fused_chain") || label.starts_with("fused_attention") {
            assert!(
                r.groups.iter().any(|g| g.marks.iter().all(|&m| m > 0)),
                "{what}: dispatch {} ({label}) marked nothing",
                r.dispatch
            );
        }
    }
    for w in runs.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        let next_step = b.step == a.step + 1;
        let next_level = b.step == a.step && level_of[b.dispatch] > level_of[a.dispatch];
        if next_step || (barriers && next_level) {
            assert!(
                b.first_begin() >= a.last_end(),
                "{what}: step {} dispatch {} began {} ns before dispatch {} (step {}) ended",
                b.step,
                b.dispatch,
                a.last_end() - b.first_begin(),
                a.dispatch,
                a.step
            );
        }
    }
}

#[test]
fn timed_kernels_decode_as_transformers_and_record_every_workgroup_in_barrier_order() {
    let (device, log) = validated_device();
    let want = expected(NAME);
    // A band below 28: of the timed chains of 4 from position 21, the first (21-24) runs it and
    // the next two the block's own grid.
    let banded = FuseOptions {
        attention_splits: Some(4),
        attention_bands: Some(vec![AttentionBand {
            below: 28,
            splits: 2,
            workgroup: 64,
        }]),
        ..FuseOptions::default()
    };
    for handoffs in [Handoffs::Off, Handoffs::On] {
        let what = format!("handoffs {handoffs:?}");
        let mut replay = timed_replay(&device, handoffs, &banded);
        replay.reset().unwrap();
        let mut ids = vec![];
        for &t in &want.prompt_ids {
            ids = vec![replay.step(Some(t)).unwrap().next_token];
        }
        // Greedy steps before the timed ones, then the timed ones in chains of 4 (one short).
        let timed = 10u32;
        let before = (want.greedy_ids.len() - ids.len()) as u32 - timed;
        ids.extend(replay.greedy_tokens(None, before, 8).unwrap());
        assert_eq!(replay.loaded().position().unwrap(), 21, "{what}");
        let (tokens, runs) = replay.timeline(None, timed, 4).unwrap();
        ids.extend(tokens);
        assert_eq!(ids, want.greedy_ids, "{what}: greedy ids");
        let barriers = replay.handed_levels() == 0;
        assert_eq!(barriers, handoffs == Handoffs::Off, "{what}: handed levels");
        check_runs(&what, &replay, &runs, timed as usize, barriers);
        // The attention block ran its band's grid in the first chain and its own after it.
        let s = &replay.loaded().schedule;
        let band_runs = |band: bool| {
            runs.iter()
                .filter(|r| {
                    let d = &s.dispatches[r.dispatch];
                    !d.alternatives.is_empty() && (r.kernel != d.kernel) == band
                })
                .map(|r| r.step)
                .collect::<std::collections::BTreeSet<_>>()
        };
        assert_eq!(
            band_runs(true),
            (0..4).collect(),
            "{what}: steps on the band"
        );
        assert_eq!(
            band_runs(false),
            (4..10).collect(),
            "{what}: steps on the own grid"
        );
        let err = replay
            .timeline(None, TIMELINE_STEPS + 1, 8)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("1..={TIMELINE_STEPS}")),
            "{what}: {err}"
        );
    }
    assert!(log.is_clean(), "{}", log.report());
}

#[test]
fn a_schedule_without_the_probe_is_refused() {
    let (device, log) = validated_device();
    let (model, schedule, _) = fused_schedule(NAME);
    let loaded = Loaded::new(device.clone(), schedule, &model.tensors).unwrap();
    let mut replay = Replay::new(loaded).unwrap();
    replay.step(Some(1)).unwrap();
    let err = replay.timeline(None, 2, 2).unwrap_err().to_string();
    assert!(err.contains("compile-model --timeline"), "{err}");
    assert!(log.is_clean(), "{}", log.report());
}
