//! The fused Gated DeltaNet step (`fused_gdn.glsl`) against the CPU, over three decode steps
//! that carry both states on the device: each key head's state columns split over 1 to 8 parts
//! (parts holding whole value heads normalise their own; narrower ones leave it to the part
//! that arrives last, which also shifts the head's q and k conv rows), each column walked by 1
//! to 4 invocations. The CPU step is the textbook formula of transformers' recurrent gated
//! delta rule in f64: causal conv over [state | x] then silu, l2-normed q and k, s = s·exp(g),
//! delta = beta·(v − sᵀk), s += k·delta, o = scale·sᵀq, y = rms-normed o · w · silu(z). The
//! arrival counters must read zero after every step. On whatever Vulkan device is here
//! (lavapipe on the CPU machines) with the validation layer on.

mod common;

use common::{buffer, noise, rel_l2};
use std::time::Duration;
use vkfuse_compiler::fuse::codegen::{self, Epi, GdnSpec};
use vkfuse_compiler::fuse::lang::{GateIndex, GdnLayout};
use vkfuse_compiler::ir::{DType, F32Attr};

const WAIT: Duration = Duration::from_secs(300);
const STEPS: usize = 3;
const L2_EPS: f32 = 1e-6;
const NORM_EPS: f32 = 1e-6;

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

fn softplus(x: f64) -> f64 {
    (1.0 + x.exp()).ln()
}

struct Shape {
    hk: usize,
    r: usize,
    dk: usize,
    dv: usize,
    km1: usize,
}

/// Key heads, value heads per key head, key and value head dims, conv kernel size - 1.
const fn shape(hk: usize, r: usize, dk: usize, dv: usize, km1: usize) -> Shape {
    Shape { hk, r, dk, dv, km1 }
}

impl Shape {
    fn rdv(&self) -> usize {
        self.r * self.dv
    }
    /// Columns of a key head's row of the projection: q, k, v, z.
    fn width(&self) -> usize {
        2 * self.dk + 2 * self.rdv()
    }
    fn channels(&self) -> usize {
        self.hk * (2 * self.dk + self.rdv())
    }
    fn spec(&self, parts: usize) -> GdnSpec {
        let (dk, rdv) = (self.dk, self.rdv());
        GdnSpec {
            hk: self.hk,
            r: self.r,
            dk,
            dv: self.dv,
            km1: self.km1,
            parts,
            layout: GdnLayout {
                width: self.width(),
                q: 0,
                k: dk,
                v: 2 * dk,
                z: 2 * dk + rdv,
                l2_eps: F32Attr(L2_EPS),
                scale: F32Attr(1.0 / (dk as f32).sqrt()),
                norm_eps: F32Attr(NORM_EPS),
                gate_inputs: vec![GateIndex::Direct, GateIndex::Direct],
            },
            conv_dtype: DType::F32,
            norm_dtype: DType::F32,
            // Qwen3-Next's gates, with A = 1 and no bias: g = -softplus(a), beta = sigmoid(b).
            g: Epi::Neg(Box::new(Epi::Softplus(Box::new(Epi::In(0))))),
            g_inputs: vec![DType::F32],
            beta: Epi::Sigmoid(Box::new(Epi::In(0))),
            beta_inputs: vec![DType::F32],
        }
    }
}

/// The step's inputs and states.
struct Step {
    conv: Vec<f32>,
    state: Vec<f32>,
}

/// One CPU step: y, and the states updated in place.
fn cpu_step(
    s: &Shape,
    st: &mut Step,
    x: &[f32],
    cw: &[f32],
    nw: &[f32],
    a: &[f32],
    b: &[f32],
) -> Vec<f64> {
    let (dk, dv, km1, rdv) = (s.dk, s.dv, s.km1, s.rdv());
    let k1 = km1 + 1;
    let scale = 1.0 / (dk as f64).sqrt();
    let mut y = vec![0.0; s.hk * rdv];
    let old = st.conv.clone();
    for kh in 0..s.hk {
        let row = &x[kh * s.width()..][..s.width()];
        // (channel, its input) for q, k, then v.
        let chans: Vec<(usize, f32)> = (0..dk)
            .map(|i| (kh * dk + i, row[i]))
            .chain((0..dk).map(|i| (s.hk * dk + kh * dk + i, row[dk + i])))
            .chain((0..rdv).map(|i| (2 * s.hk * dk + kh * rdv + i, row[2 * dk + i])))
            .collect();
        let conv: Vec<f64> = chans
            .iter()
            .map(|&(c, xv)| {
                let mut acc = cw[c * k1 + km1] as f64 * xv as f64;
                for j in 0..km1 {
                    acc += cw[c * k1 + j] as f64 * old[c * km1 + j] as f64;
                }
                for j in 0..km1 {
                    st.conv[c * km1 + j] = if j + 1 < km1 {
                        old[c * km1 + j + 1]
                    } else {
                        xv
                    };
                }
                silu(acc)
            })
            .collect();
        let l2 = |v: &[f64]| {
            let n = 1.0 / (v.iter().map(|e| e * e).sum::<f64>() + L2_EPS as f64).sqrt();
            v.iter().map(|e| e * n).collect::<Vec<f64>>()
        };
        let (q, k, v) = (l2(&conv[..dk]), l2(&conv[dk..2 * dk]), &conv[2 * dk..]);
        for hh in 0..s.r {
            let h = kh * s.r + hh;
            let decay = (-softplus(a[h] as f64)).exp();
            let beta = 1.0 / (1.0 + (-(b[h] as f64)).exp());
            let sh = &mut st.state[h * dk * dv..][..dk * dv];
            let mut o = vec![0.0; dv];
            for j in 0..dv {
                let mem: f64 = (0..dk).map(|d| sh[d * dv + j] as f64 * decay * k[d]).sum();
                let delta = (v[hh * dv + j] - mem) * beta;
                for d in 0..dk {
                    sh[d * dv + j] = (sh[d * dv + j] as f64 * decay + k[d] * delta) as f32;
                }
                o[j] = scale * (0..dk).map(|d| sh[d * dv + j] as f64 * q[d]).sum::<f64>();
            }
            let inv =
                1.0 / (o.iter().map(|e| e * e).sum::<f64>() / dv as f64 + NORM_EPS as f64).sqrt();
            for j in 0..dv {
                let z = row[2 * dk + rdv + hh * dv + j] as f64;
                y[h * dv + j] = o[j] * inv * nw[j] as f64 * silu(z);
            }
        }
    }
    y
}

/// The step in `parts` parts, each column walked by `dsplit` invocations (`None`: as many as
/// codegen gives it).
fn check(s: &Shape, parts: usize, dsplit: Option<usize>, seed: u64) {
    let spec = s.spec(parts);
    let mut gen = codegen::gdn(&spec);
    let cols = s.rdv() / parts;
    if let Some(dsplit) = dsplit {
        gen.spec_constants[0] = (cols * dsplit) as u32;
    }
    let dsplit = gen.spec_constants[0] as usize / cols;
    assert_eq!(gen.workgroups[0] as usize, s.hk * parts);
    let (device, log) = common::validated_device();
    let pipeline = common::generated_pipeline(&device, &gen);
    let v = |n: usize, seed: u64, scale: f32| -> Vec<f32> {
        (0..n).map(|i| scale * noise(i, seed)).collect()
    };
    let (c, hv) = (s.channels(), s.hk * s.r);
    let cw = v(c * (s.km1 + 1), seed + 1, 0.6);
    let nw: Vec<f32> = v(s.dv, seed + 2, 0.5).iter().map(|w| 1.0 + w).collect();
    let mut cpu = Step {
        conv: v(c * s.km1, seed + 3, 1.0),
        state: v(hv * s.dk * s.dv, seed + 4, 0.5),
    };
    let sizes = [
        hv * s.dv,
        c * s.km1,
        hv * s.dk * s.dv,
        s.hk * s.width(),
        cw.len(),
        s.dv,
        hv,
        hv,
    ];
    let mut bufs: Vec<_> = sizes
        .iter()
        .map(|&n| buffer(&device, 4 * n as u64))
        .collect();
    if parts > 1 {
        bufs.push(buffer(&device, 4 * s.hk as u64));
        device
            .upload_pod(&mut bufs[8], 0, &vec![0u32; s.hk])
            .expect("counters");
    }
    assert_eq!(bufs.len(), gen.bindings);
    device
        .upload_pod(&mut bufs[1], 0, &cpu.conv)
        .expect("conv state");
    device
        .upload_pod(&mut bufs[2], 0, &cpu.state)
        .expect("state");
    device
        .upload_pod(&mut bufs[4], 0, &cw)
        .expect("conv weight");
    device
        .upload_pod(&mut bufs[5], 0, &nw)
        .expect("norm weight");
    let mut cmd = common::record_generated(&device, &pipeline, &gen, &bufs);
    let what = format!("parts {parts}, {dsplit} walkers a column");
    for step in 0..STEPS {
        let x = v(s.hk * s.width(), seed + 10 + step as u64, 1.5);
        let a = v(hv, seed + 20 + step as u64, 2.0);
        let b = v(hv, seed + 30 + step as u64, 2.0);
        device.upload_pod(&mut bufs[3], 0, &x).expect("x");
        device.upload_pod(&mut bufs[6], 0, &a).expect("g input");
        device.upload_pod(&mut bufs[7], 0, &b).expect("beta input");
        device.submit_and_wait(&mut cmd, WAIT).expect("run");
        let want = cpu_step(s, &mut cpu, &x, &cw, &nw, &a, &b);
        let y: Vec<f32> = device.readback_pod(&bufs[0], 0, want.len()).expect("y");
        let e = rel_l2(&y, &want);
        assert!(e < 1e-5, "{what}, step {step}: y off by {e:e}");
        if parts > 1 {
            let counts: Vec<u32> = device.readback_pod(&bufs[8], 0, s.hk).expect("counters");
            assert!(
                counts.iter().all(|&n| n == 0),
                "{what}, step {step}: counters {counts:?}"
            );
        }
    }
    let conv: Vec<f32> = device
        .readback_pod(&bufs[1], 0, cpu.conv.len())
        .expect("conv");
    assert_eq!(conv, cpu.conv, "{what}: the conv state");
    let state: Vec<f32> = device
        .readback_pod(&bufs[2], 0, cpu.state.len())
        .expect("state");
    let want: Vec<f64> = cpu.state.iter().map(|&e| e as f64).collect();
    let e = rel_l2(&state, &want);
    assert!(e < 1e-5, "{what}: the recurrent state off by {e:e}");
    assert!(log.is_clean(), "validation errors:\n{}", log.report());
}

/// Value heads of 16, two a key head: parts of whole value heads (1, 2) and narrower (4, 8).
#[test]
fn parts_of_whole_and_partial_value_heads() {
    let s = shape(2, 2, 32, 16, 3);
    for parts in [1, 2, 4, 8] {
        for dsplit in [1, 2, 4] {
            check(&s, parts, Some(dsplit), 0x6d0 + parts as u64);
        }
    }
}

/// Three key heads, one value head of 32 each, a conv of two taps (one state column).
#[test]
fn one_value_head_a_key_head() {
    let s = shape(3, 1, 16, 32, 1);
    for parts in [1, 2, 4] {
        check(&s, parts, Some(2), 0x7e1 + parts as u64);
    }
}

/// Qwen3-Next's head sizes as the compiler lays them out: 8 parts of 32 columns (a quarter of
/// a value head), 8 invocations of 16 rows each.
#[test]
fn qwen3_next_head_sizes_as_compiled() {
    let s = shape(2, 2, 128, 128, 3);
    check(&s, 8, None, 0x8f2);
}

/// Parts of two whole value heads (the second part's heads start past the first), a key head
/// width no power of two takes (100 rows: 5 walkers of 20), no conv history (kernel 1), and
/// workgroups of one invocation.
#[test]
fn odd_shapes() {
    let two_heads = shape(2, 4, 16, 16, 3);
    check(&two_heads, 2, None, 0x903);
    let wide = shape(1, 1, 100, 32, 2);
    check(&wide, 1, None, 0x914);
    check(&wide, 4, None, 0x915);
    let no_history = shape(2, 2, 16, 16, 0);
    check(&no_history, 4, None, 0x926);
    // One column a part and a head of 8 rows: workgroups of one invocation.
    let single = shape(1, 1, 8, 4, 3);
    check(&single, 4, None, 0x937);
}

/// What the compiler picks: parts of 32 columns, about 16 rows an invocation.
#[test]
fn default_parts_and_workgroup() {
    let s = shape(8, 2, 128, 128, 3);
    if std::env::var_os("VKFUSE_GDN_PARTS").is_none()
        && std::env::var_os("VKFUSE_GDN_ROWS").is_none()
    {
        assert_eq!(codegen::gdn_parts(2, 128, None), 8);
        assert_eq!(s.spec(8).workgroup_size(), 256);
        assert_eq!(codegen::gdn_parts(2, 16, None), 1);
    }
    // Asked for, rounded down to a divisor of the columns.
    assert_eq!(codegen::gdn_parts(2, 128, Some(6)), 4);
    assert_eq!(codegen::gdn_parts(3, 16, Some(5)), 4);
    assert_eq!(codegen::gdn_parts(2, 16, Some(64)), 32);
    // No divisor at or below the ask leaves at most 1024 columns a part: the fewest above it.
    assert_eq!(codegen::gdn_parts(2, 1025, Some(1)), 5);
}
