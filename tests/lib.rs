//! Shared helpers of the end-to-end tests: the fixtures and how logits are compared.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};
use vkfuse_compiler::npy::{self, Array2};

/// The fixture models, each with transformers' logits (see fixtures/README.md).
pub const FIXTURES: &[&str] = &["qwen3-tied", "qwen3-untied", "llama-gqa", "qwen3-next"];

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the repo")
        .to_path_buf()
}

pub fn fixture_dir(name: &str) -> PathBuf {
    repo_root().join("fixtures/models").join(name)
}

/// What transformers produced for one fixture.
pub struct Expected {
    pub teacher_ids: Vec<u32>,
    pub prompt_ids: Vec<u32>,
    pub greedy_ids: Vec<u32>,
    pub teacher_logits: Array2,
    pub greedy_logits: Array2,
}

fn ids(v: &serde_json::Value, key: &str, file: &Path) -> Vec<u32> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("{}: `{key}` is not a list", file.display()))
        .iter()
        .map(|x| x.as_u64().expect("token ids are integers") as u32)
        .collect()
}

pub fn expected(name: &str) -> Expected {
    let dir = fixture_dir(name);
    let file = dir.join("reference.json");
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (fixtures are made by fixtures/make_fixtures.py)",
            file.display()
        )
    });
    let v: serde_json::Value = serde_json::from_str(&text).expect("reference.json is JSON");
    Expected {
        teacher_ids: ids(&v, "teacher_ids", &file),
        prompt_ids: ids(&v, "prompt_ids", &file),
        greedy_ids: ids(&v, "greedy_ids", &file),
        teacher_logits: npy::read(&dir.join("teacher_logits.npy")).expect("teacher logits"),
        greedy_logits: npy::read(&dir.join("greedy_logits.npy")).expect("greedy logits"),
    }
}

/// The test binary's SPIR-V, compiled once per kernel variant and shared by its tests. Validated
/// tests run one at a time (runtime/src/vulkan/validated_turn.rs), so a fresh cache per test
/// compiled the same kernels again and again, in series (the suite's test time 141 -> 110 s).
pub fn spirv_cache() -> MutexGuard<'static, vkfuse_compiler::lower::SpirvCache> {
    static CACHE: OnceLock<Mutex<vkfuse_compiler::lower::SpirvCache>> = OnceLock::new();
    // A test that panicked while compiling left whole entries only: used as is.
    CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// ‖a − b‖₂ / ‖b‖₂.
pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "logit rows differ in length");
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
        .sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

/// Asserts every row of `got` is within `tol` relative L2 of `want`; returns the worst error.
pub fn assert_rows_close(what: &str, got: &[Vec<f32>], want: &Array2, tol: f64) -> f64 {
    assert_eq!(got.len(), want.rows, "{what}: row count");
    let mut worst: f64 = 0.0;
    for (r, row) in got.iter().enumerate() {
        let e = rel_l2(row, want.row(r));
        assert!(
            e <= tol,
            "{what}: position {r}: relative L2 error {e:.3e} > {tol:.0e}"
        );
        worst = worst.max(e);
    }
    worst
}

/// Replay and eager run the same kernels in the same order: the same bits, or (where a kernel
/// sums with float atomics, whose order varies between runs) the same up to f32 reassociation,
/// which f16 KV caches (the default) can turn into a key rounded to the neighbouring f16:
/// [`ATOMICS_TOL`].
pub fn same_kernels_agree(name: &str, replay: &[f32], eager: &[f32], atomics: bool) {
    same_kernels_agree_within(name, replay, eager, atomics, ATOMICS_TOL);
}

/// Relative L2 between two runs of kernels that sum with float atomics, with f16 KV caches: a
/// key that moves by one f32 rounding can round to the other f16 (4.5e-5 seen; f32 caches stay
/// within 1e-5).
pub const ATOMICS_TOL: f64 = 2e-4;

/// Relative L2 between two runs of the same f16-dot kernels (`--dots f16`, the default for
/// q8_0/q4_0): the chain's float atomics sum in another order from run to run, and where an
/// f32 rounding of a sum moves the next layer's input across an f16 rounding boundary, that
/// element moves by a whole f16 step (2^-11 of it). On the 96-wide fixtures that reached 5.1e-4
/// between two eager runs (qwen3-untied q8_0, position 4) and 4.3e-4 between replay and eager
/// on an H200 (qwen3-tied q4_0, position 68; tests/handoff.rs), against 0 at f32 dots; a wrong
/// kernel moves them by ~1.
pub const F16_ATOMICS_TOL: f64 = 2e-3;

/// [`same_kernels_agree`] with `tol` for the float atomics' reassociation (relative L2).
pub fn same_kernels_agree_within(
    name: &str,
    replay: &[f32],
    eager: &[f32],
    atomics: bool,
    tol: f64,
) {
    if atomics {
        let d = rel_l2(replay, eager);
        assert!(
            d <= tol,
            "{name}: fused replay differs from fused eager by {d:.2e}"
        );
    } else {
        assert!(
            replay == eager,
            "{name}: fused replay differs from fused eager (same kernels, same order)"
        );
    }
}

/// A validated Vulkan device on lavapipe (or whatever `VKFUSE_DEVICE` picks), and its log,
/// which stays readable after the device is dropped.
pub fn validated_device() -> (vkfuse_runtime::Device, vkfuse_runtime::ValidationLog) {
    use vkfuse_runtime::{Device, Instance, InstanceOptions, Requirements};
    let instance =
        Instance::new(&InstanceOptions::validated()).expect("a Vulkan instance with validation");
    let adapter = instance.select_adapter(None).expect("a Vulkan device");
    let device = Device::new(&instance, &adapter, &Requirements::none()).expect("device");
    let log = instance.validation_log();
    (device, log)
}

/// The fixture `name` lowered unfused and loaded on `device`, ready for eager steps.
pub fn eager_fixture(name: &str, device: vkfuse_runtime::Device) -> vkfuse_runtime::session::Eager {
    vkfuse_runtime::session::Eager::new(loaded_fixture(name, device)).unwrap()
}

/// The fixture `name`: its model and its unfused schedule.
/// Greedy decoding the way the fixture script ran transformers: the prompt ids one step each,
/// then the device's own argmax fed back until there are as many tokens as `want.greedy_ids`.
/// Every step's logits, and the generated ids.
pub fn eager_greedy(
    eager: &mut vkfuse_runtime::session::Eager,
    want: &Expected,
) -> (Vec<Vec<f32>>, Vec<u32>) {
    let mut rows = vec![];
    let mut ids = vec![];
    for &t in &want.prompt_ids {
        let out = eager.step(Some(t)).unwrap();
        rows.push(out.logits);
        ids = vec![out.next_token];
    }
    while ids.len() < want.greedy_ids.len() {
        let out = eager.step(None).unwrap();
        rows.push(out.logits);
        ids.push(out.next_token);
    }
    (rows, ids)
}

/// The greedy tokens of `replay` from a reset: the prompt fed by the host, then the rest chosen
/// on the device, 8 steps per submit.
pub fn replay_greedy_ids(
    replay: &mut vkfuse_runtime::session::Replay,
    want: &Expected,
) -> Vec<u32> {
    replay.reset().unwrap();
    let mut ids = vec![];
    for &t in &want.prompt_ids {
        ids = vec![replay.step(Some(t)).unwrap().next_token];
    }
    let more = (want.greedy_ids.len() - ids.len()) as u32;
    ids.extend(replay.greedy_tokens(None, more, 8).unwrap());
    ids
}

pub fn fixture_schedule(
    name: &str,
) -> (
    vkfuse_compiler::import::Model,
    vkfuse_runtime::schedule::Schedule,
) {
    use vkfuse_compiler::lower::{self, Meta};
    use vkfuse_compiler::{import, trace};
    let model = import::load(&fixture_dir(name)).unwrap();
    let program = trace::trace(&model, &trace::TraceOptions::default()).unwrap();
    let meta = Meta {
        architecture: model.config.architecture.clone(),
        eos_token_ids: vec![],
        tokenizer: None,
    };
    let schedule = lower::lower(&program, &meta, &mut spirv_cache()).unwrap();
    (model, schedule)
}

/// The fixture `name` lowered unfused and loaded on `device` (for any executor).
pub fn loaded_fixture(
    name: &str,
    device: vkfuse_runtime::Device,
) -> vkfuse_runtime::session::Loaded {
    let (model, schedule) = fixture_schedule(name);
    vkfuse_runtime::session::Loaded::new(device, schedule, &model.tensors).unwrap()
}

/// `schedule` loaded on `device` with `weights`, its levels handed over as `handoffs` says
/// (`Handoffs::On` runs the kernels' handoff readers on lavapipe too, where `Auto` leaves them
/// off).
pub fn loaded_with_handoffs(
    device: &vkfuse_runtime::Device,
    schedule: vkfuse_runtime::schedule::Schedule,
    weights: &dyn vkfuse_runtime::session::TensorBytes,
    handoffs: vkfuse_runtime::session::Handoffs,
) -> vkfuse_runtime::session::Loaded {
    let options = vkfuse_runtime::session::LoadOptions {
        handoffs,
        ..Default::default()
    };
    vkfuse_runtime::session::Loaded::load(device.clone(), schedule, weights, options).unwrap()
}

/// The fixture `name` lowered with fusion: the model (its tensors feed the weights), the
/// schedule and the fusion report.
pub fn fused_schedule(
    name: &str,
) -> (
    vkfuse_compiler::import::Model,
    vkfuse_runtime::schedule::Schedule,
    vkfuse_compiler::fuse::FusionReport,
) {
    fused_schedule_with(name, &vkfuse_compiler::fuse::FuseOptions::default())
}

/// [`fused_schedule`] with fusion options `opts`.
pub fn fused_schedule_with(
    name: &str,
    opts: &vkfuse_compiler::fuse::FuseOptions,
) -> (
    vkfuse_compiler::import::Model,
    vkfuse_runtime::schedule::Schedule,
    vkfuse_compiler::fuse::FusionReport,
) {
    use vkfuse_compiler::fuse::lower_fused;
    use vkfuse_compiler::lower::Meta;
    use vkfuse_compiler::{import, trace};
    let model = import::load(&fixture_dir(name)).unwrap();
    let program = trace::trace(&model, &trace::TraceOptions::default()).unwrap();
    let meta = Meta {
        architecture: model.config.architecture.clone(),
        eos_token_ids: vec![],
        tokenizer: None,
    };
    let (schedule, report) = lower_fused(&program, &meta, &mut spirv_cache(), opts).unwrap();
    (model, schedule, report)
}

/// The fixture `name` lowered with fusion (and the fusion report), loaded on `device`, ready
/// for eager steps.
pub fn fused_fixture(
    name: &str,
    device: vkfuse_runtime::Device,
) -> (
    vkfuse_runtime::session::Eager,
    vkfuse_compiler::fuse::FusionReport,
) {
    let (model, schedule, report) = fused_schedule(name);
    let loaded = vkfuse_runtime::session::Loaded::new(device, schedule, &model.tensors).unwrap();
    (vkfuse_runtime::session::Eager::new(loaded).unwrap(), report)
}

/// The fixture `name` compiled as `compile-model` compiles it: fused, with the model's EOS ids
/// and its tokenizer when the directory has one.
pub fn compiled_fixture(
    name: &str,
) -> (
    vkfuse_compiler::import::Model,
    vkfuse_runtime::schedule::Schedule,
) {
    let (model, _, schedule) = compiled_dir(&fixture_dir(name));
    (model, schedule)
}

/// The model directory `dir` compiled as [`compiled_fixture`] compiles a fixture, with its
/// trace.
pub fn compiled_dir(
    dir: &Path,
) -> (
    vkfuse_compiler::import::Model,
    vkfuse_compiler::ir::Program,
    vkfuse_runtime::schedule::Schedule,
) {
    use vkfuse_compiler::fuse::{lower_fused, FuseOptions};
    use vkfuse_compiler::lower::Meta;
    use vkfuse_compiler::{import, trace};
    let model = import::load(dir).unwrap();
    let program = trace::trace(&model, &trace::TraceOptions::default()).unwrap();
    let (schedule, _) = lower_fused(
        &program,
        &Meta::of(&model),
        &mut spirv_cache(),
        &FuseOptions::default(),
    )
    .unwrap();
    (model, program, schedule)
}

/// [`compiled_fixture`] written to the schedule file `path`.
pub fn write_fixture_file(name: &str, path: &Path) {
    let (model, schedule) = compiled_fixture(name);
    schedule.write_file(path, &model.tensors).unwrap();
}

/// Logits of `program` fed `ids` one at a time through its unfused schedule (eager) and its
/// fused one (eager, with fused replay, its levels handed over, checked to agree at every step:
/// within `atomics_tol` where float atomics reassociate), on `device` with `weights`; returns
/// (unfused rows, fused rows, the fused replay, positioned after `ids`).
pub fn teacher_forced_rows(
    what: &str,
    atomics_tol: f64,
    program: &vkfuse_compiler::ir::Program,
    architecture: &str,
    weights: &dyn vkfuse_runtime::session::TensorBytes,
    device: &vkfuse_runtime::Device,
    ids: &[u32],
) -> (
    Vec<Vec<f32>>,
    Vec<Vec<f32>>,
    vkfuse_runtime::session::Replay,
) {
    use vkfuse_compiler::fuse::{lower_fused, FuseOptions};
    use vkfuse_compiler::lower::{self, Meta};
    use vkfuse_runtime::session::{Eager, Handoffs};
    let meta = Meta {
        architecture: architecture.to_string(),
        eos_token_ids: vec![],
        tokenizer: None,
    };
    let (unfused, fused) = {
        let mut spirv = spirv_cache();
        let unfused = lower::lower(program, &meta, &mut spirv).unwrap();
        let (fused, _) = lower_fused(program, &meta, &mut spirv, &FuseOptions::default()).unwrap();
        (unfused, fused)
    };
    let mut unfused = Eager::new(loaded_with_handoffs(
        device,
        unfused,
        weights,
        Handoffs::Off,
    ))
    .unwrap();
    let rows_u = ids
        .iter()
        .map(|&t| unfused.step(Some(t)).unwrap().logits)
        .collect();
    let (rows_f, _, replay) = fused_rows(what, atomics_tol, fused, weights, device, ids);
    (rows_u, rows_f, replay)
}

/// Logits of the fused `schedule` fed `ids` one at a time, eager and replayed with its levels
/// handed over on every device (Auto would leave them off on lavapipe, so that the kernels'
/// handoff readers run too), checked to agree at every step: within `atomics_tol` where float
/// atomics reassociate. Returns (eager rows, replay rows, the replay, positioned after `ids`).
pub fn fused_rows(
    what: &str,
    atomics_tol: f64,
    schedule: vkfuse_runtime::schedule::Schedule,
    weights: &dyn vkfuse_runtime::session::TensorBytes,
    device: &vkfuse_runtime::Device,
    ids: &[u32],
) -> (
    Vec<Vec<f32>>,
    Vec<Vec<f32>>,
    vkfuse_runtime::session::Replay,
) {
    use vkfuse_runtime::session::{Eager, Handoffs, Replay};
    let load = |s, handoffs| loaded_with_handoffs(device, s, weights, handoffs);
    let atomics = schedule.float_atomic_kernel().is_some();
    let mut eager = Eager::new(load(schedule.clone(), Handoffs::Off)).unwrap();
    let mut replay = Replay::new(load(schedule, Handoffs::On)).unwrap();
    let (mut rows_e, mut rows_r) = (vec![], vec![]);
    for &t in ids {
        let e = eager.step(Some(t)).unwrap().logits;
        let r = replay.step(Some(t)).unwrap().logits;
        same_kernels_agree_within(what, &r, &e, atomics, atomics_tol);
        rows_e.push(e);
        rows_r.push(r);
    }
    (rows_e, rows_r, replay)
}

/// Logits of `program` fed `ids` one at a time through the CPU reference over `weights`.
pub fn reference_rows(
    program: &vkfuse_compiler::ir::Program,
    weights: &dyn vkfuse_compiler::reference::WeightSource,
    ids: &[u32],
) -> Vec<Vec<f32>> {
    let mut r = vkfuse_compiler::reference::Reference::new(program, weights);
    ids.iter()
        .map(|&t| r.step(Some(t)).unwrap().logits)
        .collect()
}

/// Logits of `replay` fed `ids` one at a time by the host.
pub fn replay_rows(replay: &mut vkfuse_runtime::session::Replay, ids: &[u32]) -> Vec<Vec<f32>> {
    ids.iter()
        .map(|&t| replay.step(Some(t)).unwrap().logits)
        .collect()
}

/// Rows as one [`Array2`].
pub fn as_array(rows: &[Vec<f32>]) -> Array2 {
    Array2 {
        rows: rows.len(),
        cols: rows[0].len(),
        data: rows.concat(),
    }
}

/// For each of `schedule`'s attention blocks, whether its SPIR-V holds `word` (a constant or an
/// instruction that witnesses a variant of the kernel); at least one block.
pub fn attention_blocks_holding(
    schedule: &vkfuse_runtime::schedule::Schedule,
    word: u32,
) -> Vec<bool> {
    let blocks: Vec<bool> = schedule
        .kernels
        .iter()
        .filter(|k| k.label.starts_with("fused_attention"))
        .map(|k| k.spirv.contains(&word))
        .collect();
    assert!(!blocks.is_empty(), "no attention block");
    blocks
}

/// consume_tile()'s constant (fused_attention.glsl): an attention block whose SPIR-V holds it
/// takes the early tile (`AttnSpec::early_tile`).
pub const EARLY_TILE_WITNESS: u32 = 0x7f3a_5c11;

/// Whether any of `schedule`'s attention blocks walks its slots in subgroups
/// (`AttnSpec::subgroup_walk`: a band's at short positions, whose chunks take one pass, not a
/// grid whose chunks would take several): only that walk shuffles across lanes by xor
/// (`OpGroupNonUniformShuffleXor`, 6 words) in their SPIR-V.
pub fn walks_in_subgroups(schedule: &vkfuse_runtime::schedule::Schedule) -> bool {
    const SHUFFLE_XOR: u32 = (6 << 16) | 346;
    attention_blocks_holding(schedule, SHUFFLE_XOR)
        .iter()
        .any(|&b| b)
}

/// The tied embedding table's name in the Qwen3 fixtures.
pub const TABLE: &str = "model.embed_tokens.weight";

/// The qwen3-tied fixture (tied embedding) with a vocabulary of `vocab`: its table's rows
/// repeated, every other tensor as it is.
pub fn write_big_vocabulary(dir: &Path, vocab: usize) {
    let src = fixture_dir("qwen3-tied");
    std::fs::create_dir_all(dir).unwrap();
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("config.json")).unwrap()).unwrap();
    config["vocab_size"] = vocab.into();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let table = st.tensor(TABLE).unwrap();
    let row = table.data().len() / table.shape()[0];
    let big: Vec<u8> = table
        .data()
        .chunks(row)
        .cycle()
        .take(vocab)
        .flatten()
        .copied()
        .collect();
    let mut views: Vec<(String, safetensors::tensor::TensorView)> = st
        .tensors()
        .into_iter()
        .filter(|(name, _)| name != TABLE)
        .collect();
    let shape = vec![vocab, table.shape()[1]];
    views.push((
        TABLE.into(),
        safetensors::tensor::TensorView::new(table.dtype(), shape, &big).unwrap(),
    ));
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
}
