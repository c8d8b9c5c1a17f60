//! Vocabularies whose tables or logits pass what one binding may cover
//! (`maxStorageBufferRange`, 128 MiB on lavapipe).
//!
//! Replay's logits ring (each chained step's logits copied out) holds as many steps as one
//! binding covers: a vocabulary of 600000 takes 2.4 MB a step, so fewer than 64 fit. A chain of
//! that many returns every step's logits, the first step's matching the CPU reference; a longer
//! one is refused with an error naming the limit and how many fit. A ring sized for 64 steps
//! failed at load, naming nothing.
//!
//! A table of 1.1 million bf16 rows of 64 (141 MB) is refused at load with an error that names
//! the tensor and the block formats that would fit it, not only the dispatch binding it.
//!
//! Both are built for lavapipe's 128 MiB range (where the suite runs); a device whose range is
//! larger (4 GiB on NVIDIA) would need tables of gigabytes, and there they check nothing.

use std::path::PathBuf;
use vkfuse_runtime::session::{Loaded, Replay};
use vkfuse_tests::{
    compiled_dir, reference_rows, rel_l2, validated_device, write_big_vocabulary, TABLE,
};

const VOCAB: usize = 600_000;
const TOO_MANY: usize = 1_100_000;
/// The largest binding range these tables are built for (lavapipe's, 128 MiB): past it, the
/// tests say so and check nothing.
const MOST_RANGE: u64 = 128 << 20;

/// `device`'s binding range, or None (said on stderr) past [`MOST_RANGE`]: a GPU's (4 GiB on
/// NVIDIA) would need a table of gigabytes, and lavapipe, where the suite runs, has 128 MiB.
fn range_within_most(device: &vkfuse_runtime::Device) -> Option<u64> {
    let max = u64::from(device.info().max_storage_buffer_range);
    if max > MOST_RANGE {
        eprintln!("skipped: the device's binding range is {max} bytes, past {MOST_RANGE}");
        return None;
    }
    Some(max)
}

#[test]
fn chains_return_logits_up_to_what_one_binding_holds() {
    let dir: PathBuf =
        std::env::temp_dir().join(format!("vkfuse-big-vocabulary-{}", std::process::id()));
    write_big_vocabulary(&dir, VOCAB);
    let (model, program, schedule) = compiled_dir(&dir);

    let (device, log) = validated_device();
    let Some(max) = range_within_most(&device) else {
        return;
    };
    let stride = 256 + (4 * VOCAB as u64).div_ceil(256) * 256;
    let fit = (max / stride) as u32;
    assert!(
        (1..64).contains(&fit),
        "the device's binding range ({max} bytes) holds {fit} steps' logits: this test wants 1..64"
    );
    let mut replay = Replay::new(Loaded::new(device, schedule, &model.tensors).unwrap()).unwrap();

    let out = replay.steps(Some(1), fit).unwrap();
    assert_eq!(out.len(), fit as usize);
    assert!(out.iter().all(|o| o.logits.len() == VOCAB));
    let want = &reference_rows(&program, &model.tensors, &[1])[0];
    let err = rel_l2(&out[0].logits, want);
    assert!(
        err < 5e-3,
        "the first step's logits against the reference: {err}"
    );

    replay.reset().unwrap();
    let refused = replay.steps(Some(1), fit + 1).unwrap_err().to_string();
    assert!(
        refused.contains("maxStorageBufferRange")
            && refused.contains(&format!("at most {fit} steps")),
        "{refused}"
    );
    assert!(log.is_clean(), "validation errors:\n{}", log.report());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_table_past_one_binding_is_refused_naming_it() {
    let dir: PathBuf =
        std::env::temp_dir().join(format!("vkfuse-huge-table-{}", std::process::id()));
    write_big_vocabulary(&dir, TOO_MANY);
    let (model, _, schedule) = compiled_dir(&dir);
    let (device, log) = validated_device();
    let Some(max) = range_within_most(&device) else {
        return;
    };
    assert!(
        (TOO_MANY * 64 * 2) as u64 > max,
        "the device's binding range ({max} bytes) holds the whole table: this test wants less"
    );
    let err = match Loaded::new(device, schedule, &model.tensors) {
        Ok(_) => panic!("a {TOO_MANY}-row table loaded past maxStorageBufferRange {max}"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains(&format!("`{TABLE}`")) && err.contains("--weights q8_0"),
        "{err}"
    );
    assert!(log.is_clean(), "validation errors:\n{}", log.report());
    std::fs::remove_dir_all(&dir).ok();
}
