//! Eager Vulkan execution (unfused, on lavapipe in CI, validation on) against transformers'
//! float32 logits for every fixture: relative L2 <= 5e-3 at every position, the same greedy
//! tokens, and a clean validation log after everything is dropped.

use vkfuse_tests::{
    assert_rows_close, eager_fixture, eager_greedy, expected, validated_device, FIXTURES,
};

fn check(name: &str) {
    let (device, log) = validated_device();
    let want = expected(name);
    {
        let mut eager = eager_fixture(name, device);
        let rows: Vec<Vec<f32>> = want
            .teacher_ids
            .iter()
            .map(|&t| eager.step(Some(t)).unwrap().logits)
            .collect();
        let worst = assert_rows_close(
            &format!("{name} eager teacher"),
            &rows,
            &want.teacher_logits,
            5e-3,
        );

        // Greedy: the next token is chosen on the device and fed back without the host.
        eager.reset().unwrap();
        let (rows, ids) = eager_greedy(&mut eager, &want);
        assert_eq!(
            ids, want.greedy_ids,
            "{name}: eager greedy tokens differ from transformers'"
        );
        let worst_g = assert_rows_close(
            &format!("{name} eager greedy"),
            &rows,
            &want.greedy_logits,
            5e-3,
        );
        eprintln!("{name}: eager worst relative L2 {worst:.2e} (teacher), {worst_g:.2e} (greedy)");
    }
    assert!(
        log.is_clean(),
        "{name}: validation errors:\n{}",
        log.report()
    );
}

#[test]
fn eager_matches_transformers_qwen3_tied() {
    check(FIXTURES[0]);
}

#[test]
fn eager_matches_transformers_qwen3_untied_sharded() {
    check(FIXTURES[1]);
}

#[test]
fn eager_matches_transformers_llama_gqa() {
    check(FIXTURES[2]);
}

#[test]
fn eager_matches_transformers_qwen3_next() {
    check(FIXTURES[3]);
}
