//! Bands of positions (fuse::bands, `Dispatch::alternatives`): the attention block compiled
//! with other grids for short positions, and the runtime running each step on its band's grid.
//!
//! 1. Compiled: every attention dispatch of a split block carries the asked bands, ascending,
//!    as kernels of those splits and workgroup sizes, and the schedule still matches
//!    transformers (teacher forcing through every band, eager, replay and replay with
//!    handoffs; greedy tokens with chains of 8 that cross the bounds), validation clean.
//! 2. Which grid runs where: the same schedule with the block's own kernel made wrong (another
//!    attention scale) and a right copy as the alternative below position 16. Positions below
//!    16 must match transformers (so the alternative ran there) and the later ones must not
//!    (so the dispatch's own kernel ran past the bound), in eager and in replay; with the right
//!    copy below 32 instead, replay's greedy chains give transformers' tokens. A chain of 8
//!    steps runs the band of its last step: the one ending at 11 is right, the one from 12 to
//!    19 wrong at every step, 12 to 15 included.
//! 3. The bands' combine of several splits, which the fixture's 32 positions never reach (a
//!    split attends at least 32 slots): 100 positions of a 4-split block with bands of 2, 4
//!    and 3 splits against the CPU reference interpreter, eager, replay, and replay with handoffs
//!    (where the bands' splits combine by polling); and a band of 16 splits (the H100 defaults'
//!    below position 2048, polled with handoffs like every band up to
//!    `bands::MAX_POLLED_SPLITS`) under a block of 20.
//! 4. Bands the block cannot take are errors when asked for, and the defaults leave them out;
//!    a band on the next one's grid merges into it.
//! 5. Bands poll only where the compile's device has more compute units than query heads.

use vkfuse_compiler::fuse::bands::AttentionBand;
use vkfuse_compiler::fuse::{lower_fused, FuseError, FuseOptions};
use vkfuse_compiler::lower::Meta;
use vkfuse_compiler::reference::Reference;
use vkfuse_compiler::{import, trace};
use vkfuse_runtime::schedule::{Alternative, KernelDecl, Schedule};
use vkfuse_runtime::session::{Eager, Handoffs, Loaded, Replay};
use vkfuse_runtime::HandoffPush;
use vkfuse_tests::{
    as_array, assert_rows_close, expected, fixture_dir, fused_schedule_with, loaded_with_handoffs,
    rel_l2, replay_greedy_ids, validated_device, Expected,
};

const NAME: &str = "qwen3-tied";
const TOL: f64 = 5e-3;

fn band(below: u32, splits: usize, workgroup: u32) -> AttentionBand {
    AttentionBand {
        below,
        splits,
        workgroup,
    }
}

fn is_attention(label: &str) -> bool {
    label.starts_with("attention")
}

/// Teacher-forced logits of `step` over the fixture's teacher ids.
fn teacher_rows(want: &Expected, mut step: impl FnMut(u32) -> Vec<f32>) -> Vec<Vec<f32>> {
    want.teacher_ids.iter().map(|&t| step(t)).collect()
}

#[test]
fn banded_grids_match_transformers() {
    let (device, log) = validated_device();
    let want = expected(NAME);
    let bands = vec![band(8, 2, 32), band(16, 4, 64), band(24, 2, 128)];
    let opts = FuseOptions {
        attention_splits: Some(4),
        attention_bands: Some(bands.clone()),
        ..FuseOptions::default()
    };
    let (model, schedule, _) = fused_schedule_with(NAME, &opts);
    assert_eq!(schedule.bands(), vec![8, 16, 24]);
    let attention: Vec<_> = schedule
        .dispatches
        .iter()
        .filter(|d| is_attention(&d.label))
        .collect();
    assert!(!attention.is_empty(), "no attention block");
    for d in &attention {
        assert_eq!(d.alternatives.len(), bands.len(), "{}", d.label);
        for (a, b) in d.alternatives.iter().zip(&bands) {
            assert_eq!(a.below, b.below);
            let k = &schedule.kernels[a.kernel.index()];
            assert!(
                k.label.contains(&format!("splits={}]", b.splits)),
                "{}: {}",
                b,
                k.label
            );
            // Workgroups: heads x splits, of at least the head (32 wide) invocations.
            assert_eq!(k.spec_constants[0], b.workgroup.max(32), "{}", k.label);
            assert_eq!(a.workgroups[0], 4 * b.splits as u32, "{}", k.label);
        }
    }
    // No other dispatch has alternatives.
    assert!(schedule
        .dispatches
        .iter()
        .filter(|d| !is_attention(&d.label))
        .all(|d| d.alternatives.is_empty()));

    let load = |s: Schedule| Loaded::new(device.clone(), s, &model.tensors).unwrap();
    let mut eager = Eager::new(load(schedule.clone())).unwrap();
    let rows = teacher_rows(&want, |t| eager.step(Some(t)).unwrap().logits);
    assert_rows_close("banded eager", &rows, &want.teacher_logits, TOL);
    let mut replay = Replay::new(load(schedule.clone())).unwrap();
    let rows = teacher_rows(&want, |t| replay.step(Some(t)).unwrap().logits);
    assert_rows_close("banded replay", &rows, &want.teacher_logits, TOL);
    let ids = replay_greedy_ids(&mut replay, &want);
    assert_eq!(ids, want.greedy_ids, "banded replay's greedy tokens");
    // With handoffs too (Auto leaves them off on lavapipe): each step's band grid reads q/k/v
    // as words and publishes y, against transformers' logits and ids as well.
    let handed = loaded_with_handoffs(&device, schedule, &model.tensors, Handoffs::On);
    let mut replay = Replay::new(handed).unwrap();
    let rows = teacher_rows(&want, |t| replay.step(Some(t)).unwrap().logits);
    assert_rows_close("banded replay, handoffs", &rows, &want.teacher_logits, TOL);
    let ids = replay_greedy_ids(&mut replay, &want);
    assert_eq!(
        ids, want.greedy_ids,
        "banded replay's greedy tokens, handoffs"
    );
    assert!(log.is_clean(), "validation errors:\n{}", log.report());
}

/// The fixture's fused schedule whose attention blocks run a wrong kernel (four times the
/// attention scale) except below `below`, where their right kernel is the alternative.
fn wrong_past(below: u32) -> (vkfuse_compiler::import::Model, Schedule) {
    let (model, mut s, _) = fused_schedule_with(NAME, &FuseOptions::default());
    let mut swapped = std::collections::HashMap::new();
    for i in 0..s.dispatches.len() {
        if !is_attention(&s.dispatches[i].label) {
            continue;
        }
        let right = s.dispatches[i].kernel;
        let wrong = *swapped.entry(right).or_insert_with(|| {
            let mut k: KernelDecl = s.kernels[right.index()].clone();
            // Specialization constant 5: the attention scale (f32 bits).
            k.spec_constants[5] = (4.0 * f32::from_bits(k.spec_constants[5])).to_bits();
            k.label += " (scale x4)";
            s.kernels.push(k);
            vkfuse_runtime::schedule::KernelId(s.kernels.len() as u32 - 1)
        });
        let d = &mut s.dispatches[i];
        d.kernel = wrong;
        d.alternatives = vec![Alternative {
            below,
            kernel: right,
            workgroups: d.workgroups,
        }];
    }
    assert!(!swapped.is_empty(), "no attention block");
    s.validate().unwrap();
    (model, s)
}

/// Asserts rows below `below` match transformers and every later one does not.
fn right_below(what: &str, rows: &[Vec<f32>], want: &Expected, below: usize) {
    for (p, row) in rows.iter().enumerate() {
        let e = rel_l2(row, want.teacher_logits.row(p));
        if p < below {
            assert!(
                e <= TOL,
                "{what}: position {p}: {e:.3e}: the alternative did not run"
            );
        } else {
            assert!(
                e > 10.0 * TOL,
                "{what}: position {p}: {e:.3e}: the alternative ran past its bound"
            );
        }
    }
}

#[test]
fn each_step_runs_its_bands_grid() {
    let (device, log) = validated_device();
    let want = expected(NAME);
    assert!(want.teacher_ids.len() > 16, "the fixture crosses the bound");
    let (model, schedule) = wrong_past(16);
    let load = |s: Schedule| Loaded::new(device.clone(), s, &model.tensors).unwrap();
    let mut eager = Eager::new(load(schedule.clone())).unwrap();
    let rows = teacher_rows(&want, |t| eager.step(Some(t)).unwrap().logits);
    right_below("eager", &rows, &want, 16);
    let mut replay = Replay::new(load(schedule)).unwrap();
    let rows = teacher_rows(&want, |t| replay.step(Some(t)).unwrap().logits);
    right_below("replay", &rows, &want, 16);

    // A chain runs the band of its last step: 4..=11 all below 16, 12..=19 all past it.
    replay.reset().unwrap();
    for &t in &want.prompt_ids {
        replay.step(Some(t)).unwrap();
    }
    let p = want.prompt_ids.len();
    for (first, right) in [(p, true), (p + 8, false)] {
        assert!(first + 8 <= want.greedy_logits.rows);
        for (i, out) in replay.steps(None, 8).unwrap().iter().enumerate() {
            let e = rel_l2(&out.logits, want.greedy_logits.row(first + i));
            let at = first + i;
            match right {
                true => assert!(e <= TOL, "chain to {}: position {at}: {e:.3e}", first + 7),
                false => assert!(
                    e > 10.0 * TOL,
                    "chain to {}: position {at}: {e:.3e}: not its last step's band",
                    first + 7
                ),
            }
        }
    }

    // Chains of 8 steps: every one ends below 32, so every step runs the right kernel.
    let (model, schedule) = wrong_past(32);
    assert!(want.greedy_ids.len() + want.prompt_ids.len() <= 33);
    let mut replay =
        Replay::new(Loaded::new(device.clone(), schedule, &model.tensors).unwrap()).unwrap();
    let ids = replay_greedy_ids(&mut replay, &want);
    assert_eq!(ids, want.greedy_ids, "greedy chains below the bound");
    assert!(log.is_clean(), "validation errors:\n{}", log.report());
}

/// The fixture's program and model, for the reference interpreter and lower_fused.
fn program() -> (import::Model, vkfuse_compiler::ir::Program) {
    let model = import::load(&fixture_dir(NAME)).unwrap();
    let program = trace::trace(&model, &trace::TraceOptions::default()).unwrap();
    (model, program)
}

fn lower(
    program: &vkfuse_compiler::ir::Program,
    opts: &FuseOptions,
) -> Result<Schedule, FuseError> {
    let meta = Meta {
        architecture: "Qwen3ForCausalLM".into(),
        eos_token_ids: vec![],
        tokenizer: None,
    };
    lower_fused(program, &meta, &mut vkfuse_tests::spirv_cache(), opts).map(|(s, _)| s)
}

#[test]
fn banded_combines_match_the_reference() {
    let opts = FuseOptions {
        attention_splits: Some(4),
        // Invocation groups of the head (32) x splits each: 2 x 1, 1 x 4, 2 x 2 with 3 splits
        // (one group folds two, the other one: a count of splits the groups do not divide, as
        // the H100 defaults' 6 does its 4 groups) and 2 x 2, the last with every split working past 96
        // slots (the block's own grid is the other tests').
        attention_bands: Some(vec![
            band(48, 2, 64),
            band(72, 4, 32),
            band(88, 3, 64),
            band(100, 4, 64),
        ]),
        ..FuseOptions::default()
    };
    combines_match_the_reference(&opts, &[48, 72, 88, 100]);
}

#[test]
fn a_band_of_sixteen_splits_combines_as_the_reference() {
    // The H100 defaults' band of 16 below position 2048 (under a block of 32): 16 splits over
    // the combine's 2 invocation groups (8 each), of which 4 work by position 100.
    let opts = FuseOptions {
        attention_splits: Some(20),
        attention_bands: Some(vec![band(100, 16, 64)]),
        ..FuseOptions::default()
    };
    combines_match_the_reference(&opts, &[100]);
}

/// 100 positions of `opts`' banded schedule (whose bands end at `bounds`) against the CPU
/// reference interpreter: eager, replay, and replay with handoffs (the bands' polled combine),
/// whose counters and polled words are zero again afterwards.
fn combines_match_the_reference(opts: &FuseOptions, bounds: &[u32]) {
    let (device, log) = validated_device();
    let (model, program) = program();
    let schedule = lower(&program, opts).unwrap();
    assert_eq!(schedule.bands(), bounds);
    // Tokens from a fixed linear congruential sequence over the vocabulary.
    let vocab = schedule.meta.vocab_size;
    let ids: Vec<u32> = (0..100u32).map(|i| (i * 7919 + 13) % vocab).collect();
    let mut reference = Reference::new(&program, &model.tensors);
    let want: Vec<Vec<f32>> = ids
        .iter()
        .map(|&t| reference.step(Some(t)).unwrap().logits)
        .collect();
    let want = as_array(&want);
    let load = |s: Schedule| Loaded::new(device.clone(), s, &model.tensors).unwrap();
    let mut eager = Eager::new(load(schedule.clone())).unwrap();
    let rows: Vec<Vec<f32>> = ids
        .iter()
        .map(|&t| eager.step(Some(t)).unwrap().logits)
        .collect();
    assert_rows_close("banded eager, 100 positions", &rows, &want, 1e-3);
    let mut replay = Replay::new(load(schedule.clone())).unwrap();
    let rows: Vec<Vec<f32>> = ids
        .iter()
        .map(|&t| replay.step(Some(t)).unwrap().logits)
        .collect();
    assert_rows_close("banded replay, 100 positions", &rows, &want, 1e-3);
    // With handoffs, the bands' highest working split waits for the others' partials as
    // flagged words and sets them back to zero (fused_attention.glsl's polled()): a word left
    // set would hand the next layer's waiter this layer's partial.
    let handed = loaded_with_handoffs(&device, schedule.clone(), &model.tensors, Handoffs::On);
    // The block's dispatches publish their output, which is what turns the polling on.
    let plan = handed.handoff_plan();
    for (i, d) in schedule.dispatches.iter().enumerate() {
        if is_attention(&d.label) {
            assert_ne!(plan.push[i].out_at, HandoffPush::NONE_AT, "{}", d.label);
        }
    }
    let mut replay = Replay::new(handed).unwrap();
    let rows: Vec<Vec<f32>> = ids
        .iter()
        .map(|&t| replay.step(Some(t)).unwrap().logits)
        .collect();
    assert_rows_close("banded replay, handoffs, 100 positions", &rows, &want, 1e-3);
    // Every counter and polled word is zero again after the steps (the block's last binding).
    let l = replay.loaded();
    for d in l
        .schedule
        .dispatches
        .iter()
        .filter(|d| is_attention(&d.label))
    {
        let slice = d.bindings.last().unwrap();
        let buffer = &l.buffers[slice.buffer.index()];
        let words: Vec<u32> = l
            .device
            .readback_pod(buffer, slice.offset, slice.size as usize / 4)
            .unwrap();
        assert!(words.len() > 4, "{}: the polled words are bound", d.label);
        let set = words.iter().filter(|&&w| w != 0).count();
        assert_eq!(set, 0, "{}: {set} words left set", d.label);
    }
    assert!(log.is_clean(), "validation errors:\n{}", log.report());
}

#[test]
fn bands_the_block_cannot_take_are_errors_when_asked_for() {
    let (_, program) = program();
    let with = |splits: Option<usize>, bands: Vec<AttentionBand>| {
        lower(
            &program,
            &FuseOptions {
                attention_splits: splits,
                attention_bands: Some(bands),
                ..FuseOptions::default()
            },
        )
    };
    // The fixture's block is unsplit by default (its cache is small).
    let e = with(None, vec![band(16, 2, 64)]).unwrap_err().to_string();
    assert!(
        e.contains("attention bands: band 16:2x64 needs a split attention block"),
        "{e}"
    );
    let e = with(Some(2), vec![band(16, 4, 64)])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("band 16:4x64 has more splits than the attention block's 2"),
        "{e}"
    );
    // Bands no position reaches (from the 512-slot capacity on), and a last one on the block's
    // own grid (4 splits of 128 invocations: the split default for a 32-wide head), are left
    // out.
    let far = vec![band(16, 2, 64), band(600, 2, 128), band(700, 2, 64)];
    assert_eq!(with(Some(4), far).unwrap().bands(), vec![16, 600]);
    let own = vec![band(16, 2, 64), band(400, 4, 128)];
    assert_eq!(with(Some(4), own).unwrap().bands(), vec![16]);
    // Unless the band's kernel differs: below position 384, where its chunks take one pass, a
    // bf16 block walks its slots in subgroups (`AttnSpec::subgroup_walk`) and the block's own
    // grid, whose chunks of its 512-slot capacity take two, does not.
    let walking = vec![band(16, 2, 64), band(32, 4, 128)];
    assert_eq!(with(Some(4), walking).unwrap().bands(), vec![16, 32]);
    // A band on the kernel of the one before is that band over both ranges (as the block
    // formats' half-width first band is where `--attention-wg` is under twice the head, raised
    // to the head's width).
    let same = vec![band(16, 2, 64), band(32, 2, 64), band(48, 2, 128)];
    assert_eq!(with(Some(4), same).unwrap().bands(), vec![32, 48]);
    // By default none at all here: 16-bit float weights have three bands (4, 6 and 8 splits below
    // 256, 384 and 512), which the fixture's unsplit block cannot take, and a default the block
    // cannot take is left out.
    let s = lower(&program, &FuseOptions::default()).unwrap();
    assert!(s.bands().is_empty());
    // On a block of 8 splits the defaults run the block's own workgroup (128 invocations for
    // heads of 32) with 4 and 6 splits; the band of 8 is the block's own grid and falls away (a
    // band of another workgroup would stay).
    let s = lower(
        &program,
        &FuseOptions {
            attention_splits: Some(8),
            ..FuseOptions::default()
        },
    )
    .unwrap();
    assert_eq!(s.bands(), vec![256, 384]);
}

/// The bands' highest splits wait for the others inside the dispatch, one per head, so the
/// compiler emits polling bands only where its device has more compute units than the block has
/// query heads (4 here): with 4 units the band kernels are the last-arrival ones, with 5 the
/// polling ones. Only bands of up to `MAX_POLLED_SPLITS` splits poll: a 17-split band compiles
/// to the last-arrival kernel even with room, a 16-split band polls.
#[test]
fn bands_poll_only_where_the_device_has_room_for_a_waiter_per_head() {
    let (_, program) = program();
    // The band kernels of a block of `block` splits with one band `b`, compiled for a device
    // of `units` compute units.
    let kernels = |block: usize, b: AttentionBand, units: usize| {
        let mut opts = FuseOptions {
            attention_splits: Some(block),
            attention_bands: Some(vec![b]),
            ..FuseOptions::default()
        };
        opts.device.compute_units = units;
        let s = lower(&program, &opts).unwrap();
        let spirv: Vec<Vec<u32>> = s
            .dispatches
            .iter()
            .flat_map(|d| &d.alternatives)
            .map(|a| s.kernels[a.kernel.index()].spirv.clone())
            .collect();
        assert!(!spirv.is_empty());
        spirv
    };
    assert_eq!(vkfuse_compiler::fuse::bands::MAX_POLLED_SPLITS, 16);
    let wide = |splits: usize, units: usize| kernels(20, band(100, splits, 64), units);
    assert_ne!(
        wide(16, 4),
        wide(16, 132),
        "16 splits poll where there is room"
    );
    assert_eq!(wide(17, 4), wide(17, 132), "17 splits never poll");
    let band_kernels = |units: usize| kernels(4, band(48, 2, 64), units);
    let (few, enough, many) = (band_kernels(4), band_kernels(5), band_kernels(132));
    assert_ne!(few, enough, "4 units for 4 heads: no polling");
    assert_eq!(enough, many);
}
