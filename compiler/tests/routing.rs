//! The MoE routing (`route_pick.glsl`) in the three kernels that compute it: the router kernel,
//! and the experts' SwiGLU and weighted sum routing for themselves from the logits
//! (`Routing::Own`; the sum also with its epilogue adding two rows), against the CPU: the experts ranked by logit (softmax's order; ties to the
//! lower index, as transformers' `torch.topk` over equal probabilities and our top_k.comp),
//! the weights as softmax renormalised over the picks in f64, the expert rows dotted in f64.
//! Logits are quarters in [-2, 2): distinct ones differ by a quarter (no near-tie the GPU's exp
//! could reorder), and equal ones are frequent, so the tie rule is exercised. On whatever Vulkan
//! device is here (lavapipe on the CPU machines) with the validation layer on.

mod common;

use common::{buffer, noise, rel_l2};
use proptest::prelude::*;
use std::time::Duration;
use vkfuse_compiler::fuse::codegen::{
    self, Epi, ExpertSpec, ExtraSpec, Generated, RouteSpec, Routing,
};
use vkfuse_compiler::ir::DType;
use vkfuse_runtime::Device;

const WAIT: Duration = Duration::from_secs(300);
/// Rows of one expert and their length (no multiple of 4: the kernels taking 4 rows a
/// workgroup end on a partial one).
const O: usize = 10;
const I: usize = 16;

/// The CPU's picks: indices by logit, largest first, ties to the lower index; their weights
/// (softmax renormalised over the picks).
fn cpu_route(logits: &[f32], k: usize) -> (Vec<u32>, Vec<f64>) {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    order.truncate(k);
    let m = logits.iter().fold(f32::MIN, |m, &v| m.max(v)) as f64;
    let e: Vec<f64> = order
        .iter()
        .map(|&i| (logits[i] as f64 - m).exp())
        .collect();
    let total: f64 = e.iter().sum();
    (
        order.iter().map(|&i| i as u32).collect(),
        e.iter().map(|v| v / total).collect(),
    )
}

/// Row `o` of expert `e` of a stack of `experts` [O x I] matrices, dotted with `x`, in f64.
fn dot(w: &[f32], e: u32, o: usize, x: &[f32]) -> f64 {
    let row = &w[(e as usize * O + o) * I..][..I];
    row.iter().zip(x).map(|(a, b)| *a as f64 * *b as f64).sum()
}

/// `gen`, an expert kernel, over `inputs` in binding order after its output (the stack, the
/// logits or the router's indices, ...): its `out` outputs.
fn run_expert(device: &Device, gen: &Generated, inputs: &[&[f32]], out: usize) -> Vec<f32> {
    let pipeline = common::generated_pipeline(device, gen);
    let sizes = std::iter::once(out).chain(inputs.iter().map(|i| i.len()));
    let mut bufs: Vec<_> = sizes.map(|n| buffer(device, 4 * n as u64)).collect();
    assert_eq!(bufs.len(), gen.bindings);
    for (b, input) in bufs[1..].iter_mut().zip(inputs) {
        device.upload_pod(b, 0, input).expect("input");
    }
    let mut cmd = common::record_generated(device, &pipeline, gen, &bufs);
    device.submit_and_wait(&mut cmd, WAIT).expect("run");
    device.readback_pod(&bufs[0], 0, out).expect("y")
}

fn check(logits: &[f32], k: usize) {
    let n = logits.len();
    let (ids, wts) = cpu_route(logits, k);
    let (device, log) = common::validated_device();

    // The router kernel, at its own workgroup size and at 4 invocations: narrower than a
    // subgroup on lavapipe (8) and NVIDIA (32), as the router's 32 are on a 64-wide device, so
    // that a pick striding by the subgroup's size instead of its lanes skips logits.
    let spec = RouteSpec { n, k };
    for wg in [None, Some(4)] {
        let mut gen = codegen::route(&spec);
        if let Some(wg) = wg {
            gen.spec_constants[0] = wg;
        }
        let pipeline = common::generated_pipeline(&device, &gen);
        let out_words = spec.ids_offset() + k;
        let mut bufs = vec![
            buffer(&device, 4 * out_words as u64),
            buffer(&device, 4 * n as u64),
        ];
        device.upload_pod(&mut bufs[1], 0, logits).expect("logits");
        let mut cmd = common::record_generated(&device, &pipeline, &gen, &bufs);
        device.submit_and_wait(&mut cmd, WAIT).expect("run");
        let out: Vec<u32> = device.readback_pod(&bufs[0], 0, out_words).expect("out");
        let got_ids = &out[spec.ids_offset()..];
        assert_eq!(got_ids, &ids[..], "router ({wg:?}): indices of {logits:?}");
        for (r, (&bits, want)) in out[..k].iter().zip(&wts).enumerate() {
            let got = f32::from_bits(bits) as f64;
            assert!(
                (got - want).abs() <= 1e-6 * want.max(1e-3),
                "router ({wg:?}): weight {r} is {got}, want {want}"
            );
        }
    }

    let expert = |routing| ExpertSpec {
        dtype: DType::F32,
        e: n,
        o: O,
        i: I,
        k,
        routing,
        epi: Epi::Acc,
        extras: vec![],
    };
    let own = Routing::Own { n };

    // The weighted sum routing for itself: y = sum_j wts[j] * (W[ids[j]] . x[j]).
    let w: Vec<f32> = (0..n * O * I).map(|i| noise(i, 1)).collect();
    let x: Vec<f32> = (0..k * I).map(|i| noise(i, 2)).collect();
    let gen = codegen::expert_sum(&expert(own));
    let y = run_expert(&device, &gen, &[&w, logits, &x], O);
    let want: Vec<f64> = (0..O)
        .map(|o| {
            (0..k)
                .map(|j| wts[j] * dot(&w, ids[j], o, &x[j * I..][..I]))
                .sum()
        })
        .collect();
    let rel = rel_l2(&y, &want);
    assert!(rel < 1e-5, "expert sum, routed: relative L2 {rel:.2e}");

    // The same sums with the shared expert's row and the residual added as they are written
    // (Qwen3-Next's MoE block: residual + (sum + shared)).
    let shared: Vec<f32> = (0..O).map(|i| noise(i, 5)).collect();
    let residual: Vec<f32> = (0..O).map(|i| 4.0 * noise(i, 6)).collect();
    let extra = ExtraSpec {
        dtype: DType::F32,
        scalar: false,
    };
    let spec = ExpertSpec {
        epi: Epi::Add(
            Box::new(Epi::In(1)),
            Box::new(Epi::Add(Box::new(Epi::Acc), Box::new(Epi::In(0)))),
        ),
        extras: vec![extra.clone(), extra],
        ..expert(own)
    };
    let gen = codegen::expert_sum(&spec);
    let y = run_expert(&device, &gen, &[&w, logits, &x, &shared, &residual], O);
    let want: Vec<f64> = (0..O)
        .map(|o| residual[o] as f64 + (want[o] + shared[o] as f64))
        .collect();
    let rel = rel_l2(&y, &want);
    assert!(
        rel < 1e-5,
        "expert sum with its epilogue: relative L2 {rel:.2e}"
    );

    // The SwiGLU routing for itself: y[j] = silu(Wg[ids[j]] . x) * (Wu[ids[j]] . x), the gate
    // and up stacks packed one after the other.
    let w: Vec<f32> = (0..2 * n * O * I).map(|i| noise(i, 3)).collect();
    let x: Vec<f32> = (0..I).map(|i| 2.0 * noise(i, 4)).collect();
    let gen = codegen::expert_glu(&expert(own));
    let y = run_expert(&device, &gen, &[&w, logits, &x], k * O);
    let up = &w[n * O * I..];
    let want: Vec<f64> = (0..k * O)
        .map(|r| {
            let (j, o) = (r / O, r % O);
            let g = dot(&w, ids[j], o, &x);
            g / (1.0 + (-g).exp()) * dot(up, ids[j], o, &x)
        })
        .collect();
    let rel = rel_l2(&y, &want);
    assert!(rel < 1e-5, "expert SwiGLU, routed: relative L2 {rel:.2e}");
    assert!(log.is_clean(), "validation errors:\n{}", log.report());
}

/// `n` logits, quarters in [-2, 2), and a top-k of 1..=min(n, 10).
fn case() -> impl Strategy<Value = (Vec<f32>, usize)> {
    prop_oneof![
        Just(4usize),
        Just(8),
        Just(33),
        Just(64),
        Just(130),
        Just(300),
        Just(512)
    ]
    .prop_flat_map(|n| {
        (
            proptest::collection::vec((-8i32..8).prop_map(|q| q as f32 / 4.0), n),
            1..=n.min(10),
        )
    })
}

proptest! {
    // Each case builds a device and three pipelines: a few cover the sizes (fewer logits than a
    // subgroup, several per lane, a partial last round) and the ties.
    #![proptest_config(ProptestConfig::with_cases(12))]
    #[test]
    fn the_kernels_route_as_the_cpu((logits, k) in case()) {
        check(&logits, k);
    }
}

#[test]
fn equal_logits_pick_the_lowest_indices() {
    check(&[0.5; 64], 8);
    let mut logits = vec![-1.0; 64];
    logits[40] = 1.0;
    logits[3] = 1.0;
    check(&logits, 3);
}

/// The picks at the edges of the tournament's shares (route_pick.glsl: on 32-wide subgroups 16
/// shares of 32 of 512 logits and of 19 of 300; on lavapipe's 8-wide ones 8 shares of 64 and of
/// 38), at the first and last logit, and beyond the first share's K.
#[test]
fn picks_at_every_share_edge() {
    for (n, high) in [
        (512, &[0usize, 31, 32, 63, 64, 255, 256, 480, 510, 511][..]),
        (300, &[0, 18, 19, 37, 38, 150, 284, 285, 298, 299][..]),
        (512, &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9][..]),
        (512, &[502, 503, 504, 505, 506, 507, 508, 509, 510, 511][..]),
    ] {
        check(&with_picks(n, high, 7), 10);
    }
}

/// `n` noisy logits below 0.5, with logits `high[r]` made 2 - r / 8: the picks, in that order.
fn with_picks(n: usize, high: &[usize], seed: u64) -> Vec<f32> {
    let mut logits: Vec<f32> = (0..n).map(|i| noise(i, seed) - 1.5).collect();
    for (r, &i) in high.iter().enumerate() {
        logits[i] = 2.0 - r as f32 / 8.0;
    }
    logits
}

/// The router kernel's raw output (weights' bits, then the ids) with `route_pick.glsl`'s rank
/// path or its tournament forced (`ROUTE_RANK_BUDGET`).
fn route_words(device: &Device, logits: &[f32], k: usize, rank: bool) -> Vec<u32> {
    let spec = RouteSpec { n: logits.len(), k };
    let mut gen = codegen::route(&spec);
    let budget = if rank { "0xffffffffu" } else { "0u" };
    let at = gen
        .source
        .find("require\n")
        .expect("the header's extension line")
        + 8;
    gen.source
        .insert_str(at, &format!("#define ROUTE_RANK_BUDGET {budget}\n"));
    let pipeline = common::generated_pipeline(device, &gen);
    let words = spec.ids_offset() + k;
    let mut bufs = vec![
        buffer(device, 4 * words as u64),
        buffer(device, 4 * logits.len() as u64),
    ];
    device.upload_pod(&mut bufs[1], 0, logits).expect("logits");
    let mut cmd = common::record_generated(device, &pipeline, &gen, &bufs);
    device.submit_and_wait(&mut cmd, WAIT).expect("run");
    let out: Vec<u32> = device.readback_pod(&bufs[0], 0, words).expect("out");
    [&out[..k], &out[spec.ids_offset()..]].concat()
}

/// Both ways to the picks give the same bits, the CPU's experts, at the sizes each serves by
/// default: Qwen3-Next-small's 64 experts (rank on 32-wide subgroups) and Qwen3-Next's 512 top-10
/// (tournament), with ties. With every pick in one share of the tournament, out of order (a
/// share of 8 on lavapipe's 8-wide subgroups, of 32 on NVIDIA's), that share's list and the
/// merge's steps through it decide them, where random logits mostly make each pick its own
/// share's best.
#[test]
fn rank_and_tournament_agree_bit_for_bit() {
    let (device, log) = common::validated_device();
    let random = |n: usize, seed: u64| -> Vec<f32> {
        (0..n)
            .map(|i| (noise(i, seed) * 8.0).round() / 4.0)
            .collect()
    };
    let one_share = |n: usize, high: &[usize]| with_picks(n, high, 18);
    let cases = [
        (random(64, 11), 8),
        (random(512, 12), 10),
        (random(130, 13), 10),
        (random(61, 16), 5),
        (one_share(64, &[6, 1, 7, 3, 0]), 5),
        // The last share, part filled (8 a share: 56..61).
        (one_share(61, &[58, 60, 56]), 3),
        (
            one_share(512, &[37, 33, 62, 40, 35, 63, 32, 50, 44, 58]),
            10,
        ),
    ];
    for (logits, k) in cases {
        let n = logits.len();
        let ranked = route_words(&device, &logits, k, true);
        let tournament = route_words(&device, &logits, k, false);
        assert_eq!(
            ranked, tournament,
            "{n} logits, top {k}: rank and tournament differ"
        );
        let (ids, _) = cpu_route(&logits, k);
        assert_eq!(
            &ranked[k..],
            &ids[..],
            "{n} logits, top {k}: not the CPU's picks"
        );
    }
    assert!(log.is_clean(), "validation errors:\n{}", log.report());
}

/// The largest router the rules take from 1024 logits (`RouteSpec::fits`: its shared memory
/// within Vulkan's least limit) builds, runs with the validation layer clean and picks as the
/// CPU does, in the tournament its default budget takes.
#[test]
fn the_largest_router_the_rules_take_picks_as_the_cpu() {
    assert!(RouteSpec::fits(1024, 90) && !RouteSpec::fits(1024, 91));
    assert!(RouteSpec::fits(512, 10) && !RouteSpec::fits(300, 300));
    let (device, log) = common::validated_device();
    let logits: Vec<f32> = (0..1024)
        .map(|i| (noise(i, 14) * 8.0).round() / 4.0)
        .collect();
    let words = route_words(&device, &logits, 90, false);
    let (ids, _) = cpu_route(&logits, 90);
    assert_eq!(&words[90..], &ids[..], "not the CPU's picks");
    assert!(log.is_clean(), "validation errors:\n{}", log.report());
}

/// The weighted sum as Qwen3-Next-80B runs it: the router kernel's indices and weights read
/// (`Routing::Read`), more than 8 experts (4 rows a workgroup, `rows_main`), the shared expert's
/// output and the residual added as the rows are written; rows of no multiple of 4, and
/// inputs of 16 and 18 (16-byte loads, and not), against the CPU in f64.
#[test]
fn the_read_sum_in_rows_adds_its_epilogue() {
    let (device, log) = common::validated_device();
    for (e, o, i, k) in [
        (16, 10, 16, 10),
        (16, 7, 18, 9),
        (32, 13, 16, 12),
        (16, 3, 16, 10),
    ] {
        let w: Vec<f32> = (0..e * o * i).map(|q| noise(q, 1)).collect();
        let x: Vec<f32> = (0..k * i).map(|q| noise(q, 2)).collect();
        let idx: Vec<u32> = (0..k).map(|j| ((j * 7 + 3) % e) as u32).collect();
        let idx_bits: Vec<f32> = idx.iter().map(|&v| f32::from_bits(v)).collect();
        let wts: Vec<f32> = (0..k).map(|j| 0.1 + j as f32 * 0.05).collect();
        let shared: Vec<f32> = (0..o).map(|q| noise(q, 5)).collect();
        let residual: Vec<f32> = (0..o).map(|q| 4.0 * noise(q, 6)).collect();
        let extra = ExtraSpec {
            dtype: DType::F32,
            scalar: false,
        };
        let spec = ExpertSpec {
            dtype: DType::F32,
            e,
            o,
            i,
            k,
            routing: Routing::Read,
            epi: Epi::Add(
                Box::new(Epi::In(1)),
                Box::new(Epi::Add(Box::new(Epi::Acc), Box::new(Epi::In(0)))),
            ),
            extras: vec![extra.clone(), extra],
        };
        let gen = codegen::expert_sum(&spec);
        assert!(gen.source.contains("SUM_ROWS"), "{}", gen.source);
        let y = run_expert(
            &device,
            &gen,
            &[&w, &idx_bits, &x, &wts, &shared, &residual],
            o,
        );
        let want: Vec<f64> = (0..o)
            .map(|r| {
                let sum: f64 = (0..k)
                    .map(|j| {
                        let row = &w[(idx[j] as usize * o + r) * i..][..i];
                        let dot: f64 = row
                            .iter()
                            .zip(&x[j * i..][..i])
                            .map(|(a, b)| *a as f64 * *b as f64)
                            .sum();
                        wts[j] as f64 * dot
                    })
                    .sum();
                residual[r] as f64 + (sum + shared[r] as f64)
            })
            .collect();
        let rel = rel_l2(&y, &want);
        assert!(
            rel < 1e-5,
            "{e} experts of [{o}x{i}], top {k}: relative L2 {rel:.2e}"
        );
    }
    assert!(log.is_clean(), "validation errors:\n{}", log.report());
}
