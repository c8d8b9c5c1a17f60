//! The schedule file (`*.vkf`): round trip, determinism, alignment, every error path, and a
//! proptest that corrupts and truncates files and demands an `Ok` or an `Err`: never a panic,
//! never an allocation out of proportion to the file. No device needed.
//!
//! The helpers that patch files by hand read the header as `docs/schedule-format.md` lays it
//! out, so these tests also check the document.

use std::alloc::{GlobalAlloc, Layout as AllocLayout, System};
use std::borrow::Cow;
use std::cell::Cell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use proptest::prelude::*;
use vkfuse_runtime::schedule::{
    crc32, Alternative, BufferDecl, BufferId, BufferRole, Dispatch, Io, KernelDecl, KernelId,
    ModelMeta, Persistent, Schedule, ScheduleError, ScheduleFile, ScheduleFileError, Section,
    Slice, TokenEncoding, Verify, WeightUpload, FORMAT_VERSION, MAGIC, WEIGHT_ALIGN,
};
use vkfuse_runtime::session::TensorBytes;

// ---------------------------------------------------------------------------------------------
// Allocation accounting: bytes allocated by this thread, and the most it held at once, so
// parallel tests do not mix.

struct Counting;

thread_local! {
    static ALLOCATED: Cell<u64> = const { Cell::new(0) };
    // Bytes this thread holds (allocated less freed by it) and the most since `peak_by`.
    static LIVE: Cell<i64> = const { Cell::new(0) };
    static PEAK: Cell<i64> = const { Cell::new(0) };
}

fn note(bytes: usize) {
    let _ = ALLOCATED.try_with(|a| a.set(a.get() + bytes as u64));
    live(bytes as i64);
}

fn live(change: i64) {
    let _ = LIVE.try_with(|l| {
        l.set(l.get() + change);
        let _ = PEAK.try_with(|p| p.set(p.get().max(l.get())));
    });
}

// SAFETY: every call forwards to the system allocator with the same arguments; the counter is a
// const-initialized thread local without a destructor, so touching it never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: AllocLayout) -> *mut u8 {
        note(layout.size());
        // SAFETY: forwarded unchanged.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: AllocLayout) -> *mut u8 {
        note(layout.size());
        // SAFETY: forwarded unchanged.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: AllocLayout, new_size: usize) -> *mut u8 {
        note(new_size);
        live(-(layout.size() as i64));
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: AllocLayout) {
        live(-(layout.size() as i64));
        // SAFETY: forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// `f()` and the bytes this thread allocated while it ran.
fn allocated_by<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let before = ALLOCATED.with(Cell::get);
    let out = f();
    (out, ALLOCATED.with(Cell::get) - before)
}

/// `f()` and the most bytes this thread held at once while it ran, beyond what it held before.
fn peak_by<T>(f: impl FnOnce() -> T) -> (T, i64) {
    let before = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(before));
    let out = f();
    (out, PEAK.with(Cell::get) - before)
}

// ---------------------------------------------------------------------------------------------
// A small synthetic schedule and its weights.

#[derive(Default)]
struct MapWeights(HashMap<String, Vec<u8>>);

impl TensorBytes for MapWeights {
    fn tensor_bytes(&self, tensor: &str) -> Result<Cow<'_, [u8]>, String> {
        self.0
            .get(tensor)
            .map(|v| Cow::Borrowed(v.as_slice()))
            .ok_or_else(|| "not in the checkpoint".to_string())
    }
}

fn bytes(seed: u32, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

fn s(buffer: u32, offset: u64, size: u64) -> Slice {
    Slice {
        buffer: BufferId(buffer),
        offset,
        size,
    }
}

fn fake_spirv(n: u32) -> Vec<u32> {
    let mut v = vec![0x0723_0203, 0x0001_0000];
    v.extend((0..n).map(|i| i.wrapping_mul(0x9E37_79B9)));
    v
}

const VOCAB: u32 = 16;

/// Three kernels, four dispatches in three levels, four uploads of three tensors (one tied),
/// one of them larger than the alignment.
fn sample() -> (Schedule, MapWeights) {
    let buffers = vec![
        BufferDecl {
            label: "weights".into(),
            size: 8192,
            role: BufferRole::Weights,
        },
        BufferDecl {
            label: "io".into(),
            size: 128,
            role: BufferRole::Io,
        },
        BufferDecl {
            label: "kv".into(),
            size: 256,
            role: BufferRole::State,
        },
        BufferDecl {
            label: "arena".into(),
            size: 512,
            role: BufferRole::Arena,
        },
    ];
    let kernels = vec![
        KernelDecl {
            label: "embed_f16".into(),
            spirv: fake_spirv(5),
            bindings: 3,
            push_constant_bytes: 8,
            spec_constants: vec![64],
            subgroups: None,
        },
        KernelDecl {
            label: "rms_norm+matvec_f16".into(),
            spirv: fake_spirv(40),
            bindings: 4,
            push_constant_bytes: 4,
            spec_constants: vec![64, 1e-6f32.to_bits()],
            subgroups: Some(2),
        },
        KernelDecl {
            label: "argmax".into(),
            spirv: fake_spirv(9),
            bindings: 2,
            push_constant_bytes: 0,
            spec_constants: vec![],
            subgroups: None,
        },
    ];
    let pc = |words: &[u32]| {
        words
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect::<Vec<u8>>()
    };
    let dispatches = vec![
        Dispatch {
            kernel: KernelId(0),
            bindings: vec![s(0, 0, 64), s(1, 0, 4), s(3, 0, 64)],
            push_constants: pc(&[16, 4]),
            workgroups: [1, 1, 1],
            label: "embed".into(),
            // Another grid below position 16 (any valid one: the file only carries it).
            alternatives: vec![Alternative {
                below: 16,
                kernel: KernelId(0),
                workgroups: [2, 1, 1],
            }],
            // Ops of a trace (any: the file only carries them).
            ops: vec![3, 5, 8],
        },
        Dispatch {
            kernel: KernelId(1),
            bindings: vec![s(3, 0, 64), s(0, 256, 100), s(0, 8064, 64), s(3, 256, 64)],
            push_constants: pc(&[16]),
            workgroups: [4, 1, 1],
            label: "rms_norm+q".into(),
            alternatives: vec![],
            ops: vec![],
        },
        Dispatch {
            kernel: KernelId(1),
            bindings: vec![s(3, 0, 64), s(0, 256, 100), s(0, 1024, 5000), s(2, 0, 256)],
            push_constants: pc(&[16]),
            workgroups: [4, 2, 1],
            label: "rms_norm+kv".into(),
            alternatives: vec![],
            ops: vec![],
        },
        Dispatch {
            kernel: KernelId(2),
            bindings: vec![s(1, 64, 64), s(1, 0, 4)],
            push_constants: vec![],
            workgroups: [1, 1, 1],
            label: "argmax".into(),
            alternatives: vec![],
            ops: vec![],
        },
    ];
    let weights = vec![
        WeightUpload {
            tensor: "model.embed_tokens.weight".into(),
            dst: s(0, 0, 64),
        },
        WeightUpload {
            tensor: "model.layers.0.input_layernorm.weight".into(),
            dst: s(0, 256, 100),
        },
        WeightUpload {
            tensor: "model.layers.0.mlp.down_proj.weight".into(),
            dst: s(0, 1024, 5000),
        },
        WeightUpload {
            tensor: "model.embed_tokens.weight".into(),
            dst: s(0, 8064, 64),
        },
    ];
    let schedule = Schedule {
        meta: ModelMeta {
            architecture: "Qwen3ForCausalLM".into(),
            vocab_size: VOCAB,
            max_context: 32,
            eos_token_ids: vec![2, 15],
            tokenizer: Some(r#"{"model": {"type": "BPE"}, "note": "ünïcode ✓"}"#.into()),
        },
        buffers,
        weights,
        kernels,
        dispatches,
        levels: vec![0..1, 1..3, 3..4],
        io: Io {
            token: s(1, 0, 4),
            token_encoding: TokenEncoding::Index,
            position: s(1, 4, 4),
            logits: s(1, 64, 64),
        },
        persistent: vec![],
    };
    // A persistent region over the last two levels (its dispatch any valid one: the file only
    // carries it).
    let mut schedule = schedule;
    schedule.persistent.push(Persistent {
        levels: 1..3,
        dispatch: Dispatch {
            label: "persistent region".into(),
            ..schedule.dispatches[1].clone()
        },
    });
    let mut w = MapWeights::default();
    for (seed, (name, n)) in [
        ("model.embed_tokens.weight", 64),
        ("model.layers.0.input_layernorm.weight", 100),
        ("model.layers.0.mlp.down_proj.weight", 5000),
    ]
    .into_iter()
    .enumerate()
    {
        w.0.insert(name.into(), bytes(seed as u32, n));
    }
    (schedule, w)
}

/// The partial files of a write to `path` left in its folder (`PATH.PID-N.partial`).
fn partial_files(path: &Path) -> Vec<PathBuf> {
    let name = path.file_name().unwrap().to_string_lossy().to_string();
    std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with(&format!("{name}.")) && n.ends_with(".partial")
        })
        .collect()
}

/// Two writers of one path at once (two compiles with the same `-o`) each write a partial file
/// of their own: the file that ends up there is one of the two schedules whole, never a mix.
#[test]
fn two_writers_of_one_path_leave_one_schedule_whole() {
    let (small, weights) = sample();
    let mut large = small.clone();
    large.meta.architecture = "x".repeat(1 << 20);
    let path = temp_path("two-writers");
    for _ in 0..16 {
        let _ = std::fs::remove_file(&path);
        std::thread::scope(|s| {
            let a = s.spawn(|| small.write_file(&path, &weights));
            let b = s.spawn(|| large.write_file(&path, &weights));
            let (a, b) = (a.join().unwrap(), b.join().unwrap());
            assert!(a.is_ok() || b.is_ok(), "{a:?} {b:?}");
        });
        let file = ScheduleFile::open(&path).expect("one schedule, whole");
        let arch = &file.schedule().meta.architecture;
        assert!(*arch == small.meta.architecture || *arch == large.meta.architecture);
    }
    let _ = std::fs::remove_file(&path);
}

fn temp_path(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("schedule_file");
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(format!("{name}-{}.vkf", std::process::id()))
}

/// The sample, written to a file; its path and bytes.
fn sample_file(name: &str) -> (PathBuf, Vec<u8>) {
    let (schedule, weights) = sample();
    let path = temp_path(name);
    schedule.write_file(&path, &weights).expect("write");
    let bytes = std::fs::read(&path).expect("read back");
    (path, bytes)
}

/// Writes `bytes` to a fresh file and opens it.
fn open_bytes(name: &str, bytes: &[u8]) -> Result<ScheduleFile, ScheduleFileError> {
    let path = temp_path(name);
    std::fs::write(&path, bytes).expect("write");
    ScheduleFile::open(&path)
}

/// `err` is a malformed-metadata error at file offset `at`.
fn assert_malformed_metadata_at(err: &ScheduleFileError, at: usize) {
    assert!(
        matches!(
            err,
            ScheduleFileError::Malformed { section: Section::Metadata, offset, .. }
                if *offset == at as u64
        ),
        "{err}"
    );
}

// The header as docs/schedule-format.md lays it out.
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}
fn meta_range(b: &[u8]) -> std::ops::Range<usize> {
    64..64 + u64_at(b, 24) as usize
}
fn weights_range(b: &[u8]) -> std::ops::Range<usize> {
    let w0 = u64_at(b, 32) as usize;
    w0..w0 + u64_at(b, 40) as usize
}

/// Recomputes the checksums of whatever the header says, where it lies inside the file, so a
/// corrupted file reaches the decoder.
fn fix_checksums(b: &mut [u8]) {
    if b.len() < 64 {
        return;
    }
    let (meta_len, w0, wl) = (u64_at(b, 24), u64_at(b, 32), u64_at(b, 40));
    if let Some(end) = 64u64.checked_add(meta_len).filter(|&e| e <= b.len() as u64) {
        let crc = crc32::checksum(&b[64..end as usize]);
        b[48..52].copy_from_slice(&crc.to_le_bytes());
    }
    if let Some(end) = w0
        .checked_add(wl)
        .filter(|&e| e.saturating_add(4) <= b.len() as u64)
    {
        let crc = crc32::checksum(&b[w0 as usize..end as usize]);
        b[end as usize..end as usize + 4].copy_from_slice(&crc.to_le_bytes());
    }
    let crc = crc32::checksum(&b[..60]);
    b[60..64].copy_from_slice(&crc.to_le_bytes());
}

// ---------------------------------------------------------------------------------------------
// Round trip and layout

#[test]
fn should_read_back_the_schedule_and_the_weight_bytes_written() {
    let (schedule, weights) = sample();
    let (path, _) = sample_file("round-trip");
    let file = ScheduleFile::open(&path).expect("open");
    assert_eq!(file.schedule(), &schedule);
    for w in &schedule.weights {
        assert_eq!(
            file.tensor_bytes(&w.tensor).unwrap(),
            weights.tensor_bytes(&w.tensor).unwrap(),
            "{}",
            w.tensor
        );
    }
    let (back, file_weights) = file.into_parts();
    assert_eq!(back, schedule);
    assert_eq!(file_weights.total_bytes(), 64 + 100 + 5000);
    assert!(file_weights.tensor_bytes("no.such.tensor").is_err());
}

#[test]
fn should_write_identical_bytes_every_time() {
    let (schedule, weights) = sample();
    let (_, first) = sample_file("determinism-1");
    let (_, second) = sample_file("determinism-2");
    assert_eq!(first, second);
    let mut streamed = Vec::new();
    let n = schedule
        .write_to(&mut streamed, &weights)
        .expect("write_to");
    assert_eq!(streamed, first);
    assert_eq!(n, first.len() as u64);
}

/// A source that makes every tensor's bytes when asked (as a conversion to a block format
/// does): a copy of the map's, owned by the caller.
struct Made(MapWeights);

impl TensorBytes for Made {
    fn tensor_bytes(&self, tensor: &str) -> Result<Cow<'_, [u8]>, String> {
        self.0.tensor_bytes(tensor).map(|b| Cow::Owned(b.to_vec()))
    }
    fn tensor_len(&self, tensor: &str) -> Result<u64, String> {
        self.0.tensor_len(tensor)
    }
}

/// The writer holds one made tensor at a time, not every one (a Qwen3-Next-80B converted to
/// q8_0 is ~85 GB of made bytes): eight of 2 MiB written with at most ~one held, and the same
/// file as the borrowed bytes give.
#[test]
fn should_hold_one_made_tensor_at_a_time_while_writing() {
    const BIG: u64 = 2 << 20;
    let (mut schedule, mut weights) = sample();
    let base = schedule.buffers[0].size;
    schedule.buffers[0].size = base + 8 * BIG;
    for i in 0..8u64 {
        let name = format!("model.layers.{i}.mlp.experts.weight");
        schedule.weights.push(WeightUpload {
            tensor: name.clone(),
            dst: s(0, base + i * BIG, BIG),
        });
        weights.0.insert(name, vec![i as u8 + 1; BIG as usize]);
    }
    let mut borrowed = Vec::new();
    schedule
        .write_to(&mut borrowed, &weights)
        .expect("write_to");
    let made = Made(weights);
    let (n, peak) = peak_by(|| {
        schedule
            .write_to(&mut std::io::sink(), &made)
            .expect("write_to")
    });
    assert_eq!(n, borrowed.len() as u64);
    assert!(
        peak < (BIG + BIG / 2) as i64,
        "the writer held {peak} bytes at once; one made tensor is {BIG}"
    );
    let mut written = Vec::new();
    schedule.write_to(&mut written, &made).expect("write_to");
    assert!(written == borrowed, "made bytes written differently");
    // A source whose tensor is not the size it told is refused, naming the tensor.
    struct Lying(Made);
    impl TensorBytes for Lying {
        fn tensor_bytes(&self, tensor: &str) -> Result<Cow<'_, [u8]>, String> {
            self.0.tensor_bytes(tensor)
        }
        fn tensor_len(&self, tensor: &str) -> Result<u64, String> {
            Ok(self.0.tensor_len(tensor)? + u64::from(tensor.contains("layers.3.mlp")))
        }
    }
    let err = schedule
        .write_to(&mut std::io::sink(), &Lying(made))
        .unwrap_err()
        .to_string();
    assert!(err.contains("model.layers.3.mlp.experts.weight"), "{err}");
}

/// The write tells its progress after each tensor (each once: the tied table is stored once),
/// in order, ending at every weight byte the file holds; and writes the file it writes silently.
#[test]
fn should_report_the_weights_written_tensor_by_tensor() {
    use vkfuse_runtime::session::Progress;
    let (schedule, weights) = sample();
    let mut reports: Vec<Progress> = vec![];
    let mut told = Vec::new();
    schedule
        .write_to_reporting(&mut told, &weights, &mut |p| reports.push(p))
        .expect("write");
    let mut silent = Vec::new();
    schedule.write_to(&mut silent, &weights).expect("write");
    assert!(told == silent);
    let total = 64 + 100 + 5000;
    let done: Vec<u64> = reports.iter().map(|p| p.done).collect();
    assert_eq!(done, [64, 164, total], "{reports:?}");
    assert!(reports.iter().all(|p| p.total == total), "{reports:?}");
}

#[test]
fn should_start_the_weights_and_every_tensor_at_a_multiple_of_4096() {
    let (path, bytes) = sample_file("alignment");
    assert_eq!(&bytes[..8], &MAGIC);
    assert_eq!(u32_at(&bytes, 8), FORMAT_VERSION);
    let file = ScheduleFile::open(&path).expect("open");
    let layout = file.layout();
    assert_eq!(layout.weights.0 % WEIGHT_ALIGN, 0);
    assert_eq!(layout.file_len, bytes.len() as u64);
    let tensors = file.weights().tensors();
    // The tied embedding is stored once.
    assert_eq!(tensors.len(), 3);
    for t in tensors {
        assert_eq!(t.offset % WEIGHT_ALIGN, 0, "{}", t.name);
        let slice = file.tensor_bytes(&t.name).unwrap();
        // Zero-copy: the slice is the mapped file at the recorded offset.
        assert!(matches!(slice, Cow::Borrowed(_)), "{}", t.name);
        assert_eq!(
            slice,
            &bytes[t.offset as usize..(t.offset + t.len) as usize]
        );
    }
    assert!(tensors
        .windows(2)
        .all(|w| w[0].offset + w[0].len <= w[1].offset));
}

#[test]
fn should_keep_the_tokenizer_verbatim_and_its_absence() {
    let (mut schedule, weights) = sample();
    let (path, _) = sample_file("tokenizer");
    let file = ScheduleFile::open(&path).expect("open");
    assert_eq!(file.schedule().meta.tokenizer, schedule.meta.tokenizer);
    assert!(file.schedule().meta.tokenizer.is_some());

    schedule.meta.tokenizer = None;
    let path = temp_path("no-tokenizer");
    schedule.write_file(&path, &weights).expect("write");
    let file = ScheduleFile::open(&path).expect("open");
    assert_eq!(file.schedule(), &schedule);
}

#[test]
fn should_keep_the_token_key_encoding_and_refuse_an_unknown_one() {
    let (mut schedule, weights) = sample();
    schedule.io.token = s(1, 0, 8);
    schedule.io.position = s(1, 8, 4);
    let path = temp_path("token-index");
    schedule.write_file(&path, &weights).expect("write");
    let index = std::fs::read(&path).expect("read back");

    schedule.io.token_encoding = TokenEncoding::Key;
    let path = temp_path("token-key");
    schedule.write_file(&path, &weights).expect("write");
    let file = ScheduleFile::open(&path).expect("open");
    assert_eq!(file.schedule(), &schedule);
    let mut key = std::fs::read(&path).expect("read back");

    // The one metadata byte that differs is the encoding's.
    let at = (64..index.len())
        .find(|&i| index[i] != key[i])
        .expect("the encodings differ");
    assert_eq!((index[at], key[at]), (0, 1));
    key[at] = 7;
    fix_checksums(&mut key);
    let err = open_bytes("token-encoding", &key).unwrap_err();
    assert!(
        err.to_string().contains("io token: unknown encoding 7"),
        "{err}"
    );
    // At the byte itself.
    assert_malformed_metadata_at(&err, at);

    // A key needs 8 bytes, 8-aligned.
    schedule.io.token = s(1, 0, 4);
    let err = schedule.validate().unwrap_err().to_string();
    assert!(
        err.contains("io token must be a host-visible slice of at least 8 bytes"),
        "{err}"
    );
    schedule.io.token = s(1, 4, 8);
    schedule.io.position = s(1, 0, 4);
    let err = schedule.validate().unwrap_err().to_string();
    assert!(
        err.contains("a key must start at a multiple of 8 bytes, not 4"),
        "{err}"
    );
}

#[test]
fn should_reject_a_tokenizer_tag_other_than_0_or_1() {
    // The tag follows architecture, vocab_size, max_context and the eos ids (two of them).
    let (_, mut b) = sample_file("tokenizer-tag-src");
    let at = 64 + 4 + u32_at(&b, 64) as usize + 8 + 4 + 2 * 4;
    assert_eq!(b[at], 1, "the sample has a tokenizer");
    b[at] = 7;
    fix_checksums(&mut b);
    let err = open_bytes("tokenizer-tag", &b).unwrap_err();
    assert_malformed_metadata_at(&err, at);
    assert!(err.to_string().contains("tokenizer presence"), "{err}");
}

#[test]
fn should_round_trip_a_schedule_without_weights() {
    let (mut schedule, _) = sample();
    schedule.weights.clear();
    let path = temp_path("no-weights");
    schedule
        .write_file(&path, &MapWeights::default())
        .expect("write");
    let file = ScheduleFile::open(&path).expect("open");
    assert_eq!(file.schedule(), &schedule);
    assert_eq!(file.layout().weights.1, 0);
}

// ---------------------------------------------------------------------------------------------
// Writer errors

#[test]
fn should_refuse_to_write_a_schedule_that_does_not_validate() {
    let (mut schedule, weights) = sample();
    schedule.dispatches[1].kernel = KernelId(9);
    let err = schedule.write_to(&mut Vec::new(), &weights).unwrap_err();
    assert!(matches!(err, ScheduleFileError::Unwritable(_)), "{err}");
    assert!(
        err.to_string().contains("kernel k9 does not exist"),
        "{err}"
    );
}

#[test]
fn should_refuse_alternatives_that_could_not_stand_in_for_their_dispatch() {
    let alt = |below, kernel, workgroups| Alternative {
        below,
        kernel: KernelId(kernel),
        workgroups,
    };
    for (alternatives, names) in [
        (vec![alt(0, 0, [1, 1, 1])], "positive and ascending"),
        (
            vec![alt(8, 0, [1, 1, 1]), alt(8, 0, [2, 1, 1])],
            "positive and ascending",
        ),
        (vec![alt(8, 7, [1, 1, 1])], "kernel k7 does not exist"),
        // Kernel 2 binds 2 buffers, the embedding's kernel 0 three.
        (
            vec![alt(8, 2, [1, 1, 1])],
            "kernel `argmax` does not bind, take push constants",
        ),
        (vec![alt(8, 0, [1, 0, 1])], "empty workgroup count"),
    ] {
        let (mut schedule, weights) = sample();
        schedule.dispatches[0].alternatives = alternatives;
        let err = schedule.write_to(&mut Vec::new(), &weights).unwrap_err();
        assert!(matches!(err, ScheduleFileError::Unwritable(_)), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("dispatch 0 (embed), alternative below") && msg.contains(names),
            "{msg}"
        );
    }
    // The validation error of `schedule`, which must not be written.
    let refused = |schedule: &Schedule, weights: &MapWeights| {
        let err = schedule.write_to(&mut Vec::new(), weights).unwrap_err();
        assert!(matches!(err, ScheduleFileError::Unwritable(_)), "{err}");
        err.to_string()
    };
    // Inside a persistent region (levels 1..3: dispatches 1..4), whose dispatch replaces them.
    let (mut schedule, weights) = sample();
    schedule.dispatches[3].alternatives = vec![alt(8, 2, [1, 1, 1])];
    let msg = refused(&schedule, &weights);
    assert!(
        msg.contains("dispatch 3 (argmax): alternative grids inside persistent region"),
        "{msg}"
    );
    // On a region's own dispatch, which replaces levels whose grids it chose itself.
    let (mut schedule, weights) = sample();
    schedule.persistent[0].dispatch.alternatives = vec![alt(8, 1, [1, 1, 1])];
    let msg = refused(&schedule, &weights);
    assert!(
        msg.contains("persistent region 0 (persistent region): alternative grids"),
        "{msg}"
    );
    // More bounds than replay records bands for.
    let (mut schedule, weights) = sample();
    schedule.dispatches[0].alternatives = (1..=17).map(|b| alt(b, 0, [1, 1, 1])).collect();
    let msg = refused(&schedule, &weights);
    assert!(
        msg.contains("17 bounds of alternative grids, more than the 16 bands"),
        "{msg}"
    );
    schedule.dispatches[0].alternatives.pop();
    schedule.write_to(&mut Vec::new(), &weights).unwrap();
}

#[test]
fn should_refuse_ops_out_of_order_or_named_twice() {
    // Profiles pair a fused dispatch with the plain ones by its ops: each named once, in order.
    for ops in [vec![8, 3], vec![3, 3]] {
        let (mut schedule, weights) = sample();
        schedule.dispatches[0].ops = ops.clone();
        let err = schedule.write_to(&mut Vec::new(), &weights).unwrap_err();
        assert!(matches!(err, ScheduleFileError::Unwritable(_)), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("dispatch 0 (embed)") && msg.contains("not strictly ascending"),
            "{msg}"
        );
    }
}

#[test]
fn should_refuse_a_load_time_workgroup_without_a_size_or_out_of_range() {
    for (subgroups, spec) in [(0, vec![64]), (33, vec![64]), (2, vec![])] {
        let (mut schedule, weights) = sample();
        schedule.kernels[2].subgroups = Some(subgroups);
        schedule.kernels[2].spec_constants = spec;
        let err = schedule.write_to(&mut Vec::new(), &weights).unwrap_err();
        assert!(matches!(err, ScheduleFileError::Unwritable(_)), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("kernel 2 `argmax`") && msg.contains(&format!("{subgroups} subgroups")),
            "{msg}"
        );
    }
}

#[test]
fn should_name_a_missing_or_missized_weight_and_leave_no_file() {
    let (schedule, mut weights) = sample();
    weights.0.remove("model.layers.0.input_layernorm.weight");
    let path = temp_path("missing-weight");
    let _ = std::fs::remove_file(&path);
    let err = schedule.write_file(&path, &weights).unwrap_err();
    assert!(
        matches!(&err, ScheduleFileError::Weight { tensor, .. }
            if tensor == "model.layers.0.input_layernorm.weight"),
        "{err}"
    );
    assert!(!path.exists());
    assert_eq!(partial_files(&path), Vec::<PathBuf>::new());

    let (schedule, mut weights) = sample();
    weights
        .0
        .insert("model.embed_tokens.weight".into(), vec![0; 63]);
    let err = schedule.write_to(&mut Vec::new(), &weights).unwrap_err();
    assert_eq!(
        err.to_string(),
        "weight `model.embed_tokens.weight`: 63 bytes, the schedule expects 64"
    );
}

// ---------------------------------------------------------------------------------------------
// Reader errors

#[test]
fn should_name_the_file_it_cannot_open() {
    let path = temp_path("does-not-exist");
    let _ = std::fs::remove_file(&path);
    let err = ScheduleFile::open(&path).unwrap_err();
    assert!(matches!(err, ScheduleFileError::Io { .. }));
    assert!(err.to_string().contains("does-not-exist"), "{err}");
}

/// A device (or a fifo, whose opening would wait for a writer) is refused before it is opened.
#[test]
fn should_refuse_a_device_or_fifo_before_opening_it() {
    let err = ScheduleFile::open("/dev/null").unwrap_err();
    assert!(
        matches!(err, ScheduleFileError::SpecialFile { .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains("/dev/null: not a regular file"),
        "{err}"
    );
}

#[test]
fn should_say_a_file_with_another_magic_is_not_a_schedule() {
    for (name, content) in [
        ("text", b"hello, world\n".to_vec()),
        ("short", b"VKF".to_vec().into_iter().chain([b'X']).collect()),
        ("safetensors", {
            let (_, mut b) = sample_file("magic-src");
            b[0] = b'v';
            b
        }),
    ] {
        let err = open_bytes(&format!("bad-magic-{name}"), &content).unwrap_err();
        assert!(
            matches!(err, ScheduleFileError::BadMagic { .. }),
            "{name}: {err}"
        );
        assert!(
            err.to_string().contains("not a vkfuse schedule file"),
            "{err}"
        );
        assert!(
            err.to_string().contains(&format!("bad-magic-{name}")),
            "{err}"
        );
    }
}

#[test]
fn should_reject_a_newer_version_saying_which() {
    let (_, mut b) = sample_file("version-src");
    b[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    // A newer writer seals its header (every version so far keeps the checksum there).
    let crc = crc32::checksum(&b[..60]);
    b[60..64].copy_from_slice(&crc.to_le_bytes());
    // Whatever a newer version changed, the version is reported first.
    b[200] ^= 0xff;
    let err = open_bytes("version", &b).unwrap_err();
    match &err {
        ScheduleFileError::UnsupportedVersion {
            found, supported, ..
        } => {
            assert_eq!((*found, *supported), (FORMAT_VERSION + 1, FORMAT_VERSION));
        }
        e => panic!("{e}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("version {} is newer", FORMAT_VERSION + 1)),
        "{msg}"
    );
    assert!(msg.contains("upgrade vkfuse"), "{msg}");
    assert!(!msg.contains("damaged"), "{msg}");

    b[8..12].copy_from_slice(&0u32.to_le_bytes());
    let err = open_bytes("version-0", &b).unwrap_err();
    assert!(
        matches!(err, ScheduleFileError::UnsupportedVersion { found: 0, .. }),
        "{err}"
    );
}

#[test]
fn should_refuse_a_version_1_file_asking_to_recompile() {
    // Version 1 had no tokenizer in its metadata; this build reads version 9 only.
    assert_eq!(FORMAT_VERSION, 9);
    let (_, mut b) = sample_file("version-1-src");
    b[8..12].copy_from_slice(&1u32.to_le_bytes());
    fix_checksums(&mut b);
    let err = open_bytes("version-1", &b).unwrap_err();
    assert!(
        matches!(
            err,
            ScheduleFileError::UnsupportedVersion {
                found: 1,
                supported: 9,
                ..
            }
        ),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("schedule format version 1 is not supported (this vkfuse reads version 9)"),
        "{msg}"
    );
    assert!(msg.contains("recompile the model"), "{msg}");
    assert!(!msg.contains("damaged"), "{msg}");
}

#[test]
fn should_say_a_version_byte_may_be_damaged_when_the_header_checksum_fails() {
    let (_, mut b) = sample_file("version-flip-src");
    b[8] ^= 0xf0;
    let err = open_bytes("version-flip", &b).unwrap_err();
    assert!(
        matches!(
            err,
            ScheduleFileError::UnsupportedVersion {
                header_intact: false,
                ..
            }
        ),
        "{err}"
    );
    let msg = err.to_string();
    // The damage leads: random bytes are likelier than a future version.
    let damaged = msg.find(": the file is damaged: its header checksum does not match");
    let newer = msg.find("newer than this vkfuse");
    assert!(damaged.is_some() && damaged < newer, "{msg}");
}

#[test]
fn should_name_the_section_a_truncated_file_ends_in() {
    let (_, b) = sample_file("truncate-src");
    let meta = meta_range(&b);
    let weights = weights_range(&b);
    let cases = [
        (0, Section::Header, 64),
        (12, Section::Header, 64),
        (63, Section::Header, 64),
        (64, Section::Metadata, meta.end as u64),
        (
            meta.start + meta.len() / 2,
            Section::Metadata,
            meta.end as u64,
        ),
        (meta.end + 1, Section::Weights, weights.end as u64),
        (
            weights.start + 4096 + 7,
            Section::Weights,
            weights.end as u64,
        ),
        (weights.end, Section::Trailer, b.len() as u64),
        (b.len() - 1, Section::Trailer, b.len() as u64),
    ];
    for (len, section, expected) in cases {
        let err = open_bytes("truncated", &b[..len]).unwrap_err();
        match &err {
            ScheduleFileError::Truncated {
                section: s,
                expected: e,
                actual,
                ..
            } => assert_eq!(
                (*s, *e, *actual),
                (section, expected, len as u64),
                "cut at {len}: {err}"
            ),
            e => panic!("cut at {len}: {e}"),
        }
        assert!(err.to_string().contains("truncated in the"), "{err}");
    }
}

#[test]
fn should_report_a_flipped_metadata_byte_as_a_metadata_checksum_mismatch() {
    let (_, mut b) = sample_file("flip-meta-src");
    let meta = meta_range(&b);
    b[meta.start + meta.len() / 3] ^= 0x10;
    let err = open_bytes("flip-meta", &b).unwrap_err();
    assert!(
        matches!(
            err,
            ScheduleFileError::ChecksumMismatch {
                section: Section::Metadata,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("checksum mismatch in the metadata"),
        "{err}"
    );
}

#[test]
fn should_report_a_flipped_weight_byte_as_a_weights_checksum_mismatch() {
    let (_, mut b) = sample_file("flip-weights-src");
    let w = weights_range(&b);
    b[w.start + 4096 + 1234] ^= 0x01;
    let err = open_bytes("flip-weights", &b).unwrap_err();
    assert!(
        matches!(
            err,
            ScheduleFileError::ChecksumMismatch {
                section: Section::Weights,
                ..
            }
        ),
        "{err}"
    );
    // Tools that never upload the weights may skip that check, and their dump says so.
    let path = temp_path("flip-weights");
    let skipped = ScheduleFile::open_with(&path, Verify::SkipWeightsChecksum).unwrap();
    let dump = skipped.to_string();
    assert!(
        dump.contains("(stored, not checked: loading checks it)"),
        "{dump}"
    );
    let (good, _) = sample_file("flip-weights-good");
    let dump = ScheduleFile::open(&good).unwrap().to_string();
    assert!(!dump.contains("not checked"), "{dump}");
}

#[test]
fn should_report_a_flipped_header_byte_as_a_header_checksum_mismatch() {
    let (_, mut b) = sample_file("flip-header-src");
    b[25] ^= 0x01; // the metadata length
    let err = open_bytes("flip-header", &b).unwrap_err();
    assert!(
        matches!(
            err,
            ScheduleFileError::ChecksumMismatch {
                section: Section::Header,
                ..
            }
        ),
        "{err}"
    );
}

/// No checksum covers the padding between the metadata and the weights: a byte there is
/// found by the zeros it must be, and named by its offset.
#[test]
fn should_reject_a_nonzero_byte_in_the_padding() {
    let (_, mut b) = sample_file("padding-src");
    let at = meta_range(&b).end;
    assert!(at < u64_at(&b, 32) as usize, "the sample has padding");
    b[at] = 1;
    let err = open_bytes("padding", &b).unwrap_err();
    assert_malformed_metadata_at(&err, at);
    assert!(err.to_string().contains("padding"), "{err}");
}

#[test]
fn should_reject_bytes_after_the_trailer() {
    let (_, mut b) = sample_file("trailing-src");
    b.extend_from_slice(b"junk");
    let err = open_bytes("trailing", &b).unwrap_err();
    assert!(
        matches!(
            err,
            ScheduleFileError::Malformed {
                section: Section::Trailer,
                ..
            }
        ),
        "{err}"
    );
}

/// A section length or offset whose sum overflows names the field it is stored in: the
/// metadata's length (byte 24), the weights section's offset and length (32).
#[test]
fn should_name_the_header_field_whose_sum_overflows() {
    let (_, b) = sample_file("overflow-src");
    // The weights' offset must stay a multiple of 4096 to reach the sum.
    let aligned_max = u64::MAX - 4095;
    for (at, value, want) in [
        (24usize, u64::MAX, 24u64),
        (32, aligned_max, 32),
        (40, u64::MAX, 32),
    ] {
        let mut b = b.clone();
        b[at..at + 8].copy_from_slice(&value.to_le_bytes());
        if at == 32 {
            // A length that takes the offset past 2^64.
            b[40..48].copy_from_slice(&8192u64.to_le_bytes());
        }
        fix_checksums(&mut b);
        let err = open_bytes("overflow", &b).unwrap_err();
        assert!(
            matches!(
                err,
                ScheduleFileError::Malformed { section: Section::Header, offset, .. }
                    if offset == want
            ),
            "byte {at}: {err}"
        );
        assert!(err.to_string().contains("overflow"), "byte {at}: {err}");
    }
}

#[test]
fn should_reject_at_open_a_schedule_that_does_not_validate() {
    // vocab_size follows the architecture string (u32 length + bytes) at the metadata's start.
    let (_, mut b) = sample_file("invalid-src");
    let at = 64 + 4 + u32_at(&b, 64) as usize;
    assert_eq!(u32_at(&b, at), VOCAB);
    b[at..at + 4].copy_from_slice(&0u32.to_le_bytes());
    fix_checksums(&mut b);
    let err = open_bytes("invalid", &b).unwrap_err();
    match &err {
        ScheduleFileError::Invalid {
            error: ScheduleError::Invalid(m),
            ..
        } => assert!(m.contains("vocab_size"), "{m}"),
        e => panic!("{e}"),
    }
    assert!(err.to_string().contains("invalid-"), "{err}");
    // Named once: the validation error is in the message and not also the source, which a
    // caller printing the chain (`{:#}`) would print again.
    assert!(std::error::Error::source(&err).is_none(), "{err}");
}

#[test]
fn should_reject_a_count_larger_than_the_bytes_left_without_allocating_it() {
    // The eos count follows architecture, vocab_size and max_context.
    let (_, mut b) = sample_file("huge-count-src");
    let at = 64 + 4 + u32_at(&b, 64) as usize + 8;
    b[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    fix_checksums(&mut b);
    let (result, allocated) = allocated_by(|| open_bytes("huge-count", &b));
    let err = result.unwrap_err();
    assert_malformed_metadata_at(&err, at);
    assert!(allocated < 1 << 20, "{allocated} bytes allocated");
}

// ---------------------------------------------------------------------------------------------
// The text dump

#[test]
fn should_dump_every_table_readably() {
    let (path, _) = sample_file("dump");
    let file = ScheduleFile::open(&path).expect("open");
    let text = vkfuse_runtime::schedule::dump(file.schedule());
    for needle in [
        "schedule Qwen3ForCausalLM: vocab 16, max context 32, eos [2, 15], tokenizer 51 bytes",
        "4 buffers (8.9 KiB), 4 weight uploads (5.1 KiB), 3 kernels, 4 dispatches in 3 levels",
        // Its kernels declare no capability a device may lack (compile_model_cli checks the
        // others on compiled schedules).
        "  needs: compute only\n",
        "io: token b1[+0,4] position b1[+4,4] logits b1[+64,64]",
        "b0   weights          8192 (8.0 KiB)  weights",
        "b2   state             256 (256 B)  kv",
        "k1   rms_norm+matvec_f16: 42 words of SPIR-V, 4 bindings, 4 push-constant bytes, \
         spec [64, 897988541], workgroup 2 subgroups (at load)",
        "  level 1\n    d1    k1 [4,1,1] b3[+0,64] b0[+256,100] b0[+8064,64] b3[+256,64] \
         push [16] rms_norm+q\n    d2    k1 [4,2,1]",
        "d3    k2 [1,1,1] b1[+64,64] b1[+0,4] argmax",
        // Its ops, which an unfused-style label does not list.
        "push [16 4] embed (#3 #5 #8)\n          below position 16: k0 [2,1,1]\n",
        "weights (4 uploads, 5228 bytes):",
        "model.layers.0.mlp.down_proj.weight -> b0[+1024,5000]",
        "persistent regions: 1 (applied where the device keeps every workgroup resident: 2 levels then)",
        "    p0   levels 1..3 k1 [4,1,1] b3[+0,64]",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
    let whole = file.to_string();
    assert!(whole.contains("vkfuse schedule format 9"), "{whole}");
    assert!(whole.contains("tensors in the file (3):"), "{whole}");
    assert!(whole.contains(&text), "{whole}");
}

#[test]
fn should_dump_an_invalid_schedule_without_panicking() {
    let (mut schedule, _) = sample();
    schedule.levels = vec![0..2, 5..9];
    schedule.dispatches[0].push_constants = vec![1, 2, 3];
    let text = schedule.to_string();
    assert!(text.contains("dispatches 5..9 do not exist"), "{text}");
    assert!(text.contains("in no level"), "{text}");
    assert!(text.contains("push [01 02 03]"), "{text}");
}

// ---------------------------------------------------------------------------------------------
// Corruption never panics

#[derive(Clone, Debug)]
struct Corruption {
    /// (position as a fraction of the length, xor mask)
    flips: Vec<(f64, u8)>,
    /// Bias the flips into the header and metadata, where the decoder lives.
    into_metadata: bool,
    fix_checksums: bool,
    truncate: Option<f64>,
}

fn corruption() -> impl Strategy<Value = Corruption> {
    (
        prop::collection::vec((0.0f64..1.0, 1u8..=255), 0..8),
        any::<bool>(),
        prop::bool::weighted(0.7),
        prop::option::weighted(0.3, 0.0f64..1.0),
    )
        .prop_map(
            |(flips, into_metadata, fix_checksums, truncate)| Corruption {
                flips,
                into_metadata,
                fix_checksums,
                truncate,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn should_return_ok_or_err_on_any_corruption_without_panicking(c in corruption()) {
        thread_local! {
            static SOURCE: Vec<u8> = sample_file("prop-src").1;
        }
        let mut b = SOURCE.with(Clone::clone);
        let span = if c.into_metadata { meta_range(&b).end } else { b.len() };
        for &(at, mask) in &c.flips {
            let i = ((at * span as f64) as usize).min(span - 1);
            b[i] ^= mask;
        }
        if c.fix_checksums {
            fix_checksums(&mut b);
        }
        if let Some(t) = c.truncate {
            b.truncate((t * b.len() as f64) as usize);
        }
        let len = b.len() as u64;
        let (result, allocated) = allocated_by(|| open_bytes("prop", &b));
        // Bounded by the file, whatever the lengths inside claim.
        prop_assert!(
            allocated <= 16 * len + (1 << 16),
            "{allocated} bytes allocated for a file of {len}"
        );
        if c.flips.is_empty() && c.truncate.is_none() {
            prop_assert!(result.is_ok(), "{}", result.unwrap_err());
        }
        if let Err(e) = result {
            // Every error names the file.
            prop_assert!(e.to_string().contains("prop-"), "{e}");
        }
    }
}
