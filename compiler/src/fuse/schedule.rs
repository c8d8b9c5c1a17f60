//! The fused lowering: discover the layer templates, saturate and extract each template once
//! (and the head and tail, as units of one instance), then instantiate every unit's fused
//! program by op offset into one `Schedule` the eager executor runs as it is.
//!
//! Buffers are the unfused lowering's: `weights` (packed weights are uploaded part after part
//! into one slice), `state`, `io` (token, position, logits) and `arena`, whose values are placed
//! from level-based liveness by the buffer planner.

use super::bands::AttentionBand;
use super::codegen::Generated;
use super::cost::{Cost, DeviceCost};
use super::discover::{discover, Segmentation};
use super::extract::extract;
use super::kv_prefetch::{self, KvPrefetch};
use super::lang::{FuseAnalysis, FuseGraph};
use super::persistent::{self, MatvecKernels};
use super::prefetch::{self, Prefetch};
use super::program::{FusedUnit, KernelKind, ProgramError, Saturation, UValue};
use super::report::FusionReport;
use super::rules::{experts, rules_routing_own};
use super::unit::{LeafRef, Unit};
use super::zeros;
use crate::import::layout;
use crate::ir::{OpId, OpKind, Program, StateKind, ValueId};
use crate::kernels::{self, KernelError};
use crate::lower::{self, Meta, SpirvCache, ALIGN};
use crate::plan::{self, Request};
use crate::regions::{regions, Access};
use egg::{Runner, SimpleScheduler};
use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::time::Duration;
use vkfuse_runtime::schedule::{
    Alternative, BufferId, Dispatch, Io, KernelDecl, KernelId, Schedule, Slice, TokenEncoding,
    WeightUpload,
};

/// Where the fused schedule's arena slices start: at 4 KiB pages. On an H100 the same schedule
/// with every arena slice 2 KiB off a page ran q8_0 2.1% slower (bf16 0.9%, q4_0 1.8%): the
/// attention block's scratch, first in the arena, had left every later slice there, and a
/// scratch of whole pages (or the arena moved by 2 or 6 KiB) gave the time back, while moves
/// of whole pages did nothing (docs/perf.md, session 28). Why a page matters was not isolated.
const ARENA_ALIGN: u64 = 4096;

/// Options of the fusion stage.
#[derive(Clone, Debug)]
pub struct FuseOptions {
    /// The device class whose costs extraction minimises.
    pub device: DeviceCost,
    /// Saturation limits per unit.
    pub node_limit: usize,
    pub iter_limit: usize,
    pub time_limit: Duration,
    /// Place arena values from liveness (false: every value its own slot).
    pub plan_memory: bool,
    /// Offer persistent regions over runs of matvec levels (`fuse::persistent`); the runtime
    /// applies them only where the device keeps every workgroup resident.
    pub persistent: bool,
    /// Splits per query head of the attention block; `None` chooses from the shapes and
    /// `device` ([`super::codegen::attention_splits`]). `Some(1)` is the unsplit kernel.
    pub attention_splits: Option<usize>,
    /// Workgroup size of the attention block (a power of two up to 1024, raised to the head
    /// dim where smaller); `None`: [`super::codegen::attention_wg`]. A tuning knob.
    pub attention_wg: Option<u32>,
    /// The attention block's grids for bands of short positions ([`super::bands`]); `None`:
    /// the choice for the program's weights ([`super::bands::for_program`]), where the block is
    /// split and has at least the bands' splits. Given bands that cannot apply are an error.
    pub attention_bands: Option<Vec<AttentionBand>>,
    /// Workgroups per key head of the linear-attention step, each taking a share of its state
    /// columns (rounded down to a divisor of them); `None`: [`super::codegen::gdn_parts`].
    pub gdn_parts: Option<usize>,
    /// Weight prefetch into L2 beside weight-free levels ([`super::prefetch`]); `None`: the
    /// choice for the program's weights and bands ([`Prefetch::for_program`]).
    pub prefetch: Option<Prefetch>,
    /// Each attention block's K/V caches read into L2 a level or two before it
    /// ([`super::kv_prefetch`]); `None`: the choice for the program's weights
    /// ([`KvPrefetch::for_program`]) where the default weight prefetch has anything to read.
    pub kv_prefetch: Option<KvPrefetch>,
    /// Chain a matvec into the matvec kernel feeding it ([`super::rules::chain`]): one level
    /// fewer per SwiGLU block, but the kernel needs float atomics on the device.
    pub chain: bool,
    /// Fold the step's tail (argmax into the token, position advanced) into the matvec that
    /// computes the logits (`argmax-in-matvec`, [`super::rules::tail`]): one level fewer per
    /// step, but the kernel needs 64-bit atomics on the device.
    pub argmax_in_matvec: bool,
    /// Timing probes: kernels reduced to their input wait and output ([`super::ablate`]);
    /// the schedule computes wrong tokens. Empty for every real schedule.
    pub ablate: Vec<super::ablate::Ablate>,
    /// The block formats' dots in packed f16 products ([`super::dots`]; `compile-model
    /// --dots`, f16 by default where the weights are q8_0/q4_0). Off here, so that a
    /// schedule's kernels dequantise exactly as the CPU reference does unless asked.
    pub f16_dots: bool,
    /// The chained MLP's block-format dots as int8 products of its input quantised per block
    /// of 32 ([`super::dots`]; `compile-model --dots`, int8 by default where the weights are
    /// q8_0/q4_0), whatever `f16_dots` says for the other kernels. Off here.
    pub int8_chain: bool,
    /// The most experts every expert workgroup picks its own among; more are picked once a
    /// step by the router's workgroup, a level before them. `None`: `VKFUSE_OWN_ROUTING_MAX`
    /// or [`experts::OWN_ROUTING_MAX`] (64: Qwen3-Next-80B's 512 are routed once).
    pub own_routing_max: Option<usize>,
}

impl Default for FuseOptions {
    fn default() -> Self {
        FuseOptions {
            device: DeviceCost::default(),
            node_limit: 20_000,
            iter_limit: 30,
            time_limit: Duration::from_secs(10),
            plan_memory: true,
            persistent: true,
            attention_splits: None,
            attention_wg: None,
            attention_bands: None,
            gdn_parts: None,
            prefetch: None,
            kv_prefetch: None,
            chain: true,
            argmax_in_matvec: true,
            ablate: vec![],
            f16_dots: false,
            int8_chain: false,
            own_routing_max: None,
        }
    }
}

/// Why fused lowering failed.
#[derive(Debug, thiserror::Error)]
pub enum FuseError {
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error(transparent)]
    Program(#[from] ProgramError),
    #[error("op {op} `{text}` has no kernel")]
    NoKernel { op: String, text: String },
    #[error("the program lacks {0}")]
    Missing(&'static str),
    #[error("{0} (please report)")]
    Internal(String),
    #[error("buffer planning failed (please report): {0}")]
    Plan(plan::PlanError),
}

/// The fused programs of a whole trace: one per unit.
#[derive(Clone, Debug)]
pub struct Fused {
    pub segmentation: Segmentation,
    /// The head (if any ops), one per template, the tail (if any ops).
    pub units: Vec<FusedUnit>,
    /// Which unit runs at each place, in program order, with the instance's first op.
    pub sequence: Vec<(usize, usize)>,
}

/// Saturates `unit` under the limits of `opts`.
fn saturate(unit: &mut Unit, opts: &FuseOptions) -> Saturation {
    let g = std::mem::replace(&mut unit.egraph, FuseGraph::new(FuseAnalysis::default()));
    let runner = Runner::default()
        .with_egraph(g)
        .with_node_limit(opts.node_limit)
        .with_iter_limit(opts.iter_limit)
        .with_time_limit(opts.time_limit)
        .with_scheduler(SimpleScheduler)
        .run(
            &rules_routing_own(experts::own_routing_max(opts.own_routing_max))
                .into_iter()
                .filter(|r| opts.chain || !r.name.as_str().starts_with("chain-"))
                .filter(|r| opts.argmax_in_matvec || r.name.as_str() != "argmax-in-matvec")
                .collect::<Vec<_>>(),
        );
    let stop = match &runner.stop_reason {
        Some(egg::StopReason::Saturated) => "saturated".to_string(),
        Some(egg::StopReason::IterationLimit(n)) => format!("iteration limit {n}"),
        Some(egg::StopReason::NodeLimit(n)) => format!("node limit {n}"),
        Some(egg::StopReason::TimeLimit(s)) => format!("time limit {s}s"),
        Some(egg::StopReason::Other(s)) => s.clone(),
        None => "not run".to_string(),
    };
    unit.egraph = runner.egraph;
    Saturation {
        iterations: runner.iterations.len(),
        nodes: unit.egraph.total_size(),
        classes: unit.egraph.number_of_classes(),
        stop,
    }
}

/// Fuses one unit: build, price unfused, saturate, extract, make its program.
pub fn fuse_unit(
    p: &Program,
    ops: Range<usize>,
    label: &str,
    opts: &FuseOptions,
) -> Result<FusedUnit, FuseError> {
    let mut unit = Unit::build(p, ops);
    let roots: Vec<_> = unit.roots.iter().map(|r| r.class()).collect();
    let unfused = extract(&unit.egraph, &roots, &opts.device).cost;
    let saturation = saturate(&mut unit, opts);
    let roots: Vec<_> = unit
        .roots
        .iter()
        .map(|r| unit.egraph.find(r.class()))
        .collect();
    let ex = extract(&unit.egraph, &roots, &opts.device);
    for r in unit.roots.iter_mut() {
        *r = match *r {
            super::unit::Root::Value { offset, class } => super::unit::Root::Value {
                offset,
                class: unit.egraph.find(class),
            },
            super::unit::Root::Effect { offset, class } => super::unit::Root::Effect {
                offset,
                class: unit.egraph.find(class),
            },
        };
    }
    Ok(FusedUnit::new(
        p, &unit, &ex, label, saturation, unfused, opts,
    )?)
}

/// Fuses every unit of `p`.
pub fn fuse(p: &Program, opts: &FuseOptions) -> Result<Fused, FuseError> {
    let seg = discover(p);
    let mut units = vec![];
    let mut sequence = vec![];
    if !seg.head.is_empty() {
        units.push(fuse_unit(p, seg.head.clone(), "head", opts)?);
        sequence.push((units.len() - 1, seg.head.start));
    }
    let first_template = units.len();
    for (t, tpl) in seg.templates.iter().enumerate() {
        let rep = &seg.instances[tpl.instances[0]];
        units.push(fuse_unit(p, rep.ops.clone(), &format!("T{t}"), opts)?);
    }
    for inst in &seg.instances {
        sequence.push((first_template + inst.template.0 as usize, inst.ops.start));
    }
    if !seg.tail.is_empty() {
        units.push(fuse_unit(p, seg.tail.clone(), "tail", opts)?);
        sequence.push((units.len() - 1, seg.tail.start));
    }
    Ok(Fused {
        segmentation: seg,
        units,
        sequence,
    })
}

/// A bump allocator of aligned slices in one buffer.
struct Region {
    id: BufferId,
    size: u64,
}

impl Region {
    fn alloc(&mut self, bytes: u64) -> Slice {
        let offset = self.size.div_ceil(ALIGN) * ALIGN;
        let size = bytes.max(4).div_ceil(4) * 4;
        self.size = offset + size;
        Slice {
            buffer: self.id,
            offset,
            size,
        }
    }
}

type KernelKey = (String, Vec<u32>, usize, usize);

struct Lowering<'a> {
    p: &'a Program,
    bufs: [Region; 4],
    state_slices: Vec<Slice>,
    io_logits: Slice,
    logits: ValueId,
    values: HashMap<ValueId, Slice>,
    packed: HashMap<Vec<ValueId>, Slice>,
    /// Weights stored transposed, by value.
    transposed: HashMap<ValueId, Slice>,
    uploads: Vec<WeightUpload>,
    kernels: Vec<KernelDecl>,
    kernel_ids: HashMap<KernelKey, KernelId>,
    /// The matvec kernels, for persistent regions.
    matvecs: MatvecKernels,
    /// The kernels' parts in the prefetches: streaming weights (targets), and how; hosting
    /// them (the attention blocks, with their caches' shape, and linear-attention steps).
    prefetch_roles: HashMap<KernelId, prefetch::Role>,
    /// The zero kernels (merged per level by [`zeros::merge`]).
    zeros: HashSet<KernelId>,
    dispatches: Vec<Dispatch>,
    accesses: Vec<Access>,
    /// Arena allocations (base slices), for the buffer plan.
    arena_allocs: Vec<Slice>,
    /// The arrival counters ([`super::program::Arrival`]): one zeroed slice of the state
    /// buffer shared by every such kernel (each dispatch leaves it zero, and they run in
    /// different levels).
    arrival_counters: Option<Slice>,
    /// The token state, and how it holds the token (`TokenEncoding::Key`: the embedding
    /// decodes it, and nothing else but the step's matvec may bind it).
    token: Slice,
    token_encoding: TokenEncoding,
    /// The defines every generated kernel gets ([`FuseOptions::f16_dots`], `int8_chain`).
    defines: &'static str,
}

const WEIGHTS: usize = 0;
const STATE: usize = 1;
const IO: usize = 2;
const ARENA: usize = 3;

impl Lowering<'_> {
    fn weight(&mut self, v: ValueId) -> Result<Slice, FuseError> {
        if let Some(s) = self.values.get(&v) {
            return Ok(*s);
        }
        let ty = self.p.ty(v).clone();
        let s = match &self.p.def(v).kind {
            OpKind::Weight { name } => {
                let s = self.bufs[WEIGHTS].alloc(ty.bytes() as u64);
                self.uploads.push(WeightUpload {
                    tensor: name.clone(),
                    dst: Slice {
                        size: ty.bytes() as u64,
                        ..s
                    },
                });
                s
            }
            OpKind::WeightStack { pattern, count } => {
                let s = self.bufs[WEIGHTS].alloc(ty.bytes() as u64);
                let per = (ty.bytes() / count) as u64;
                for e in 0..*count {
                    self.uploads.push(WeightUpload {
                        tensor: pattern.replace("{}", &e.to_string()),
                        dst: Slice {
                            buffer: s.buffer,
                            offset: s.offset + e as u64 * per,
                            size: per,
                        },
                    });
                }
                s
            }
            OpKind::ReadState { state } => self.state_slices[state.index()],
            _ => {
                return Err(FuseError::Internal(format!(
                    "value {v} is read before any kernel wrote it"
                )))
            }
        };
        self.values.insert(v, s);
        Ok(s)
    }

    fn packed(&mut self, parts: &[ValueId]) -> Result<Slice, FuseError> {
        if let Some(s) = self.packed.get(parts) {
            return Ok(*s);
        }
        let total: usize = parts.iter().map(|v| self.p.ty(*v).bytes()).sum();
        let s = self.bufs[WEIGHTS].alloc(total as u64);
        let mut at = s.offset;
        for v in parts {
            // A weight, or stacked expert weights (one tensor per expert, in expert order).
            let Some(tensors) = self.p.def(*v).kind.tensors() else {
                return Err(FuseError::Internal(format!(
                    "packed value {v} is no weight"
                )));
            };
            let bytes = self.p.ty(*v).bytes() as u64 / tensors.len() as u64;
            for tensor in tensors {
                self.uploads.push(WeightUpload {
                    tensor,
                    dst: Slice {
                        buffer: s.buffer,
                        offset: at,
                        size: bytes,
                    },
                });
                at += bytes;
            }
        }
        self.packed.insert(parts.to_vec(), s);
        Ok(s)
    }

    /// Weight `v` (a matrix) stored transposed: the upload names the derived tensor
    /// ([`crate::import::layout::transposed`]) that the weights' source computes.
    fn transposed(&mut self, v: ValueId) -> Result<Slice, FuseError> {
        if let Some(s) = self.transposed.get(&v) {
            return Ok(*s);
        }
        let OpKind::Weight { name } = &self.p.def(v).kind else {
            return Err(FuseError::Internal(format!(
                "transposed value {v} is no weight"
            )));
        };
        let ty = self.p.ty(v);
        let &[rows, cols] = ty.shape.dims() else {
            return Err(FuseError::Internal(format!(
                "transposed weight {name} is no matrix"
            )));
        };
        let bytes = layout::transposed_bytes(ty.dtype, rows, cols) as u64;
        let s = self.bufs[WEIGHTS].alloc(bytes);
        self.uploads.push(WeightUpload {
            tensor: layout::transposed(name),
            dst: Slice { size: bytes, ..s },
        });
        self.transposed.insert(v, s);
        Ok(s)
    }

    fn leaf_value(&self, leaf: LeafRef, start: usize) -> Result<ValueId, FuseError> {
        leaf.value(self.p, start)
            .ok_or_else(|| FuseError::Internal("a state leaf used as a value".into()))
    }

    /// The kernel of generated source `gen` (compiled on first use; true: just added).
    fn generated_kernel(
        &mut self,
        gen: &Generated,
        subgroups: Option<u32>,
        spirv: &mut SpirvCache,
    ) -> Result<(KernelId, bool), FuseError> {
        let source = crate::kernels::with_defines(&gen.source, self.defines);
        let key = (source.clone(), gen.spec_constants.clone(), 0, gen.bindings);
        if let Some(k) = self.kernel_ids.get(&key) {
            return Ok((*k, false));
        }
        let id = KernelId(self.kernels.len() as u32);
        self.kernels.push(KernelDecl {
            label: gen.label.clone(),
            spirv: spirv.get_source(&gen.label, &source)?,
            bindings: gen.bindings as u32,
            push_constant_bytes: 0,
            spec_constants: gen.spec_constants.clone(),
            subgroups,
        });
        self.kernel_ids.insert(key, id);
        Ok((id, true))
    }

    /// Lowers one instance (first op `start`) of `fu`.
    fn instance(
        &mut self,
        fu: &FusedUnit,
        start: usize,
        spirv: &mut SpirvCache,
    ) -> Result<(), FuseError> {
        let mut slots: Vec<Option<Slice>> = vec![None; fu.values.len()];
        let logits_value: Vec<usize> = fu
            .outputs
            .iter()
            .filter(|(o, _)| self.p.ops[start + o].result == Some(self.logits))
            .map(|(_, v)| *v)
            .collect();
        for (ki, k) in fu.kernels.iter().enumerate() {
            let mut bindings = Vec::with_capacity(k.bindings.len());
            for &v in &k.bindings {
                let s = match &fu.values[v] {
                    // Allocated by its producer, or by the zero kernel running before it.
                    UValue::Out { kernel, bytes, .. }
                        if slots[v].is_none()
                            && (*kernel == ki || matches!(k.kind, KernelKind::Zero { .. })) =>
                    {
                        let s = if logits_value.contains(&v) {
                            self.io_logits
                        } else {
                            let s = self.bufs[ARENA].alloc(*bytes);
                            self.arena_allocs.push(s);
                            s
                        };
                        slots[v] = Some(s);
                        s
                    }
                    _ => self.resolve(fu, &mut slots, v, start)?,
                };
                bindings.push(s);
            }
            let mut alternatives = vec![];
            let (kernel, push_constants, workgroups, label) = match &k.kind {
                KernelKind::Unfused { offset } | KernelKind::InPlace { offset } => {
                    let id = OpId::new(start + offset);
                    let mut call =
                        kernels::select(self.p, id).ok_or_else(|| FuseError::NoKernel {
                            op: id.to_string(),
                            text: self.p.op_text(id),
                        })?;
                    if self.token_encoding == TokenEncoding::Key && bindings.contains(&self.token) {
                        if !matches!(self.p.ops[id.index()].kind, OpKind::Embedding) {
                            return Err(FuseError::Internal(format!(
                                "`{}` reads the token state, which holds the argmax's key: \
                                 only the embedding decodes it",
                                self.p.op_text(id)
                            )));
                        }
                        call.defines.push(("TOKEN_KEY".into(), "1".into()));
                    }
                    let variant: Vec<String> = call
                        .defines
                        .iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect();
                    let label = format!("{}[{}]", call.kernel, variant.join(","));
                    let key = (
                        label.clone(),
                        call.spec_constants.clone(),
                        call.push_constants.len(),
                        call.bindings,
                    );
                    let kernel = match self.kernel_ids.get(&key) {
                        Some(k) => *k,
                        None => {
                            let id = KernelId(self.kernels.len() as u32);
                            self.kernels.push(KernelDecl {
                                label,
                                spirv: spirv.get(&call)?,
                                bindings: call.bindings as u32,
                                push_constant_bytes: call.push_constants.len() as u32,
                                spec_constants: call.spec_constants.clone(),
                                subgroups: call.subgroups(),
                            });
                            self.kernel_ids.insert(key, id);
                            id
                        }
                    };
                    (
                        kernel,
                        call.push_constants.clone(),
                        call.workgroups,
                        self.p.op_text(id),
                    )
                }
                _ => {
                    let gen = k
                        .generated
                        .as_ref()
                        .ok_or_else(|| FuseError::Internal("a fused kernel without code".into()))?;
                    let step = matches!(&k.kind, KernelKind::Matvec(spec) if spec.step);
                    if self.token_encoding == TokenEncoding::Key
                        && !step
                        && bindings.contains(&self.token)
                    {
                        return Err(FuseError::Internal(format!(
                            "`{}` binds the token state, which holds the argmax's key",
                            gen.label
                        )));
                    }
                    let subgroups = match &k.kind {
                        KernelKind::Matvec(_) => {
                            crate::kernels::matvec_subgroups(&gen.spec_constants)
                        }
                        _ => None,
                    };
                    let kernel = match self.generated_kernel(gen, subgroups, spirv)? {
                        (id, false) => id,
                        (id, true) => {
                            if let KernelKind::Matvec(spec) = &k.kind {
                                self.matvecs.insert(id, (spec.clone(), gen.clone()));
                            }
                            match k.kind {
                                KernelKind::Matvec(_) => {
                                    self.prefetch_roles.insert(id, prefetch::Role::Matvec);
                                }
                                KernelKind::Chain(_) => {
                                    self.prefetch_roles.insert(id, prefetch::Role::Chain);
                                }
                                KernelKind::Attention(ref a) => {
                                    let role = prefetch::Role::Attention {
                                        heads: a.hkv as u32,
                                        capacity: a.capacity as u32,
                                    };
                                    self.prefetch_roles.insert(id, role);
                                }
                                _ => {}
                            }
                            if matches!(k.kind, KernelKind::Zero { .. }) {
                                self.zeros.insert(id);
                            }
                            id
                        }
                    };
                    let ops: Vec<String> = k
                        .covers
                        .iter()
                        .filter(|&&o| fu.op_names[o] != "reshape")
                        .map(|o| format!("#{}", start + o))
                        .collect();
                    let label = format!("{} ({})", k.describe(&fu.op_names), ops.join(" "));
                    for (below, alt) in &k.alternatives {
                        let (id, _) = self.generated_kernel(alt, None, spirv)?;
                        alternatives.push(Alternative {
                            below: *below,
                            kernel: id,
                            workgroups: alt.workgroups,
                        });
                    }
                    (kernel, vec![], gen.workgroups, label)
                }
            };
            // A kernel combining by last arrival: its scratch (placed in the arena like a value
            // live in this dispatch's level only) and its counters, after its other bindings.
            let mut writes = k.writes.clone();
            if let Some(arrival) = k.arrival() {
                if arrival.scratch_bytes > 0 {
                    let scratch = self.bufs[ARENA].alloc(arrival.scratch_bytes);
                    self.arena_allocs.push(scratch);
                    writes.push(bindings.len());
                    bindings.push(scratch);
                }
                let counters = self.arrival_counters.ok_or_else(|| {
                    FuseError::Internal(format!("`{label}` has no arrival counters"))
                })?;
                writes.push(bindings.len());
                bindings.push(Slice {
                    size: arrival.counter_bytes,
                    ..counters
                });
            }
            if bindings.len() != self.kernels[kernel.index()].bindings as usize {
                return Err(FuseError::Internal(format!(
                    "`{label}` binds {} buffers, its kernel declares {}",
                    bindings.len(),
                    self.kernels[kernel.index()].bindings
                )));
            }
            let mut access = Access::default();
            for (i, s) in bindings.iter().enumerate() {
                if writes.contains(&i) {
                    access.writes.push(*s);
                } else {
                    access.reads.push(*s);
                }
            }
            self.accesses.push(access);
            self.dispatches.push(Dispatch {
                kernel,
                bindings,
                push_constants,
                workgroups,
                label,
                alternatives,
                ops: k.covers.iter().map(|o| (start + o) as u32).collect(),
            });
        }
        for &(offset, v) in &fu.outputs {
            let s = self.resolve(fu, &mut slots, v, start)?;
            if let Some(r) = self.p.ops[start + offset].result {
                self.values.insert(r, s);
            }
        }
        Ok(())
    }

    fn resolve(
        &mut self,
        fu: &FusedUnit,
        slots: &mut [Option<Slice>],
        v: usize,
        start: usize,
    ) -> Result<Slice, FuseError> {
        if let Some(s) = slots[v] {
            return Ok(s);
        }
        let s = match &fu.values[v] {
            UValue::Leaf { leaf, .. } => match leaf {
                LeafRef::StateOf { .. } => {
                    let st = leaf
                        .state(self.p, start)
                        .ok_or_else(|| FuseError::Internal("a state leaf without state".into()))?;
                    self.state_slices[st.index()]
                }
                _ => {
                    let value = self.leaf_value(*leaf, start)?;
                    self.weight(value)?
                }
            },
            UValue::View {
                of,
                byte_offset,
                ty,
            } => {
                let base = self.resolve(fu, slots, *of, start)?;
                Slice {
                    buffer: base.buffer,
                    offset: base.offset + byte_offset,
                    size: (ty.bytes() as u64).max(4).div_ceil(4) * 4,
                }
            }
            UValue::Packed { parts, .. } => {
                let mut ids = vec![];
                for &part in parts {
                    let UValue::Leaf { leaf, .. } = &fu.values[part] else {
                        return Err(FuseError::Internal("a packed part is no leaf".into()));
                    };
                    ids.push(self.leaf_value(*leaf, start)?);
                }
                self.packed(&ids)?
            }
            UValue::Transposed { of } => {
                let UValue::Leaf { leaf, .. } = &fu.values[*of] else {
                    return Err(FuseError::Internal("a transposed value is no leaf".into()));
                };
                let value = self.leaf_value(*leaf, start)?;
                self.transposed(value)?
            }
            UValue::Written { of, .. } => self.resolve(fu, slots, *of, start)?,
            UValue::Out { .. } => {
                return Err(FuseError::Internal(
                    "a kernel output read before its kernel ran".into(),
                ))
            }
            UValue::Effect { .. } => {
                return Err(FuseError::Internal("an effect bound as a buffer".into()))
            }
        };
        slots[v] = Some(s);
        Ok(s)
    }
}

/// Lowers `p` with fusion to a schedule the executors run as they run the unfused one.
pub fn lower_fused(
    p: &Program,
    meta: &Meta,
    spirv: &mut SpirvCache,
    opts: &FuseOptions,
) -> Result<(Schedule, FusionReport), FuseError> {
    let fused = fuse(p, opts)?;
    let (schedule, plan) = lower_units_planned(p, meta, spirv, opts, &fused)?;
    let mut report = FusionReport::new(p, &fused, &schedule);
    report.plan = Some(plan);
    Ok((schedule, report))
}

/// Instantiates the fused units of `fused` into a schedule.
pub fn lower_units(
    p: &Program,
    meta: &Meta,
    spirv: &mut SpirvCache,
    opts: &FuseOptions,
    fused: &Fused,
) -> Result<Schedule, FuseError> {
    Ok(lower_units_planned(p, meta, spirv, opts, fused)?.0)
}

/// [`lower_units`], also returning the arena plan (for the report: arena vs lower bound).
pub fn lower_units_planned(
    p: &Program,
    meta: &Meta,
    spirv: &mut SpirvCache,
    opts: &FuseOptions,
    fused: &Fused,
) -> Result<(Schedule, plan::Plan), FuseError> {
    let logits = p
        .output("logits")
        .ok_or(FuseError::Missing("a `logits` output"))?;
    let token = p
        .state_of_kind(StateKind::Token)
        .ok_or(FuseError::Missing("a token state"))?;
    let position = p
        .state_of_kind(StateKind::Position)
        .ok_or(FuseError::Missing("a position state"))?;
    let mut bufs = [0, 1, 2, 3].map(|i| Region {
        id: BufferId(i),
        size: 0,
    });
    // Where the matvec computing the logits also picks the token (`argmax-in-matvec`), its
    // workgroups fold their rows into the token state as a 64-bit key with one atomicMax each,
    // counting no arrival (matvec_step.glsl): the state holds the key, 8 bytes, which the
    // embedding decodes, the host too.
    let token_encoding = if fused
        .units
        .iter()
        .flat_map(|u| &u.kernels)
        .any(|k| matches!(&k.kind, KernelKind::Matvec(spec) if spec.step))
    {
        TokenEncoding::Key
    } else {
        TokenEncoding::Index
    };
    let state_slices: Vec<Slice> = p
        .states
        .iter()
        .map(|s| match s.kind {
            StateKind::Token => bufs[IO].alloc(token_encoding.bytes()),
            StateKind::Position => bufs[IO].alloc(s.ty.bytes() as u64),
            _ => bufs[STATE].alloc(s.ty.bytes() as u64),
        })
        .collect();
    let token_slice = state_slices[token.index()];
    let io_logits = bufs[IO].alloc(p.ty(logits).bytes() as u64);
    // The arrival counters: one zeroed state slice for every kernel combining by last arrival
    // (and the attention bands' polled partials), sized for the largest.
    let counter_bytes = fused
        .units
        .iter()
        .flat_map(|u| &u.kernels)
        .filter_map(|k| k.arrival().map(|a| a.counter_bytes))
        .max();
    let arrival_counters = counter_bytes.map(|bytes| bufs[STATE].alloc(bytes));
    let mut l = Lowering {
        p,
        bufs,
        state_slices,
        io_logits,
        logits,
        values: HashMap::new(),
        packed: HashMap::new(),
        transposed: HashMap::new(),
        uploads: vec![],
        kernels: vec![],
        kernel_ids: HashMap::new(),
        matvecs: HashMap::new(),
        prefetch_roles: HashMap::new(),
        zeros: HashSet::new(),
        dispatches: vec![],
        accesses: vec![],
        arena_allocs: vec![],
        arrival_counters,
        token: token_slice,
        token_encoding,
        defines: super::dots::defines(opts.f16_dots, opts.int8_chain),
    };
    for &(u, start) in &fused.sequence {
        l.instance(&fused.units[u], start, spirv)?;
    }

    let regions = regions(&l.accesses);
    let mut slots: Vec<Option<Dispatch>> = l.dispatches.drain(..).map(Some).collect();
    let mut dispatches: Vec<Dispatch> = regions
        .order
        .iter()
        .map(|&i| slots[i].take().expect("a permutation"))
        .collect();

    // Arena allocations placed from level-based liveness (views map to their allocation).
    let arena_id = BufferId(ARENA as u32);
    let allocs = &l.arena_allocs;
    let alloc_of = |s: &Slice| -> Option<usize> {
        let i = allocs.partition_point(|a| a.offset <= s.offset);
        (i > 0 && s.offset < allocs[i - 1].offset + allocs[i - 1].size).then_some(i - 1)
    };
    let mut requests: Vec<Request> = allocs
        .iter()
        .map(|a| Request {
            bytes: a.size,
            first: u32::MAX,
            last: 0,
        })
        .collect();
    for (level, range) in regions.levels.iter().enumerate() {
        for d in &dispatches[range.start as usize..range.end as usize] {
            for b in d.bindings.iter().filter(|b| b.buffer == arena_id) {
                let i = alloc_of(b).ok_or_else(|| {
                    FuseError::Internal(format!("arena slice at {} has no allocation", b.offset))
                })?;
                requests[i].first = requests[i].first.min(level as u32);
                requests[i].last = requests[i].last.max(level as u32);
            }
        }
    }
    for r in &mut requests {
        if r.first == u32::MAX {
            r.first = 0;
        }
    }
    // Levels replay may hand over run with no barrier between them, so a slot is kept to the
    // end of such a run: a later level of it must not write where an earlier one, maybe still
    // running, reads or writes (the runtime's plan checks this and keeps the barrier where it
    // finds such aliasing).
    let run_end = handoff_run_ends(&regions.levels, &dispatches, &l.kernels);
    for r in &mut requests {
        if let Some(&end) = run_end.get(r.last as usize) {
            r.last = end;
        }
    }
    let plan = if opts.plan_memory {
        plan::plan(&requests, ARENA_ALIGN)
    } else {
        plan::plan_naive(&requests, ARENA_ALIGN)
    }
    .map_err(FuseError::Plan)?;
    plan::check(&requests, &plan, ARENA_ALIGN).map_err(FuseError::Plan)?;
    // VKFUSE_ARENA_PAD=bytes (rounded down to ALIGN): every arena slice that much further, the
    // A/B knob of the placement probe (ARENA_ALIGN); read at compile time.
    let pad = crate::kernels::knob("VKFUSE_ARENA_PAD").map_or(0, |p| u64::from(p) / ALIGN * ALIGN);
    for d in &mut dispatches {
        for b in d.bindings.iter_mut().filter(|b| b.buffer == arena_id) {
            let i = alloc_of(b).expect("checked above");
            b.offset = pad + plan.offsets[i] + (b.offset - allocs[i].offset);
        }
    }
    l.bufs[ARENA].size = pad + plan.arena_bytes;

    let mut levels = regions.levels;
    let weights = BufferId(WEIGHTS as u32);
    let banded = dispatches.iter().any(|d| !d.alternatives.is_empty());
    let choice = opts
        .prefetch
        .unwrap_or_else(|| Prefetch::for_program(p, banded));
    let prefetches = prefetch::plan(&dispatches, &levels, &l.prefetch_roles, weights, choice);
    // By default only where the default weight prefetch finds enough to read (tiny models
    // gain nothing but dispatches), whatever `--prefetch-mib` says.
    let kv_choice = opts.kv_prefetch.unwrap_or_else(|| {
        let default = Prefetch::for_program(p, banded);
        if !prefetch::plan(&dispatches, &levels, &l.prefetch_roles, weights, default).is_empty() {
            KvPrefetch::for_program(p)
        } else {
            KvPrefetch::NONE
        }
    });
    let blocks = l
        .prefetch_roles
        .values()
        .any(|r| matches!(r, prefetch::Role::Attention { .. }));
    if !prefetches.is_empty() || (kv_choice.slots > 0 && blocks) {
        // Written never in practice (prefetch.comp): any 4 bytes nothing reads.
        let sink = l.bufs[STATE].alloc(4);
        prefetch::add(
            &mut dispatches,
            &mut levels,
            &mut l.kernels,
            prefetches,
            sink,
            spirv,
        )?;
        kv_prefetch::add(
            &mut dispatches,
            &mut levels,
            &mut l.kernels,
            &l.prefetch_roles,
            kv_choice,
            sink,
            spirv,
        )?;
    }

    let renumbered = zeros::merge(
        &mut dispatches,
        &mut levels,
        &mut l.kernels,
        &l.zeros,
        spirv,
    )?;
    if token_encoding == TokenEncoding::Key {
        // The key goes back below every logit's before the step's matvec folds into it again,
        // after level 0, whose embedding (and replay's copy to the host) reads it.
        zeros::reset_token_key(&mut dispatches, &mut levels, &mut l.kernels, l.token, spirv)?;
    }
    l.matvecs = std::mem::take(&mut l.matvecs)
        .into_iter()
        .filter_map(|(k, v)| renumbered[k.index()].map(|k| (k, v)))
        .collect();

    // An ablated schedule offers no regions: a region's body is rebuilt from its matvecs'
    // specs, without the ablation (fuse::ablate).
    let runs = if opts.persistent && opts.ablate.is_empty() {
        persistent::find_in(&dispatches, &levels, &l.matvecs)
    } else {
        vec![]
    };
    // The grid barrier's counters, zero like all state (and left zero by every barrier).
    let sync = (!runs.is_empty()).then(|| l.bufs[STATE].alloc(8));
    let buffers = lower::buffer_decls(l.bufs.iter().map(|r| r.size));
    let mut schedule = Schedule {
        meta: lower::model_meta(p, meta, logits),
        buffers,
        weights: l.uploads,
        kernels: l.kernels,
        dispatches,
        levels,
        io: Io {
            token: l.token,
            token_encoding,
            position: l.state_slices[position.index()],
            logits: l.io_logits,
        },
        persistent: vec![],
    };
    if let Some(sync) = sync {
        persistent::add_regions(&mut schedule, &runs, &l.matvecs, sync, spirv)?;
    }
    Ok((schedule, plan))
}

/// The unfused cost of a whole program (for reports): one dispatch per compute op.
pub fn unfused_dispatches(p: &Program) -> usize {
    p.ops.iter().filter(|o| !kernels::is_alias(&o.kind)).count()
}

impl Fused {
    /// Estimated cost of one token: every instance's unit cost.
    pub fn estimate(&self) -> Cost {
        let mut c = Cost::default();
        for &(u, _) in &self.sequence {
            let uc = self.units[u].cost;
            c.dispatches += uc.dispatches;
            c.levels += uc.levels;
            c.bytes += uc.bytes;
            c.us += uc.us;
        }
        c
    }
}

/// For each level, the last level of its run of levels that replay may hand over one to the
/// next (`vkfuse_runtime::session::handoff` plans the real handoffs from the same roles): level
/// i (from 2) may join level i - 1 when a kernel of i reads handoff words and one of i - 1
/// publishes. A superset of the runtime's handoffs, so planning against it is safe.
fn handoff_run_ends(
    levels: &[std::ops::Range<u32>],
    dispatches: &[Dispatch],
    kernels: &[KernelDecl],
) -> Vec<u32> {
    // Per kernel (its role is read from its SPIR-V once): (reads handoff words, publishes).
    let kernel_sides: Vec<(bool, bool)> = kernels
        .iter()
        .map(|k| {
            k.handoff_role()
                .map_or((false, false), |r| (!r.reads.is_empty(), r.publishes))
        })
        .collect();
    // Per level: (a kernel reads handoff words, a kernel publishes them).
    let sides: Vec<(bool, bool)> = levels
        .iter()
        .map(|level| {
            dispatches[level.start as usize..level.end as usize]
                .iter()
                .filter_map(|d| kernel_sides.get(d.kernel.index()))
                .fold((false, false), |(r, p), &(kr, kp)| (r || kr, p || kp))
        })
        .collect();
    let joins: Vec<bool> = (0..levels.len())
        .map(|i| i >= 2 && sides[i].0 && sides[i - 1].1)
        .collect();
    let mut ends = vec![0u32; levels.len()];
    let mut end = levels.len().saturating_sub(1);
    for i in (0..levels.len()).rev() {
        ends[i] = end as u32;
        if joins[i] {
            continue;
        }
        end = i.saturating_sub(1);
    }
    ends
}
