//! Weights cut into pages at load (`Schedule::with_weight_pages`): a device that makes smaller
//! buffers than a model's weights (NVIDIA: about 4 GiB) still runs it, each page its own buffer.
//!
//! Every fixture, fused and unfused, is loaded with pages no bigger than the largest range one
//! binding reads, so its weights take several buffers, and run teacher-forced beside the same
//! schedule loaded whole: the same kernels read the same bytes from other buffers, so the logits
//! must be the same bits (up to the float atomics' order, where a kernel sums with them), within
//! 5e-3 of transformers', and the fused replay's greedy tokens must be transformers'. A page
//! smaller than one binding's weights is a clear error naming the tensor.

use vkfuse_runtime::schedule::{BufferRole, Schedule};
use vkfuse_runtime::session::{Eager, LoadOptions, Loaded, Replay, SessionError};
use vkfuse_runtime::Device;
use vkfuse_tests::{
    assert_rows_close, expected, fixture_schedule, fused_schedule, replay_greedy_ids,
    same_kernels_agree, validated_device, FIXTURES,
};

/// The most bytes one binding of `schedule` reads from its weights.
fn largest_weight_binding(schedule: &Schedule) -> u64 {
    schedule
        .dispatches
        .iter()
        .flat_map(|d| &d.bindings)
        .filter(|s| schedule.buffer(s.buffer).role == BufferRole::Weights)
        .map(|s| s.size)
        .max()
        .expect("the step reads weights")
}

fn load(
    device: &Device,
    schedule: Schedule,
    weights: &dyn vkfuse_runtime::session::TensorBytes,
    page: Option<u64>,
) -> Result<Loaded, SessionError> {
    let options = LoadOptions {
        weight_page_bytes: page,
        ..LoadOptions::default()
    };
    Loaded::load(device.clone(), schedule, weights, options)
}

fn weight_buffers(l: &Loaded) -> usize {
    l.schedule
        .buffers
        .iter()
        .filter(|b| b.role == BufferRole::Weights)
        .count()
}

fn check(name: &str, fused: bool) {
    let (device, log) = validated_device();
    let want = expected(name);
    let what = format!("{name} ({})", if fused { "fused" } else { "unfused" });
    let (model, schedule) = if fused {
        let (m, s, _) = fused_schedule(name);
        (m, s)
    } else {
        fixture_schedule(name)
    };
    let page = largest_weight_binding(&schedule);
    let whole = load(&device, schedule.clone(), &model.tensors, None).unwrap();
    let paged = load(&device, schedule.clone(), &model.tensors, Some(page)).unwrap();
    assert_eq!(weight_buffers(&whole), 1, "{what}");
    let pages = weight_buffers(&paged);
    assert!(pages >= 3, "{what}: {pages} weight buffers of {page} bytes");
    for b in &paged.schedule.buffers {
        if b.role == BufferRole::Weights {
            assert!(b.size <= page, "{what}: a page of {} bytes", b.size);
        }
    }
    let atomics = whole.schedule.float_atomic_kernel().is_some();
    let mut whole = Eager::new(whole).unwrap();
    let mut eager = Eager::new(paged).unwrap();
    let rows: Vec<Vec<f32>> = want
        .teacher_ids
        .iter()
        .map(|&t| {
            let w = whole.step(Some(t)).unwrap().logits;
            let p = eager.step(Some(t)).unwrap().logits;
            same_kernels_agree(&what, &p, &w, atomics);
            p
        })
        .collect();
    assert_rows_close(&what, &rows, &want.teacher_logits, 5e-3);
    if fused {
        let paged = load(&device, schedule, &model.tensors, Some(page)).unwrap();
        let mut replay = Replay::new(paged).unwrap();
        assert_eq!(
            replay_greedy_ids(&mut replay, &want),
            want.greedy_ids,
            "{what}: greedy tokens, {pages} weight buffers"
        );
    }
    assert!(log.is_clean(), "{what}: {}", log.report());
}

#[test]
fn fused_schedules_run_with_their_weights_in_pages() {
    for name in FIXTURES {
        check(name, true);
    }
}

#[test]
fn unfused_schedules_run_with_their_weights_in_pages() {
    for name in FIXTURES {
        check(name, false);
    }
}

#[test]
fn a_page_smaller_than_one_binding_s_weights_is_a_clear_error() {
    let (device, _log) = validated_device();
    let (model, schedule, _) = fused_schedule("qwen3-tied");
    let page = largest_weight_binding(&schedule) - 4;
    let err = match load(&device, schedule, &model.tensors, Some(page)) {
        Ok(_) => panic!("loaded with pages of {page} bytes"),
        Err(e) => e.to_string(),
    };
    // The tied embedding table is the largest: the embedding and lm_head both read it whole.
    assert!(
        err.contains("`model.embed_tokens.weight`") && err.contains(&format!("({page} bytes)")),
        "{err}"
    );
}
