//! Norm weights folded into the matrices after them (`compile-model --fold-norms`,
//! `TraceOptions::fold_norms`) on the dense fixtures, validation on:
//! - the trace reads q, k and v as their matrices times the attention norm's weight
//!   (`import::layout::folded`), gate and up times the MLP norm's, an lm_head of its own times
//!   the final norm's (one shared with the embedding stays unfolded), and leaves each folded
//!   norm a weight of ones; the fused kernels with a norm prologue then load no norm weight
//!   (`NW_ONES`) but the shared lm_head's, where without the fold none skips it;
//! - the CPU reference over the folded weights and the fused schedule replayed match
//!   transformers' float32 logits within 1e-2 with the same greedy tokens (the fold rounds the
//!   bf16 fixtures' matrices once more: up to 8e-3 where the unfolded reference keeps within
//!   1e-3)
//!   (the fixtures' norm weights are 1 + N(0, 0.1): a fold along the wrong axis, or a norm
//!   left unfolded with its weight dropped, misses by far more);
//! - the same inside persistent regions, whose matvec bodies read the norm weight element by
//!   element;
//! - quantised to q8_0 or q4_0 after the fold (compile-model's default for those formats): the
//!   kernels within 1.5e-4 of the CPU reference on the same bytes, and that reference as close
//!   to transformers as the unfolded quantised one (within a quarter);
//! - a folded name whose norm weight is missing or of another length is an error that names it.

use vkfuse_compiler::fuse::{self, lower_fused, FuseOptions};
use vkfuse_compiler::import::{self, layout, ImportError};
use vkfuse_compiler::ir::{OpKind, Program};
use vkfuse_compiler::lower::Meta;
use vkfuse_compiler::quant::{self, EncodedWeights, WeightFormat};
use vkfuse_compiler::trace::{self, TraceOptions};
use vkfuse_runtime::session::{LoadOptions, Loaded, Persistence, Replay, TensorBytes};
use vkfuse_tests::{
    as_array, assert_rows_close, expected, fixture_dir, reference_rows, rel_l2, replay_greedy_ids,
    replay_rows, spirv_cache, teacher_forced_rows, validated_device, ATOMICS_TOL,
};

const DENSE: &[&str] = &["qwen3-tied", "qwen3-untied", "llama-gqa"];

/// Relative L2 to transformers' logits at every position, folded: the fixtures' matrices are
/// bf16, and so is each folded one, W · diag(w) rounded once more, which moves the logits by up
/// to 7.6e-3 (qwen3-tied's last positions) where the unfolded reference keeps within 1e-3.
const FOLDED_TOL: f64 = 1e-2;

fn traced(name: &str, fold_norms: bool) -> (import::Model, Program) {
    let model = import::load(&fixture_dir(name)).unwrap();
    let opts = TraceOptions {
        fold_norms,
        ..TraceOptions::default()
    };
    let program = trace::trace(&model, &opts).unwrap();
    (model, program)
}

fn weight_names(p: &Program) -> Vec<&str> {
    p.ops
        .iter()
        .filter_map(|op| match &op.kind {
            OpKind::Weight { name } => Some(name.as_str()),
            _ => None,
        })
        .collect()
}

/// Asserts that `program` reads each of `matrices` folded by `norm` and not plain, and `norm`
/// as ones only.
fn assert_folded(name: &str, program: &Program, norm: &str, matrices: &[String]) {
    let names = weight_names(program);
    for w in matrices {
        assert!(
            names.contains(&layout::folded(w, norm).as_str()),
            "{name}: {w} not folded"
        );
        assert!(!names.contains(&w.as_str()), "{name}: {w} also unfolded");
    }
    assert!(
        names.contains(&layout::ones(norm).as_str()),
        "{name}: {norm}"
    );
    assert!(!names.contains(&norm), "{name}: {norm} still read");
}

#[test]
fn the_trace_folds_every_norm_into_the_matrices_after_it() {
    for name in DENSE {
        let (model, program) = traced(name, true);
        for layer in 0..model.config.num_layers {
            let pre = format!("model.layers.{layer}");
            let qkv = ["q_proj", "k_proj", "v_proj"].map(|m| format!("{pre}.self_attn.{m}.weight"));
            let norm = format!("{pre}.input_layernorm.weight");
            assert_folded(name, &program, &norm, &qkv);
            let mlp = ["gate_proj", "up_proj"].map(|m| format!("{pre}.mlp.{m}.weight"));
            let norm = format!("{pre}.post_attention_layernorm.weight");
            assert_folded(name, &program, &norm, &mlp);
        }
        let names = weight_names(&program);
        let norm = "model.norm.weight";
        if model.tensors.contains("lm_head.weight") {
            assert_folded(name, &program, norm, &["lm_head.weight".to_string()]);
        } else {
            // Shared with the embedding: one table, read plain by both.
            assert!(names.contains(&norm), "{name}: {norm}");
            let table = "model.embed_tokens.weight";
            assert!(
                !names.contains(&layout::folded(table, norm).as_str()),
                "{name}: the shared table folded"
            );
        }
        // Without the option, nothing is.
        let (_, plain) = traced(name, false);
        assert!(
            weight_names(&plain).iter().all(|n| !n.contains('#')),
            "{name}: a derived weight without --fold-norms"
        );
    }
}

/// Each of the fused program's kernels with a norm prologue (q/k/v, the MLP chain, lm_head),
/// by label, and whether it skips the norm weight's loads.
fn nw_ones(program: &Program) -> Vec<(String, bool)> {
    let fused = fuse::fuse(program, &FuseOptions::default()).unwrap();
    fused
        .units
        .iter()
        .flat_map(|u| &u.kernels)
        .filter_map(|k| k.generated.as_ref())
        .filter(|g| g.source.contains("#define NORM 1"))
        .map(|g| (g.label.clone(), g.source.contains("#define NW_ONES 1")))
        .collect()
}

#[test]
fn the_folded_kernels_load_no_norm_weight_but_the_shared_lm_head() {
    // q/k/v and the MLP chain (one kernel each for all layers) skip their norm weight's
    // loads, and so does lm_head where it is its own table.
    for (name, ones) in [("qwen3-tied", 2), ("qwen3-untied", 3)] {
        let (_, folded) = traced(name, true);
        let got = nw_ones(&folded);
        assert_eq!(got.len(), 3, "{name}: {got:?}");
        let n = got.iter().filter(|(_, o)| *o).count();
        assert_eq!(n, ones, "{name}: {got:?}");
        let (_, plain) = traced(name, false);
        let got = nw_ones(&plain);
        assert!(!got.is_empty() && got.iter().all(|(_, o)| !o), "{got:?}");
    }
}

/// The folded fixture `name` teacher-forced through the CPU reference, then through its unfused
/// and fused schedules (eager, and fused replay with its levels handed over, checked to agree),
/// each within `FOLDED_TOL` of transformers' logits, and the fused replay's greedy tokens
/// transformers'.
fn check(name: &str) {
    let want = expected(name);
    let (model, program) = traced(name, true);
    let rows = reference_rows(&program, &model.tensors, &want.teacher_ids);
    let worst = assert_rows_close(
        &format!("{name} folded, reference"),
        &rows,
        &want.teacher_logits,
        FOLDED_TOL,
    );
    eprintln!("{name} folded: reference worst relative L2 {worst:.3e}");
    let (device, log) = validated_device();
    let (unfused, fused, mut replay) = teacher_forced_rows(
        name,
        ATOMICS_TOL,
        &program,
        &model.config.architecture,
        &model.tensors,
        &device,
        &want.teacher_ids,
    );
    for (what, rows) in [("unfused", unfused), ("fused", fused)] {
        let worst = assert_rows_close(
            &format!("{name} folded, {what}"),
            &rows,
            &want.teacher_logits,
            FOLDED_TOL,
        );
        eprintln!("{name} folded: {what} worst relative L2 {worst:.3e}");
    }
    let ids = replay_greedy_ids(&mut replay, &want);
    assert_eq!(ids, want.greedy_ids, "{name}: folded greedy tokens");
    assert!(log.is_clean(), "{name}: validation:\n{}", log.report());
}

/// Relative L2 to transformers' logits (worst, mean over positions).
fn errors(rows: &[Vec<f32>], want: &vkfuse_compiler::npy::Array2) -> (f64, f64) {
    let e: Vec<f64> = rows
        .iter()
        .enumerate()
        .map(|(r, row)| rel_l2(row, want.row(r)))
        .collect();
    let worst = e.iter().cloned().fold(0.0, f64::max);
    (worst, e.iter().sum::<f64>() / e.len() as f64)
}

/// Fixture `name` folded, then quantised to `format` (compile-model's default for the block
/// formats): its unfused and fused schedules within 1.5e-4 of the CPU reference on the same
/// bytes (quant_vs_transformers' bound), and that reference as close to transformers as the
/// unfolded quantised one, within a quarter (the fold moves each matrix's rounding, not its
/// size; a fold that loses the norm weight misses llama-gqa's q4_0 by half again: 0.29
/// against 0.19).
fn check_quantised(name: &str, format: WeightFormat) {
    let want = expected(name);
    let quantised = |fold: bool| {
        let (model, mut program) = traced(name, fold);
        quant::convert(&mut program, format).unwrap();
        let architecture = model.config.architecture.clone();
        let weights = EncodedWeights::new(model.tensors, &program).unwrap();
        let rows = reference_rows(&program, &weights, &want.teacher_ids);
        (architecture, program, weights, rows)
    };
    let (_, _, _, plain) = quantised(false);
    let (architecture, program, weights, folded) = quantised(true);
    let (pw, pm) = errors(&plain, &want.teacher_logits);
    let (fw, fm) = errors(&folded, &want.teacher_logits);
    eprintln!(
        "{name} {format}: relative L2 to transformers, folded worst {fw:.3e} mean {fm:.3e}, \
         unfolded worst {pw:.3e} mean {pm:.3e}"
    );
    assert!(
        fw <= 1.25 * pw && fm <= 1.25 * pm,
        "{name} {format}: folded worst {fw:.3e} mean {fm:.3e} against unfolded {pw:.3e} {pm:.3e}"
    );
    let (device, log) = validated_device();
    let (unfused, fused, _) = teacher_forced_rows(
        name,
        ATOMICS_TOL,
        &program,
        &architecture,
        &weights,
        &device,
        &want.teacher_ids,
    );
    let oracle = as_array(&folded);
    for (what, rows) in [("unfused", unfused), ("fused", fused)] {
        assert_rows_close(
            &format!("{name} {format} folded, {what}"),
            &rows,
            &oracle,
            1.5e-4,
        );
    }
    assert!(log.is_clean(), "{name}: validation:\n{}", log.report());
}

#[test]
fn folded_qwen3_tied_matches_transformers() {
    check("qwen3-tied");
}

#[test]
fn folded_qwen3_untied_matches_transformers() {
    check("qwen3-untied");
}

#[test]
fn folded_llama_gqa_matches_transformers() {
    check("llama-gqa");
}

/// The folded q/k/v inside persistent regions (`fuse::persistent`), whose matvec bodies read
/// the norm weight element by element (`nw_at`, not `nw4_at`): compiled without chains, which
/// would leave no run of matvec levels for a region; one workgroup per region on lavapipe.
#[test]
fn folded_persistent_regions_match_transformers() {
    for name in DENSE {
        let want = expected(name);
        let (model, program) = traced(name, true);
        let opts = FuseOptions {
            chain: false,
            ..FuseOptions::default()
        };
        let (schedule, _) =
            lower_fused(&program, &Meta::of(&model), &mut spirv_cache(), &opts).unwrap();
        assert!(!schedule.persistent.is_empty(), "{name}: no region offered");
        let (device, log) = validated_device();
        let persistence = match device.info().compute_units {
            Some(_) => Persistence::Units,
            None => Persistence::Groups(1),
        };
        let options = LoadOptions {
            persistence,
            ..LoadOptions::default()
        };
        let loaded = Loaded::load(device, schedule, &model.tensors, options).unwrap();
        let mut replay = Replay::new(loaded).unwrap();
        let rows = replay_rows(&mut replay, &want.teacher_ids);
        assert_rows_close(
            &format!("{name} folded, persistent"),
            &rows,
            &want.teacher_logits,
            FOLDED_TOL,
        );
        assert!(log.is_clean(), "{name}: validation:\n{}", log.report());
    }
}

#[test]
fn q8_0_after_the_fold_is_as_close_as_unfolded() {
    check_quantised("qwen3-untied", WeightFormat::Q8_0);
}

#[test]
fn q4_0_after_the_fold_is_as_close_as_unfolded() {
    check_quantised("llama-gqa", WeightFormat::Q4_0);
}

#[test]
fn a_fold_with_a_missing_or_mis_shaped_norm_is_an_error_naming_it() {
    let model = import::load(&fixture_dir("qwen3-tied")).unwrap();
    let t = &model.tensors;
    let q = "model.layers.0.self_attn.q_proj.weight";
    let shape = t.get(q).unwrap().shape.clone();
    let missing = layout::folded(q, "model.layers.0.no_such_norm.weight");
    match t.expect(&missing, &shape) {
        Err(ImportError::MissingTensor { tensor, .. }) => {
            assert_eq!(tensor, "model.layers.0.no_such_norm.weight")
        }
        other => panic!("{other:?}"),
    }
    // q's norm over its output rows instead of its input columns (a 2-D "norm" here).
    let wrong = layout::folded(q, "model.layers.0.self_attn.k_proj.weight");
    let err = t.expect(&wrong, &shape).unwrap_err().to_string();
    assert!(err.contains("k_proj") && err.contains("fold"), "{err}");
    assert!(t.tensor_bytes(&wrong).is_err());
}
