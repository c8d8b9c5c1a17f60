//! The wide matvec (`codegen::wide_matvec`, `fused_chain.glsl`'s INNER_ONLY: o_proj, where the
//! attention block hands its output over) against the CPU: y = in0 + W · x, the rows of W
//! dequantised by the format's own decoder (`quant::blocks::decode`) and dotted in f64. Rows
//! long enough that each lane preloads its first steps into registers before x is staged
//! (PRE_STEPS) and takes the rest in the loop, and rows shorter than one step per lane; at the
//! workgroup size codegen gives and at smaller ones, where a subgroup takes several rounds of
//! rows and only the first comes from the preload. The handoff words are not bound here (x is
//! read from its binding): `tests/handoff.rs` runs the handed-over reader end to end. On
//! whatever Vulkan device is here (lavapipe on the CPU machines) with the validation layer on.

mod common;

use common::{buffer, noise, rel_l2};
use std::time::Duration;
use vkfuse_compiler::fuse::codegen::{self, Epi, ExtraSpec, MatvecSpec};
use vkfuse_compiler::ir::DType;
use vkfuse_compiler::quant::blocks;
use vkfuse_runtime::Buffer;

const WAIT: Duration = Duration::from_secs(300);

/// o_proj's spec: no norm, the residual as extra input 0, x written by a publishing kernel.
fn spec(dtype: DType, rows: usize, cols: usize) -> MatvecSpec {
    MatvecSpec {
        dtype,
        cols,
        part_rows: vec![rows],
        zipped: false,
        norm: None,
        extras: vec![ExtraSpec {
            dtype: DType::F32,
            scalar: false,
        }],
        epi: Epi::Add(Box::new(Epi::In(0)), Box::new(Epi::Acc)),
        step: false,
        x_published: true,
    }
}

/// `subgroups`: run the kernel at this many of the device's subgroups per workgroup instead of
/// codegen's size.
fn check(dtype: DType, rows: usize, cols: usize, subgroups: Option<u32>) {
    let spec = spec(dtype, rows, cols);
    assert!(codegen::is_wide(&spec), "{dtype} [{rows}x{cols}]: not wide");
    let mut gen = codegen::matvec(&spec);
    assert!(gen.label.contains("wide"), "{}", gen.label);
    let (device, log) = common::validated_device();
    if let Some(n) = subgroups {
        gen.spec_constants[0] = n * device.info().subgroup_size;
    }
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| noise(i, 1) / (cols as f32).sqrt())
        .collect();
    let mut codes = vec![];
    blocks::encode(dtype, &w, cols, &mut codes);
    let held = blocks::decode(dtype, &codes, cols);
    let x: Vec<f32> = (0..cols).map(|i| 3.0 * noise(i, 2)).collect();
    let in0: Vec<f32> = (0..rows).map(|i| noise(i, 3)).collect();
    let want: Vec<f64> = held
        .chunks_exact(cols)
        .zip(&in0)
        .map(|(row, r)| {
            *r as f64
                + row
                    .iter()
                    .zip(&x)
                    .map(|(w, x)| *w as f64 * *x as f64)
                    .sum::<f64>()
        })
        .collect();

    let pipeline = common::generated_pipeline(&device, &gen);
    // y, weights, x, in0.
    let sizes = [
        4 * rows as u64,
        codes.len() as u64,
        4 * cols as u64,
        4 * rows as u64,
    ];
    let mut bufs: Vec<Buffer> = sizes.iter().map(|&b| buffer(&device, b)).collect();
    assert_eq!(bufs.len(), gen.bindings);
    device.upload_pod(&mut bufs[1], 0, &codes).expect("weights");
    device.upload_pod(&mut bufs[2], 0, &x).expect("x");
    device.upload_pod(&mut bufs[3], 0, &in0).expect("in0");
    let mut cmd = common::record_generated(&device, &pipeline, &gen, &bufs);
    device.submit_and_wait(&mut cmd, WAIT).expect("run");

    let y: Vec<f32> = device.readback_pod(&bufs[0], 0, rows).expect("y");
    let rel = rel_l2(&y, &want);
    let what = format!(
        "{dtype} [{rows}x{cols}] workgroup {}",
        gen.spec_constants[0]
    );
    assert!(rel < 1e-5, "{what}: relative L2 {rel:.2e}");
    assert!(log.is_clean(), "validation errors:\n{}", log.report());
}

#[test]
fn bf16_rows_longer_than_the_preload_match_the_cpu() {
    // 256 steps of 8 weights a row: 8 of them per lane preloaded at most, the rest looped.
    check(DType::BF16, 64, 2048, None);
}

#[test]
fn f16_rows_of_an_odd_step_count_match_the_cpu() {
    // 17 steps: a lane with none, or one past the preload.
    check(DType::F16, 32, 136, None);
}

#[test]
fn q8_0_rows_match_the_cpu() {
    check(DType::Q8_0, 48, 384, None);
}

#[test]
fn q4_0_rows_longer_than_the_preload_match_the_cpu() {
    check(DType::Q4_0, 32, 2048, None);
}

#[test]
fn f32_rows_without_a_preload_match_the_cpu() {
    check(DType::F32, 32, 96, None);
}

#[test]
fn small_workgroups_take_rows_in_several_rounds_and_match_the_cpu() {
    // 16 rows per workgroup over 8 subgroups, in two groups of 4 (4 rows each): rounds after
    // the first load all their weights in the loop. (Fewer subgroups than a group's 4 the
    // kernel does not take: fused_chain.glsl.)
    check(DType::BF16, 32, 512, Some(8));
    check(DType::Q4_0, 32, 512, Some(8));
}

#[test]
fn a_matvec_whose_x_no_kernel_publishes_stays_plain() {
    let mut s = spec(DType::BF16, 64, 128);
    s.x_published = false;
    assert!(!codegen::is_wide(&s));
    assert!(!codegen::matvec(&s).label.contains("wide"));
}
