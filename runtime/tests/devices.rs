//! Device listing, selection and creation on the machine's Vulkan device(s).

mod common;

use common::{assert_clean, instance, with_device};
use vkfuse_runtime::{Device, Error, Feature, Requirements};

#[test]
fn should_list_devices_with_their_limits() {
    let instance = instance();
    let log = instance.validation_log();
    let adapters = instance.adapters().expect("enumerate");
    assert!(!adapters.is_empty(), "no Vulkan device");
    for a in &adapters {
        let info = a.info();
        let text = a.to_string();
        assert!(
            text.starts_with(&format!("[{}] {}", a.index(), info.name)),
            "{text}"
        );
        for key in [
            "compute:",
            "subgroups:",
            "memory:",
            "timestamps:",
            "features:",
        ] {
            assert!(text.contains(key), "{key} missing in\n{text}");
        }
        assert!(info.max_workgroup_invocations >= 128);
        assert!(info.subgroup_size >= 1);
        assert!(info.max_push_constants_size >= 128);
        assert!(info.device_local_bytes > 0);
        assert!(info.min_storage_buffer_offset_alignment.is_power_of_two());
        assert!(info.compute_queue_family.is_some());
        // Printed for the record (`cargo test -- --nocapture`).
        println!("{a}");
    }
    drop(adapters);
    drop(instance);
    assert_clean(&log);
}

#[test]
fn should_fail_with_the_device_count_when_the_index_is_out_of_range() {
    let instance = instance();
    let count = instance.adapters().expect("enumerate").len();
    let err = instance.select_adapter(Some(count + 5)).unwrap_err();
    match &err {
        Error::AdapterIndex {
            index,
            count: c,
            list,
            ..
        } => {
            assert_eq!((*index, *c), (count + 5, count));
            assert!(list.contains("[0]"), "{list}");
        }
        other => panic!("wrong error {other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("there are {count} device(s)")),
        "{msg}"
    );
}

#[test]
fn should_select_by_explicit_index() {
    let instance = instance();
    let first = instance.select_adapter(Some(0)).expect("device 0");
    assert_eq!(first.index(), 0);
    let chosen = instance.select_adapter(None).expect("a device");
    assert!(chosen.index() < instance.adapters().expect("enumerate").len());
}

#[test]
fn should_create_a_device_with_what_lavapipe_and_real_gpus_offer() {
    let needs = Requirements::new(&[
        Feature::StorageBuffer16Bit,
        Feature::ShaderFloat16,
        Feature::SubgroupBasic,
        Feature::SubgroupArithmetic,
        Feature::Timestamps,
    ]);
    let (enabled, log) = with_device(&needs, |device| {
        assert!(device.timestamps_supported());
        device.enabled_features()
    });
    assert!(enabled.storage_buffer_16bit && enabled.shader_float16);
    assert_clean(&log);
}

#[test]
fn should_name_the_device_and_what_it_lacks() {
    let instance = instance();
    let adapter = instance.select_adapter(None).expect("a device");
    let every = [
        Feature::StorageBuffer16Bit,
        Feature::StorageBuffer8Bit,
        Feature::ShaderFloat16,
        Feature::ShaderInt8,
        Feature::ShaderInt16,
        Feature::ShaderInt64,
        Feature::SubgroupBasic,
        Feature::SubgroupArithmetic,
        Feature::SubgroupShuffle,
        Feature::SubgroupBallot,
        Feature::Timestamps,
    ];
    let missing = adapter.info().missing(&Requirements::new(&every));
    let result = Device::new(&instance, &adapter, &Requirements::new(&every));
    if missing.is_empty() {
        assert!(result.is_ok());
    } else {
        let msg = result.unwrap_err().to_string();
        assert!(msg.contains(&adapter.info().name), "{msg}");
    }
}

#[test]
fn should_refuse_an_adapter_of_another_instance() {
    let a = instance();
    let b = instance();
    let adapter = b.select_adapter(None).expect("a device");
    let err = Device::new(&a, &adapter, &Requirements::none()).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
}

#[test]
fn should_check_that_a_model_fits_device_memory() {
    let (msgs, log) = with_device(&Requirements::none(), |device| {
        let have = device.info().device_local_bytes;
        assert!(device.check_fits(have / 2).is_ok());
        device.check_fits(have * 2).unwrap_err().to_string()
    });
    assert!(
        msgs.starts_with("model needs ") && msgs.contains(" GiB, device "),
        "{msgs}"
    );
    assert_clean(&log);
}

/// Runs test `name` of this binary again in a child process with `env` set (Vulkan reads its
/// environment once, so this cannot be done in-process beside other tests) and checks it passed.
fn in_child(name: &str, env: &[(&str, &str)]) {
    let exe = std::env::current_exe().expect("test binary");
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["--exact", name, "--test-threads=1", "--nocapture"])
        .env("VKFUSE_TEST_CHILD", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run the child");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("1 passed"),
        "child failed:\n{text}"
    );
}

fn is_child() -> bool {
    std::env::var_os("VKFUSE_TEST_CHILD").is_some()
}

#[test]
fn should_explain_how_to_get_a_driver_when_there_is_none() {
    if !is_child() {
        let none = "/nonexistent/vkfuse_icd.json";
        return in_child(
            "should_explain_how_to_get_a_driver_when_there_is_none",
            &[("VK_DRIVER_FILES", none), ("VK_ICD_FILENAMES", none)],
        );
    }
    let err = vkfuse_runtime::Instance::new(&Default::default())
        .and_then(|i| i.select_adapter(None).map(drop))
        .unwrap_err();
    assert!(
        matches!(err, Error::NoVulkan { .. } | Error::NoDevice),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains("mesa-vulkan-drivers"), "{msg}");
    println!("{msg}");
}

#[test]
fn should_say_which_package_brings_a_missing_validation_layer() {
    if !is_child() {
        return in_child(
            "should_say_which_package_brings_a_missing_validation_layer",
            &[
                ("VK_LAYER_PATH", "/nonexistent"),
                ("XDG_DATA_DIRS", "/nonexistent"),
                ("XDG_DATA_HOME", "/nonexistent"),
            ],
        );
    }
    let err =
        vkfuse_runtime::Instance::new(&vkfuse_runtime::InstanceOptions::validated()).unwrap_err();
    assert!(matches!(err, Error::LayerMissing { .. }), "{err:?}");
    assert!(err.to_string().contains("vulkan-validationlayers"), "{err}");
}

#[test]
fn should_select_by_vkfuse_device_unless_an_index_is_given() {
    if !is_child() {
        return in_child(
            "should_select_by_vkfuse_device_unless_an_index_is_given",
            &[("VKFUSE_DEVICE", "99")],
        );
    }
    let instance = instance();
    let err = instance.select_adapter(None).unwrap_err().to_string();
    assert!(err.contains("VKFUSE_DEVICE=99"), "{err}");
    assert_eq!(
        instance.select_adapter(Some(0)).expect("device 0").index(),
        0
    );
}

#[test]
fn should_turn_validation_on_from_the_environment() {
    if !is_child() {
        return in_child(
            "should_turn_validation_on_from_the_environment",
            &[("VKFUSE_VALIDATION", "1")],
        );
    }
    let instance = vkfuse_runtime::Instance::new(&Default::default()).expect("instance");
    assert!(instance.validation_enabled());
}
