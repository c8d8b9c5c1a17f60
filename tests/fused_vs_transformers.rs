//! Fused Vulkan execution (the fusion compiler's schedule, run by the eager executor on
//! lavapipe in CI, validation on) against transformers' float32 logits for every fixture:
//! relative L2 <= 5e-3 at every position, the same greedy tokens, a clean validation log, and
//! for dense models at most 6 dispatches per layer + 4 per token. Replay of the same schedule
//! (barriers only between the dependency levels fusion computed) must give eager's logits bit
//! for bit, teacher-forced and greedy, with 0 descriptor writes, 0 recordings and 1 submit per
//! token. Every fixture is checked at 32 teacher-forced and 31 greedy positions (at least 30
//! each; the hybrid fixture's conv and delta-rule states are carried across all of them).

use vkfuse_compiler::fuse::FuseOptions;
use vkfuse_runtime::session::{Eager, Loaded, Replay};
use vkfuse_tests::{
    assert_rows_close, eager_greedy, expected, fused_schedule_with, validated_device, FIXTURES,
};

/// Layers of each fixture (from its config).
fn layers(name: &str) -> usize {
    let dir = vkfuse_tests::fixture_dir(name);
    let text = std::fs::read_to_string(dir.join("config.json")).expect("config.json");
    let v: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    v["num_hidden_layers"].as_u64().expect("num_hidden_layers") as usize
}

fn check(name: &str, dense: bool, opts: &FuseOptions) {
    let (device, log) = validated_device();
    let want = expected(name);
    {
        let (model, schedule, report) = fused_schedule_with(name, opts);
        let load = |s| Loaded::new(device.clone(), s, &model.tensors).unwrap();
        let mut eager = Eager::new(load(schedule.clone())).unwrap();
        let mut replay = Replay::new(load(schedule)).unwrap();
        let dispatches = eager.loaded().schedule.dispatches.len();
        // A chained matvec sums its workgroups' shares with float atomics, in an order that
        // varies between runs: eager and replay then agree to f32 reassociation, not bits.
        let atomics = eager.loaded().schedule.float_atomic_kernel().is_some();
        let l = layers(name);
        eprintln!(
            "{name}: {} dispatches per token ({} unfused), {} levels; {} layers",
            dispatches, report.unfused_dispatches, report.levels, l
        );
        if dense {
            assert!(
                dispatches <= 6 * l + 4,
                "{name}: {dispatches} dispatches per token, more than 6 per layer + 4"
            );
        }
        let rows: Vec<Vec<f32>> = want
            .teacher_ids
            .iter()
            .map(|&t| {
                let e = eager.step(Some(t)).unwrap();
                let r = replay.step(Some(t)).unwrap();
                vkfuse_tests::same_kernels_agree(name, &r.logits, &e.logits, atomics);
                r.logits
            })
            .collect();
        assert!(rows.len() >= 30, "{name}: only {} positions", rows.len());
        let worst = assert_rows_close(
            &format!("{name} fused teacher"),
            &rows,
            &want.teacher_logits,
            5e-3,
        );

        // Greedy: the next token is chosen on the device and fed back without the host.
        eager.reset().unwrap();
        let (rows, ids) = eager_greedy(&mut eager, &want);
        assert_eq!(
            ids, want.greedy_ids,
            "{name}: fused greedy tokens differ from transformers'"
        );
        let worst_g = assert_rows_close(
            &format!("{name} fused greedy"),
            &rows,
            &want.greedy_logits,
            5e-3,
        );
        assert!(rows.len() >= 30, "{name}: only {} positions", rows.len());

        // The same greedy sequence replayed: the prompt fed by the host, then one submit per
        // token, the token chosen and fed back on the device, nothing recorded or written.
        replay.reset().unwrap();
        let mut replayed = vec![];
        let mut ids = vec![];
        for &t in &want.prompt_ids {
            let out = replay.step(Some(t)).unwrap();
            replayed.push(out.logits);
            ids = vec![out.next_token];
        }
        replay.prepare(1).unwrap();
        let before = device.counters();
        let steps = (want.greedy_ids.len() - 1) as u64;
        while ids.len() < want.greedy_ids.len() {
            let out = replay.steps(None, 1).unwrap().pop().unwrap();
            replayed.push(out.logits);
            ids.push(out.next_token);
        }
        let c = device.counters().since(&before);
        assert_eq!(
            (c.descriptor_writes, c.recordings, c.submits),
            (0, 0, steps),
            "{name}: fused replay per token: 0 descriptor writes, 0 recordings, 1 submit"
        );
        assert_eq!(ids, want.greedy_ids, "{name}: fused replay greedy tokens");
        assert_eq!(replayed.len(), rows.len());
        for (r, e) in replayed.iter().zip(&rows) {
            vkfuse_tests::same_kernels_agree(name, r, e, atomics);
        }
        eprintln!("{name}: fused worst relative L2 {worst:.2e} (teacher), {worst_g:.2e} (greedy)");
    }
    assert!(
        log.is_clean(),
        "{name}: validation errors:\n{}",
        log.report()
    );
}

#[test]
fn fused_matches_transformers_qwen3_tied() {
    check(FIXTURES[0], true, &FuseOptions::default());
}

#[test]
fn fused_matches_transformers_qwen3_untied_sharded() {
    check(FIXTURES[1], true, &FuseOptions::default());
}

#[test]
fn fused_matches_transformers_llama_gqa() {
    check(FIXTURES[2], true, &FuseOptions::default());
}

#[test]
fn fused_matches_transformers_qwen3_next() {
    check(FIXTURES[3], false, &FuseOptions::default());
}

/// The linear-attention step in 4 parts a key head: parts of 8 state columns, narrower than
/// the fixture's value heads of 16, so the part that arrives last shifts the head's q and k conv
/// rows and normalises its outputs (`fused_gdn.glsl`; the default takes one part here).
#[test]
fn fused_matches_transformers_qwen3_next_in_parts() {
    let opts = FuseOptions {
        gdn_parts: Some(4),
        ..FuseOptions::default()
    };
    let (_, schedule, _) = fused_schedule_with(FIXTURES[3], &opts);
    let steps = schedule
        .kernels
        .iter()
        .filter(|k| k.label.contains("fused_gdn"));
    assert!(steps.clone().count() > 0 && steps.clone().all(|k| k.label.contains("parts=4")));
    check(FIXTURES[3], false, &opts);
}

/// The experts routed once a step by the router's workgroup, as models of more than
/// `OWN_ROUTING_MAX` experts are (Qwen3-Next-80B's 512; the fixture's 8 take each workgroup's
/// own pick by default): the expert kernels read its indices and weights, and the fused
/// schedule still matches transformers.
#[test]
fn fused_matches_transformers_qwen3_next_routed_once() {
    let opts = FuseOptions {
        own_routing_max: Some(0),
        ..FuseOptions::default()
    };
    let (_, schedule, _) = fused_schedule_with(FIXTURES[3], &opts);
    let routers = schedule
        .dispatches
        .iter()
        .filter(|d| d.label.starts_with("router:"))
        .count();
    let experts: Vec<&str> = schedule
        .dispatches
        .iter()
        .filter(|d| d.label.starts_with("experts "))
        .map(|d| d.label.as_str())
        .collect();
    assert!(routers > 0 && experts.len() == 2 * routers, "{experts:?}");
    assert!(
        experts
            .iter()
            .all(|l| !l.contains("routed in each workgroup")),
        "{experts:?}"
    );
    // The sums add the shared expert's output and the residual as they are written
    // (`fold-add-into-read-expert-sum`), so that the shared expert's down runs beside them.
    let sums = experts.iter().filter(|l| l.contains("weighted and summed"));
    assert!(
        sums.clone().count() == routers
            && sums.clone().all(|l| l.contains("add(in1, add(acc, in0))")),
        "{experts:?}"
    );
    let (_, default, _) = fused_schedule_with(FIXTURES[3], &FuseOptions::default());
    assert!(default
        .dispatches
        .iter()
        .all(|d| !d.label.starts_with("router:")));
    check(FIXTURES[3], false, &opts);
}
