//! Fences, timeouts, timestamps, counters, and the validation log itself (that it catches
//! leaks at vkDestroyDevice and missing barriers, and can be read after everything is dropped).

mod common;

use std::time::Duration;

use ash::vk;
use common::{assert_clean, on_device, spirv_file, with_device};
use vkfuse_runtime::{
    BufferBinding, BufferKind, Device, Error, Instance, InstanceOptions, Requirements,
    SpecConstants, Stages,
};

const WAIT: Duration = Duration::from_secs(60);

#[test]
fn should_time_out_then_finish_a_long_dispatch() {
    on_device(|device| {
        let mut state = device
            .create_buffer(64 * 4 * 16, BufferKind::Upload)
            .unwrap();
        state.write_pod(0, &vec![1u32; 64 * 16]).unwrap();
        let pipeline = device
            .create_pipeline(&spirv_file("spin"), &SpecConstants::new(), 1, 4)
            .unwrap();
        let pool = device.create_descriptor_pool(1, 1).unwrap();
        let set = pool.allocate(&pipeline).unwrap();
        device
            .write_descriptors(&set, &[BufferBinding::whole(0, &state)])
            .unwrap();
        let mut cmd = device.create_command_buffer().unwrap();
        let mut rec = cmd.begin().unwrap();
        rec.bind_pipeline(&pipeline).unwrap();
        rec.bind_descriptor_set(&set).unwrap();
        // About a second of work on lavapipe, a few milliseconds on a GPU.
        rec.push_constants(0, &20_000_000u32.to_ne_bytes()).unwrap();
        rec.dispatch(16, 1, 1).unwrap();
        rec.finish().unwrap();

        let err = device
            .submit_and_wait(&mut cmd, Duration::ZERO)
            .unwrap_err();
        assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
        assert!(cmd.is_pending().unwrap());
        // While it runs: no re-recording, no resubmission, no descriptor update of its set.
        assert!(matches!(cmd.begin(), Err(Error::InUse(_))));
        assert!(matches!(device.submit(&mut cmd), Err(Error::InUse(_))));
        let rewrite = device.write_descriptors(&set, &[BufferBinding::whole(0, &state)]);
        assert!(matches!(rewrite, Err(Error::InUse(_))), "{rewrite:?}");

        let start = std::time::Instant::now();
        cmd.wait(WAIT).unwrap();
        println!("waited {:?}", start.elapsed());
        assert!(!cmd.is_pending().unwrap());
        device
            .write_descriptors(&set, &[BufferBinding::whole(0, &state)])
            .unwrap();
    });
}

#[test]
fn should_wait_for_a_pending_command_buffer_when_dropped() {
    on_device(|device| {
        let mut state = device.create_buffer(64 * 4, BufferKind::Upload).unwrap();
        state.write_pod(0, &[0u32; 64]).unwrap();
        let pipeline = device
            .create_pipeline(&spirv_file("spin"), &SpecConstants::new(), 1, 4)
            .unwrap();
        let pool = device.create_descriptor_pool(1, 1).unwrap();
        let set = pool.allocate(&pipeline).unwrap();
        device
            .write_descriptors(&set, &[BufferBinding::whole(0, &state)])
            .unwrap();
        let mut cmd = device.create_command_buffer().unwrap();
        let mut rec = cmd.begin().unwrap();
        rec.bind_pipeline(&pipeline).unwrap();
        rec.bind_descriptor_set(&set).unwrap();
        rec.push_constants(0, &1_000_000u32.to_ne_bytes()).unwrap();
        rec.dispatch(1, 1, 1).unwrap();
        rec.finish().unwrap();
        device.submit(&mut cmd).unwrap();
        // Everything the submission uses is dropped while it may still run: the command buffer
        // keeps them alive and waits; validation would flag a destroyed in-use object.
        drop((pipeline, set, pool));
        drop(cmd);
    });
}

#[test]
fn should_measure_gpu_time_with_timestamps() {
    on_device(|device| {
        let Some(timestamps) = device.create_timestamp_pool(2).unwrap() else {
            // A device without timestamps reports GPU time as unknown.
            assert!(!device.timestamps_supported());
            return;
        };
        let mut state = device
            .create_buffer(64 * 4 * 4, BufferKind::Upload)
            .unwrap();
        state.write_pod(0, &[0u32; 256]).unwrap();
        let pipeline = device
            .create_pipeline(&spirv_file("spin"), &SpecConstants::new(), 1, 4)
            .unwrap();
        let pool = device.create_descriptor_pool(1, 1).unwrap();
        let set = pool.allocate(&pipeline).unwrap();
        device
            .write_descriptors(&set, &[BufferBinding::whole(0, &state)])
            .unwrap();
        let mut cmd = device.create_command_buffer().unwrap();
        let mut rec = cmd.begin().unwrap();
        rec.reset_timestamps(&timestamps).unwrap();
        rec.write_timestamp(&timestamps, 0).unwrap();
        rec.bind_pipeline(&pipeline).unwrap();
        rec.bind_descriptor_set(&set).unwrap();
        rec.push_constants(0, &200_000u32.to_ne_bytes()).unwrap();
        rec.dispatch(4, 1, 1).unwrap();
        rec.write_timestamp(&timestamps, 1).unwrap();
        assert!(matches!(
            rec.write_timestamp(&timestamps, 2),
            Err(Error::InvalidArgument(_))
        ));
        rec.finish().unwrap();
        device.submit_and_wait(&mut cmd, WAIT).unwrap();

        let ticks = timestamps.ticks(0, 2).unwrap();
        assert!(ticks.iter().all(Option::is_some), "{ticks:?}");
        let ns = timestamps.elapsed_ns(0, 1).unwrap().expect("both written");
        assert!(ns > 0.0, "{ns} ns");
        println!("spin dispatch: {:.1} us of GPU time", ns / 1e3);
    });
}

#[test]
fn should_count_what_the_host_asked_of_the_gpu() {
    on_device(|device| {
        let n = 64u32;
        let mut a = device.create_buffer(256, BufferKind::Upload).unwrap();
        a.write_pod(0, &vec![1.0f32; 64]).unwrap();
        let b = device.create_buffer(256, BufferKind::DeviceLocal).unwrap();
        let c = device.create_buffer(256, BufferKind::Readback).unwrap();
        let spec = SpecConstants::new().u32(0, 64);
        let pipeline = device
            .create_pipeline(&spirv_file("scale_add"), &spec, 2, 8)
            .unwrap();
        let pool = device.create_descriptor_pool(2, 4).unwrap();
        let (ab, bc) = (
            pool.allocate(&pipeline).unwrap(),
            pool.allocate(&pipeline).unwrap(),
        );

        let before = device.counters();
        device
            .write_descriptors(
                &ab,
                &[BufferBinding::whole(0, &a), BufferBinding::whole(1, &b)],
            )
            .unwrap();
        device
            .write_descriptors(
                &bc,
                &[BufferBinding::whole(0, &b), BufferBinding::whole(1, &c)],
            )
            .unwrap();
        let mut cmd = device.create_command_buffer().unwrap();
        let mut rec = cmd.begin().unwrap();
        rec.bind_pipeline(&pipeline).unwrap();
        for set in [&ab, &bc] {
            rec.bind_descriptor_set(set).unwrap();
            rec.push_constants_pod(0, &[n, 1.0f32.to_bits()]).unwrap();
            rec.dispatch(1, 1, 1).unwrap();
            rec.compute_barrier();
        }
        rec.finish().unwrap();
        // Recorded once, submitted three times: "three tokens" of replay.
        for _ in 0..3 {
            device.submit_and_wait(&mut cmd, WAIT).unwrap();
        }
        let mut run = device.counters().since(&before);
        assert_eq!(run.descriptor_writes, 4);
        assert_eq!(run.recordings, 1);
        assert_eq!(run.submits, 3);
        assert_eq!(run.dispatches, 6, "dispatches count per submit");
        assert_eq!(run.barriers, 6);
        assert!(run.host_ns > 0);
        assert_eq!(run.gpu_ns, None);

        run.tokens = 3;
        run.wall_ns = 3_000_000;
        let per = run.per_token().unwrap();
        assert_eq!(per.dispatches_per_token, 2.0);
        assert_eq!(per.barriers_per_token, 2.0);
        assert_eq!(per.submits_per_token, 1.0);
        assert!((per.recordings_per_token - 1.0 / 3.0).abs() < 1e-12);
        assert!((per.descriptor_writes_per_token - 4.0 / 3.0).abs() < 1e-12);
        assert_eq!(per.tokens_per_s, Some(1000.0));
        assert_eq!(per.gpu_us_per_token, None);
    });
}

#[test]
fn should_report_leaked_objects_after_the_device_is_dropped() {
    let (_, log) = with_device(&Requirements::none(), |device: &Device| {
        let info = vk::BufferCreateInfo::default()
            .size(64)
            .usage(vk::BufferUsageFlags::STORAGE_BUFFER);
        // SAFETY: a valid create info on a live device; the buffer is leaked on purpose.
        let leaked = unsafe { device.raw().create_buffer(&info, None) }.unwrap();
        assert_ne!(leaked, vk::Buffer::null());
        assert!(
            device.validation_log().is_clean(),
            "clean until the device goes"
        );
    });
    let errors = log.take_errors();
    assert!(
        errors.iter().any(|m| m.text.contains("VkBuffer")),
        "expected a leak report at vkDestroyDevice, got {errors:#?}"
    );
    assert_clean(&log);
}

#[test]
fn should_catch_a_missing_barrier_with_sync_validation() {
    let instance = Instance::new(&InstanceOptions {
        validation: true,
        sync_validation: true,
    })
    .unwrap();
    let log = instance.validation_log();
    let adapter = instance.select_adapter(None).unwrap();
    let device = Device::new(&instance, &adapter, &Requirements::none()).unwrap();
    let run = |barrier: bool| {
        let a = device.create_buffer(256, BufferKind::DeviceLocal).unwrap();
        let b = device.create_buffer(256, BufferKind::DeviceLocal).unwrap();
        let c = device.create_buffer(256, BufferKind::DeviceLocal).unwrap();
        let spec = SpecConstants::new().u32(0, 64);
        let pipeline = device
            .create_pipeline(&spirv_file("scale_add"), &spec, 2, 8)
            .unwrap();
        let pool = device.create_descriptor_pool(2, 4).unwrap();
        let (ab, bc) = (
            pool.allocate(&pipeline).unwrap(),
            pool.allocate(&pipeline).unwrap(),
        );
        device
            .write_descriptors(
                &ab,
                &[BufferBinding::whole(0, &a), BufferBinding::whole(1, &b)],
            )
            .unwrap();
        device
            .write_descriptors(
                &bc,
                &[BufferBinding::whole(0, &b), BufferBinding::whole(1, &c)],
            )
            .unwrap();
        let mut cmd = device.create_command_buffer().unwrap();
        let mut rec = cmd.begin().unwrap();
        rec.bind_pipeline(&pipeline).unwrap();
        rec.bind_descriptor_set(&ab).unwrap();
        rec.push_constants_pod(0, &[64u32, 0]).unwrap();
        rec.dispatch(1, 1, 1).unwrap();
        if barrier {
            rec.barrier(Stages::COMPUTE, Stages::COMPUTE);
        }
        rec.bind_descriptor_set(&bc).unwrap();
        rec.dispatch(1, 1, 1).unwrap();
        rec.finish().unwrap();
        device.submit_and_wait(&mut cmd, WAIT).unwrap();
    };
    run(true);
    assert_clean(&log);
    run(false);
    let errors = log.take_errors();
    assert!(
        errors
            .iter()
            .any(|m| m.id_name.contains("SYNC-HAZARD-READ")),
        "expected a read-after-write hazard, got {errors:#?}"
    );
    drop((device, adapter, instance));
    assert_clean(&log);
}
