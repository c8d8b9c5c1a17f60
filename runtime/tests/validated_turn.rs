//! Validated instances take turns across threads (runtime/src/vulkan/validated_turn.rs): the
//! Khronos validation layer keeps all instances' and devices' data in one unlocked map, and one
//! thread creating and destroying validated instances beside another calling through the layer
//! segfaulted inside it within seconds before the turns (3 runs of 3, 30 s each).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use vkfuse_runtime::{BufferKind, Device, Instance, InstanceOptions, Requirements};

fn validated_device() -> (Instance, Device) {
    let instance = Instance::new(&InstanceOptions::validated()).expect("a validated instance");
    let adapter = instance.select_adapter(None).expect("a Vulkan device");
    let device = Device::new(&instance, &adapter, &Requirements::none()).expect("device");
    (instance, device)
}

#[test]
fn a_second_thread_waits_for_the_first_threads_validated_instance() {
    let (first, device) = validated_device();
    // Reentrant: this thread may hold a second validated instance beside the first.
    let (second, _second_device) = validated_device();

    let made = Arc::new(AtomicUsize::new(0));
    let counter = made.clone();
    let other = thread::spawn(move || {
        // Instances and devices made and destroyed, as the tests of a binary do in parallel.
        for _ in 0..5 {
            let (i, d) = validated_device();
            counter.fetch_add(1, Ordering::SeqCst);
            drop(d);
            drop(i);
        }
    });

    // Meanwhile this thread calls through the layer; the other must not have begun.
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(1) {
        let mut b = device.create_buffer(256, BufferKind::DeviceLocal).unwrap();
        device.upload_pod(&mut b, 0, &[7u32; 64]).unwrap();
    }
    assert_eq!(
        made.load(Ordering::SeqCst),
        0,
        "a validated instance was made beside ours"
    );
    drop(device);
    drop(first);
    // One validated instance still held: still waiting.
    thread::sleep(Duration::from_millis(200));
    assert_eq!(
        made.load(Ordering::SeqCst),
        0,
        "made while this thread held one"
    );
    drop(_second_device);
    drop(second);
    other.join().expect("the other thread's instances");
    assert_eq!(made.load(Ordering::SeqCst), 5);
}
