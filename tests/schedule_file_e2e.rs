//! A schedule written to a file and read back runs exactly like the in-memory one: the same
//! logits bit for bit, within 5e-3 of transformers, the same greedy tokens.

use vkfuse_runtime::schedule::ScheduleFile;
use vkfuse_runtime::session::{Eager, Loaded};
use vkfuse_tests::{assert_rows_close, expected, fixture_schedule, validated_device};

#[test]
fn schedule_file_round_trip_runs_like_the_in_memory_schedule() {
    let name = "qwen3-untied";
    let (model, schedule) = fixture_schedule(name);
    let path = std::env::temp_dir().join(format!("vkfuse-e2e-{}.vkf", std::process::id()));
    schedule.write_file(&path, &model.tensors).unwrap();
    let file = ScheduleFile::open(&path).unwrap();
    assert_eq!(file.schedule(), &schedule);
    let want = expected(name);
    let (device, log) = validated_device();
    {
        let run = |s, w: &dyn vkfuse_runtime::session::TensorBytes| -> Vec<Vec<f32>> {
            let mut e = Eager::new(Loaded::new(device.clone(), s, w).unwrap()).unwrap();
            want.teacher_ids
                .iter()
                .map(|&t| e.step(Some(t)).unwrap().logits)
                .collect()
        };
        let from_file = run(file.schedule().clone(), file.weights());
        let in_memory = run(schedule, &model.tensors);
        assert_eq!(
            from_file, in_memory,
            "bitwise equal: same kernels, same bytes"
        );
        assert_rows_close("file", &from_file, &want.teacher_logits, 5e-3);
    }
    std::fs::remove_file(&path).ok();
    assert!(log.is_clean(), "{}", log.report());
}

/// A kernel the driver cannot build (SPIR-V damaged past the file's checksums, here cut to its
/// header) is named in the load error: its id and label, not only the driver's code.
#[test]
fn a_kernel_the_driver_cannot_build_is_named() {
    use vkfuse_runtime::schedule::KernelId;
    use vkfuse_runtime::session::SessionError;
    use vkfuse_runtime::{Device, Instance, InstanceOptions, Requirements};
    let (model, mut schedule) = fixture_schedule("qwen3-untied");
    let last = schedule.kernels.len() - 1;
    schedule.kernels[last].spirv.truncate(5);
    // Without the validation layer, which would flag the module before the driver sees it.
    let instance = Instance::new(&InstanceOptions::default()).expect("a Vulkan instance");
    let adapter = instance.select_adapter(None).expect("a Vulkan device");
    let device = Device::new(&instance, &adapter, &Requirements::none()).expect("device");
    let err = Loaded::new(device, schedule.clone(), &model.tensors)
        .err()
        .expect("a kernel without code does not load");
    let label = &schedule.kernels[last].label;
    match &err {
        SessionError::Kernel {
            kernel, label: l, ..
        } => {
            assert_eq!((*kernel, l), (KernelId(last as u32), label), "{err}");
        }
        other => panic!("not a kernel error: {other}"),
    }
    assert!(
        err.to_string().contains(&format!("k{last} `{label}`")),
        "{err}"
    );
}
