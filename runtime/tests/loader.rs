//! The process keeps the Vulkan loader and its drivers loaded once an instance has opened them
//! (`vulkan/loader.rs`): NVIDIA's driver cannot be opened again without end in one process.
//! Its own binary, so no other test's instance holds the drivers open for it. Linux only: it
//! reads what is mapped from `/proc/self/maps`.
#![cfg(target_os = "linux")]

use std::collections::BTreeSet;

use vkfuse_runtime::{Device, Instance, InstanceOptions, Requirements};

/// The shared libraries mapped into this process now (Linux's `/proc/self/maps`).
fn mapped_libraries() -> BTreeSet<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .filter(|path| path.contains(".so"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_driver_stays_loaded_after_its_instances_are_gone_and_instances_keep_coming() {
    let before = mapped_libraries();
    let (during, adapter_name) = {
        let instance = Instance::new(&InstanceOptions::default()).expect("a Vulkan instance");
        let adapter = instance.select_adapter(None).expect("a Vulkan device");
        (mapped_libraries(), adapter.info().name.clone())
    };
    let after = mapped_libraries();
    // The loader and the driver at least, else the check below would pass for nothing.
    let opened: Vec<_> = during.difference(&before).collect();
    assert!(!opened.is_empty(), "no library was opened for the instance");
    // Layers (`VKFUSE_VALIDATION=1` in the environment) come and go with their instance.
    let closed: Vec<_> = during
        .difference(&after)
        .filter(|path| !path.contains("VkLayer"))
        .collect();
    assert!(
        closed.is_empty(),
        "closed when the instance was dropped: {closed:?}"
    );

    // NVIDIA's driver failed at the 30th instance of a process before the drivers were kept.
    for i in 0..40 {
        let instance = Instance::new(&InstanceOptions::default())
            .unwrap_or_else(|e| panic!("instance {i}: {e}"));
        let adapter = instance
            .select_adapter(None)
            .unwrap_or_else(|e| panic!("instance {i}: {e}"));
        assert_eq!(adapter.info().name, adapter_name, "instance {i}");
        Device::new(&instance, &adapter, &Requirements::none())
            .unwrap_or_else(|e| panic!("device of instance {i}: {e}"));
    }
}
