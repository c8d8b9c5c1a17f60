//! The timeline probe (`compile-model --timeline`, `kernels/glsl/timeline.glsl`,
//! `session::timeline`): every kernel of the fused schedule wrapped so that each workgroup
//! records its begin and end on the device's clock.
//!
//! 1. The wrapped schedule still decodes transformers' greedy tokens (the kernels compute what
//!    they did), with and without handoffs, validation clean.
//! 2. What it records is what ran: every workgroup of every dispatch of every timed step has
//!    exactly one record (`Timeline::read` refuses a missing or a surplus one), each ends
//!    after it began with its marks between, the attention block and the chained MLP mark
//!    their way, and the Vulkan barrier between two levels shows: no workgroup of a level
//!    begins before every workgroup of the level before has ended (lavapipe's realtime clock
//!    is the host's monotonic one). A step begins after the step before it ended.
//! 3. A schedule without the probe is refused by name, and so are more steps than are kept.

use vkfuse_compiler::fuse::{lower_fused, FuseOptions};
use vkfuse_compiler::lower::{Meta, SpirvCache};
use vkfuse_compiler::{import, trace};
use vkfuse_runtime::session::timeline::{DispatchRun, TIMELINE_STEPS};
use vkfuse_runtime::session::{Handoffs, LoadOptions, Loaded, Replay};
use vkfuse_tests::{expected, fixture_dir, fused_schedule, validated_device};

const NAME: &str = "qwen3-tied";

fn timed_replay(device: &vkfuse_runtime::Device, handoffs: Handoffs) -> Replay {
    let model = import::load(&fixture_dir(NAME)).unwrap();
    let program = trace::trace(&model, &trace::TraceOptions::default()).unwrap();
    let (schedule, _) = lower_fused(
        &program,
        &Meta::of(&model),
        &mut SpirvCache::timeline(),
        &FuseOptions::default(),
    )
    .unwrap();
    assert!(schedule.kernels.iter().all(|k| k.records_timeline()));
    let options = LoadOptions {
        handoffs,
        ..LoadOptions::default()
    };
    let loaded = Loaded::load(device.clone(), schedule, &model.tensors, options).unwrap();
    Replay::new(loaded).unwrap()
}

/// Checks 2 above on `runs` of `steps` steps of `replay`'s schedule; `barriers` where no level
/// was handed over.
fn check_runs(what: &str, replay: &Replay, runs: &[DispatchRun], steps: usize, barriers: bool) {
    let s = &replay.loaded().schedule;
    let mut level_of = vec![0; s.dispatches.len()];
    for (i, level) in s.levels.iter().enumerate() {
        for d in level.clone() {
            level_of[d as usize] = i;
        }
    }
    assert_eq!(runs.len(), steps * s.dispatches.len(), "{what}: dispatches");
    for r in runs {
        let d = &s.dispatches[r.dispatch];
        let (_, grid) = d.grid_at(u32::MAX);
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
    for handoffs in [Handoffs::Off, Handoffs::On] {
        let what = format!("handoffs {handoffs:?}");
        let mut replay = timed_replay(&device, handoffs);
        replay.reset().unwrap();
        let mut ids = vec![];
        for &t in &want.prompt_ids {
            ids = vec![replay.step(Some(t)).unwrap().next_token];
        }
        // Greedy steps before the timed ones, then the timed ones in chains of 4 (one short).
        let timed = 10u32;
        let before = (want.greedy_ids.len() - ids.len()) as u32 - timed;
        ids.extend(replay.greedy_tokens(None, before, 8).unwrap());
        let (tokens, runs) = replay.timeline(None, timed, 4).unwrap();
        ids.extend(tokens);
        assert_eq!(ids, want.greedy_ids, "{what}: greedy ids");
        let barriers = replay.handed_levels() == 0;
        assert_eq!(barriers, handoffs == Handoffs::Off, "{what}: handed levels");
        check_runs(&what, &replay, &runs, timed as usize, barriers);
    }
    assert!(log.is_clean(), "{}", log.report());
}

#[test]
fn a_schedule_without_the_probe_and_too_many_steps_are_refused() {
    let (device, log) = validated_device();
    let (model, schedule, _) = fused_schedule(NAME);
    let loaded = Loaded::new(device.clone(), schedule, &model.tensors).unwrap();
    let mut replay = Replay::new(loaded).unwrap();
    replay.step(Some(1)).unwrap();
    let err = replay.timeline(None, 2, 2).unwrap_err().to_string();
    assert!(err.contains("compile-model --timeline"), "{err}");
    let mut timed = timed_replay(&device, Handoffs::Off);
    timed.step(Some(1)).unwrap();
    let err = timed
        .timeline(None, TIMELINE_STEPS + 1, 8)
        .unwrap_err()
        .to_string();
    assert!(err.contains(&format!("1..={TIMELINE_STEPS}")), "{err}");
    assert!(log.is_clean(), "{}", log.report());
}
