//! Replay against eager and transformers: the same kernels and bytes, recorded once, so the
//! logits are bitwise equal to eager's; K steps per submit give the same tokens as K = 1; and
//! per token the host writes no descriptor, records nothing and submits once (1/K).

use vkfuse_runtime::session::{Eager, Replay};
use vkfuse_tests::{assert_rows_close, expected, loaded_fixture, validated_device, FIXTURES};

fn check(name: &str) {
    let (device, log) = validated_device();
    let want = expected(name);
    {
        let mut eager = Eager::new(loaded_fixture(name, device.clone())).unwrap();
        let mut replay = Replay::new(loaded_fixture(name, device.clone())).unwrap();
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

        // Greedy with K = 1 and K = 8 per submit: the same tokens as transformers.
        for k in [1u32, 8] {
            replay.reset().unwrap();
            let mut ids = vec![];
            let mut rows = vec![];
            for &t in &want.prompt_ids {
                let out = replay.step(Some(t)).unwrap();
                rows.push(out.logits);
                ids = vec![out.next_token];
            }
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
                (if k == 1 { 1 } else { 2 }, 0),
                "chains are recorded once"
            );
            assert_eq!(c.submits, submits_expected);
            assert_eq!(ids, want.greedy_ids, "{name}: replay K={k} greedy tokens");
            assert_rows_close(
                &format!("{name} replay K={k}"),
                &rows,
                &want.greedy_logits,
                5e-3,
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
    check(FIXTURES[0]);
}

#[test]
fn replay_matches_eager_and_transformers_qwen3_untied() {
    check(FIXTURES[1]);
}

#[test]
fn replay_matches_eager_and_transformers_llama_gqa() {
    check(FIXTURES[2]);
}

#[test]
fn replay_matches_eager_and_transformers_qwen3_next() {
    check(FIXTURES[3]);
}
