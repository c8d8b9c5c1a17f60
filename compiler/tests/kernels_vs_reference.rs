//! Every kernel against the CPU reference interpreter, on whatever Vulkan device is here
//! (lavapipe on the CPU machines), with the validation layer on.
//!
//! Each test builds a one-op (or few-op) program whose inputs are `weight` ops (random values,
//! rounded to the weight's dtype for both sides) or states (set on the reference and uploaded
//! the same way), runs it on the reference and on the device through `kernels::select` +
//! `kernels::compile` (one buffer per value, one dispatch per op, a barrier between), and
//! compares every computed value and every written state. Tolerance: relative L2 <= 1e-5
//! unless a test says otherwise; copies, selections and integer results must match exactly.
//! Every buffer carries a guard tail after its bound range, checked after each run: a kernel
//! writing past its range fails the test.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use half::{bf16, f16};
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence};
use vkfuse_compiler::ir::{
    DType, F32Attr, OpId, OpKind, Program, Shape, StateId, StateKind, Type, ValueId,
};
use vkfuse_compiler::kernels::{self, KernelCall};
use vkfuse_compiler::quant;
use vkfuse_compiler::reference::{Data, Reference, Tensor};
use vkfuse_runtime::{
    Buffer, BufferBinding, BufferKind, Device, Instance, InstanceOptions, Pipeline, Requirements,
    SpecConstants, ValidationLog,
};

const WAIT: Duration = Duration::from_secs(120);
/// Bytes after each buffer's bound range, filled with [`CANARY`] and checked after the run.
const GUARD: u64 = 64;
const CANARY: u32 = 0xDEAD_BEEF;

// ---------------------------------------------------------------------------------------------
// The device, shared by every test of this binary.

/// A kernel variant: its name and defines (what decides the SPIR-V).
type Variant = (String, Vec<(String, String)>);
/// A pipeline: the variant, its specialization constants and push-constant bytes.
type PipelineKey = (Variant, Vec<u32>, usize);

struct Gpu {
    device: Device,
    log: ValidationLog,
    spirv: HashMap<Variant, Vec<u32>>,
    pipelines: HashMap<PipelineKey, Arc<Pipeline>>,
    _instance: Instance,
}

fn gpu() -> MutexGuard<'static, Gpu> {
    static GPU: OnceLock<Mutex<Gpu>> = OnceLock::new();
    let cell = GPU.get_or_init(|| {
        let instance =
            Instance::new(&InstanceOptions::validated()).expect("Vulkan with the validation layer");
        assert!(instance.validation_enabled());
        let adapter = instance.select_adapter(None).expect("a Vulkan device");
        let device = Device::new(&instance, &adapter, &Requirements::none()).expect("device");
        let log = instance.validation_log();
        Mutex::new(Gpu {
            device,
            log,
            spirv: HashMap::new(),
            pipelines: HashMap::new(),
            _instance: instance,
        })
    });
    // A test that panicked while holding the lock leaves the device usable.
    cell.lock().unwrap_or_else(|e| e.into_inner())
}

impl Gpu {
    fn pipeline(&mut self, call: &KernelCall) -> Arc<Pipeline> {
        let variant: Variant = (call.kernel.to_string(), call.defines.clone());
        let spirv = self
            .spirv
            .entry(variant.clone())
            .or_insert_with(|| {
                kernels::compile(call.kernel, &call.defines).unwrap_or_else(|e| panic!("{e}"))
            })
            .clone();
        let key: PipelineKey = (
            variant,
            call.spec_constants.clone(),
            call.push_constants.len(),
        );
        let device = &self.device;
        self.pipelines
            .entry(key)
            .or_insert_with(|| {
                let spec = call
                    .spec_constants
                    .iter()
                    .enumerate()
                    .fold(SpecConstants::new(), |s, (i, v)| s.u32(i as u32, *v));
                let pipeline = device
                    .create_pipeline(
                        &spirv,
                        &spec,
                        call.bindings as u32,
                        call.push_constants.len() as u32,
                    )
                    .unwrap_or_else(|e| panic!("pipeline of {call}: {e}"));
                Arc::new(pipeline)
            })
            .clone()
    }
}

// ---------------------------------------------------------------------------------------------
// Test programs.

/// A deterministic generator for the data of one case (its seed comes from proptest).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // SplitMix64.
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [lo, hi).
    fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next() >> 40) as f32 / (1u64 << 24) as f32)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
}

/// The value as stored in `dtype` and read back as f32 (what both sides see).
fn round(dtype: DType, v: f32) -> f32 {
    match dtype {
        DType::F32 => v,
        DType::F16 => f16::from_f32(v).to_f32(),
        DType::BF16 => bf16::from_f32(v).to_f32(),
        DType::I32 => unreachable!("weights are float"),
        DType::Q8_0 | DType::Q4_0 => unreachable!("block formats are encoded by rows"),
    }
}

/// A program under construction with its weights and initial states.
struct Case {
    p: Program,
    weights: HashMap<String, Vec<f32>>,
    /// The bytes of block-quantised weights (`weights` holds them dequantised).
    encoded: HashMap<String, Vec<u8>>,
    states: Vec<(StateId, Tensor)>,
    rng: Rng,
}

impl Case {
    fn new(seed: u64) -> Case {
        Case {
            p: Program::new(),
            weights: HashMap::new(),
            encoded: HashMap::new(),
            states: vec![],
            rng: Rng(seed),
        }
    }

    /// A weight with the given values (rounded to `dtype`; block formats quantised, and the
    /// reference reads them dequantised from the bytes the device gets).
    fn weight_data(&mut self, dtype: DType, dims: &[usize], data: Vec<f32>) -> ValueId {
        assert_eq!(data.len(), dims.iter().product::<usize>());
        let name = format!("w{}", self.weights.len());
        let values = if dtype.is_quantized() {
            let cols = *dims.last().expect("rank >= 1");
            let mut bytes = vec![];
            quant::blocks::encode(dtype, &data, cols, &mut bytes);
            let values = quant::blocks::decode(dtype, &bytes, cols);
            self.encoded.insert(name.clone(), bytes);
            values
        } else {
            data.into_iter().map(|v| round(dtype, v)).collect()
        };
        self.weights.insert(name.clone(), values);
        let kind = OpKind::Weight { name };
        self.p
            .push(kind, vec![], Some(Type::new(dtype, dims)))
            .expect("weight")
            .expect("result")
    }

    /// A weight of values uniform in [lo, hi).
    fn weight_in(&mut self, dtype: DType, dims: &[usize], lo: f32, hi: f32) -> ValueId {
        let data = self.rng.vec(dims.iter().product(), lo, hi);
        self.weight_data(dtype, dims, data)
    }

    /// A weight of values uniform in [-1, 1).
    fn weight(&mut self, dtype: DType, dims: &[usize]) -> ValueId {
        self.weight_in(dtype, dims, -1.0, 1.0)
    }

    /// An f32 activation (an f32 weight).
    fn f32(&mut self, dims: &[usize]) -> ValueId {
        self.weight(DType::F32, dims)
    }

    /// Declares a state holding `value` and reads it.
    fn state(&mut self, kind: StateKind, value: Tensor) -> (StateId, ValueId) {
        let dtype = if matches!(value.data, Data::I32(_)) {
            DType::I32
        } else {
            DType::F32
        };
        let name = format!("s{}", self.states.len());
        let id = self.p.add_state(name, kind, Type::new(dtype, value.dims()));
        self.states.push((id, value));
        let v = self.op(OpKind::ReadState { state: id }, vec![]);
        (id, v)
    }

    /// The position state, read.
    fn position(&mut self, pos: i32) -> ValueId {
        self.state(StateKind::Position, Tensor::i32(&[1], vec![pos]))
            .1
    }

    fn op(&mut self, kind: OpKind, args: Vec<ValueId>) -> ValueId {
        self.p
            .value(kind, args)
            .unwrap_or_else(|e| panic!("test program: {e}"))
    }
}

/// A value that tests rounding to f16: a midpoint between two neighbouring finite f16s (a tie),
/// one a little off such a midpoint, a value in f16's subnormal range, one near its largest
/// finite value (65504; 65520 and above round to infinity), or one of any magnitude.
fn f16_rounding_probe(rng: &mut Rng) -> f32 {
    let sign = if rng.below(2) == 0 { 1.0 } else { -1.0 };
    // Neighbouring finite f16s: h < 0x7bff (65504), so h + 1 is finite too.
    let h = rng.below(0x7bff) as u16;
    let (lo, hi) = (f16::from_bits(h).to_f32(), f16::from_bits(h + 1).to_f32());
    // The edges: 65520 (the tie that rounds to infinity) and the f32 below it, the smallest
    // subnormal's half (a tie to zero) and 2^-14 (the smallest normal) and the f32s around it.
    let edges = [
        65520.0,
        f32::from_bits(65520f32.to_bits() - 1),
        2f32.powi(-25),
        2f32.powi(-14),
        f32::from_bits(2f32.powi(-14).to_bits() - 1),
        f32::from_bits(2f32.powi(-14).to_bits() + 1),
    ];
    sign * match rng.below(6) {
        0 => (lo + hi) / 2.0,
        1 => (lo + hi) / 2.0 * (1.0 + (rng.uniform(-1.0, 1.0) * 1e-6)),
        2 => rng.uniform(0.0, 6.2e-5),
        3 => rng.uniform(65000.0, 66000.0),
        4 => edges[rng.below(edges.len())],
        _ => rng.uniform(1.0, 2.0) * 2f32.powi(rng.below(48) as i32 - 30),
    }
}

/// How results must agree.
#[derive(Clone, Copy, Debug)]
enum Tol {
    Exact,
    RelL2(f64),
}

const DEFAULT: Tol = Tol::RelL2(1e-5);

fn compare(what: &str, got: &[f32], want: &[f32], tol: Tol) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), want.len(), "{}: length", what);
    match tol {
        Tol::Exact => {
            for (i, (g, w)) in got.iter().zip(want).enumerate() {
                prop_assert!(
                    g.to_bits() == w.to_bits(),
                    "{}: element {} is {} on the device, {} on the reference",
                    what,
                    i,
                    g,
                    w
                );
            }
        }
        Tol::RelL2(max) => {
            let diff: f64 = got
                .iter()
                .zip(want)
                .map(|(g, w)| (*g as f64 - *w as f64).powi(2))
                .sum::<f64>()
                .sqrt();
            let norm: f64 = want.iter().map(|w| (*w as f64).powi(2)).sum::<f64>().sqrt();
            let rel = diff / norm.max(1e-30);
            let worst = got
                .iter()
                .zip(want)
                .enumerate()
                .max_by(|a, b| (a.1 .0 - a.1 .1).abs().total_cmp(&(b.1 .0 - b.1 .1).abs()))
                .map(|(i, (g, w))| format!("worst at {i}: {g} vs {w}"))
                .unwrap_or_default();
            if std::env::var("KERNEL_TEST_ERRORS").is_ok() {
                eprintln!("ERR {rel:.3e} {what}");
            }
            prop_assert!(
                rel <= max,
                "{}: relative L2 error {:.3e} > {:.1e} ({})",
                what,
                rel,
                max,
                worst
            );
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Running a case on the device.

/// The bytes of `t` as `dtype` stores them, rounded up to 4 bytes.
fn encode(dtype: DType, t: &Tensor) -> Vec<u8> {
    let mut bytes: Vec<u8> = match (&t.data, dtype) {
        (Data::I32(v), _) => bytemuck::cast_slice(v).to_vec(),
        (Data::F32(v), DType::F32) => bytemuck::cast_slice(v).to_vec(),
        (Data::F32(v), DType::F16) => v
            .iter()
            .flat_map(|x| f16::from_f32(*x).to_bits().to_le_bytes())
            .collect(),
        (Data::F32(v), DType::BF16) => v
            .iter()
            .flat_map(|x| bf16::from_f32(*x).to_bits().to_le_bytes())
            .collect(),
        (Data::F32(_), DType::I32) => unreachable!("float data of an i32 value"),
        (Data::F32(_), DType::Q8_0 | DType::Q4_0) => {
            unreachable!("block-quantised weights upload their encoded bytes")
        }
    };
    bytes.resize(bytes.len().div_ceil(4) * 4, 0);
    bytes
}

/// A value's bytes read back as f32 (floats) or i32-as-f32-bits (so one comparison serves).
fn decode(ty: &Type, bytes: &[u8]) -> Vec<f32> {
    let n = ty.shape.numel();
    match ty.dtype {
        DType::F32 => bytemuck::cast_slice::<u8, f32>(&bytes[..4 * n]).to_vec(),
        DType::I32 => bytemuck::cast_slice::<u8, i32>(&bytes[..4 * n])
            .iter()
            .map(|i| f32::from_bits(*i as u32))
            .collect(),
        DType::F16 => bytes[..2 * n]
            .chunks(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        DType::BF16 => bytes[..2 * n]
            .chunks(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        DType::Q8_0 | DType::Q4_0 => unreachable!("kernels compute f32 and i32 values"),
    }
}

/// A tensor as f32 (i32 as bits), matching [`decode`].
fn flat(t: &Tensor) -> Vec<f32> {
    match &t.data {
        Data::F32(v) => v.clone(),
        Data::I32(v) => v.iter().map(|i| f32::from_bits(*i as u32)).collect(),
    }
}

fn range_of(ty: &Type) -> u64 {
    (ty.bytes().div_ceil(4) * 4).max(4) as u64
}

/// A device buffer of `range` bytes plus the guard, holding `bytes` (the canary where `bytes`
/// is empty: a result element the kernel does not write cannot pass for a zero) then the
/// canary.
fn buffer(device: &Device, range: u64, bytes: &[u8]) -> Buffer {
    let mut buf = device
        .create_buffer(range + GUARD, BufferKind::DeviceLocal)
        .expect("buffer");
    let canary = |words: u64| (0..words).flat_map(|_| CANARY.to_le_bytes());
    let mut init: Vec<u8> = if bytes.is_empty() {
        canary(range / 4).collect()
    } else {
        bytes.to_vec()
    };
    init.resize(range as usize, 0);
    init.extend(canary(GUARD / 4));
    device.upload(&mut buf, 0, &init).expect("upload");
    buf
}

/// Runs `case` on the reference and on the device; compares every value a kernel computed and
/// every state written. `tol` gives the tolerance of each op kind by name.
fn check(case: Case, tol: impl Fn(&str) -> Tol) -> Result<(), TestCaseError> {
    let Case {
        p,
        weights,
        encoded,
        states,
        ..
    } = case;
    p.verify()
        .map_err(|e| TestCaseError::fail(format!("test program: {e}")))?;

    let mut reference = Reference::new(&p, &weights);
    for (id, t) in &states {
        reference.set_state(*id, t.clone());
    }
    let want = reference
        .run_values()
        .map_err(|e| TestCaseError::fail(format!("reference: {e}")))?;

    let mut gpu = gpu();
    let device = gpu.device.clone();

    // One buffer per state and per computed value; aliases point at existing buffers.
    let mut buffers: Vec<(Buffer, u64)> = Vec::new();
    let mut state_buf: Vec<Option<usize>> = vec![None; p.states.len()];
    for (id, t) in &states {
        let ty = &p.state(*id).ty;
        let range = range_of(ty);
        buffers.push((buffer(&device, range, &encode(ty.dtype, t)), range));
        state_buf[id.index()] = Some(buffers.len() - 1);
    }
    let mut value_buf: Vec<Option<usize>> = vec![None; p.values.len()];
    let mut dispatches: Vec<(OpId, KernelCall, Vec<usize>)> = Vec::new();
    for id in p.op_ids() {
        let op = p.op(id);
        let call = kernels::select(&p, id);
        prop_assert_eq!(
            call.is_some(),
            !kernels::is_alias(&op.kind),
            "select of {}",
            op.kind.name()
        );
        let result = match &op.kind {
            OpKind::Weight { .. } | OpKind::WeightStack { .. } => {
                let ty = p.ty(op.result.expect("result"));
                let t = want[op.result.expect("result").index()]
                    .as_ref()
                    .expect("weight value");
                let range = range_of(ty);
                let bytes = match &op.kind {
                    OpKind::Weight { name } if ty.dtype.is_quantized() => encoded[name].clone(),
                    _ => encode(ty.dtype, t),
                };
                buffers.push((buffer(&device, range, &bytes), range));
                Some(buffers.len() - 1)
            }
            OpKind::ReadState { state } | OpKind::KvWrite { state } => state_buf[state.index()],
            OpKind::Reshape { .. } => value_buf[op.args[0].index()],
            OpKind::WriteState { .. } => None,
            _ => {
                let range = range_of(p.ty(op.result.expect("result")));
                buffers.push((buffer(&device, range, &[]), range));
                Some(buffers.len() - 1)
            }
        };
        if let Some(v) = op.result {
            value_buf[v.index()] = result;
        }
        if let Some(call) = call {
            prop_assert_eq!(call.bindings, 1 + op.args.len());
            let first = match &op.kind {
                OpKind::KvWrite { state } | OpKind::WriteState { state } => {
                    state_buf[state.index()]
                }
                _ => result,
            };
            let mut binds = vec![first.expect("binding 0")];
            binds.extend(
                op.args
                    .iter()
                    .map(|a| value_buf[a.index()].expect("operand buffer")),
            );
            dispatches.push((id, call, binds));
        }
    }

    let pipelines: Vec<Arc<Pipeline>> = dispatches
        .iter()
        .map(|(_, call, _)| gpu.pipeline(call))
        .collect();
    let total_bindings: usize = dispatches.iter().map(|(_, c, _)| c.bindings).sum();
    let pool = device
        .create_descriptor_pool(dispatches.len() as u32, total_bindings as u32)
        .expect("pool");
    let mut sets = Vec::new();
    for ((_, _, binds), pipeline) in dispatches.iter().zip(&pipelines) {
        let set = pool.allocate(pipeline).expect("descriptor set");
        let writes: Vec<BufferBinding> = binds
            .iter()
            .enumerate()
            .map(|(b, &i)| BufferBinding {
                binding: b as u32,
                buffer: &buffers[i].0,
                offset: 0,
                range: buffers[i].1,
            })
            .collect();
        device
            .write_descriptors(&set, &writes)
            .expect("descriptor writes");
        sets.push(set);
    }
    let mut cmd = device.create_command_buffer().expect("command buffer");
    {
        let mut rec = cmd.begin().expect("begin");
        for (i, ((_, call, _), pipeline)) in dispatches.iter().zip(&pipelines).enumerate() {
            if i > 0 {
                rec.compute_barrier();
            }
            rec.bind_pipeline(pipeline).expect("bind pipeline");
            rec.bind_descriptor_set(&sets[i]).expect("bind set");
            if !call.push_constants.is_empty() {
                rec.push_constants(0, &call.push_constants)
                    .expect("push constants");
            }
            let [x, y, z] = call.workgroups;
            rec.dispatch(x, y, z).expect("dispatch");
        }
        rec.finish().expect("finish");
    }
    device.submit_and_wait(&mut cmd, WAIT).expect("submit");

    let read = |i: usize| -> Vec<u8> {
        let (buf, range) = &buffers[i];
        let mut bytes = vec![0u8; (*range + GUARD) as usize];
        device.readback(buf, 0, &mut bytes).expect("readback");
        bytes
    };
    for (i, (_, range)) in buffers.iter().enumerate() {
        let bytes = read(i);
        let guard: &[u32] = bytemuck::cast_slice(&bytes[*range as usize..]);
        prop_assert!(
            guard.iter().all(|w| *w == CANARY),
            "a kernel wrote past the end of buffer {}",
            i
        );
    }
    for (id, call, _) in &dispatches {
        let op = p.op(*id);
        let name = op.kind.name();
        if let Some(v) = op.result {
            let got = decode(p.ty(v), &read(value_buf[v.index()].expect("buffer")));
            let want = flat(want[v.index()].as_ref().expect("reference value"));
            compare(&format!("{name} ({call})"), &got, &want, tol(name))?;
        }
        if let OpKind::WriteState { state } | OpKind::KvWrite { state } = op.kind {
            let got = decode(
                &p.state(state).ty,
                &read(state_buf[state.index()].expect("state buffer")),
            );
            compare(
                &format!("state written by {name} ({call})"),
                &got,
                &flat(reference.state(state)),
                tol(name),
            )?;
        }
    }
    let errors = gpu.log.take_errors();
    prop_assert!(
        errors.is_empty(),
        "validation errors:\n{}",
        errors.iter().map(|m| format!("{m}\n")).collect::<String>()
    );
    Ok(())
}

fn config(cases: u32) -> Config {
    // PROPTEST_CASES overrides the per-test count (for longer soak runs).
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    Config {
        cases,
        max_shrink_iters: 32,
        failure_persistence: Some(Box::new(FileFailurePersistence::Off)),
        ..Config::default()
    }
}

fn float_dtype() -> impl Strategy<Value = DType> {
    prop_oneof![Just(DType::F32), Just(DType::F16), Just(DType::BF16)]
}

fn quant_dtype() -> impl Strategy<Value = DType> {
    prop_oneof![Just(DType::Q8_0), Just(DType::Q4_0)]
}

/// Sizes that are and are not multiples of 8 (the vector width of 16-bit loads).
fn size(max: usize) -> impl Strategy<Value = usize> {
    prop_oneof![(1..=max / 8).prop_map(|k| 8 * k), 1..=max]
}

fn eps(v: f32) -> F32Attr {
    F32Attr(v)
}

// ---------------------------------------------------------------------------------------------
// The tests, one per op kind (a few share a test).

#[test]
fn quantised_vocabulary_sized_matvec_matches() {
    // 65536 rows and more (an lm_head) take 8 rows per workgroup with block-quantised weights
    // (`kernels::matvec_tuning`); 37 rows past a multiple of 8 exercise the last workgroup.
    for (dt, seed) in [(DType::Q8_0, 11), (DType::Q4_0, 12)] {
        let mut c = Case::new(seed);
        let w = c.weight(dt, &[65536 + 37, 64]);
        let x = c.f32(&[64]);
        c.op(OpKind::Matvec, vec![w, x]);
        check(c, |_| DEFAULT).unwrap_or_else(|e| panic!("{dt}: {e}"));
    }
}

#[test]
fn every_op_kind_has_a_kernel_or_is_an_alias() {
    let aliases = ["weight", "weight_stack", "read_state", "reshape"];
    // One program holding every op kind, so `select` is asked about each.
    let mut c = Case::new(1);
    let pos = c.position(3);
    let (conv, conv_v) = c.state(StateKind::Conv, Tensor::f32(&[4, 3], vec![0.0; 12]));
    let (kv, kv_v) = c.state(StateKind::KvCache, Tensor::f32(&[2, 8, 4], vec![0.0; 64]));
    let (_, rec_v) = c.state(StateKind::Recurrent, Tensor::f32(&[2, 4, 4], vec![0.0; 32]));
    let x = c.f32(&[4]);
    let q = c.f32(&[4, 4]);
    let kx = c.f32(&[2, 4]);
    let w = c.weight(DType::BF16, &[4, 4]);
    let stack = c.p.push(
        OpKind::WeightStack {
            pattern: "e{}".into(),
            count: 2,
        },
        vec![],
        Some(Type::new(DType::F16, [2, 4, 4])),
    );
    let stack = stack.expect("weight_stack").expect("result");
    let idx = c.op(OpKind::TopK { k: 2 }, vec![x]);
    let e = c.op(OpKind::Embedding, vec![w, pos]);
    let kvw = c.op(OpKind::KvWrite { state: kv }, vec![kx, pos]);
    let ops = vec![
        (
            OpKind::RmsNorm {
                eps: eps(1e-6),
                zero_centered: false,
            },
            vec![x, e],
        ),
        (OpKind::GatedRmsNorm { eps: eps(1e-6) }, vec![x, x, e]),
        (OpKind::L2Norm { eps: eps(1e-6) }, vec![x]),
        (OpKind::Matvec, vec![w, x]),
        (OpKind::ExpertMatvec, vec![stack, idx, x]),
        (OpKind::Add, vec![x, x]),
        (OpKind::Mul, vec![x, x]),
        (OpKind::Div, vec![x, x]),
        (OpKind::Silu, vec![x]),
        (OpKind::Sigmoid, vec![x]),
        (OpKind::Softplus, vec![x]),
        (OpKind::Exp, vec![x]),
        (OpKind::Neg, vec![x]),
        (
            OpKind::Rope {
                theta: eps(1e4),
                rotary_dim: 4,
            },
            vec![q, pos],
        ),
        (
            OpKind::Slice {
                axis: 0,
                start: 1,
                end: 3,
            },
            vec![x],
        ),
        (OpKind::Concat { axis: 0 }, vec![x, x]),
        (
            OpKind::Reshape {
                shape: Shape::new([2, 2]),
            },
            vec![x],
        ),
        (
            OpKind::Attention { scale: eps(0.5) },
            vec![q, kvw, kv_v, pos],
        ),
        (OpKind::CausalConv1d, vec![conv_v, x, q]),
        (OpKind::ConvShift, vec![conv_v, x]),
        (
            OpKind::DeltaRuleUpdate,
            vec![rec_v, kx, c.f32(&[2, 4]), c.f32(&[2]), c.f32(&[2])],
        ),
        (
            OpKind::DeltaRuleReadout { scale: eps(0.5) },
            vec![rec_v, kx],
        ),
        (OpKind::Softmax, vec![x]),
        (OpKind::Gather, vec![x, idx]),
        (OpKind::Sum { axis: 0 }, vec![x]),
        (OpKind::Argmax, vec![x]),
        (OpKind::Increment, vec![pos]),
    ];
    for (kind, args) in ops {
        c.op(kind, args);
    }
    let conv_new = c.op(OpKind::ConvShift, vec![conv_v, x]);
    c.p.push(OpKind::WriteState { state: conv }, vec![conv_new], None)
        .expect("write_state");

    let mut seen: HashMap<&str, bool> = HashMap::new();
    for id in c.p.op_ids() {
        let kind = &c.p.op(id).kind;
        let call = kernels::select(&c.p, id);
        assert_eq!(
            call.is_none(),
            aliases.contains(&kind.name()),
            "{}",
            kind.name()
        );
        if let Some(call) = &call {
            assert!(
                vkfuse_kernels::source(call.kernel).is_some(),
                "{}: no GLSL named {}",
                kind.name(),
                call.kernel
            );
            assert_eq!(call.bindings, 1 + kind.arity());
            assert!(
                call.defines.windows(2).all(|w| w[0] <= w[1]),
                "defines sorted"
            );
        }
        seen.insert(kind.name(), call.is_some());
    }
    for name in OpKind::NAMES {
        assert!(
            seen.contains_key(name),
            "the coverage program lacks `{name}`: add it here"
        );
    }
}

#[test]
fn every_kernel_variant_compiles() {
    let dtypes = ["F32", "F16", "BF16"];
    let d = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    for (name, _) in vkfuse_kernels::KERNELS {
        let variants: Vec<Vec<(String, String)>> = match *name {
            "embedding" | "matvec" => dtypes
                .iter()
                .chain(&["Q8_0", "Q4_0"])
                .map(|t| d(&[("DTYPE_1", t)]))
                .collect(),
            "expert_matvec" => dtypes.iter().map(|t| d(&[("DTYPE_1", t)])).collect(),
            "rms_norm" => dtypes.iter().map(|t| d(&[("DTYPE_2", t)])).collect(),
            "gated_rms_norm" | "causal_conv1d" => {
                dtypes.iter().map(|t| d(&[("DTYPE_3", t)])).collect()
            }
            "slice" => ["F32", "F16", "BF16", "I32"]
                .iter()
                .map(|t| d(&[("DTYPE_1", t)]))
                .collect(),
            "concat" => ["F32", "BF16", "I32"]
                .iter()
                .map(|t| d(&[("DTYPE_1", t), ("DTYPE_2", t)]))
                .collect(),
            "binary" => ["ADD", "MUL", "DIV"]
                .iter()
                .map(|o| d(&[("DTYPE_1", "F16"), ("DTYPE_2", "BF16"), ("OP", o)]))
                .collect(),
            "unary" => ["SILU", "SIGMOID", "SOFTPLUS", "EXP", "NEG"]
                .iter()
                .map(|o| d(&[("DTYPE_1", "F32"), ("OP", o)]))
                .collect(),
            _ => vec![vec![]],
        };
        for defines in variants {
            kernels::compile(name, &defines).unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

proptest! {
    #![proptest_config(config(8))]

    #[test]
    fn write_state_copies_the_value_into_the_state(n in 1usize..700, pos in 0i32..1000, seed in any::<u64>()) {
        let mut c = Case::new(seed);
        let init = c.rng.vec(n, -1.0, 1.0);
        let (s, _) = c.state(StateKind::Recurrent, Tensor::f32(&[n], init));
        let v = c.f32(&[n]);
        c.p.push(OpKind::WriteState { state: s }, vec![v], None).expect("write_state");
        // The position advance: an i32 state written from increment(read_state).
        let (ps, p) = c.state(StateKind::Position, Tensor::i32(&[1], vec![pos]));
        let next = c.op(OpKind::Increment, vec![p]);
        c.p.push(OpKind::WriteState { state: ps }, vec![next], None).expect("write_state");
        check(c, |_| Tol::Exact)?;
    }

    #[test]
    fn kv_write_stores_x_at_the_position(hkv in 1usize..5, d in prop_oneof![Just(64usize), Just(128), 1usize..80], cap in 1usize..300, pos_frac in 0.0f64..1.0, seed in any::<u64>()) {
        let mut c = Case::new(seed);
        let pos = ((cap as f64 * pos_frac) as usize).min(cap - 1) as i32;
        let init = c.rng.vec(hkv * cap * d, -1.0, 1.0);
        let (kv, _) = c.state(StateKind::KvCache, Tensor::f32(&[hkv, cap, d], init));
        let p = c.position(pos);
        let x = c.f32(&[hkv, d]);
        c.op(OpKind::KvWrite { state: kv }, vec![x, p]);
        check(c, |_| Tol::Exact)?;
    }

    /// f16 caches: every element rounded to the nearest f16, ties to even, as the reference
    /// (the half crate) rounds, over values that test the rounding: exact midpoints between
    /// neighbouring f16s, f16's subnormal range, and around its largest finite value.
    #[test]
    fn kv_write_rounds_to_the_nearest_f16(hkv in 1usize..4, d in prop_oneof![Just(64usize), (1usize..40).prop_map(|h| 2 * h)], cap in 1usize..40, pos_frac in 0.0f64..1.0, seed in any::<u64>()) {
        let mut c = Case::new(seed);
        let pos = ((cap as f64 * pos_frac) as usize).min(cap - 1) as i32;
        let init: Vec<f32> = c.rng.vec(hkv * cap * d, -1.0, 1.0).into_iter().map(|v| f16::from_f32(v).to_f32()).collect();
        let name = format!("s{}", c.states.len());
        let kv = c.p.add_state(name, StateKind::KvCache, Type::new(DType::F16, [hkv, cap, d]));
        c.states.push((kv, Tensor::f32(&[hkv, cap, d], init)));
        let p = c.position(pos);
        let xs: Vec<f32> = (0..hkv * d).map(|_| f16_rounding_probe(&mut c.rng)).collect();
        let x = c.weight_data(DType::F32, &[hkv, d], xs);
        c.op(OpKind::KvWrite { state: kv }, vec![x, p]);
        check(c, |_| Tol::Exact)?;
    }

    #[test]
    fn embedding_reads_the_token_row(dt in float_dtype(), v in 1usize..300, h in size(600), tok_frac in 0.0f64..1.0, seed in any::<u64>()) {
        let mut c = Case::new(seed);
        let tok = ((v as f64 * tok_frac) as usize).min(v - 1) as i32;
        let table = c.weight(dt, &[v, h]);
        let (_, t) = c.state(StateKind::Token, Tensor::i32(&[1], vec![tok]));
        c.op(OpKind::Embedding, vec![table, t]);
        check(c, |_| Tol::Exact)?;
    }

    #[test]
    fn rms_norm_matches_plain_and_zero_centred(dt in float_dtype(), rows in 1usize..6, n in size(1100), zc in any::<bool>(), seed in any::<u64>()) {
        let mut c = Case::new(seed);
        let x = c.weight_in(DType::F32, &[rows, n], -3.0, 3.0);
        let w = c.weight(dt, &[n]);
        c.op(OpKind::RmsNorm { eps: eps(1e-6), zero_centered: zc }, vec![x, w]);
        check(c, |_| DEFAULT)?;
    }

    #[test]
    fn gated_rms_norm_matches(dt in float_dtype(), rows in 1usize..5, n in size(300), seed in any::<u64>()) {
        let mut c = Case::new(seed);
        let x = c.weight_in(DType::F32, &[rows, n], -3.0, 3.0);
        let z = c.weight_in(DType::F32, &[rows, n], -4.0, 4.0);
        let w = c.weight(dt, &[n]);
        c.op(OpKind::GatedRmsNorm { eps: eps(1e-6) }, vec![x, z, w]);
        check(c, |_| DEFAULT)?;
    }

    #[test]
    fn l2_norm_matches(rows in 1usize..9, n in size(300), seed in any::<u64>()) {
        let mut c = Case::new(seed);
        let x = c.weight_in(DType::F32, &[rows, n], -2.0, 2.0);
        c.op(OpKind::L2Norm { eps: eps(1e-6) }, vec![x]);
        check(c, |_| DEFAULT)?;
    }

    #[test]
    fn matvec_matches(dt in float_dtype(), o in prop_oneof![1usize..300, 4096usize..4200], i in size(1100), seed in any::<u64>()) {
        let mut c = Case::new(seed);
        let w = c.weight(dt, &[o, i]);
        let x = c.f32(&[i]);
        c.op(OpKind::Matvec, vec![w, x]);
        check(c, |_| DEFAULT)?;
    }

    #[test]
    fn quantised_matvec_matches(dt in quant_dtype(), o in prop_oneof![1usize..300, 4096usize..4200], blocks in prop_oneof![1usize..40, Just(32), Just(96)], seed in any::<u64>()) {
        let mut c = Case::new(seed);
        let i = 32 * blocks;
        let w = c.weight(dt, &[o, i]);
        let x = c.f32(&[i]);
        c.op(OpKind::Matvec, vec![w, x]);
        check(c, |_| DEFAULT)?;
    }

    #[test]
    fn embedding_dequantises_the_token_row(dt in quant_dtype(), v in 1usize..300, blocks in 1usize..20, tok_frac in 0.0f64..1.0, seed in any::<u64>()) {
        let mut c = Case::new(seed);
        let tok = ((v as f64 * tok_frac) as usize).min(v - 1) as i32;
        let table = c.weight(dt, &[v, 32 * blocks]);
        let (_, t) = c.state(StateKind::Token, Tensor::i32(&[1], vec![tok]));
        c.op(OpKind::Embedding, vec![table, t]);
        check(c, |_| Tol::Exact)?;
    }

    #[test]
    fn expert_matvec_reads_the_expert_on_the_device(
        dt in float_dtype(), e in 1usize..9, o in 1usize..150, i in size(400), k in 1usize..5,
        per_row in any::<bool>(), stacked in any::<bool>(), seed in any::<u64>(),
    ) {
        let mut c = Case::new(seed);
        let w = if stacked {
            // weight_stack: one tensor per expert, as Qwen3-Next stores them.
            for j in 0..e {
                let data = c.rng.vec(o * i, -1.0, 1.0);
                c.weights.insert(format!("expert.{j}"), data.into_iter().map(|v| round(dt, v)).collect());
            }
            let kind = OpKind::WeightStack { pattern: "expert.{}".into(), count: e };
            c.p.push(kind, vec![], Some(Type::new(dt, [e, o, i]))).expect("stack").expect("result")
        } else {
            c.weight(dt, &[e, o, i])
        };
        let idx: Vec<i32> = (0..k).map(|_| c.rng.below(e) as i32).collect();
        let (_, idx) = c.state(StateKind::Recurrent, Tensor::i32(&[k], idx));
        let x = if per_row { c.f32(&[k, i]) } else { c.f32(&[i]) };
        c.op(OpKind::ExpertMatvec, vec![w, idx, x]);
        check(c, |_| DEFAULT)?;
    }

    #[test]
    fn binary_ops_broadcast_like_numpy(
        op in 0usize..3, da in float_dtype(), db in float_dtype(),
        dims in prop::collection::vec(1usize..7, 1..=4), mask_a in any::<u8>(), mask_b in any::<u8>(),
        drop_a in 0usize..3, seed in any::<u64>(),
    ) {
        let mut c = Case::new(seed);
        // Each operand: the output shape with some dims set to 1 and some leading dims dropped.
        let shape = |mask: u8, drop: usize| -> Vec<usize> {
            let d: Vec<usize> = dims.iter().enumerate().map(|(i, &n)| if mask & (1 << i) != 0 { 1 } else { n }).collect();
            d[drop.min(d.len() - 1)..].to_vec()
        };
        let (sa, sb) = (shape(mask_a, drop_a), shape(mask_b, 0));
        let a = c.weight(da, &sa);
        // Keep divisors away from 0.
        let b = if op == 2 { c.weight_in(db, &sb, 0.5, 2.0) } else { c.weight(db, &sb) };
        let kind = [OpKind::Add, OpKind::Mul, OpKind::Div][op].clone();
        c.op(kind, vec![a, b]);
        check(c, |_| DEFAULT)?;
    }

    #[test]
    fn unary_ops_match(op in 0usize..5, dt in float_dtype(), n in 1usize..1500, seed in any::<u64>()) {
        let mut c = Case::new(seed);
        // softplus: wide enough to cross torch's threshold of 20 and to reach tiny exp(x).
        let range = [8.0, 8.0, 30.0, 8.0, 8.0][op];
        let x = c.weight_in(dt, &[n], -range, range);
        let kind = [OpKind::Silu, OpKind::Sigmoid, OpKind::Softplus, OpKind::Exp, OpKind::Neg][op].clone();
        let exact = matches!(kind, OpKind::Neg);
        c.op(kind, vec![x]);
        check(c, |_| if exact { Tol::Exact } else { DEFAULT })?;
    }

    #[test]
    fn rope_rotates_the_first_rotary_dims(
        heads in 1usize..9, d in prop_oneof![Just(64usize), Just(128), Just(256)],
        frac in prop_oneof![Just(4usize), Just(2), Just(1)], theta in prop_oneof![Just(1e4f32), Just(1e6), Just(5e5)],
        pos in prop_oneof![0i32..8, 0i32..600], seed in any::<u64>(),
    ) {
        // rotary_dim = d / frac: fractions 0.25, 0.5 and 1.
        let mut c = Case::new(seed);
        let x = c.f32(&[heads, d]);
        let p = c.position(pos);
        c.op(OpKind::Rope { theta: F32Attr(theta), rotary_dim: d / frac }, vec![x, p]);
        check(c, |_| DEFAULT)?;
    }

    #[test]
    fn slice_selects_along_any_axis(
        dt in prop_oneof![Just(DType::F32), Just(DType::F16), Just(DType::BF16), Just(DType::I32)],
        dims in prop::collection::vec(1usize..9, 1..=4), axis_seed in any::<usize>(), a in any::<usize>(), b in any::<usize>(),
        seed in any::<u64>(),
    ) {
        let mut c = Case::new(seed);
        let axis = axis_seed % dims.len();
        let (s, e) = (a % dims[axis], b % dims[axis]);
        let (start, end) = (s.min(e), s.max(e) + 1);
        let x = if dt == DType::I32 {
            let n = dims.iter().product();
            let v: Vec<i32> = (0..n).map(|_| c.rng.next() as i32).collect();
            c.state(StateKind::Recurrent, Tensor::i32(&dims, v)).1
        } else {
            c.weight(dt, &dims)
        };
        c.op(OpKind::Slice { axis, start, end }, vec![x]);
        check(c, |_| Tol::Exact)?;
    }

    #[test]
    fn concat_joins_along_any_axis(
        dt in prop_oneof![Just(DType::F32), Just(DType::F16), Just(DType::BF16), Just(DType::I32)],
        dims in prop::collection::vec(1usize..8, 1..=4), axis_seed in any::<usize>(), extra in 1usize..7,
        seed in any::<u64>(),
    ) {
        let mut c = Case::new(seed);
        let axis = axis_seed % dims.len();
        let mut db = dims.clone();
        db[axis] = extra;
        let make = |c: &mut Case, d: &[usize]| {
            if dt == DType::I32 {
                let v: Vec<i32> = (0..d.iter().product()).map(|_| c.rng.next() as i32).collect();
                c.state(StateKind::Recurrent, Tensor::i32(d, v)).1
            } else {
                c.weight(dt, d)
            }
        };
        let a = make(&mut c, &dims);
        let b = make(&mut c, &db);
        c.op(OpKind::Concat { axis }, vec![a, b]);
        check(c, |_| Tol::Exact)?;
    }

    #[test]
    fn attention_matches_over_positions_with_gqa(
        hkv in 1usize..4, group in prop_oneof![Just(1usize), Just(2), Just(4), Just(8), 1usize..9],
        d in prop_oneof![Just(64usize), Just(128), 1usize..100], cap in 1usize..400, pos_frac in 0.0f64..1.0,
        seed in any::<u64>(),
    ) {
        let mut c = Case::new(seed);
        let hq = hkv * group;
        let pos = ((cap as f64 * pos_frac) as usize).min(cap - 1) as i32;
        let kinit = c.rng.vec(hkv * cap * d, -1.0, 1.0);
        let vinit = c.rng.vec(hkv * cap * d, -1.0, 1.0);
        let (kc, k) = c.state(StateKind::KvCache, Tensor::f32(&[hkv, cap, d], kinit));
        let (_, v) = c.state(StateKind::KvCache, Tensor::f32(&[hkv, cap, d], vinit));
        let p = c.position(pos);
        // Sharper than 1/sqrt(d) so the softmax is not flat.
        let q = c.weight_in(DType::F32, &[hq, d], -2.0, 2.0);
        // The new key goes in first: attention reads the cache kv_write returns.
        let knew = c.f32(&[hkv, d]);
        let k = if seed % 2 == 0 { c.op(OpKind::KvWrite { state: kc }, vec![knew, p]) } else { k };
        c.op(OpKind::Attention { scale: F32Attr(1.0 / (d as f32).sqrt()) }, vec![q, k, v, p]);
        check(c, |name| if name == "kv_write" { Tol::Exact } else { DEFAULT })?;
    }

    #[test]
    fn causal_conv1d_and_conv_shift_match(dt in float_dtype(), ch in 1usize..600, k in 2usize..6, seed in any::<u64>()) {
        let mut c = Case::new(seed);
        let init = c.rng.vec(ch * (k - 1), -1.0, 1.0);
        let (s, sv) = c.state(StateKind::Conv, Tensor::f32(&[ch, k - 1], init));
        let x = c.f32(&[ch]);
        let w = c.weight(dt, &[ch, k]);
        c.op(OpKind::CausalConv1d, vec![sv, x, w]);
        let shifted = c.op(OpKind::ConvShift, vec![sv, x]);
        c.p.push(OpKind::WriteState { state: s }, vec![shifted], None).expect("write_state");
        check(c, |name| if name == "causal_conv1d" { DEFAULT } else { Tol::Exact })?;
    }

    #[test]
    fn delta_rule_update_and_readout_match(
        hk in 1usize..4, group in 1usize..4, dk in prop_oneof![Just(128usize), 1usize..140],
        dv in prop_oneof![Just(128usize), 1usize..140], seed in any::<u64>(),
    ) {
        let mut c = Case::new(seed);
        let hv = hk * group;
        let init = c.rng.vec(hv * dk * dv, -1.0, 1.0);
        let (s, sv) = c.state(StateKind::Recurrent, Tensor::f32(&[hv, dk, dv], init));
        // k and q l2-normalised as in GatedDeltaNet, so the state stays bounded.
        let k = c.f32(&[hk, dk]);
        let k = c.op(OpKind::L2Norm { eps: eps(1e-6) }, vec![k]);
        let v = c.f32(&[hv, dv]);
        let g = c.weight_in(DType::F32, &[hv], -2.0, 0.0);
        let beta = c.weight_in(DType::F32, &[hv], 0.0, 1.0);
        let q = c.f32(&[hk, dk]);
        let new = c.op(OpKind::DeltaRuleUpdate, vec![sv, k, v, g, beta]);
        c.op(OpKind::DeltaRuleReadout { scale: F32Attr(1.0 / (dk as f32).sqrt()) }, vec![new, q]);
        c.p.push(OpKind::WriteState { state: s }, vec![new], None).expect("write_state");
        check(c, |_| DEFAULT)?;
    }

    #[test]
    fn softmax_matches(rows in 1usize..6, n in 1usize..1200, seed in any::<u64>()) {
        let mut c = Case::new(seed);
        let x = c.weight_in(DType::F32, &[rows, n], -6.0, 6.0);
        c.op(OpKind::Softmax, vec![x]);
        check(c, |_| DEFAULT)?;
    }

    #[test]
    fn top_k_orders_largest_first_ties_to_lower_index(n in 1usize..600, k_frac in 0.0f64..1.0, ties in any::<bool>(), seed in any::<u64>()) {
        let mut c = Case::new(seed);
        let k = ((n as f64 * k_frac) as usize).clamp(1, 10.min(n));
        let data: Vec<f32> = if ties {
            (0..n).map(|_| [-1.0, 0.0, 0.5, 1.0, -0.0][c.rng.below(5)]).collect()
        } else {
            c.rng.vec(n, -1.0, 1.0)
        };
        let x = c.weight_data(DType::F32, &[n], data);
        c.op(OpKind::TopK { k }, vec![x]);
        c.op(OpKind::Argmax, vec![x]);
        check(c, |_| Tol::Exact)?;
    }

    #[test]
    fn gather_picks_by_device_indices(n in 1usize..500, k in 1usize..300, seed in any::<u64>()) {
        let mut c = Case::new(seed);
        let x = c.f32(&[n]);
        let idx: Vec<i32> = (0..k).map(|_| c.rng.below(n) as i32).collect();
        let (_, idx) = c.state(StateKind::Recurrent, Tensor::i32(&[k], idx));
        c.op(OpKind::Gather, vec![x, idx]);
        check(c, |_| Tol::Exact)?;
    }

    #[test]
    fn sum_reduces_any_axis(dims in prop::collection::vec(1usize..12, 1..=4), axis_seed in any::<usize>(), seed in any::<u64>()) {
        let mut c = Case::new(seed);
        let axis = axis_seed % dims.len();
        let x = c.f32(&dims);
        c.op(OpKind::Sum { axis }, vec![x]);
        check(c, |_| DEFAULT)?;
    }

    #[test]
    fn argmax_over_a_large_vocabulary(n in prop_oneof![1usize..100, 30000usize..70000], seed in any::<u64>()) {
        let mut c = Case::new(seed);
        let x = c.weight_in(DType::F32, &[n], -10.0, 10.0);
        c.op(OpKind::Argmax, vec![x]);
        check(c, |_| Tol::Exact)?;
    }
}

// ---------------------------------------------------------------------------------------------
// Timing (not a test): `cargo test --test kernels_vs_reference -- --ignored --nocapture bench`
// on a real GPU. Each dispatch is timed alone between two timestamps (a barrier after it), with
// its operands rotated over copies totalling more than the GPU's L2, so the figures are what an
// unfused, eager step sees from DRAM.

/// Median GPU time (µs) of op `id` of `p` and the bytes its operands and result occupy. Float
/// buffers hold zeros, i32 buffers (positions, indices) `int_fill`.
/// `wg` overrides the workgroup size `select` chose (to compare sizes).
/// Median GPU time (us) of op `id`'s kernel and the bytes it touches; `wg` overrides the
/// workgroup size, `rows` a matvec's rows per workgroup (spec constant 3, grid recomputed).
fn time_op(
    p: &Program,
    id: OpId,
    int_fill: u32,
    wg: Option<u32>,
    rows: Option<u32>,
) -> Option<(f64, u64)> {
    const ITERS: u32 = 30;
    const ROTATE_BYTES: u64 = 256 << 20;
    let mut call = kernels::select(p, id)?;
    if let Some(wg) = wg {
        call.spec_constants[0] = wg;
    }
    if let Some(rows) = rows {
        let o = call.spec_constants[1];
        call.spec_constants[3] = rows;
        let n = o.div_ceil(rows);
        let x = n.min(u32::try_from(kernels::MAX_WORKGROUPS_X).expect("fits"));
        call.workgroups = [x, n.div_ceil(x), 1];
    }
    let mut gpu = gpu();
    let device = gpu.device.clone();
    let op = p.op(id);
    let types: Vec<Type> = std::iter::once(p.ty(op.result?).clone())
        .chain(op.args.iter().map(|a| p.ty(*a).clone()))
        .collect();
    let bytes: u64 = types.iter().map(range_of).sum();
    let max_range = u64::from(device.info().max_storage_buffer_range);
    if types.iter().any(|t| range_of(t) > max_range) {
        eprintln!("skipped {call}: a binding is past maxStorageBufferRange ({max_range} bytes)");
        return None;
    }
    let copies = (ROTATE_BYTES / bytes).clamp(1, u64::from(ITERS)) as usize;
    let pipeline = gpu.pipeline(&call);
    let mut buffers: Vec<Vec<Buffer>> = Vec::new();
    let mut cmd = device.create_command_buffer().expect("cmd");
    {
        let mut rec = cmd.begin().expect("begin");
        for _ in 0..copies {
            let set: Vec<Buffer> = types
                .iter()
                .map(|t| {
                    let b = device
                        .create_buffer(range_of(t), BufferKind::DeviceLocal)
                        .expect("buffer");
                    let fill = if t.dtype == DType::I32 { int_fill } else { 0 };
                    rec.fill_buffer(&b, 0, range_of(t), fill).expect("fill");
                    b
                })
                .collect();
            buffers.push(set);
        }
        rec.finish().expect("finish");
    }
    device.submit_and_wait(&mut cmd, WAIT).expect("fill");
    let us = common::median_dispatch_us(&device, &pipeline, &buffers, call.workgroups, ITERS, WAIT);
    let errors = gpu.log.take_errors();
    assert!(errors.is_empty(), "validation errors: {errors:?}");
    Some((us?, bytes))
}

#[test]
#[ignore = "a timing run for a real GPU, not a test"]
fn bench_kernels_on_this_device() {
    let mut rows: Vec<String> = Vec::new();
    let mut bench = |label: &str, c: &Case, int_fill: u32, wg: Option<u32>, r: Option<u32>| {
        let id = OpId::new(c.p.ops.len() - 1);
        if let Some((us, bytes)) = time_op(&c.p, id, int_fill, wg, r) {
            let gbs = bytes as f64 / (us * 1e3);
            let mut wg = wg.map(|w| format!(" wg {w}")).unwrap_or_default();
            if let Some(r) = r {
                wg += &format!(" rows {r}");
            }
            rows.push(format!(
                "{label:<44} {us:>9.2} us {gbs:>8.0} GB/s  ({}{wg})",
                kernels::select(&c.p, id).expect("kernel")
            ));
        }
    };
    // Qwen3-0.6B's shapes (hidden 1024, 16 q heads, 8 kv heads of 128, intermediate 3072),
    // with the fused kernels' stacked q/k/v [4096, 1024] and gate/up [6144, 1024]; bf16 also
    // with a sweep of workgroup size x rows per workgroup (the selected ones first).
    for dt in [DType::BF16, DType::F16] {
        for (o, i) in [
            (4096, 1024),
            (2048, 1024),
            (1024, 2048),
            (6144, 1024),
            (3072, 1024),
            (1024, 3072),
            (151_936, 1024),
        ] {
            let mut c = Case::new(0);
            let w =
                c.p.push(
                    OpKind::Weight { name: "w".into() },
                    vec![],
                    Some(Type::new(dt, [o, i])),
                )
                .expect("w")
                .expect("r");
            let x =
                c.p.push(
                    OpKind::Weight { name: "x".into() },
                    vec![],
                    Some(Type::f32([i])),
                )
                .expect("x")
                .expect("r");
            c.op(OpKind::Matvec, vec![w, x]);
            let label = format!("matvec {dt} [{o},{i}]");
            bench(&label, &c, 0, None, None);
            if dt == DType::BF16 {
                for wg in [64, 128, 256] {
                    for rows in [1, 2, 4, 8] {
                        bench(&label, &c, 0, Some(wg), Some(rows));
                    }
                }
            }
        }
    }
    for cap in [256usize, 1024, 4096] {
        let mut c = Case::new(0);
        let q =
            c.p.push(
                OpKind::Weight { name: "q".into() },
                vec![],
                Some(Type::f32([16, 128])),
            )
            .expect("q")
            .expect("r");
        let k =
            c.p.push(
                OpKind::Weight { name: "k".into() },
                vec![],
                Some(Type::f32([8, cap, 128])),
            )
            .expect("k")
            .expect("r");
        let v =
            c.p.push(
                OpKind::Weight { name: "v".into() },
                vec![],
                Some(Type::f32([8, cap, 128])),
            )
            .expect("v")
            .expect("r");
        let p = c.position(0);
        c.op(
            OpKind::Attention {
                scale: F32Attr(0.088),
            },
            vec![q, k, v, p],
        );
        // At the last slot: the whole cache is attended.
        for wg in [256, 512, 1024] {
            let label = format!("attention 16/8x128 pos {}", cap - 1);
            bench(&label, &c, cap as u32 - 1, Some(wg), None);
        }
    }
    for n in [1024usize, 4096] {
        let mut c = Case::new(0);
        let x =
            c.p.push(
                OpKind::Weight { name: "x".into() },
                vec![],
                Some(Type::f32([n])),
            )
            .expect("x")
            .expect("r");
        let w =
            c.p.push(
                OpKind::Weight { name: "w".into() },
                vec![],
                Some(Type::new(DType::BF16, [n])),
            )
            .expect("w")
            .expect("r");
        c.op(
            OpKind::RmsNorm {
                eps: F32Attr(1e-6),
                zero_centered: false,
            },
            vec![x, w],
        );
        bench(&format!("rms_norm [{n}]"), &c, 0, None, None);
    }
    {
        let mut c = Case::new(0);
        let x =
            c.p.push(
                OpKind::Weight { name: "x".into() },
                vec![],
                Some(Type::f32([151_936])),
            )
            .expect("x")
            .expect("r");
        c.op(OpKind::Argmax, vec![x]);
        for wg in [256, 1024] {
            bench("argmax [151936]", &c, 0, Some(wg), None);
        }
    }
    for r in rows {
        eprintln!("{r}");
    }
}
