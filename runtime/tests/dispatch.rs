//! Compute dispatches of the tiny shaders in `tests/data/`: specialization and push constants,
//! dependent dispatches with a barrier, subgroup arithmetic, f16 storage, the pipeline cache.

mod common;

use std::time::Duration;

use common::{on_device, spirv_file};
use vkfuse_runtime::{
    BufferBinding, BufferKind, Device, Error, Feature, PipelineDesc, Requirements, SpecConstants,
    Stages,
};

const WAIT: Duration = Duration::from_secs(30);

/// `scale_add` with workgroup size 64 and the given constants.
fn scale_add(device: &Device, scale: f32, offset: i32) -> vkfuse_runtime::Pipeline {
    let spec = SpecConstants::new().u32(0, 64).f32(1, scale).i32(2, offset);
    device
        .create_pipeline(&spirv_file("scale_add"), &spec, 2, 8)
        .expect("pipeline")
}

fn push(n: u32, add: f32) -> [u32; 2] {
    [n, add.to_bits()]
}

#[test]
fn should_apply_specialization_and_push_constants() {
    on_device(|device| {
        let n = 1000u32;
        let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let mut input = device
            .create_buffer(4 * u64::from(n), BufferKind::DeviceLocal)
            .unwrap();
        device.upload_pod(&mut input, 0, &x).unwrap();
        let output = device
            .create_buffer(4 * u64::from(n), BufferKind::DeviceLocal)
            .unwrap();

        let pipeline = scale_add(device, 2.0, -3);
        let pool = device.create_descriptor_pool(1, 2).unwrap();
        let set = pool.allocate(&pipeline).unwrap();
        device
            .write_descriptors(
                &set,
                &[
                    BufferBinding::whole(0, &input),
                    BufferBinding::whole(1, &output),
                ],
            )
            .unwrap();

        let mut cmd = device.create_command_buffer().unwrap();
        let mut rec = cmd.begin().unwrap();
        rec.bind_pipeline(&pipeline).unwrap();
        rec.bind_descriptor_set(&set).unwrap();
        rec.push_constants_pod(0, &push(n, 0.5)).unwrap();
        rec.dispatch(n.div_ceil(64), 1, 1).unwrap();
        rec.finish().unwrap();
        device.submit_and_wait(&mut cmd, WAIT).unwrap();

        let y: Vec<f32> = device.readback_pod(&output, 0, n as usize).unwrap();
        for (i, v) in y.iter().enumerate() {
            assert_eq!(*v, i as f32 * 2.0 - 3.0 + 0.5, "y[{i}]");
        }
    });
}

#[test]
fn should_see_the_first_dispatch_through_a_barrier() {
    on_device(|device| {
        let n = 4096u32;
        let bytes = 4 * u64::from(n);
        let mut a = device.create_buffer(bytes, BufferKind::Upload).unwrap();
        a.write_pod(0, &vec![1.0f32; n as usize]).unwrap();
        let b = device
            .create_buffer(bytes, BufferKind::DeviceLocal)
            .unwrap();
        let c = device.create_buffer(bytes, BufferKind::Readback).unwrap();

        // Two pipelines of one layout shape: a -> b (x*3), b -> c (x*3 + 1).
        let first = scale_add(device, 3.0, 0);
        let second = scale_add(device, 3.0, 1);
        let pool = device.create_descriptor_pool(2, 4).unwrap();
        let ab = pool.allocate(&first).unwrap();
        let bc = pool.allocate(&second).unwrap();
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
        rec.bind_pipeline(&first).unwrap();
        rec.bind_descriptor_set(&ab).unwrap();
        rec.push_constants_pod(0, &push(n, 0.0)).unwrap();
        rec.dispatch(n / 64, 1, 1).unwrap();
        rec.compute_barrier();
        rec.bind_pipeline(&second).unwrap();
        rec.bind_descriptor_set(&bc).unwrap();
        rec.push_constants_pod(0, &push(n, 0.0)).unwrap();
        rec.dispatch(n / 64, 1, 1).unwrap();
        rec.barrier(Stages::COMPUTE, Stages::HOST);
        rec.finish().unwrap();
        assert_eq!((cmd.dispatches(), cmd.barriers()), (2, 2));

        // Replayed: the same recording, submitted three times, gives the same answer.
        for _ in 0..3 {
            device.submit_and_wait(&mut cmd, WAIT).unwrap();
            let y: Vec<f32> = c.read_pod(0, n as usize).unwrap();
            assert!(y.iter().all(|v| *v == 10.0), "{:?}", &y[..4]);
        }
    });
}

#[test]
fn should_sum_over_subgroups() {
    let needs = Requirements::new(&[Feature::SubgroupArithmetic]);
    let (_, log) = common::with_device(&needs, |device| {
        let n = 256u32;
        let size = device.info().subgroup_size;
        let mut x = device
            .create_buffer(4 * u64::from(n), BufferKind::Upload)
            .unwrap();
        x.write_pod(0, &(0..n).collect::<Vec<u32>>()).unwrap();
        let y = device
            .create_buffer(4 * u64::from(n), BufferKind::Readback)
            .unwrap();
        let pipeline = device
            .create_pipeline(&spirv_file("subgroup_sum"), &SpecConstants::new(), 2, 0)
            .unwrap();
        let pool = device.create_descriptor_pool(1, 2).unwrap();
        let set = pool.allocate(&pipeline).unwrap();
        device
            .write_descriptors(
                &set,
                &[BufferBinding::whole(0, &x), BufferBinding::whole(1, &y)],
            )
            .unwrap();
        let mut cmd = device.create_command_buffer().unwrap();
        let mut rec = cmd.begin().unwrap();
        rec.bind_pipeline(&pipeline).unwrap();
        rec.bind_descriptor_set(&set).unwrap();
        rec.dispatch(n / 64, 1, 1).unwrap();
        rec.barrier(Stages::COMPUTE, Stages::HOST);
        rec.finish().unwrap();
        device.submit_and_wait(&mut cmd, WAIT).unwrap();
        let got: Vec<u32> = y.read_pod(0, n as usize).unwrap();
        // Subgroups are consecutive invocations of the default size (true on lavapipe and on
        // the GPUs vkfuse targets without varying subgroup size).
        for (i, v) in got.iter().enumerate() {
            let start = i as u32 / size * size;
            let want: u32 = (start..start + size).sum();
            assert_eq!(*v, want, "invocation {i}, subgroup size {size}");
        }
    });
    common::assert_clean(&log);
}

#[test]
fn should_read_f16_storage_when_16bit_storage_is_enabled() {
    let needs = Requirements::new(&[Feature::StorageBuffer16Bit, Feature::ShaderFloat16]);
    let (_, log) = common::with_device(&needs, |device| {
        let values: Vec<half::f16> = [0.5f32, -1.25, 3.0, 65504.0, 1e-3]
            .iter()
            .map(|v| half::f16::from_f32(*v))
            .collect();
        let n = values.len() as u32;
        // 10 bytes: a buffer whose size is not a multiple of 4.
        let mut x = device
            .create_buffer(2 * u64::from(n), BufferKind::DeviceLocal)
            .unwrap();
        device.upload_pod(&mut x, 0, &values).unwrap();
        let y = device
            .create_buffer(4 * u64::from(n), BufferKind::DeviceLocal)
            .unwrap();
        let pipeline = device
            .create_pipeline(&spirv_file("half_to_float"), &SpecConstants::new(), 2, 4)
            .unwrap();
        let pool = device.create_descriptor_pool(1, 2).unwrap();
        let set = pool.allocate(&pipeline).unwrap();
        device
            .write_descriptors(
                &set,
                &[BufferBinding::whole(0, &x), BufferBinding::whole(1, &y)],
            )
            .unwrap();
        let mut cmd = device.create_command_buffer().unwrap();
        let mut rec = cmd.begin().unwrap();
        rec.bind_pipeline(&pipeline).unwrap();
        rec.bind_descriptor_set(&set).unwrap();
        rec.push_constants(0, &n.to_ne_bytes()).unwrap();
        rec.dispatch(1, 1, 1).unwrap();
        rec.finish().unwrap();
        device.submit_and_wait(&mut cmd, WAIT).unwrap();
        let got: Vec<f32> = device.readback_pod(&y, 0, n as usize).unwrap();
        let want: Vec<f32> = values.iter().map(|v| 2.0 * v.to_f32()).collect();
        assert_eq!(got, want);
    });
    common::assert_clean(&log);
}

/// `scale_add` (workgroup size `spec`) described in full, with no cache and no statistics.
fn scale_add_desc<'a>(spirv: &'a [u32], spec: &'a SpecConstants) -> PipelineDesc<'a> {
    PipelineDesc {
        label: "scale_add",
        spirv,
        entry_point: "main",
        spec_constants: spec,
        n_bindings: 2,
        push_constant_bytes: 8,
        cache: None,
        capture_statistics: false,
    }
}

#[test]
fn should_reuse_a_pipeline_cache_from_its_bytes() {
    on_device(|device| {
        let spirv = spirv_file("scale_add");
        let spec = SpecConstants::new().u32(0, 64);
        let cache = device.create_pipeline_cache(&[]).unwrap();
        let desc = PipelineDesc {
            cache: Some(&cache),
            ..scale_add_desc(&spirv, &spec)
        };
        let first = device.create_pipeline_with(&desc).unwrap();
        assert_eq!(first.label(), "scale_add");
        let bytes = cache.data().unwrap();
        let reloaded = device.create_pipeline_cache(&bytes).unwrap();
        device
            .create_pipeline_with(&PipelineDesc {
                cache: Some(&reloaded),
                ..desc
            })
            .unwrap();
        // Garbage is ignored by the driver, not an error.
        device
            .create_pipeline_cache(&[1, 2, 3, 4, 5, 6, 7, 8])
            .unwrap();
    });
}

/// The driver's statistics of a pipeline: none unless asked for, and asked for, some exactly
/// where the device offers them (lavapipe does not; NVIDIA's name registers per invocation).
/// Its internal representations likewise, where a driver has any (NVIDIA's has none).
#[test]
fn should_report_driver_statistics_only_where_captured_and_offered() {
    on_device(|device| {
        let spirv = spirv_file("scale_add");
        let spec = SpecConstants::new().u32(0, 64);
        let desc = scale_add_desc(&spirv, &spec);
        let plain = device.create_pipeline_with(&desc).unwrap();
        assert_eq!(plain.statistics().unwrap(), None);
        assert_eq!(plain.representations().unwrap(), None);
        let captured = device
            .create_pipeline_with(&PipelineDesc {
                capture_statistics: true,
                ..desc
            })
            .unwrap();
        let stats = captured.statistics().unwrap();
        let offered = device.info().features.pipeline_executable_info;
        assert_eq!(stats.is_some(), offered, "{stats:?}");
        if let Some(stats) = stats {
            assert!(!stats.is_empty() && stats.iter().all(|s| !s.name.is_empty()));
        }
        let reps = captured.representations().unwrap();
        assert_eq!(reps.is_some(), offered);
        for r in reps.unwrap_or_default() {
            assert!(!r.name.is_empty() && r.executable == 0, "{r:?}");
        }
    });
}

#[test]
fn should_refuse_misuse_before_it_reaches_the_driver() {
    on_device(|device| {
        let pipeline = scale_add(device, 1.0, 0);
        let buffer = device.create_buffer(256, BufferKind::DeviceLocal).unwrap();
        let pool = device.create_descriptor_pool(1, 2).unwrap();
        let set = pool.allocate(&pipeline).unwrap();
        let misaligned = BufferBinding {
            binding: 0,
            buffer: &buffer,
            offset: 1,
            range: 16,
        };
        let invalid = |r: Result<(), Error>| matches!(r, Err(Error::InvalidArgument(_)));
        assert!(invalid(device.write_descriptors(&set, &[misaligned])));
        let outside = BufferBinding {
            offset: 0,
            range: 257,
            ..misaligned
        };
        assert!(invalid(device.write_descriptors(&set, &[outside])));
        let bad_binding = BufferBinding::whole(2, &buffer);
        assert!(invalid(device.write_descriptors(&set, &[bad_binding])));

        let mut cmd = device.create_command_buffer().unwrap();
        {
            let mut rec = cmd.begin().unwrap();
            assert!(
                invalid(rec.dispatch(1, 1, 1)),
                "dispatch before bind_pipeline"
            );
            rec.bind_pipeline(&pipeline).unwrap();
            assert!(
                invalid(rec.push_constants(4, &[0; 8])),
                "past the 8 push-constant bytes"
            );
            assert!(
                invalid(rec.push_constants(0, &[0; 3])),
                "not a multiple of 4"
            );
            assert!(invalid(rec.dispatch(u32::MAX, 1, 1)));
            assert!(invalid(rec.fill_buffer(&buffer, 2, 4, 0)));
            assert!(
                invalid(rec.copy_buffer(&buffer, 0, &buffer, 8, 16)),
                "overlap"
            );
            // Dropped without finish: abandoned.
        }
        assert!(invalid(device.submit(&mut cmd)));
        assert!(matches!(
            device.create_pipeline(&[1, 2, 3], &SpecConstants::new(), 1, 0),
            Err(Error::InvalidSpirv(_))
        ));
        assert!(invalid(
            device
                .create_pipeline(&spirv_file("scale_add"), &SpecConstants::new(), 2, 6)
                .map(drop)
        ));
        assert!(invalid(
            device.create_buffer(0, BufferKind::Upload).map(drop)
        ));
    });
}

#[test]
fn should_report_an_exhausted_descriptor_pool_as_out_of_memory() {
    on_device(|device| {
        let pipeline = scale_add(device, 1.0, 0);
        let pool = device.create_descriptor_pool(1, 2).unwrap();
        let _set = pool.allocate(&pipeline).unwrap();
        let err = pool.allocate(&pipeline).unwrap_err();
        assert!(matches!(err, Error::OutOfMemory { .. }), "{err:?}");
    });
}

#[test]
fn should_count_storage_buffers_against_the_pool() {
    on_device(|device| {
        let pipeline = scale_add(device, 1.0, 0);
        let pool = device.create_descriptor_pool(4, 3).unwrap();
        let _set = pool.allocate(&pipeline).unwrap();
        let err = pool.allocate(&pipeline).unwrap_err();
        assert!(matches!(err, Error::OutOfMemory { .. }), "{err:?}");
    });
}

#[test]
fn should_refuse_to_submit_a_recording_whose_set_was_updated_since() {
    on_device(|device| {
        let pipeline = scale_add(device, 1.0, 0);
        let a = device.create_buffer(256, BufferKind::DeviceLocal).unwrap();
        let b = device.create_buffer(256, BufferKind::DeviceLocal).unwrap();
        let pool = device.create_descriptor_pool(1, 2).unwrap();
        let set = pool.allocate(&pipeline).unwrap();
        let bind = [BufferBinding::whole(0, &a), BufferBinding::whole(1, &b)];
        device.write_descriptors(&set, &bind).unwrap();
        let record = |cmd: &mut vkfuse_runtime::CommandBuffer| {
            let mut rec = cmd.begin().unwrap();
            rec.bind_pipeline(&pipeline).unwrap();
            rec.bind_descriptor_set(&set).unwrap();
            rec.push_constants_pod(0, &push(64, 0.0)).unwrap();
            rec.dispatch(1, 1, 1).unwrap();
            rec.finish().unwrap();
        };
        let mut cmd = device.create_command_buffer().unwrap();
        record(&mut cmd);
        device.submit_and_wait(&mut cmd, WAIT).unwrap();
        // Vulkan invalidates the recording when the set changes; vkfuse says so.
        device.write_descriptors(&set, &bind).unwrap();
        let err = device.submit(&mut cmd).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
        record(&mut cmd);
        device.submit_and_wait(&mut cmd, WAIT).unwrap();
    });
}
