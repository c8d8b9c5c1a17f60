//! The matvec family's workgroup size, chosen at load from the device (`KernelDecl::subgroups`,
//! issue 7 item 1): on every fixture, fused and unfused, each matvec kernel leaves its size open
//! as a count of subgroups (its compiled size is that many of the 32-wide device class's) and
//! every other kernel keeps its own. Loaded on this device (lavapipe: 8-wide subgroups), the
//! open kernels get that many of its subgroups, and the replayed step still produces
//! transformers' greedy tokens, with the validation layer clean.

use vkfuse_runtime::schedule::{KernelId, Schedule};
use vkfuse_runtime::session::{Loaded, Replay};
use vkfuse_tests::{
    expected, fixture_schedule, fused_schedule, replay_greedy_ids, validated_device,
};

const FIXTURES: [&str; 4] = ["qwen3-tied", "qwen3-untied", "llama-gqa", "qwen3-next"];

fn is_matvec(label: &str) -> bool {
    label.starts_with("matvec[") || label.starts_with("fused_matvec[")
}

/// Every matvec kernel leaves its workgroup open, in subgroups of the compiled size; no other
/// kernel does.
fn check_declared(name: &str, s: &Schedule) {
    let mut open = 0;
    for k in &s.kernels {
        match (is_matvec(&k.label), k.subgroups) {
            (true, Some(n)) => {
                assert_eq!(k.spec_constants[0], 32 * n, "{name}: {}", k.label);
                open += 1;
            }
            (false, None) => {}
            (m, sg) => panic!("{name}: `{}` (matvec: {m}) has subgroups {sg:?}", k.label),
        }
    }
    assert!(open > 0, "{name}: no matvec kernel");
}

fn check(name: &str, schedule: Schedule, model: vkfuse_compiler::import::Model) {
    check_declared(name, &schedule);
    let (device, log) = validated_device();
    let width = device.info().subgroup_size;
    let loaded = Loaded::new(device, schedule, &model.tensors).unwrap();
    let s = &loaded.schedule;
    for (i, k) in s.kernels.iter().enumerate() {
        let got = loaded.workgroup_size(KernelId(i as u32));
        match k.subgroups {
            Some(n) => assert_eq!(got, Some(n * width), "{name}: {}", k.label),
            None => assert_eq!(
                got,
                k.spec_constants.first().copied(),
                "{name}: {}",
                k.label
            ),
        }
    }
    let want = expected(name);
    let mut replay = Replay::new(loaded).unwrap();
    assert_eq!(
        replay_greedy_ids(&mut replay, &want),
        want.greedy_ids,
        "{name}: greedy tokens with workgroups of {width}-wide subgroups"
    );
    assert!(log.is_clean(), "{name}: {}", log.report());
}

#[test]
fn should_open_and_size_the_matvec_workgroups_at_load_fused() {
    for name in FIXTURES {
        let (model, schedule, _) = fused_schedule(name);
        check(name, schedule, model);
    }
}

#[test]
fn should_open_and_size_the_matvec_workgroups_at_load_unfused() {
    for name in FIXTURES {
        let (model, schedule) = fixture_schedule(name);
        check(name, schedule, model);
    }
}
