//! The fused expert kernels (`expert_dots.glsl`) on stacks stored in the block formats
//! (`--weights q8_0|q4_0`, each expert's matrix encoded as a matrix of its own), against the
//! CPU: the experts' rows decoded from the very bytes the device reads (`quant::blocks`) and
//! dotted in f64, then the SwiGLU and the routing-weighted sum. The experts are picked on the
//! device from the router's logits (`Routing::Own`), with distinct logits so that the CPU picks
//! the same ones. Random shapes (inputs of one to several blocks of 32, rows, experts, top-k),
//! on whatever Vulkan device is here (lavapipe on the CPU machines), validation on. Both dots:
//! f32 (the exact dequantisation: within 1e-5) and the packed f16 products of `--dots f16`
//! (`F16_DOTS`, the default for these formats: each product and input rounded to f16, within
//! 3e-3).

mod common;

use common::{buffer, noise, rel_l2};
use proptest::test_runner::{Config, TestRunner};
use std::time::Duration;
use vkfuse_compiler::fuse::codegen::{self, Epi, ExpertSpec, Generated, Routing};
use vkfuse_compiler::ir::DType;
use vkfuse_compiler::quant::blocks;
use vkfuse_runtime::{Device, ValidationLog};

const WAIT: Duration = Duration::from_secs(300);

/// The picks of distinct logits, largest first, and their softmax renormalised over them.
fn cpu_route(logits: &[f32], k: usize) -> (Vec<usize>, Vec<f64>) {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    order.truncate(k);
    let e: Vec<f64> = order
        .iter()
        .map(|&i| (logits[i] as f64 - logits[order[0]] as f64).exp())
        .collect();
    let total: f64 = e.iter().sum();
    (order, e.iter().map(|v| v / total).collect())
}

/// `gen` over the encoded stack `w`, `logits` and input `x`: its first `out` outputs.
fn run(
    device: &Device,
    gen: &Generated,
    w: &[u8],
    logits: &[f32],
    x: &[f32],
    out: usize,
) -> Vec<f32> {
    let pipeline = common::generated_pipeline(device, gen);
    let mut bufs = vec![
        buffer(device, 4 * out as u64),
        buffer(device, w.len() as u64),
        buffer(device, 4 * logits.len() as u64),
        buffer(device, 4 * x.len() as u64),
    ];
    assert_eq!(bufs.len(), gen.bindings);
    device.upload(&mut bufs[1], 0, w).expect("weights");
    device.upload_pod(&mut bufs[2], 0, logits).expect("logits");
    device.upload_pod(&mut bufs[3], 0, x).expect("x");
    let mut cmd = common::record_generated(device, &pipeline, gen, &bufs);
    device.submit_and_wait(&mut cmd, WAIT).expect("run");
    device.readback_pod(&bufs[0], 0, out).expect("y")
}

/// `count` experts of [o x i] random weights, each encoded in `dtype` as a matrix of its own
/// (what the stack's uploads hold), and the values those bytes decode to.
fn stack(dtype: DType, count: usize, o: usize, i: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let mut bytes = vec![];
    let mut values = vec![];
    for e in 0..count {
        let w: Vec<f32> = (0..o * i).map(|n| noise(e * o * i + n, seed)).collect();
        let mut one = vec![];
        blocks::encode(dtype, &w, i, &mut one);
        values.extend(blocks::decode(dtype, &one, i));
        bytes.extend(one);
    }
    (bytes, values)
}

fn dot(w: &[f32], row: usize, x: &[f32]) -> f64 {
    let i = x.len();
    w[row * i..][..i]
        .iter()
        .zip(x)
        .map(|(a, b)| *a as f64 * *b as f64)
        .sum()
}

#[allow(clippy::too_many_arguments)]
fn check(
    device: &Device,
    log: &ValidationLog,
    dtype: DType,
    f16: bool,
    n: usize,
    k: usize,
    o: usize,
    i: usize,
    seed: u64,
) {
    // Distinct logits, a quarter apart: no near-tie for the device's exp to reorder.
    let mut logits: Vec<f32> = (0..n).map(|e| e as f32 / 4.0 - 2.0).collect();
    logits.rotate_left(seed as usize % n);
    let (ids, wts) = cpu_route(&logits, k);
    let spec = |o, i| ExpertSpec {
        dtype,
        e: n,
        o,
        i,
        k,
        routing: Routing::Own { n },
        epi: Epi::Acc,
        extras: vec![],
    };
    let what = format!("{dtype:?} (f16 dots: {f16}): {n} experts, top {k}, [{o} x {i}]");
    let tol = if f16 { 3e-3 } else { 1e-5 };
    // The kernel with F16_DOTS where asked, which then takes f16 arithmetic (and only then).
    let gen = |g: Generated| {
        let g = if f16 {
            let source = vkfuse_compiler::kernels::with_defines(&g.source, "F16_DOTS");
            Generated { source, ..g }
        } else {
            g
        };
        assert_eq!(
            common::kernel_decl(&g).uses_float16_arithmetic(),
            f16,
            "{}",
            g.label
        );
        g
    };

    // The SwiGLU: gate and up stacks packed one after the other, y[j] over expert ids[j].
    let (w, wv) = stack(dtype, 2 * n, o, i, seed);
    let x: Vec<f32> = (0..i).map(|c| 2.0 * noise(c, seed + 1)).collect();
    let y = run(
        device,
        &gen(codegen::expert_glu(&spec(o, i))),
        &w,
        &logits,
        &x,
        k * o,
    );
    let want: Vec<f64> = (0..k * o)
        .map(|r| {
            let (j, row) = (r / o, r % o);
            let g = dot(&wv, ids[j] * o + row, &x);
            g / (1.0 + (-g).exp()) * dot(&wv, (n + ids[j]) * o + row, &x)
        })
        .collect();
    let rel = rel_l2(&y, &want);
    assert!(rel < tol, "{what}: SwiGLU off by relative L2 {rel:.2e}");

    // The weighted sum of the experts' down rows, each over its own input row.
    let (w, wv) = stack(dtype, n, i, o, seed + 2);
    let x: Vec<f32> = (0..k * o).map(|c| noise(c, seed + 3)).collect();
    let y = run(
        device,
        &gen(codegen::expert_sum(&spec(i, o))),
        &w,
        &logits,
        &x,
        i,
    );
    let want: Vec<f64> = (0..i)
        .map(|row| {
            (0..k)
                .map(|j| wts[j] * dot(&wv, ids[j] * i + row, &x[j * o..][..o]))
                .sum()
        })
        .collect();
    let rel = rel_l2(&y, &want);
    assert!(
        rel < tol,
        "{what}: weighted sum off by relative L2 {rel:.2e}"
    );
    assert!(
        log.is_clean(),
        "{what}: validation errors:\n{}",
        log.report()
    );
}

#[test]
fn block_format_experts_match_the_cpu() {
    // One device for every case: NVIDIA's driver refused a new instance (vkCreateInstance:
    // ERROR_INCOMPATIBLE_DRIVER) after a few dozen in one process on the H200, one per case.
    let (device, log) = common::validated_device();
    let shapes = (2usize..24, 1usize..9, 1usize..12, 1usize..5, 0u64..1000);
    TestRunner::new(Config::with_cases(8))
        .run(&shapes, |(n, k, rows, blocks, seed)| {
            let k = k.min(n);
            for dtype in [DType::Q8_0, DType::Q4_0] {
                for f16 in [false, true] {
                    // Rows of whole blocks both ways: the SwiGLU's input and the sum's.
                    check(
                        &device,
                        &log,
                        dtype,
                        f16,
                        n,
                        k,
                        32 * rows,
                        32 * blocks,
                        seed,
                    );
                }
            }
            Ok(())
        })
        .unwrap();
    // Qwen3-Next-80B's top 10: more experts than a pass of `expert_dots.glsl` takes, the sum in
    // 4 rows a workgroup (`rows_main`), its experts shared among groups of invocations.
    for dtype in [DType::Q8_0, DType::Q4_0] {
        for f16 in [false, true] {
            check(&device, &log, dtype, f16, 16, 10, 64, 64, 7);
            // The sum's input rows of 96 (12 steps): its 128 invocations in 10 groups of 12
            // (`rows_main`), the last 8 idle, and 12 experts, so that two groups take two each.
            check(&device, &log, dtype, f16, 16, 12, 96, 64, 9);
        }
    }
}
