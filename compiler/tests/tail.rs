//! The fused tail (argmax of the logits into the token state, position advanced) over several
//! workgroups, the last to arrive combining their bests, against a CPU argmax (the largest
//! value in total order, ties to the lower index), on whatever Vulkan device is here (lavapipe
//! on the CPU machines) with the validation layer on. Vocabularies past 16384 logits take
//! several workgroups (`codegen::tail_groups`); the planted maxima tie across workgroups, so
//! the combine's order decides. The same buffers run twice: the arrival counter must be back
//! at zero after each run, or the second would combine before every workgroup arrived.
//!
//! The same tail folded into the matvec that computes the logits (`MatvecSpec::step`, one
//! 64-bit atomicMax per workgroup into the token state, the argmax's key): its rows are weight
//! column 0 (x is one-hot), so the logits are exact and the CPU argmax of the weights is the
//! oracle; both the logits and the token are checked, over two runs on the same buffers.

mod common;

use std::time::Duration;

use common::{argmax, buffer};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError};
use vkfuse_compiler::fuse::codegen::{self, TailSpec};
use vkfuse_compiler::ir::DType;
use vkfuse_runtime::Buffer;

const WAIT: Duration = Duration::from_secs(120);

/// Runs the tail of `n` logits twice on the same buffers and checks both runs.
fn tail_matches(n: usize, logits: &[f32]) -> Result<(), TestCaseError> {
    let spec = TailSpec::Step { n };
    let groups = codegen::tail_groups(&spec);
    prop_assert!(
        groups > 1,
        "{n} logits take one workgroup: the test misses the combine"
    );
    let (device, log) = common::validated_device();
    let gen = codegen::tail(&spec);
    let pipeline = common::generated_pipeline(&device, &gen);
    // Token state, logits, position state, position, partial bests (key, index), counter.
    let sizes = [4, 4 * n as u64, 4, 4, 8 * groups as u64, 4];
    let mut bufs: Vec<Buffer> = sizes.iter().map(|&b| buffer(&device, b)).collect();
    prop_assert_eq!(bufs.len(), gen.bindings);
    device.upload_pod(&mut bufs[1], 0, logits).expect("logits");
    device
        .upload_pod(&mut bufs[3], 0, &[41i32])
        .expect("position");
    device
        .upload_pod(&mut bufs[5], 0, &[0u32])
        .expect("counter");
    let mut cmd = common::record_generated(&device, &pipeline, &gen, &bufs);
    let want = argmax(logits);
    for run in 0..2 {
        device.upload_pod(&mut bufs[0], 0, &[-1i32]).expect("token");
        device.submit_and_wait(&mut cmd, WAIT).expect("run");
        let token: Vec<i32> = device.readback_pod(&bufs[0], 0, 1).expect("token");
        prop_assert_eq!(token[0], want as i32, "run {}: {} logits", run, n);
        let pos: Vec<i32> = device.readback_pod(&bufs[2], 0, 1).expect("position");
        prop_assert_eq!(pos[0], 42, "run {}: position advanced", run);
        let counter: Vec<u32> = device.readback_pod(&bufs[5], 0, 1).expect("counter");
        prop_assert_eq!(counter[0], 0, "run {}: arrival counter left set", run);
    }
    prop_assert!(log.is_clean(), "validation errors:\n{}", log.report());
    Ok(())
}

/// Logits with the maximum planted at several indices (ties across workgroups).
fn logits() -> impl Strategy<Value = (usize, Vec<f32>)> {
    (16385usize..=160_000)
        .prop_flat_map(|n| {
            (
                Just(n),
                prop::collection::vec(-10.0f32..10.0, n),
                prop::collection::vec(0..n, 1..4),
            )
        })
        .prop_map(|(n, mut x, at)| {
            for i in at {
                x[i] = 11.0;
            }
            (n, x)
        })
}

proptest! {
    #![proptest_config(Config { cases: 8, failure_persistence: None, ..Config::default() })]

    #[test]
    fn tail_argmax_over_several_workgroups_matches_the_cpu((n, x) in logits()) {
        tail_matches(n, &x)?;
    }
}

#[test]
fn tail_argmax_matches_at_the_qwen3_vocabulary_with_ties_at_both_ends() {
    let n = 151_936;
    let mut x: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 / 100.0).collect();
    // The same maximum in the last workgroup's slice and the first's: the lower index wins.
    x[n - 3] = 20.0;
    x[5] = 20.0;
    tail_matches(n, &x).unwrap();
    // -0.0 sorts below +0.0 in total order.
    let mut z = vec![-1.0f32; n];
    z[100_000] = 0.0;
    z[7] = -0.0;
    tail_matches(n, &z).unwrap();
}

/// Columns of the step test's weights (x is one-hot at column 0).
const COLS: usize = 32;

/// Runs the matvec of `values.len()` rows with the step folded in, twice on the same buffers
/// (the token state set back to a key the host wrote before each, as the schedule's reset
/// does), and checks the logits, the token (the argmax's key) and the position.
fn matvec_step_matches(values: &[f32]) -> Result<(), TestCaseError> {
    matvec_step_matches_as(values, false)?;
    matvec_step_matches_as(values, true)
}

/// [`matvec_step_matches`] with the rows folded through subgroup operations or, with
/// `shared_fold`, shared memory (the path of subgroups narrower than the rows).
fn matvec_step_matches_as(values: &[f32], shared_fold: bool) -> Result<(), TestCaseError> {
    let n = values.len();
    let spec = common::bare_matvec(DType::F32, n, COLS, true);
    let (device, log) = common::validated_device();
    let mut gen = codegen::matvec(&spec);
    // Float weights: the atomics filtered by the key each workgroup read as it began.
    prop_assert!(gen.source.contains("#define STEP_FILTER 1"));
    if shared_fold {
        gen.source = vkfuse_compiler::kernels::with_defines(&gen.source, "STEP_FOLD_SHARED");
        prop_assert!(gen.source.contains("STEP_FOLD_SHARED"));
    }
    let pipeline = common::generated_pipeline(&device, &gen);
    // Logits, weights, x, token state (the argmax's key), position state, position.
    let sizes = [
        4 * n as u64,
        4 * (n * COLS) as u64,
        4 * COLS as u64,
        8,
        4,
        4,
    ];
    let mut bufs: Vec<Buffer> = sizes.iter().map(|&b| buffer(&device, b)).collect();
    prop_assert_eq!(bufs.len(), gen.bindings);
    // Row r is (values[r], 1, 2, ..): the one-hot x picks column 0.
    let w: Vec<f32> = values
        .iter()
        .flat_map(|&v| std::iter::once(v).chain((1..COLS).map(|c| c as f32)))
        .collect();
    device.upload_pod(&mut bufs[1], 0, &w).expect("weights");
    let mut x = vec![0.0f32; COLS];
    x[0] = 1.0;
    device.upload_pod(&mut bufs[2], 0, &x).expect("x");
    device
        .upload_pod(&mut bufs[5], 0, &[41i32])
        .expect("position");
    let mut cmd = common::record_generated(&device, &pipeline, &gen, &bufs);
    let want = argmax(values);
    for run in 0..2 {
        // Token 3 as the host writes it (`TokenEncoding::Key`), a key below every row's.
        device
            .upload_pod(&mut bufs[3], 0, &[!3u32, 0])
            .expect("token");
        device.submit_and_wait(&mut cmd, WAIT).expect("run");
        let y: Vec<f32> = device.readback_pod(&bufs[0], 0, n).expect("logits");
        let differ = y
            .iter()
            .zip(values)
            .position(|(a, b)| a.to_bits() != b.to_bits());
        prop_assert!(
            differ.is_none(),
            "run {}: logit {:?} differs from the weights' column 0",
            run,
            differ.map(|i| (i, y[i], values[i]))
        );
        let key: Vec<u32> = device.readback_pod(&bufs[3], 0, 2).expect("token");
        prop_assert_eq!(!key[0], want as u32, "run {}: {} rows", run, n);
        let pos: Vec<i32> = device.readback_pod(&bufs[4], 0, 1).expect("position");
        prop_assert_eq!(pos[0], 42, "run {}: position advanced", run);
    }
    prop_assert!(log.is_clean(), "validation errors:\n{}", log.report());
    Ok(())
}

/// Rows with the maximum planted at several of them (ties across workgroups), from one row to
/// a few thousand workgroups.
fn rows() -> impl Strategy<Value = Vec<f32>> {
    (1usize..=20_000)
        .prop_flat_map(|n| {
            (
                prop::collection::vec(-10.0f32..10.0, n),
                prop::collection::vec(0..n, 1..4),
            )
        })
        .prop_map(|(mut x, at)| {
            for i in at {
                x[i] = 11.0;
            }
            x
        })
}

proptest! {
    #![proptest_config(Config { cases: 8, failure_persistence: None, ..Config::default() })]

    #[test]
    fn argmax_in_the_logits_matvec_matches_the_cpu(x in rows()) {
        matvec_step_matches(&x)?;
    }
}

#[test]
fn argmax_in_the_logits_matvec_matches_at_the_qwen3_vocabulary_with_ties_at_both_ends() {
    let n = 151_936;
    let mut x: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 / 100.0).collect();
    x[n - 3] = 20.0;
    x[5] = 20.0;
    // A tie inside one workgroup's rows too (rows 4..8 share one at 4 rows per workgroup).
    x[6] = 20.0;
    matvec_step_matches(&x).unwrap();
    // Every logit negative (the accumulator starts at +0, so no row computes -0).
    let mut z = vec![-1.0f32; n];
    z[100_000] = -0.5;
    z[n - 1] = -0.5;
    matvec_step_matches(&z).unwrap();
}

#[test]
fn only_the_folded_kernel_declares_64_bit_atomics_which_the_runtime_then_requires() {
    let decl = |step: bool| {
        common::kernel_decl(&codegen::matvec(&common::bare_matvec(
            DType::BF16,
            1000,
            64,
            step,
        )))
    };
    assert!(decl(true).uses_int64_atomics());
    assert!(!decl(false).uses_int64_atomics());
    assert!(!decl(true).adds_floats_atomically());
}
