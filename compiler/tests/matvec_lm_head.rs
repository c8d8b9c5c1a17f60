//! The fused matvec over block-quantised weights at lm_head's size (65536 rows and more: two
//! subgroups of 32 per workgroup and 8 rows each, `kernels::matvec_tuning`; the fixtures'
//! vocabularies never reach it), with the final norm as its prologue and the step's argmax
//! folded in, against the CPU: the rows dequantised by `quant::blocks::decode` (the format's
//! own decoder) and dotted in f64 with the normed input. Rows of 39 blocks (156 steps of 8
//! weights) take some invocations through 5 steps and some through 4; rows of 3 blocks leave
//! most invocations without any. On whatever Vulkan device is here (lavapipe on the CPU
//! machines) with the validation layer on.

mod common;

use common::{argmax, buffer, noise, rel_l2};
use std::time::Duration;
use vkfuse_compiler::fuse::codegen::{self, MatvecSpec, NormSpec};
use vkfuse_compiler::ir::{DType, F32Attr};
use vkfuse_compiler::kernels;
use vkfuse_compiler::quant::blocks;
use vkfuse_runtime::Buffer;

const WAIT: Duration = Duration::from_secs(300);
const EPS: f32 = 1e-6;

/// The subgroup size of the device the tests run on.
fn device_subgroup_size() -> u32 {
    common::validated_device().0.info().subgroup_size
}

fn check(dtype: DType, rows: usize, cols: usize) {
    check_at(dtype, rows, cols, None);
}

/// `wg`: run the kernel at this workgroup size instead of codegen's 64.
fn check_at(dtype: DType, rows: usize, cols: usize, wg: Option<u32>) {
    check_probe(dtype, rows, cols, wg, "", 1e-5, 1e-3);
}

/// [`check_at`] with `defines` (`#define NAME 1` each, comma-separated: a probe's) in the
/// kernel, within relative L2 `tol` and `worst_tol` per row of the CPU.
fn check_probe(
    dtype: DType,
    rows: usize,
    cols: usize,
    wg: Option<u32>,
    defines: &str,
    tol: f64,
    worst_tol: f64,
) {
    let spec = MatvecSpec {
        norm: Some(NormSpec {
            eps: F32Attr(EPS),
            zero_centered: false,
            dtype: DType::F32,
            ones: false,
        }),
        ..common::bare_matvec(dtype, rows, cols, true)
    };
    let mut gen = codegen::matvec(&spec);
    assert_eq!(gen.spec_constants[0], 64, "two subgroups per workgroup");
    if let Some(wg) = wg {
        gen.spec_constants[0] = wg;
    }
    gen.source = kernels::with_defines(&gen.source, defines);
    assert_eq!(gen.spec_constants[3], 8, "8 rows per workgroup");
    let w: Vec<f32> = (0..rows * cols).map(|i| noise(i, 1)).collect();
    let mut codes = vec![];
    blocks::encode(dtype, &w, cols, &mut codes);
    let dequantised = blocks::decode(dtype, &codes, cols);
    let x: Vec<f32> = (0..cols).map(|i| 3.0 * noise(i, 2)).collect();
    let nw: Vec<f32> = (0..cols).map(|i| 1.0 + 0.5 * noise(i, 3)).collect();
    let ms = x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / cols as f64;
    let scale = 1.0 / (ms + EPS as f64).sqrt();
    let want: Vec<f64> = dequantised
        .chunks_exact(cols)
        .map(|row| {
            row.iter()
                .zip(&x)
                .zip(&nw)
                .map(|((w, x), n)| *w as f64 * *x as f64 * scale * *n as f64)
                .sum()
        })
        .collect();

    let (device, log) = common::validated_device();
    let pipeline = common::generated_pipeline(&device, &gen);
    // Logits, weights, x, norm weight, token state (the argmax's key), position state,
    // position.
    let sizes = [
        4 * rows as u64,
        codes.len() as u64,
        4 * cols as u64,
        4 * cols as u64,
        8,
        4,
        4,
    ];
    let mut bufs: Vec<Buffer> = sizes.iter().map(|&b| buffer(&device, b)).collect();
    assert_eq!(bufs.len(), gen.bindings);
    device.upload_pod(&mut bufs[1], 0, &codes).expect("weights");
    device.upload_pod(&mut bufs[2], 0, &x).expect("x");
    device
        .upload_pod(&mut bufs[3], 0, &nw)
        .expect("norm weight");
    device
        .upload_pod(&mut bufs[6], 0, &[7i32])
        .expect("position");
    // A token the host wrote (`TokenEncoding::Key`: its complement, then a zero key), which
    // every row's key beats.
    device
        .upload_pod(&mut bufs[4], 0, &[!5u32, 0])
        .expect("token");
    let mut cmd = common::record_generated(&device, &pipeline, &gen, &bufs);
    device.submit_and_wait(&mut cmd, WAIT).expect("run");

    let y: Vec<f32> = device.readback_pod(&bufs[0], 0, rows).expect("logits");
    let rel = rel_l2(&y, &want);
    eprintln!("{dtype} [{rows}x{cols}] {defines}: relative L2 {rel:.2e}");
    assert!(
        rel < tol,
        "{dtype} [{rows}x{cols}] {defines}: relative L2 {rel:.2e}"
    );
    let worst = y
        .iter()
        .zip(&want)
        .map(|(a, b)| (*a as f64 - b).abs())
        .fold(0.0, f64::max);
    assert!(
        worst < worst_tol,
        "{dtype} [{rows}x{cols}] {defines}: worst row off by {worst:.2e}"
    );
    // The token is the argmax of the logits the kernel wrote (checked above against the CPU).
    let best = argmax(&y);
    let key: Vec<u32> = device.readback_pod(&bufs[4], 0, 2).expect("token");
    assert_eq!(!key[0], best as u32, "{dtype} [{rows}x{cols}]: token");
    assert_ne!(
        key[1], 0,
        "{dtype} [{rows}x{cols}]: the best logit's order key"
    );
    let pos: Vec<i32> = device.readback_pod(&bufs[5], 0, 1).expect("position");
    assert_eq!(pos[0], 8, "{dtype} [{rows}x{cols}]: position advanced");
    assert!(log.is_clean(), "validation errors:\n{}", log.report());
}

/// The scales' shuffle path (fused_matvec.glsl's SCALE_SHUFFLE: a workgroup of one subgroup,
/// a lane per scale word) at the device's subgroup size, so that lavapipe's subgroups of 8
/// reach it too: 13 blocks (7 words, the last half padding; in the last step the lanes left
/// read word 6, whose lane is past the row by then) and 3 blocks (2 words, most lanes holding
/// none). At 32 (an H100's; the compiler's shape before session 57, and with
/// `VKFUSE_MATVEC_HUGE_WG=32` still) 33 blocks have the last step's lanes read word 16 of a
/// lane past the row.
#[test]
fn lm_heads_match_the_cpu_with_one_subgroup_per_workgroup() {
    let sg = device_subgroup_size();
    if sg >= 32 {
        check_at(DType::Q4_0, 65536 + 3, 33 * 32, Some(32));
        check_at(DType::Q8_0, 65536 + 3, 33 * 32, Some(32));
        return;
    }
    assert!(
        sg >= 8,
        "8 rows per workgroup need subgroups of 8 (this one: {sg})"
    );
    for dtype in [DType::Q4_0, DType::Q8_0] {
        check_at(dtype, 65536 + 3, 13 * 32, Some(sg));
        check_at(dtype, 65536 + 5, 3 * 32, Some(sg));
    }
}

/// q4_0 and q8_0 lm_heads with `defines` on both scale paths: the shuffle's at the device's
/// subgroup size (at most 32), and the plain one at codegen's 64 where the subgroups are
/// narrower.
fn both_scale_paths(defines: &str, tol: f64, worst_tol: f64) {
    let sg = device_subgroup_size();
    for dtype in [DType::Q4_0, DType::Q8_0] {
        check_probe(
            dtype,
            65536 + 3,
            13 * 32,
            Some(sg.min(32)),
            defines,
            tol,
            worst_tol,
        );
        if sg < 32 {
            check_probe(dtype, 65536 + 5, 3 * 32, None, defines, tol, worst_tol);
        }
    }
}

/// The f16 dots' lm_head (kernels/glsl/quant.glsl; `F16_MV`, and the `F16_ACC` probe with it), on
/// both scale paths: the shuffle's at the device's subgroup size (lavapipe's 8 reaches it only
/// here) and the plain one at 32 where the subgroups are narrower. Within f16's rounding of
/// the input and of each step's products (lavapipe: 4.3-4.5e-4 relative L2, 5.0-6.4e-4 with
/// F16_ACC), where a swapped input pair or a neighbouring block's scale gives 1.0-1.4.
#[test]
fn the_f16_dot_lm_heads_match_the_cpu_within_f16_rounding() {
    for defines in ["F16_MV", "F16_MV,F16_ACC"] {
        both_scale_paths(defines, 2e-3, 0.1);
    }
}

#[test]
fn q4_0_lm_head_of_39_blocks_matches_the_cpu() {
    check(DType::Q4_0, 65536 + 37, 39 * 32);
}

#[test]
fn q8_0_lm_head_of_39_blocks_matches_the_cpu() {
    check(DType::Q8_0, 65536 + 37, 39 * 32);
}

#[test]
fn q4_0_and_q8_0_lm_heads_of_three_blocks_match_the_cpu() {
    check(DType::Q4_0, 65536 + 5, 96);
    check(DType::Q8_0, 65536 + 5, 96);
}

/// A fused matvec of 65536 rows of 64 `dtype` weights, no norm, the step's tail if `step`: for
/// what its SPIR-V declares.
fn small_spec(dtype: DType, step: bool) -> MatvecSpec {
    common::bare_matvec(dtype, 65536, 64, step)
}

#[test]
fn fused_matvecs_declare_shuffles_which_the_runtime_then_requires() {
    let decl = |dtype: DType| common::kernel_decl(&codegen::matvec(&small_spec(dtype, false)));
    // The block formats' scales by shuffle, every format's dots summed by shuffles
    // (reduce.glsl's SUBGROUP_SUMS).
    assert!(decl(DType::Q4_0).uses_subgroup_shuffle());
    assert!(decl(DType::Q8_0).uses_subgroup_shuffle());
    assert!(decl(DType::BF16).uses_subgroup_shuffle());
}

#[test]
fn only_the_f16_dots_declare_f16_arithmetic() {
    let mut gen = codegen::matvec(&small_spec(DType::Q4_0, true));
    // Without them no kernel needs `shaderFloat16` (f16 storage is unpacked from words).
    assert!(!common::kernel_decl(&gen).uses_float16_arithmetic());
    gen.source = kernels::with_defines(&gen.source, "F16_MV");
    assert!(common::kernel_decl(&gen).uses_float16_arithmetic());
}

/// The argmax's atomics filtered by the key as each workgroup began (matvec_step.glsl's
/// STEP_FILTER, which the compiler sets for float and q8_0 weights, not q4_0's; tail.rs's
/// oracle), on the block formats' paths: still the CPU's token.
#[test]
fn filtered_step_keys_pick_the_cpu_token() {
    let filtered = |dtype| codegen::matvec(&small_spec(dtype, true)).source;
    assert!(filtered(DType::Q8_0).contains("#define STEP_FILTER 1"));
    assert!(!filtered(DType::Q4_0).contains("STEP_FILTER"));
    check_probe(DType::Q4_0, 65539, 39 * 32, None, "STEP_FILTER", 1e-5, 1e-3);
    check_probe(DType::Q8_0, 65539, 3 * 32, None, "STEP_FILTER", 1e-5, 1e-3);
}
