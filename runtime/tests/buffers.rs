//! Buffer upload/readback round trips of random sizes and offsets, fills and copies.

mod common;

use common::on_device;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use vkfuse_runtime::{BufferKind, Device, Error, Stages};

/// Round trip of `data` at `offset` in a buffer of `size` bytes of `kind`, through the device's
/// helpers (staging for device-local buffers, direct for mapped ones).
fn round_trip(device: &Device, kind: BufferKind, size: u64, offset: u64, data: &[u8]) -> Vec<u8> {
    let mut buffer = device.create_buffer(size, kind).expect("buffer");
    assert_eq!(buffer.size(), size);
    device.upload(&mut buffer, offset, data).expect("upload");
    let mut out = vec![0u8; data.len()];
    device
        .readback(&buffer, offset, &mut out)
        .expect("readback");
    out
}

fn case() -> impl Strategy<Value = (u64, u64, Vec<u8>)> {
    // Sizes from 1 byte (not multiples of 4 on purpose) to ~300 KB, data at any offset.
    (1usize..300_000, 0u64..4096).prop_flat_map(|(len, offset)| {
        (
            Just(offset + len as u64 + 7),
            Just(offset),
            proptest::collection::vec(any::<u8>(), len),
        )
    })
}

#[test]
fn should_round_trip_random_bytes_through_every_buffer_kind() {
    on_device(|device| {
        let mut runner = TestRunner::new(Config {
            cases: 24,
            ..Config::default()
        });
        for kind in [
            BufferKind::DeviceLocal,
            BufferKind::Upload,
            BufferKind::Readback,
        ] {
            runner
                .run(&case(), |(size, offset, data)| {
                    let out = round_trip(device, kind, size, offset, &data);
                    prop_assert_eq!(out, data, "{:?} size {} offset {}", kind, size, offset);
                    Ok(())
                })
                .unwrap();
        }
    });
}

#[test]
fn should_upload_in_pieces_larger_than_the_staging_chunk() {
    on_device(|device| {
        // 64 MiB + 3 bytes: two staging pieces, the last of 3 bytes.
        let len = (64 << 20) + 3;
        let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let out = round_trip(device, BufferKind::DeviceLocal, len as u64 + 5, 5, &data);
        assert!(out == data, "64 MiB round trip differs");
    });
}

#[test]
fn should_fill_and_copy_on_the_gpu() {
    on_device(|device| {
        let a = device.create_buffer(1024, BufferKind::DeviceLocal).unwrap();
        let b = device.create_buffer(1027, BufferKind::Readback).unwrap();
        let mut cmd = device.create_command_buffer().unwrap();
        let mut rec = cmd.begin().unwrap();
        rec.fill_buffer(&a, 0, 1024, 0xA5A5_A5A5).unwrap();
        rec.fill_buffer(&a, 512, 256, 0x0102_0304).unwrap();
        rec.barrier(Stages::TRANSFER, Stages::TRANSFER);
        rec.copy_buffer(&a, 1, &b, 3, 1023).unwrap();
        rec.barrier(Stages::TRANSFER, Stages::HOST);
        rec.finish().unwrap();
        device
            .submit_and_wait(&mut cmd, std::time::Duration::from_secs(30))
            .unwrap();
        let mut got = vec![0u8; 1027];
        b.read(0, &mut got).unwrap();
        let mut a_bytes = vec![0xA5u8; 1024];
        for chunk in a_bytes[512..768].chunks_mut(4) {
            chunk.copy_from_slice(&0x0102_0304u32.to_ne_bytes());
        }
        assert_eq!(&got[3..1026], &a_bytes[1..]);
        assert_eq!(got[1026], 0, "past the copy");
    });
}

#[test]
fn should_refuse_buffers_beyond_one_allocation_as_out_of_memory() {
    on_device(|device| {
        let info = device.info();
        let too_big = info.max_memory_allocation_size.min(info.max_buffer_size) + 1;
        match device.create_buffer(too_big, BufferKind::DeviceLocal) {
            Err(Error::OutOfMemory { requested, what }) => {
                assert_eq!(requested, too_big);
                assert!(what.contains("device-local buffer"), "{what}");
            }
            other => panic!("expected OutOfMemory, got {other:?}"),
        }
    });
}

#[test]
fn should_refuse_host_access_outside_or_to_device_local_memory() {
    on_device(|device| {
        let mut mapped = device.create_buffer(10, BufferKind::Upload).unwrap();
        assert!(matches!(
            mapped.write(8, &[0; 3]),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            mapped.write(u64::MAX, &[0; 3]),
            Err(Error::InvalidArgument(_))
        ));
        mapped.write(7, &[1, 2, 3]).unwrap();
        let mut local = device.create_buffer(10, BufferKind::DeviceLocal).unwrap();
        assert!(matches!(
            local.write(0, &[0; 4]),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            device.upload(&mut local, 8, &[0; 3]),
            Err(Error::InvalidArgument(_))
        ));
        assert_eq!(
            device.align_storage_offset(1),
            device.storage_offset_alignment()
        );
    });
}
