//! Persistent regions (fuse::persistent) against transformers and against the same schedule
//! without them, on every fixture. On lavapipe the regions run with ONE workgroup (the runtime
//! never turns them on there by itself: its workgroups are not all resident at once), which
//! still runs every member body, every virtual-workgroup loop and every grid barrier of the
//! generated kernels; `bench/h100 tests` runs this suite on the H100 too, with one workgroup
//! per SM, where the barriers really wait.
//!
//! Each level computes its rows as its own kernel does, but from weights held in registers and
//! reduced over lane clusters (a different summation order), so the logits must match the levels run one dispatch each
//! within 2e-4 relative L2 at every position (f16 KV caches: a key may round the other way), and transformers within 5e-3, with the same
//! greedy tokens.

use vkfuse_compiler::fuse::FuseOptions;
use vkfuse_runtime::session::{Eager, LoadOptions, Loaded, Persistence, Replay};
use vkfuse_tests::{
    assert_rows_close, expected, fused_schedule_with, rel_l2, replay_greedy_ids, validated_device,
    FIXTURES,
};

fn check(name: &str) {
    let (device, log) = validated_device();
    // One workgroup on lavapipe; one per compute unit where the device reports them.
    let persistence = match device.info().compute_units {
        Some(_) => Persistence::Units,
        None => Persistence::Groups(1),
    };
    let want = expected(name);
    // Regions run over consecutive matvec levels; a chained MLP (one level, not a matvec)
    // leaves no run of two, so this suite compiles without chains.
    let opts = FuseOptions {
        chain: false,
        ..FuseOptions::default()
    };
    let (model, schedule, _) = fused_schedule_with(name, &opts);
    assert!(
        !schedule.persistent.is_empty(),
        "{name}: no persistent region offered"
    );
    let levels = schedule.levels.len();
    let with = schedule.levels_with_persistent();
    let load = |p| {
        let options = LoadOptions {
            persistence: p,
            ..LoadOptions::default()
        };
        Loaded::load(device.clone(), schedule.clone(), &model.tensors, options).unwrap()
    };
    let mut plain = Eager::new(load(Persistence::Off)).unwrap();
    let mut persistent = Replay::new(load(persistence)).unwrap();
    assert_eq!(
        persistent.loaded().schedule.levels.len(),
        with,
        "{name}: regions applied"
    );
    eprintln!("{name}: {levels} levels, {with} with persistent regions");

    let mut rows = vec![];
    for (i, &t) in want.teacher_ids.iter().enumerate() {
        let a = plain.step(Some(t)).unwrap();
        let b = persistent.step(Some(t)).unwrap();
        let d = rel_l2(&b.logits, &a.logits);
        // Regions sum in another order; with f16 KV caches (the default) a key that moves by
        // one f32 rounding can round to the other f16.
        assert!(
            d <= vkfuse_tests::ATOMICS_TOL,
            "{name}: position {i}: persistent regions change the logits by {d:.2e} relative L2"
        );
        rows.push(b.logits);
    }
    assert_rows_close(
        &format!("{name} persistent teacher"),
        &rows,
        &want.teacher_logits,
        5e-3,
    );

    // Greedy on the device, 8 steps per submit: the grid barriers' counters must be zero
    // again at every region of every step (a stale count would release a level early).
    let ids = replay_greedy_ids(&mut persistent, &want);
    assert_eq!(
        ids, want.greedy_ids,
        "{name}: persistent greedy tokens differ from transformers'"
    );
    assert!(
        log.is_clean(),
        "{name}: validation errors:\n{}",
        log.report()
    );
}

#[test]
fn persistent_regions_match_qwen3_tied() {
    check(FIXTURES[0]);
}

#[test]
fn persistent_regions_match_qwen3_untied_sharded() {
    check(FIXTURES[1]);
}

#[test]
fn persistent_regions_match_llama_gqa() {
    check(FIXTURES[2]);
}

/// Qwen3-Next's layers offer no run of two matvec levels: its MoE block ends in the experts'
/// weighted sum, which adds the shared expert and the residual as it writes (so the next
/// layer's input projection follows a kernel no region covers), and its other matvec levels
/// share theirs with a norm or an expert kernel. The regions' kernels are the dense layers'
/// matvecs, which the other fixtures check.
#[test]
fn qwen3_next_offers_no_persistent_region() {
    let opts = FuseOptions {
        chain: false,
        ..FuseOptions::default()
    };
    let (_, schedule, _) = fused_schedule_with(FIXTURES[3], &opts);
    assert!(
        schedule.persistent.is_empty(),
        "{} regions offered",
        schedule.persistent.len()
    );
}

/// On a device that does not report its compute units (lavapipe), more than one workgroup per
/// region is refused by name: its grid barriers could hang, and lavapipe's atomic loads let
/// waiters pass early (wrong tokens from run to run, silently, before this check).
#[test]
fn should_refuse_several_region_workgroups_where_residency_is_unknown() {
    let (device, _log) = validated_device();
    if device.info().compute_units.is_some() {
        eprintln!("skipped: this device reports its compute units");
        return;
    }
    let opts = FuseOptions {
        chain: false,
        ..FuseOptions::default()
    };
    let (model, schedule, _) = fused_schedule_with("llama-gqa", &opts);
    assert!(!schedule.persistent.is_empty());
    for (groups, refused) in [(1, false), (2, true), (64, true)] {
        let options = LoadOptions {
            persistence: Persistence::Groups(groups),
            ..LoadOptions::default()
        };
        match Loaded::load(device.clone(), schedule.clone(), &model.tensors, options) {
            Ok(_) => assert!(!refused, "{groups} workgroups were not refused"),
            Err(e) => {
                let msg = e.to_string();
                assert!(refused, "{groups} workgroups refused: {msg}");
                assert!(
                    msg.contains(&format!("{groups} workgroups"))
                        && msg.contains("--persistent off"),
                    "{msg}"
                );
            }
        }
    }
}
