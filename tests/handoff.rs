//! Handoffs (`session::handoff`, `kernels/glsl/handoff.glsl`): replay records no barrier
//! before a level whose one consumer reads what one producer of the level before published as
//! flagged words, on every fixture, fused, its attention split over the context and not.
//!
//! lavapipe runs a command buffer's dispatches one after the other, so there a consumer never
//! waits; what this checks is everything else: the plan hands levels over on every dense
//! fixture, the producers publish every element a consumer reads at the right word, the
//! consumers read the words and not their bindings' stale bytes (the bindings of an arena
//! reused from layer to layer hold the last layer's values), and the words are emptied between
//! steps, both in a step of its own (K=1) and between the steps of a chain (K=8). The logits
//! must match the same fused schedule run eager (a barrier after every dispatch) within the
//! float atomics' reassociation at every teacher-forced position, and the greedy tokens must be
//! transformers'. `bench/h100 tests` runs it on the H100, where the consumers really wait.

use vkfuse_compiler::fuse::{lower_fused, FuseOptions};
use vkfuse_compiler::import::{self, TensorStore};
use vkfuse_compiler::lower::{Meta, SpirvCache};
use vkfuse_compiler::quant::{self, EncodedWeights, WeightFormat};
use vkfuse_compiler::trace;
use vkfuse_runtime::schedule::Schedule;
use vkfuse_runtime::session::{Eager, Handoffs, Replay};
use vkfuse_runtime::HANDOFF_EMPTY;
use vkfuse_tests::{
    expected, fixture_dir, fused_schedule_with, loaded_with_handoffs, replay_greedy_ids,
    same_kernels_agree_within, validated_device, ATOMICS_TOL, F16_ATOMICS_TOL, FIXTURES,
};

/// The planned words after a step: all empty again, for the next step's consumers (on lavapipe
/// a consumer never runs before its producer, so stale words would go unseen there; on a GPU
/// it would read the last step's values and run ahead).
fn assert_words_empty(what: &str, replay: &Replay) {
    let l = replay.loaded();
    let n = l.handoff_plan().words as usize;
    let words = l.handoff_words().expect("handoff words");
    let got: Vec<u32> = l.device.readback_pod(words.buffer(), 0, n).unwrap();
    let full = got.iter().filter(|&&w| w != HANDOFF_EMPTY).count();
    assert_eq!(
        full, 0,
        "{what}: {full} of {n} handoff words not emptied after the step"
    );
}

fn check(name: &str, splits: Option<usize>) {
    let opts = FuseOptions {
        attention_splits: splits,
        ..FuseOptions::default()
    };
    let (model, schedule, _) = fused_schedule_with(name, &opts);
    let what = format!("{name} (attention splits {splits:?})");
    let (device, log) = validated_device();
    let load = |handoffs| loaded_with_handoffs(&device, schedule.clone(), &model.tensors, handoffs);
    // Auto leaves them off on lavapipe (it relies on in-order launches: measured on NVIDIA).
    if !device.info().name.contains("NVIDIA") {
        assert_eq!(
            load(Handoffs::Auto).handoff_plan().handed_levels(),
            0,
            "{what}"
        );
    }
    assert_eq!(
        load(Handoffs::Off).handoff_plan().handed_levels(),
        0,
        "{what}"
    );
    let mut eager = Eager::new(load(Handoffs::Off)).unwrap();
    let mut replay = Replay::new(load(Handoffs::On)).unwrap();
    let handed = replay.handed_levels();
    // The dense fixtures hand q/k/v to the attention block, its output to the wide o_proj and
    // o_proj's output to the chained MLP in every layer.
    // Three per layer: q/k/v -> attention -> o_proj -> the chained MLP (llama-gqa's MLP is
    // not chained: gate/up -> the wide down instead of o_proj -> chain). One fewer would mean
    // the buffer plan aliased a slot the run still touches (fuse/schedule.rs). The hybrid
    // fixture's one full-attention layer hands two, q/gate/k/v -> the gated block -> o_proj,
    // and each of its three linear-attention layers two, the projection (x and the gates' a
    // and b) -> the step -> its out projection (its MoE blocks are no chains).
    let expected_handed = match name {
        "qwen3-tied" | "llama-gqa" => 3 * 2,
        "qwen3-untied" => 3 * 3,
        _ => 2 + 2 * 3,
    };
    assert_eq!(handed, expected_handed, "{what}: levels handed over");
    // The dump (`vkfuse inspect`) names the roles the kernels declare.
    let dump = schedule.to_string();
    assert!(
        dump.contains("handoff: publishes binding 0"),
        "{what}: {dump}"
    );
    let role = |label: &str| {
        dump.lines()
            .find(|l| l.contains(label))
            .and_then(|l| l.split("handoff: ").nth(1))
            .unwrap_or("")
            .to_string()
    };
    assert_eq!(
        role("fused_attention["),
        "publishes binding 0, reads bindings 1,2,3 as words",
        "{what}: {dump}"
    );
    assert_eq!(
        role("fused_matvec[wide "),
        "publishes binding 0, reads bindings 2 as words",
        "{what}: {dump}"
    );
    // The linear-attention step reads x and the gates' a and b (bindings 7 and 9: g's second
    // input, beta's only one) as words.
    if dump.contains("fused_gdn[") {
        assert_eq!(
            role("fused_gdn["),
            "publishes binding 0, reads bindings 3,7,9 as words",
            "{what}: {dump}"
        );
    }
    let atomics = schedule.float_atomic_kernel().is_some();
    let want = expected(name);
    for (i, &t) in want.teacher_ids.iter().enumerate() {
        let e = eager.step(Some(t)).unwrap().logits;
        let r = replay.step(Some(t)).unwrap().logits;
        same_kernels_agree_within(
            &format!("{what} position {i}"),
            &r,
            &e,
            atomics,
            ATOMICS_TOL,
        );
        assert_words_empty(&what, &replay);
    }
    assert_eq!(
        replay_greedy_ids(&mut replay, &want),
        want.greedy_ids,
        "{what}: greedy tokens with {handed} levels handed over"
    );
    assert_words_empty(&what, &replay);
    assert!(log.is_clean(), "{what}: {}", log.report());
}

#[test]
fn should_hand_levels_over_and_match_the_barriers() {
    for name in FIXTURES {
        check(name, None);
    }
}

#[test]
fn should_hand_levels_over_with_the_attention_split() {
    for name in FIXTURES {
        check(name, Some(4));
    }
}

/// Past the first chunk of the context every working split of the attention block reads its
/// head's q, k and v as words and the splits' partials are combined: 96 positions, 4 splits of
/// at least 32 slots, every step's logits against the same schedule run eager. Also in q8_0
/// with f16 dots, whose block settles its rope angles and first tile before the wait
/// (`AttnSpec::early_tile`; the tile's consumer runs on the handed-over path only), and with
/// that consumer's store made unconditional (`EARLY_TILE_STORE_ALWAYS`, test only): it goes
/// to a slot no result reads before its own split rewrites it, so the logits do not move.
/// Float weights under f16 dots do not take the early tile (it lost there). And qwen3-tied
/// (heads of 32) in q4_0, whose block walks its slots in subgroups as well
/// (`AttnSpec::subgroup_walk`, attend_subgroups.glsl; llama-gqa's heads of 16 do not fit it),
/// also with the early tile's store made unconditional; and as stored (bf16), where it walks
/// without the early tile.
#[test]
fn should_hand_q_k_v_to_every_split_at_longer_positions() {
    longer_positions("llama-gqa", None, false, "");
    longer_positions("qwen3-tied", None, false, "");
    // Qwen3-Next's gated block: the gate applied where its splits combine, by the last to
    // arrive (eager) and by the highest split polling the others' words (replay's bands).
    longer_positions("qwen3-next", None, false, "");
    for (name, format) in [
        ("llama-gqa", WeightFormat::Q8_0),
        ("qwen3-tied", WeightFormat::Q4_0),
    ] {
        for defines in ["", "EARLY_TILE_STORE_ALWAYS"] {
            longer_positions(name, Some(format), true, defines);
        }
    }
    let (_, schedule) = split_schedule("llama-gqa", None, true, "");
    assert!(!early_tile(&schedule));
    assert!(!vkfuse_tests::walks_in_subgroups(&schedule));
}

/// Fixture `name` with 4 attention splits, its matvec weights in `format` (`None`: as stored),
/// fused with `f16_dots` and the probe's `defines`: the weights as the schedule reads them,
/// and the schedule.
fn split_schedule(
    name: &str,
    format: Option<WeightFormat>,
    f16_dots: bool,
    defines: &str,
) -> (EncodedWeights<TensorStore>, Schedule) {
    let model = import::load(&fixture_dir(name)).unwrap();
    let mut program = trace::trace(&model, &trace::TraceOptions::default()).unwrap();
    if let Some(format) = format {
        quant::convert(&mut program, format).unwrap();
    }
    let meta = Meta::of(&model);
    let opts = FuseOptions {
        attention_splits: Some(4),
        f16_dots,
        ..FuseOptions::default()
    };
    let mut spirv = SpirvCache::with_probe_defines(defines);
    let schedule = lower_fused(&program, &meta, &mut spirv, &opts).unwrap().0;
    (
        EncodedWeights::new(model.tensors, &program).unwrap(),
        schedule,
    )
}

/// Whether the schedule's attention blocks take the early tile: consume_tile()'s constant
/// witnesses it in their SPIR-V (every block alike).
fn early_tile(schedule: &Schedule) -> bool {
    let blocks = vkfuse_tests::attention_blocks_holding(schedule, vkfuse_tests::EARLY_TILE_WITNESS);
    assert!(blocks.iter().all(|&b| b == blocks[0]), "{blocks:?}");
    blocks[0]
}

fn longer_positions(name: &str, format: Option<WeightFormat>, f16_dots: bool, defines: &str) {
    let what = format!("{name} ({format:?}, f16 dots {f16_dots}, {defines:?})");
    let (weights, schedule) = split_schedule(name, format, f16_dots, defines);
    if defines.is_empty() {
        assert_eq!(early_tile(&schedule), f16_dots, "{what}");
        // The walk: heads of 32 to 128 (qwen3-tied's 32, not llama-gqa's 16), with q4_0 or
        // 16-bit float matvecs (both fixtures are stored in bf16).
        let head_fits = matches!(name, "qwen3-tied" | "qwen3-next");
        let format_walks = matches!(format, None | Some(WeightFormat::Q4_0));
        assert_eq!(
            vkfuse_tests::walks_in_subgroups(&schedule),
            head_fits && format_walks,
            "{what}"
        );
    }
    let (device, log) = validated_device();
    let load = |handoffs| loaded_with_handoffs(&device, schedule.clone(), &weights, handoffs);
    let mut eager = Eager::new(load(Handoffs::Off)).unwrap();
    let mut replay = Replay::new(load(Handoffs::On)).unwrap();
    assert!(replay.handed_levels() > 0);
    let atomics = schedule.float_atomic_kernel().is_some();
    let mut token = 1;
    for i in 0..96 {
        let e = eager.step(Some(token)).unwrap();
        let r = replay.step(Some(token)).unwrap().logits;
        same_kernels_agree_within(
            &format!("{what} position {i}"),
            &r,
            &e.logits,
            atomics,
            if f16_dots {
                F16_ATOMICS_TOL
            } else {
                ATOMICS_TOL
            },
        );
        token = e.next_token;
    }
    assert!(log.is_clean(), "{what}: {}", log.report());
}

/// `compile-model --ablate` (timing probes): every ablated kernel still publishes every word
/// its handed-over consumer waits for (on lavapipe a missing word would hang the step, on a
/// GPU too), its label is marked, and it does change the output, which is what makes it an
/// ablation: 40 greedy steps with handoffs on, 4 attention splits so that positions past 32
/// combine splits, against the same schedule unablated.
#[test]
fn should_run_every_ablation_with_handoffs_and_change_the_tokens() {
    use vkfuse_compiler::fuse::ablate::{Ablate, MARK};
    let name = "qwen3-untied";
    let (device, log) = validated_device();
    let ids = |ablate: Vec<Ablate>| {
        let opts = FuseOptions {
            attention_splits: Some(4),
            ablate,
            ..FuseOptions::default()
        };
        let (model, schedule, _) = fused_schedule_with(name, &opts);
        let marked = schedule
            .kernels
            .iter()
            .filter(|k| k.label.ends_with(MARK))
            .count();
        // A region's body would be rebuilt without the ablation: none offered.
        if marked > 0 {
            assert!(schedule.persistent.is_empty());
        }
        let mut replay = Replay::new(loaded_with_handoffs(
            &device,
            schedule.clone(),
            &model.tensors,
            Handoffs::On,
        ))
        .unwrap();
        assert!(replay.handed_levels() > 0);
        let mut ids = vec![replay.step(Some(1)).unwrap().next_token];
        ids.extend(replay.greedy_tokens(None, 39, 8).unwrap());
        assert_words_empty(name, &replay);
        (ids, marked)
    };
    let (plain, marked) = ids(vec![]);
    assert_eq!(marked, 0);
    for a in [
        Ablate::Matvec,
        Ablate::WideMatvec,
        Ablate::Attention,
        Ablate::AttentionCombine,
        Ablate::Chain,
    ] {
        let (got, marked) = ids(vec![a]);
        assert!(marked > 0, "{a:?}: no kernel marked");
        assert_ne!(
            got, plain,
            "{a:?}: the same tokens as the unablated schedule"
        );
    }
    assert!(log.is_clean(), "{}", log.report());
}
