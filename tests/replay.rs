//! Replay against eager and transformers: the same kernels and bytes, recorded once, so the
//! logits are bitwise equal to eager's; K steps per submit give the same tokens as K = 1; and
//! per token the host writes no descriptor, records nothing and submits once (1/K). Both
//! state write-back strategies (the schedule's copies; ping-pong recordings that swap the state
//! buffers) give eager's logits bit for bit.

use vkfuse_runtime::session::{Eager, Replay, WriteBack};
use vkfuse_tests::{assert_rows_close, expected, loaded_fixture, validated_device, FIXTURES};

fn check(name: &str, write_back: WriteBack) {
    let (device, log) = validated_device();
    let want = expected(name);
    {
        let mut eager = Eager::new(loaded_fixture(name, device.clone())).unwrap();
        let mut replay =
            Replay::with_write_back(loaded_fixture(name, device.clone()), write_back).unwrap();
        let plan = replay.ping_pong_plan();
        let has_state = name == "qwen3-next";
        assert_eq!(
            !plan.states.is_empty(),
            has_state && write_back == WriteBack::PingPong,
            "{name}: ping-pong applies exactly where state is copied back: {plan:?}"
        );
        if !plan.states.is_empty() {
            // Every copy of a conv or recurrent state is dropped (unfused: producers are
            // plain kernels); the position and token (I/O, updated in place) are not states.
            assert!(plan.kept.is_empty(), "{name}: copies kept: {:?}", plan.kept);
            eprintln!("{name}: ping-pong drops {} copies", plan.states.len());
        }
        let before = device.counters();
        let mut rows = vec![];
        for &t in &want.teacher_ids {
            let r = replay.step(Some(t)).unwrap();
            let e = eager.step(Some(t)).unwrap();
            assert_eq!(
                r.logits, e.logits,
                "{name}: replay differs from eager (same kernels, same order)"
            );
            rows.push(r.logits);
        }
        let c = device.counters().since(&before);
        let n = want.teacher_ids.len() as u64;
        // Eager did n recordings and wrote every binding n times; replay none of either.
        let bindings: u64 = eager
            .loaded()
            .schedule
            .dispatches
            .iter()
            .map(|d| d.bindings.len() as u64)
            .sum();
        assert_eq!(c.recordings, n, "only eager records per token");
        assert_eq!(
            c.descriptor_writes,
            n * bindings,
            "only eager writes descriptors per token"
        );
        assert_eq!(c.submits, 2 * n, "one submit per token each");
        assert_rows_close(
            &format!("{name} replay teacher"),
            &rows,
            &want.teacher_logits,
            5e-3,
        );

        // Greedy with K = 1, 3 (odd: chains start at either ping-pong parity) and 8 per
        // submit: the same tokens as transformers, with logits and with tokens only.
        for k in [1u32, 3, 8] {
            replay.reset().unwrap();
            let mut ids = vec![];
            let mut rows = vec![];
            for &t in &want.prompt_ids {
                let out = replay.step(Some(t)).unwrap();
                rows.push(out.logits);
                ids = vec![out.next_token];
            }
            let rest = (want.greedy_ids.len() - 1) as u32;
            replay.prepare(k).unwrap();
            replay.prepare(rest % k).unwrap();
            let before = device.counters();
            let mut submits_expected = 0;
            while ids.len() < want.greedy_ids.len() {
                let left = (want.greedy_ids.len() - ids.len()) as u32;
                let outs = replay.steps(None, k.min(left)).unwrap();
                submits_expected += 1;
                for o in outs {
                    rows.push(o.logits);
                    ids.push(o.next_token);
                }
            }
            let c = device.counters().since(&before);
            assert_eq!(
                (c.recordings, c.descriptor_writes),
                (0, 0),
                "chains are recorded by prepare, once"
            );
            assert_eq!(c.submits, submits_expected);
            assert_eq!(ids, want.greedy_ids, "{name}: replay K={k} greedy tokens");
            assert_rows_close(
                &format!("{name} replay K={k}"),
                &rows,
                &want.greedy_logits,
                5e-3,
            );

            // Tokens only, two chains in flight: one submit per K steps, no recording.
            replay.reset().unwrap();
            let (last, prompt) = want.prompt_ids.split_last().unwrap();
            for &t in prompt {
                replay.step(Some(t)).unwrap();
            }
            let first = replay.step(Some(*last)).unwrap().next_token;
            let n = want.greedy_ids.len() - 1;
            let before = device.counters();
            let gpu_before = replay.gpu_ns();
            let mut ids = vec![first];
            ids.extend(replay.greedy_tokens(None, n as u32, k).unwrap());
            let c = device.counters().since(&before);
            assert_eq!(ids, want.greedy_ids, "{name}: tokens-only K={k}");
            // Every chain's timestamps were reset and written (a pool left unreset reads as no
            // time at all).
            if let (Some(a), Some(b)) = (gpu_before, replay.gpu_ns()) {
                assert!(
                    b > a,
                    "{name}: tokens-only K={k}: no GPU time ({a} -> {b} ns)"
                );
            }
            assert_eq!(
                (c.recordings, c.descriptor_writes, c.submits),
                (0, 0, n.div_ceil(k as usize) as u64),
                "{name}: tokens-only K={k}: nothing recorded, one submit per chain"
            );
        }
    }
    assert!(
        log.is_clean(),
        "{name}: validation errors:\n{}",
        log.report()
    );
}

#[test]
fn replay_matches_eager_and_transformers_qwen3_tied() {
    check(FIXTURES[0], WriteBack::default());
}

#[test]
fn replay_matches_eager_and_transformers_qwen3_untied() {
    check(FIXTURES[1], WriteBack::default());
}

#[test]
fn replay_matches_eager_and_transformers_llama_gqa() {
    check(FIXTURES[2], WriteBack::default());
}

#[test]
fn replay_ping_pong_matches_eager_and_transformers_qwen3_next() {
    check(FIXTURES[3], WriteBack::PingPong);
}

#[test]
fn replay_copy_write_back_matches_eager_and_transformers_qwen3_next() {
    check(FIXTURES[3], WriteBack::Copy);
}
