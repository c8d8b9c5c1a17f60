//! The CPU reference interpreter against transformers' float32 logits, for every fixture:
//! relative L2 <= 1e-3 at every position, and the same greedy tokens.

use vkfuse_compiler::reference::Reference;
use vkfuse_compiler::{import, trace};
use vkfuse_tests::{assert_rows_close, expected, fixture_dir, reference_rows, FIXTURES};

fn check(name: &str) {
    let model = import::load(&fixture_dir(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let program = trace::trace(&model, &trace::TraceOptions::default()).unwrap();
    let want = expected(name);

    // Teacher forcing: one row per fed token.
    let rows = reference_rows(&program, &model.tensors, &want.teacher_ids);
    let worst = assert_rows_close(
        &format!("{name} teacher"),
        &rows,
        &want.teacher_logits,
        1e-3,
    );

    // Greedy: the prompt, then the device-style loop that feeds back the argmax.
    let mut r = Reference::new(&program, &model.tensors);
    let mut rows = vec![];
    let mut ids = vec![];
    for &t in &want.prompt_ids {
        let out = r.step(Some(t)).unwrap();
        rows.push(out.logits);
        ids = vec![out.next_token as u32];
    }
    while ids.len() < want.greedy_ids.len() {
        let out = r.step(None).unwrap();
        rows.push(out.logits);
        ids.push(out.next_token as u32);
    }
    assert_eq!(
        ids, want.greedy_ids,
        "{name}: greedy tokens differ from transformers'"
    );
    let worst_g = assert_rows_close(&format!("{name} greedy"), &rows, &want.greedy_logits, 1e-3);
    eprintln!("{name}: worst relative L2 {worst:.2e} (teacher), {worst_g:.2e} (greedy)");
}

#[test]
fn reference_matches_transformers_qwen3_tied() {
    check(FIXTURES[0]);
}

#[test]
fn reference_matches_transformers_qwen3_untied_sharded() {
    check(FIXTURES[1]);
}

#[test]
fn reference_matches_transformers_llama_gqa() {
    check(FIXTURES[2]);
}

#[test]
fn reference_matches_transformers_qwen3_next() {
    check(FIXTURES[3]);
}
