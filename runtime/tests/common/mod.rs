//! Shared test helpers: a validated instance and device on whatever Vulkan device is here
//! (lavapipe on the CPU machines), and the check that the run was validation-clean after
//! everything was dropped.

#![allow(dead_code)] // each test binary uses a different part

use vkfuse_runtime::{
    spirv_from_bytes, Device, Instance, InstanceOptions, Requirements, ValidationLog,
};

/// A validated instance (the layer must be installed: `apt-get install vulkan-validationlayers`).
pub fn instance() -> Instance {
    Instance::new(&InstanceOptions::validated()).expect("Vulkan with the validation layer")
}

/// Runs `f` on a device of a validated instance, drops the device and the instance, and
/// returns what `f` returned with the log, which still holds everything reported up to and
/// including `vkDestroyDevice` / `vkDestroyInstance`.
pub fn with_device<R>(
    requirements: &Requirements,
    f: impl FnOnce(&Device) -> R,
) -> (R, ValidationLog) {
    let instance = instance();
    assert!(instance.validation_enabled());
    let log = instance.validation_log();
    let adapter = instance.select_adapter(None).expect("a Vulkan device");
    let device = Device::new(&instance, &adapter, requirements).expect("device creation");
    let result = f(&device);
    drop(device);
    drop(adapter);
    drop(instance);
    (result, log)
}

/// Panics with every validation error when the log is not clean.
pub fn assert_clean(log: &ValidationLog) {
    // Warnings do not fail a test; shown with `--nocapture` or when the test fails.
    for w in log.warnings() {
        println!("validation warning: {w}");
    }
    assert!(log.is_clean(), "validation errors:\n{}", log.report());
}

/// [`with_device`] with no requirements, asserting a clean log at the end.
pub fn on_device<R>(f: impl FnOnce(&Device) -> R) -> R {
    let (result, log) = with_device(&Requirements::none(), f);
    assert_clean(&log);
    result
}

/// The words of `tests/data/<name>.spv` (compiled with glslc, committed beside its GLSL).
pub fn spirv_file(name: &str) -> Vec<u32> {
    let path = format!("{}/tests/data/{name}.spv", env!("CARGO_MANIFEST_DIR"));
    let bytes = std::fs::read(&path).expect("read SPIR-V");
    spirv_from_bytes(&bytes).expect("valid SPIR-V")
}
