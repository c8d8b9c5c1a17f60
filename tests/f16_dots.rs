//! The block formats' dots in packed f16 arithmetic (`compile-model --dots f16`, the default
//! for q8_0/q4_0: `FuseOptions::f16_dots`, kernels/glsl/quant.glsl), on every fixture with the
//! validation layer on, folded as compile-model folds q8_0/q4_0. Three oracles:
//! - the CPU reference on the same bytes (f32 dots): f16's rounding of the input and of each
//!   step's products moves the logits by ~1e-3, where a wrong code pair, input pair or scale
//!   moves them by ~1;
//! - transformers' logits: no further from them than the reference's own error plus that;
//! - fused eager (the same kernels): replay equal up to the float atomics' reassociation,
//!   which f16 can round into a whole f16 step of the next layer's input ([`F16_ATOMICS_TOL`]).
//!
//! The hybrid fixture's MoE router picks another expert where two gates tie within f16's
//! rounding (a few of its 32 positions, docs/perf.md session 37): its bound against the
//! reference holds at all but [`HYBRID_TIES`] positions, and every position stays within
//! q8_0/q4_0's own bounds against transformers (`quant_vs_transformers`).
//!
//! The chained MLPs' int8 dots (compile-model's default for q8_0/q4_0: `FuseOptions::int8_chain`,
//! `--dots int8`, the other kernels' dots in f16) against the same oracles, with bounds of their
//! own ([`I8_TOL`], [`I8_ATOMICS_TOL`]); `compiler/tests/chain.rs` checks the kernel against a
//! CPU model of the int8 route.
//!
//! The F16_ACC probe (the sums in f16 too, `VKFUSE_DEFINES=F16_ACC`) runs on qwen3-untied: every f16 path a lavapipe device runs (the chain's preloaded and looped
//! steps, its down blocks, the wide matvec, the fused matvecs; lm_head's scale shuffle needs
//! 32-wide subgroups: `compiler/tests/matvec_lm_head.rs`).

use vkfuse_compiler::fuse::{lower_fused, FuseOptions};
use vkfuse_compiler::import;
use vkfuse_compiler::lower::{Meta, SpirvCache};
use vkfuse_compiler::quant::{self, EncodedWeights, WeightFormat};
use vkfuse_compiler::trace::{self, TraceOptions};
use vkfuse_tests::{expected, fixture_dir, rel_l2, validated_device, F16_ATOMICS_TOL};

/// The hybrid fixture's bound against the reference: its Gated DeltaNet state carries each
/// step's f16 rounding into the next (q8_0 grows from 1e-3 to 9.3e-3 over its 32 positions);
/// [`HYBRID_TIES`] positions may pass it, where the router picks another expert (q4_0: one at
/// 1.1e-1).
const HYBRID_TOL: f64 = 2e-2;
const HYBRID_TIES: usize = 3;

/// The int8 chains' bound against the reference, and against transformers beyond the
/// reference's own distance: the input's and act's int8 rounding (lavapipe: 0.9e-3 to 2.1e-2
/// from the reference on the dense fixtures, at most 7.5e-3 further from transformers, where a
/// wrong code, offset or scale moves the logits by ~1).
const I8_TOL: f64 = 3e-2;
/// Replay against eager with int8 chains: the chain's atomics as for the f16 dots, where an
/// input that an f32 rounding moves across an int8 rounding boundary moves by 1/127 of its
/// block's largest (lavapipe: at most 1.3e-7; an H200: 4.3e-3, qwen3-untied q8_0).
const I8_ATOMICS_TOL: f64 = 1e-2;

/// Each position's relative L2 of `rows` against `want`.
fn errors(rows: &[Vec<f32>], want: &[Vec<f32>]) -> Vec<f64> {
    rows.iter().zip(want).map(|(a, b)| rel_l2(a, b)).collect()
}

fn worst(e: &[f64]) -> f64 {
    e.iter().cloned().fold(0.0, f64::max)
}

fn median(e: &[f64]) -> f64 {
    let mut e = e.to_vec();
    e.sort_by(f64::total_cmp);
    e[e.len() / 2]
}

/// The fixture `name` in `format`, folded as compile-model folds it, compiled with f16 dots
/// (and the probe's `defines`) and replayed against the three oracles.
fn check(name: &str, format: WeightFormat, defines: &str) {
    check_split(name, format, defines, None, Dots::F16);
}

/// The fused kernels' dots: f16, or f16 with the chained MLPs' in int8 (compile-model's
/// default for q8_0/q4_0, `--dots auto` or `int8`).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Dots {
    F16,
    Int8Chain,
}

impl Dots {
    /// How far the fused logits may lie from the reference's (the f32 dots on the same bytes),
    /// from transformers' beyond the reference's own distance, and replay's from eager's.
    fn bounds(self) -> (f64, f64, f64) {
        match self {
            Dots::F16 => (5e-3, 5e-3, F16_ATOMICS_TOL),
            Dots::Int8Chain => (I8_TOL, I8_TOL, I8_ATOMICS_TOL),
        }
    }
}

/// [`check`] with the attention block split as `splits` says (`None`: as the shapes choose).
fn check_split(name: &str, format: WeightFormat, defines: &str, splits: Option<usize>, dots: Dots) {
    let want = expected(name);
    let model = import::load(&fixture_dir(name)).unwrap();
    let opts = TraceOptions {
        fold_norms: trace::FoldNorms::Auto.folds(&model, Some(format)),
        ..TraceOptions::default()
    };
    let mut program = trace::trace(&model, &opts).unwrap();
    quant::convert(&mut program, format).unwrap();
    let weights = EncodedWeights::new(&model.tensors, &program).unwrap();
    let reference = vkfuse_tests::reference_rows(&program, &weights, &want.teacher_ids);
    let transformers: Vec<Vec<f32>> = (0..want.teacher_logits.rows)
        .map(|r| want.teacher_logits.row(r).to_vec())
        .collect();
    let ref_err = errors(&reference, &transformers);
    let meta = Meta {
        architecture: model.config.architecture.clone(),
        eos_token_ids: vec![],
        tokenizer: None,
    };
    // A cache of its own: the shared test cache compiles without the probe's defines.
    let mut spirv = SpirvCache::with_probe_defines(defines);
    let fuse = FuseOptions {
        f16_dots: true,
        int8_chain: dots == Dots::Int8Chain,
        attention_splits: splits,
        ..FuseOptions::default()
    };
    let schedule = lower_fused(&program, &meta, &mut spirv, &fuse).unwrap().0;
    let what = format!("{name} {format} {dots:?} dots {defines} splits {splits:?}");
    let (ref_tol, teacher_tol, atomics_tol) = dots.bounds();
    if splits.is_some_and(|s| s > 1) {
        // consume_tile()'s constant: the split block takes the early tile (tests/handoff.rs).
        assert!(
            vkfuse_tests::attention_blocks_holding(&schedule, vkfuse_tests::EARLY_TILE_WITNESS)
                .iter()
                .any(|&b| b),
            "{what}: no early tile"
        );
    }
    // The split block's band below 256 walks in subgroups for q4_0 with heads of 32 to 128
    // (here qwen3-tied's 32).
    if splits.is_some_and(|s| s > 1) {
        assert_eq!(
            vkfuse_tests::walks_in_subgroups(&schedule),
            format == WeightFormat::Q4_0 && model.config.head_dim.is_multiple_of(32),
            "{what}: the subgroup walk"
        );
    }
    assert!(
        schedule.float16_kernel().is_some(),
        "{what}: no kernel declares f16 arithmetic"
    );
    assert_eq!(
        schedule.integer_dot_kernel().is_some(),
        dots == Dots::Int8Chain,
        "{what}: a kernel declares integer dot products"
    );
    let (device, log) = validated_device();
    let (eager, fused, replay) = vkfuse_tests::fused_rows(
        &what,
        atomics_tol,
        schedule,
        &weights,
        &device,
        &want.teacher_ids,
    );
    let vs_ref = errors(&fused, &reference);
    let fused_err = errors(&fused, &transformers);
    eprintln!(
        "{what}: vs reference worst {:.2e} median {:.2e}; vs transformers worst: reference \
         {:.3e}, fused {:.3e}; replay vs eager worst {:.2e}",
        worst(&vs_ref),
        median(&vs_ref),
        worst(&ref_err),
        worst(&fused_err),
        worst(&errors(&fused, &eager))
    );
    if name == "qwen3-next" {
        // All but the router's ties within HYBRID_TOL, the median within the dense bound;
        // every position within the format's own accuracy bounds (quant_vs_transformers).
        let ties = vs_ref.iter().filter(|e| **e >= HYBRID_TOL).count();
        eprintln!("{what}: {ties} positions past {HYBRID_TOL:.0e} from the reference");
        assert!(
            ties <= HYBRID_TIES && median(&vs_ref) < 5e-3,
            "{what}: {ties} positions past {HYBRID_TOL:.0e} from the reference, the median {:.2e}: \
             {vs_ref:?}",
            median(&vs_ref)
        );
        let bound = if format == WeightFormat::Q8_0 {
            5e-1
        } else {
            2.0
        };
        assert!(
            worst(&fused_err) <= bound,
            "{what}: {:.2e} from transformers (bound {bound:.0e})",
            worst(&fused_err)
        );
    } else {
        assert!(
            worst(&vs_ref) < ref_tol,
            "{what}: {:.2e} from the reference",
            worst(&vs_ref)
        );
        for (p, (f, r)) in fused_err.iter().zip(&ref_err).enumerate() {
            assert!(
                *f < r + teacher_tol,
                "{what}: position {p}: {f:.3e} from transformers, the reference {r:.3e}"
            );
        }
    }
    drop(replay);
    assert!(log.is_clean(), "{what}: validation:\n{}", log.report());
}

fn both_formats(name: &str) {
    for format in [WeightFormat::Q8_0, WeightFormat::Q4_0] {
        check(name, format, "");
    }
}

#[test]
fn qwen3_tied_f16_dots_stay_within_f16_rounding_of_the_f32_dots() {
    both_formats("qwen3-tied");
}

#[test]
fn qwen3_untied_f16_dots_stay_within_f16_rounding_of_the_f32_dots() {
    both_formats("qwen3-untied");
}

#[test]
fn llama_gqa_f16_dots_stay_within_f16_rounding_of_the_f32_dots() {
    both_formats("llama-gqa");
}

#[test]
fn qwen3_next_f16_dots_stay_within_f16_rounding_of_the_f32_dots() {
    both_formats("qwen3-next");
}

/// A split attention block takes the early tile with f16 dots (its rope angles before the
/// wait, its first K/V tile consumed after its first polls): against the same oracles, with
/// its levels handed over in replay (the fixtures' 32 positions fit one 32-slot chunk, so a
/// single split works at each; tests/handoff.rs combines them at longer positions). In q4_0,
/// qwen3-tied's heads of 32 take the subgroup walk too (`AttnSpec::subgroup_walk`, in the band
/// below position 256, whose chunks take one pass).
#[test]
fn a_split_attention_block_with_the_early_tile_stays_within_f16_rounding() {
    for format in [WeightFormat::Q8_0, WeightFormat::Q4_0] {
        check_split("qwen3-untied", format, "", Some(4), Dots::F16);
    }
    check_split("qwen3-tied", WeightFormat::Q4_0, "", Some(4), Dots::F16);
}

#[test]
fn the_f16_acc_probe_stays_within_f16_rounding_of_the_f32_dots() {
    for format in [WeightFormat::Q8_0, WeightFormat::Q4_0] {
        check("qwen3-untied", format, "F16_ACC");
    }
}

/// The fixtures whose MLPs chain (llama-gqa's 200 inner rows and qwen3-next's shared expert's
/// 48 are not whole blocks of 32: their MLPs stay two matvecs, with f16 dots).
fn int8_chains(name: &str) {
    for format in [WeightFormat::Q8_0, WeightFormat::Q4_0] {
        check_split(name, format, "", None, Dots::Int8Chain);
    }
}

#[test]
fn qwen3_tied_int8_chains_stay_within_int8_rounding_of_the_f32_dots() {
    int8_chains("qwen3-tied");
}

#[test]
fn qwen3_untied_int8_chains_stay_within_int8_rounding_of_the_f32_dots() {
    int8_chains("qwen3-untied");
}
