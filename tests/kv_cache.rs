//! Both KV-cache types on every fixture, with the validation layer on: f16 (the default,
//! `compile-model --kv-cache f16`) and f32 (`--kv-cache f32`, which the other suites no longer
//! reach). Two oracles:
//! - the CPU reference interpreter of the same program (its kv_write rounds to f16 as the
//!   kernels store): the unfused and the fused schedules, teacher-forced, within relative L2
//!   1.5e-4 at every position, and fused replay within 2e-4 of fused eager (float atomics
//!   reassociate, and a key can round to the other f16 for it);
//! - transformers' float32 logits: the rounding of keys and values moves the logits by about
//!   f16's precision, within the 5e-3 the f32 caches are held to, and the greedy tokens are
//!   transformers' own.

use vkfuse_compiler::reference::Reference;
use vkfuse_compiler::{import, trace};
use vkfuse_tests::{
    as_array, assert_rows_close, expected, fixture_dir, spirv_cache, validated_device,
};

fn check(name: &str, kv: trace::KvCache) {
    let f16 = kv == trace::KvCache::F16;
    let want = expected(name);
    let model = import::load(&fixture_dir(name)).unwrap();
    let opts = trace::TraceOptions {
        kv_cache: kv,
        ..Default::default()
    };
    let program = trace::trace(&model, &opts).unwrap();
    let caches: Vec<_> = program
        .states
        .iter()
        .filter(|s| s.name.contains("_cache_"))
        .collect();
    assert!(!caches.is_empty(), "{name}: no KV caches");
    for s in &caches {
        assert_eq!(s.ty.dtype, kv.dtype(), "{name}: {}", s.name);
    }

    // The oracle on the same program, teacher-forced.
    let mut reference = Reference::new(&program, &model.tensors);
    let ref_rows: Vec<Vec<f32>> = want
        .teacher_ids
        .iter()
        .map(|&t| reference.step(Some(t)).unwrap().logits)
        .collect();
    let worst_t = assert_rows_close(
        &format!("{name} {kv:?} cache reference"),
        &ref_rows,
        &want.teacher_logits,
        5e-3,
    );

    let (device, log) = validated_device();
    {
        let (rows_u, rows_f, mut replay) = vkfuse_tests::teacher_forced_rows(
            &format!("{name} {kv:?} cache"),
            // The chain's float atomics reassociate between runs; a key that moves by an f32
            // rounding can round to the neighbouring f16 (seen: 4.5e-5).
            if f16 { vkfuse_tests::ATOMICS_TOL } else { 1e-5 },
            &program,
            &model.config.architecture,
            &model.tensors,
            &device,
            &want.teacher_ids,
        );
        let oracle = as_array(&ref_rows);
        // Looser than f32 caches' 1e-4: a key the kernels compute within f32 rounding of the
        // reference's can round to the neighbouring f16 (lavapipe: unfused 9.3e-5 at worst).
        // Tight enough that attending to the fresh slot unrounded fails (2.8e-4..3.9e-4).
        let tol = if f16 { 1.5e-4 } else { 1e-4 };
        let eu = assert_rows_close(
            &format!("{name} {kv:?} cache unfused"),
            &rows_u,
            &oracle,
            tol,
        );
        let ef = assert_rows_close(&format!("{name} {kv:?} cache fused"), &rows_f, &oracle, tol);

        // Greedy on the device: transformers' tokens.
        let ids = vkfuse_tests::replay_greedy_ids(&mut replay, &want);
        assert_eq!(
            ids, want.greedy_ids,
            "{name}: greedy tokens with {kv:?} caches differ from transformers'"
        );
        eprintln!(
            "KV {kv:?} {name}: reference vs transformers worst {worst_t:.2e}; kernels vs \
             reference: unfused {eu:.1e}, fused {ef:.1e}"
        );
    }
    assert!(
        log.is_clean(),
        "{name}: validation errors:\n{}",
        log.report()
    );
}

#[test]
fn f16_qwen3_tied() {
    check("qwen3-tied", trace::KvCache::F16);
}

#[test]
fn f16_qwen3_untied() {
    check("qwen3-untied", trace::KvCache::F16);
}

#[test]
fn f16_llama_gqa() {
    check("llama-gqa", trace::KvCache::F16);
}

#[test]
fn f16_qwen3_next() {
    check("qwen3-next", trace::KvCache::F16);
}

#[test]
fn f32_qwen3_tied() {
    check("qwen3-tied", trace::KvCache::F32);
}

#[test]
fn f32_qwen3_untied() {
    check("qwen3-untied", trace::KvCache::F32);
}

#[test]
fn f32_llama_gqa() {
    check("llama-gqa", trace::KvCache::F32);
}

#[test]
fn f32_qwen3_next() {
    check("qwen3-next", trace::KvCache::F32);
}

/// A KV cache longer than one binding may cover on this device (`maxStorageBufferRange`) is
/// refused at load before any buffer is made, naming the dispatch that binds it and
/// `--max-context`; before, the descriptor write failed with the bare limit.
#[test]
fn a_cache_past_the_binding_limit_is_refused_by_name() {
    let (device, log) = validated_device();
    let model = import::load(&fixture_dir("qwen3-tied")).unwrap();
    let c = &model.config;
    // One slot past the limit, at f16 where that many slots are a context the trace takes, else
    // at f32 (an H200's 4 GiB range is 2^25 f16 slots of this fixture, 2^24 f32 ones).
    let range = device.info().max_storage_buffer_range as usize;
    let past = |bytes: usize| range / (c.num_kv_heads * c.head_dim * bytes) + 1;
    let limit = trace::TraceOptions::MAX_CONTEXT_LIMIT;
    let Some((kv_cache, slots)) = [(trace::KvCache::F16, 2), (trace::KvCache::F32, 4)]
        .into_iter()
        .map(|(kv, bytes)| (kv, past(bytes)))
        .find(|&(_, slots)| slots <= limit)
    else {
        // No context the trace takes reaches past this device's range: it refuses the longer
        // one by name before anything is lowered.
        let opts = trace::TraceOptions {
            max_context: Some(past(4)),
            ..Default::default()
        };
        let err = trace::trace(&model, &opts)
            .expect_err("refused")
            .to_string();
        assert!(err.contains("--max-context"), "{err}");
        return;
    };
    let opts = trace::TraceOptions {
        max_context: Some(slots),
        kv_cache,
        ..Default::default()
    };
    let program = trace::trace(&model, &opts).unwrap();
    let meta = vkfuse_compiler::lower::Meta::of(&model);
    let schedule = vkfuse_compiler::lower::lower(&program, &meta, &mut spirv_cache()).unwrap();
    let options = vkfuse_runtime::session::LoadOptions::default();
    let err = vkfuse_runtime::session::Loaded::load(device, schedule, &model.tensors, options)
        .err()
        .expect("a cache past maxStorageBufferRange loads");
    let msg = err.to_string();
    assert!(msg.contains("maxStorageBufferRange"), "{msg}");
    assert!(msg.contains("--max-context"), "{msg}");
    assert!(msg.contains("_cache_"), "{msg}");
    assert!(log.is_clean(), "{}", log.report());
}
