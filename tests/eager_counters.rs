//! The eager baseline is honest: per token it records once, writes every binding of every
//! dispatch, puts a barrier after every dispatch and submits once; and its errors are clear.

use vkfuse_compiler::{import, lower, trace};
use vkfuse_runtime::schedule::BufferRole;
use vkfuse_runtime::session::{Loaded, SessionError};
use vkfuse_tests::{eager_fixture, fixture_dir, validated_device};

#[test]
fn eager_counts_every_dispatch_binding_and_barrier_per_token() {
    let (device, log) = validated_device();
    {
        let mut eager = eager_fixture("llama-gqa", device.clone());
        let dispatches = eager.loaded().schedule.dispatches.len() as u64;
        let bindings: u64 = eager
            .loaded()
            .schedule
            .dispatches
            .iter()
            .map(|d| d.bindings.len() as u64)
            .sum();
        let before = device.counters();
        let tokens = 3;
        for t in 0..tokens {
            eager.step(Some(10 + t)).unwrap();
        }
        let c = device.counters().since(&before);
        assert_eq!(c.dispatches, dispatches * tokens as u64);
        assert_eq!(
            c.barriers,
            (dispatches + 1) * tokens as u64,
            "a barrier after every dispatch, and one making the output copy visible to the host"
        );
        assert_eq!(
            c.descriptor_writes,
            bindings * tokens as u64,
            "every binding written every token"
        );
        assert_eq!(c.recordings, tokens as u64, "re-recorded every token");
        assert_eq!(c.submits, tokens as u64, "one submit per token");
        assert!(c.host_ns > 0);
    }
    assert!(log.is_clean(), "{}", log.report());
}

#[test]
fn eager_refuses_a_step_past_the_kv_capacity() {
    let (device, log) = validated_device();
    {
        let model = import::load(&fixture_dir("qwen3-tied")).unwrap();
        let program = trace::trace(
            &model,
            &trace::TraceOptions {
                max_context: Some(3),
                ..Default::default()
            },
        )
        .unwrap();
        let meta = lower::Meta {
            architecture: String::new(),
            eos_token_ids: vec![],
            tokenizer: None,
        };
        let schedule = lower::lower(&program, &meta, &mut vkfuse_tests::spirv_cache()).unwrap();
        let mut eager = vkfuse_runtime::session::Eager::new(
            Loaded::new(device, schedule, &model.tensors).unwrap(),
        )
        .unwrap();
        for t in 0..3 {
            eager.step(Some(t + 5)).unwrap();
        }
        match eager.step(Some(1)) {
            Err(SessionError::ContextFull {
                position: 3,
                capacity: 3,
            }) => {}
            other => panic!(
                "expected ContextFull, got {:?}",
                other.map(|o| o.next_token)
            ),
        }
    }
    assert!(log.is_clean(), "{}", log.report());
}

#[test]
fn a_model_larger_than_device_memory_is_a_clear_error() {
    let (device, log) = validated_device();
    {
        let model = import::load(&fixture_dir("qwen3-tied")).unwrap();
        let program = trace::trace(&model, &trace::TraceOptions::default()).unwrap();
        let meta = lower::Meta {
            architecture: String::new(),
            eos_token_ids: vec![],
            tokenizer: None,
        };
        let mut schedule = lower::lower(&program, &meta, &mut vkfuse_tests::spirv_cache()).unwrap();
        let weights = schedule
            .buffers
            .iter_mut()
            .find(|b| b.role == BufferRole::Weights)
            .unwrap();
        weights.size = 1 << 44; // 16 TiB
        let err = Loaded::new(device, schedule, &model.tensors)
            .err()
            .expect("must not fit");
        let msg = err.to_string();
        assert!(msg.contains("GiB"), "{msg}");
    }
    assert!(log.is_clean(), "{}", log.report());
}
