//! The chained kernel (`fused_chain.glsl`: SwiGLU's gate/up and down in one dispatch) against
//! the CPU, at shapes the fixtures never reach: more output rows than invocations (each
//! invocation several rows or steps, the last ones partial), the float outer product in one
//! group and in two, the block formats by whole transposed blocks. The outer weights go in
//! through `import::layout::transpose`, as compile-model lays them out; the CPU reads the
//! untransposed matrix, dequantised by the format's own decoder (`quant::blocks::decode`), and
//! sums in f64. On whatever Vulkan device is here (lavapipe on the CPU machines) with the
//! validation layer on.
//!
//! The int8 dots (`I8_CHAIN`, compile-model's default for q8_0/q4_0) against two oracles: the
//! exact sums, within int8's rounding of the input and of act (~1e-2; a wrong code, offset or
//! scale moves y by ~1), and a CPU model of the route (each block of 32 inputs, then of act,
//! as round(127 v / max |v|) times max |v| / 127, the codes as the format stores them), which
//! the kernel matches to f32 rounding (lavapipe: 5e-8) but where a value within f32 of a
//! rounding tie lands on the other code (~1e-4 each; q4_0's offset off by one: 4e-2).

mod common;

use common::{buffer, noise, rel_l2};
use std::time::Duration;
use vkfuse_compiler::fuse::codegen::{self, ChainSpec, Epi, ExtraSpec, MatvecSpec, NormSpec};
use vkfuse_compiler::import::layout;
use vkfuse_compiler::ir::{DType, F32Attr};
use vkfuse_compiler::kernels;
use vkfuse_compiler::quant::blocks;
use vkfuse_runtime::Buffer;

const WAIT: Duration = Duration::from_secs(300);
const EPS: f32 = 1e-6;

/// `rows x cols` weights of `dtype` (seeded), as bytes and as the values they hold.
fn weights(dtype: DType, rows: usize, cols: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let v: Vec<f32> = (0..rows * cols)
        .map(|i| noise(i, seed) / (cols as f32).sqrt())
        .collect();
    let mut bytes = vec![];
    blocks::encode(dtype, &v, cols, &mut bytes);
    let held = blocks::decode(dtype, &bytes, cols);
    (bytes, held)
}

/// y = in0 + W2 · (silu(gate · xn) * (up · xn)), xn = rms_norm(x) * nw: `j` act rows, `i`
/// inputs, `o` outputs; the norm weights f32.
fn check(dtype: DType, j: usize, i: usize, o: usize) {
    check_norm(dtype, j, i, o, DType::F32, false, false);
}

/// `v` as int8 codes per block of 32 (the block's largest |v| maps to 127), dequantised: what
/// the int8 dots take for it.
fn int8_blocks(v: &[f64]) -> Vec<f64> {
    v.chunks(32)
        .flat_map(|b| {
            let m = b.iter().fold(0.0f64, |m, x| m.max(x.abs()));
            b.iter().map(move |x| {
                if m > 0.0 {
                    (x / m * 127.0).round() * m / 127.0
                } else {
                    0.0
                }
            })
        })
        .collect()
}

/// [`check`] with norm weights of `nw_dtype`, stored as w - 1 where `zero_centered`, and the
/// dots in int8 where `int8` (the block formats only).
fn check_norm(
    dtype: DType,
    j: usize,
    i: usize,
    o: usize,
    nw_dtype: DType,
    zero_centered: bool,
    int8: bool,
) {
    let spec = ChainSpec {
        inner: MatvecSpec {
            dtype,
            cols: i,
            part_rows: vec![j, j],
            zipped: true,
            norm: Some(NormSpec {
                eps: F32Attr(EPS),
                zero_centered,
                dtype: nw_dtype,
                ones: false,
            }),
            extras: vec![],
            epi: Epi::Mul(
                Box::new(Epi::Silu(Box::new(Epi::Part(0)))),
                Box::new(Epi::Part(1)),
            ),
            step: false,
            x_published: false,
        },
        outer_dtype: dtype,
        out_rows: o,
        add_in: Some(ExtraSpec {
            dtype: DType::F32,
            scalar: false,
        }),
    };
    let mut gen = codegen::chain(&spec);
    if int8 {
        gen.source = kernels::with_defines(&gen.source, "F16_DOTS,I8_CHAIN");
    }
    let (gate_b, gate) = weights(dtype, j, i, 1);
    let (up_b, up) = weights(dtype, j, i, 2);
    let (down_b, down) = weights(dtype, o, j, 3);
    let down_t = layout::transpose(&down_b, dtype, o, j).expect("transposed");
    let x: Vec<f32> = (0..i).map(|k| 3.0 * noise(k, 4)).collect();
    // The norm weights as stored (w - 1 where zero-centred), then as the kernel applies them.
    let stored: Vec<f32> = (0..i)
        .map(|k| 0.5 * noise(k, 5) + if zero_centered { 0.0 } else { 1.0 })
        .collect();
    let mut nw_bytes = vec![];
    blocks::encode(nw_dtype, &stored, i, &mut nw_bytes);
    let nw: Vec<f32> = blocks::decode(nw_dtype, &nw_bytes, i)
        .iter()
        .map(|v| v + if zero_centered { 1.0 } else { 0.0 })
        .collect();
    let in0: Vec<f32> = (0..o).map(|k| noise(k, 6)).collect();

    let ms = x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / i as f64;
    let xn: Vec<f64> = x
        .iter()
        .zip(&nw)
        .map(|(x, n)| *x as f64 * *n as f64 / (ms + EPS as f64).sqrt())
        .collect();
    // The exact sums, and the int8 route's: x · nw quantised (the norm's scale, applied after
    // the dots, does not move the codes), act quantised per workgroup's block of 32 rows.
    let model = |xq: &[f64], quantise_act: bool| -> Vec<f64> {
        let dot = |w: &[f32]| w.iter().zip(xq).map(|(w, x)| *w as f64 * x).sum::<f64>();
        let mut act: Vec<f64> = (0..j)
            .map(|r| {
                let (g, u) = (dot(&gate[r * i..][..i]), dot(&up[r * i..][..i]));
                g / (1.0 + (-g).exp()) * u
            })
            .collect();
        if quantise_act {
            act = int8_blocks(&act);
        }
        (0..o)
            .map(|r| {
                let row = &down[r * j..][..j];
                in0[r] as f64
                    + row
                        .iter()
                        .zip(&act)
                        .map(|(w, a)| *w as f64 * a)
                        .sum::<f64>()
            })
            .collect()
    };
    let want = model(&xn, false);
    let scale = 1.0 / (ms + EPS as f64).sqrt();
    let xw: Vec<f64> = x
        .iter()
        .zip(&nw)
        .map(|(x, n)| *x as f64 * *n as f64)
        .collect();
    let int8_xn: Vec<f64> = int8_blocks(&xw).iter().map(|v| v * scale).collect();
    let want_int8 = model(&int8_xn, true);

    let (device, log) = common::validated_device();
    let pipeline = common::generated_pipeline(&device, &gen);
    // y, gate and up packed, x, norm weight, down transposed, in0.
    let inner: Vec<u8> = gate_b.iter().chain(&up_b).copied().collect();
    let data: [&[u8]; 6] = [
        &vec![0u8; 4 * o],
        &inner,
        bytemuck::cast_slice(&x),
        &nw_bytes,
        &down_t,
        bytemuck::cast_slice(&in0),
    ];
    let mut bufs: Vec<Buffer> = data
        .iter()
        .map(|d| buffer(&device, d.len() as u64))
        .collect();
    assert_eq!(bufs.len(), gen.bindings);
    for (b, d) in bufs.iter_mut().zip(data) {
        device.upload_pod(b, 0, d).expect("upload");
    }
    let mut cmd = common::record_generated(&device, &pipeline, &gen, &bufs);
    device.submit_and_wait(&mut cmd, WAIT).expect("run");

    let y: Vec<f32> = device.readback_pod(&bufs[0], 0, o).expect("y");
    let rel = rel_l2(&y, &want);
    if int8 {
        let rel_model = rel_l2(&y, &want_int8);
        assert!(
            rel < 1e-2 && rel_model < 1e-3,
            "{dtype} j={j} i={i} o={o} int8: relative L2 {rel:.2e} from the exact sums, \
             {rel_model:.2e} from the int8 route's"
        );
    } else {
        assert!(
            rel < 1e-5,
            "{dtype} j={j} i={i} o={o}: relative L2 {rel:.2e}"
        );
    }
    assert!(log.is_clean(), "validation errors:\n{}", log.report());
}

#[test]
fn q8_0_chain_with_more_output_rows_than_invocations_matches_the_cpu() {
    // 1024 invocations, 2080 output rows: three rows for some, two for the others.
    check(DType::Q8_0, 64, 96, 2080);
}

#[test]
fn q4_0_chain_matches_the_cpu() {
    check(DType::Q4_0, 96, 64, 1056);
}

#[test]
fn bf16_chain_with_more_steps_than_invocations_matches_the_cpu() {
    // 1025 steps of 4 rows over 1024 invocations: one group, two steps for one of them.
    check(DType::BF16, 64, 40, 4100);
}

#[test]
fn q4_0_chain_staging_x_in_two_rounds_with_zero_centred_bf16_norm_weights_matches_the_cpu() {
    // 4608 inputs: 1152 vec4s staged by 1024 invocations, so some take two (the first vec4's
    // norm weights are loaded before x is waited for, the second's in the loop).
    check_norm(DType::Q4_0, 32, 4608, 64, DType::BF16, true, false);
}

#[test]
fn int8_chains_match_the_int8_route_and_stay_near_the_exact_sums() {
    // The shapes above: several output rows per invocation (q8_0), q4_0's n - 8, and x staged
    // in two rounds (each round's blocks quantised by their own eight invocations).
    check_norm(DType::Q8_0, 64, 96, 2080, DType::F32, false, true);
    check_norm(DType::Q4_0, 96, 64, 1056, DType::F32, false, true);
    check_norm(DType::Q4_0, 32, 4608, 64, DType::BF16, true, true);
}

#[test]
fn f32_chain_in_two_groups_matches_the_cpu() {
    // 25 steps: two groups of 16 act rows each (`codegen::chain_shape`'s default).
    check(DType::F32, 32, 16, 100);
}

#[test]
fn bf16_chain_of_qwen3_0_6b_shape_matches_the_cpu() {
    // 256 steps in 2 groups of 256 invocations: half the workgroup loads no outer weights.
    check(DType::BF16, 3072, 1024, 1024);
}
