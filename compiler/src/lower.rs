//! Unfused lowering: one dispatch per op, one arena slice per value, dispatches grouped into
//! dependency levels. This is the eager baseline's schedule and the starting point of fusion.
//!
//! Buffers: `weights` (uploaded once), `state` (KV caches, conv and recurrent state), `io`
//! (token, position, logits; host-visible) and `arena` (everything else). Views cost nothing:
//! `reshape`, `read_state` and `kv_write` alias the slice they view.

use crate::import::TensorStore;
use crate::ir::{OpKind, Program, StateKind, ValueId};
use crate::kernels::{self, KernelCall, KernelError};
use crate::plan::{self, Plan, Request};
use crate::regions::{regions, Access};
use std::borrow::Cow;
use std::collections::HashMap;
use vkfuse_runtime::schedule::{
    BufferDecl, BufferId, BufferRole, Dispatch, Io, KernelDecl, KernelId, ModelMeta, Schedule,
    Slice, TokenEncoding, WeightUpload,
};
use vkfuse_runtime::session::TensorBytes;

/// Every slice starts at a multiple of this: at least any device's
/// `minStorageBufferOffsetAlignment` (the Vulkan spec caps it at 256).
pub const ALIGN: u64 = 256;

#[derive(Debug, thiserror::Error)]
pub enum LowerError {
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error("op {op} `{text}` has no kernel")]
    NoKernel { op: String, text: String },
    #[error("op {op} `{text}` reads state `{state}` after it was overwritten in the same step")]
    StateHazard {
        op: String,
        text: String,
        state: String,
    },
    #[error("the program lacks {0}")]
    Missing(&'static str),
    #[error("buffer planning failed (please report): {0}")]
    Plan(plan::PlanError),
}

/// Model facts the schedule carries.
#[derive(Clone, Debug, Default)]
pub struct Meta {
    pub architecture: String,
    pub eos_token_ids: Vec<u32>,
    /// The model's `tokenizer.json`, recorded verbatim in the schedule.
    pub tokenizer: Option<String>,
}

impl Meta {
    /// The facts of an imported model: its architecture, EOS ids and tokenizer.
    pub fn of(model: &crate::import::Model) -> Meta {
        Meta {
            architecture: model.config.architecture.clone(),
            eos_token_ids: model.config.eos_token_ids.clone(),
            tokenizer: model.tokenizer.clone(),
        }
    }
}

fn round4(bytes: u64) -> u64 {
    bytes.div_ceil(4) * 4
}

/// A bump allocator of aligned slices in one buffer.
struct Region {
    id: BufferId,
    size: u64,
}

impl Region {
    fn alloc(&mut self, bytes: u64) -> Slice {
        let offset = self.size.div_ceil(ALIGN) * ALIGN;
        let size = round4(bytes.max(4));
        self.size = offset + size;
        Slice {
            buffer: self.id,
            offset,
            size,
        }
    }
}

/// A kernel template and its defines: what one SPIR-V module is compiled from.
type KernelSource = (String, Vec<(String, String)>);

/// A pipeline's identity in a schedule: its source, specialisation constants, push-constant
/// bytes and binding count.
type PipelineKey = (String, Vec<(String, String)>, Vec<u32>, usize, usize);

/// SPIR-V per (kernel, defines), compiled once per process.
#[derive(Default)]
pub struct SpirvCache {
    library: HashMap<KernelSource, Vec<u32>>,
    /// Generated sources (the fused kernels), by content.
    generated: HashMap<String, Vec<u32>>,
    /// Every kernel wrapped for the timeline probe, recording these (`kernels::timeline`).
    timeline: Option<kernels::timeline::Records>,
    /// A probe's defines for every generated kernel ([`Self::with_probe_defines`]); `None`:
    /// `VKFUSE_DEFINES`.
    probe_defines: Option<String>,
}

impl SpirvCache {
    /// A cache whose kernels all record their workgroups' times, and where `records` says so
    /// the SMs they ran on (`compile-model --timeline`, `--timeline-sm`).
    pub fn timeline(records: kernels::timeline::Records) -> SpirvCache {
        SpirvCache {
            timeline: Some(records),
            ..SpirvCache::default()
        }
    }

    /// A cache whose generated kernels get the probe's `defines` (comma-separated, as
    /// `VKFUSE_DEFINES` takes them; the variable is then not read): for tests of a probe, which
    /// setting the variable would race with the other tests of the process.
    pub fn with_probe_defines(defines: &str) -> SpirvCache {
        SpirvCache {
            probe_defines: Some(defines.to_string()),
            ..SpirvCache::default()
        }
    }

    pub fn get(&mut self, call: &KernelCall) -> Result<Vec<u32>, KernelError> {
        let key = (call.kernel.to_string(), call.defines.clone());
        if let Some(words) = self.library.get(&key) {
            return Ok(words.clone());
        }
        let words = kernels::compile_with(call.kernel, &call.defines, self.timeline)?;
        self.library.insert(key, words.clone());
        Ok(words)
    }

    /// The SPIR-V of a generated source, compiled once per distinct source text.
    pub fn get_source(&mut self, label: &str, source: &str) -> Result<Vec<u32>, KernelError> {
        if let Some(words) = self.generated.get(source) {
            return Ok(words.clone());
        }
        // VKFUSE_DEFINES=A,B defines A and B (as 1) in every generated kernel: the A/B knob of
        // probes kept in the GLSL behind a define (`bench/h100 variants`); nothing by default.
        // Read once per process, so the cache stays keyed by the source as generated.
        let defines = match &self.probe_defines {
            Some(d) => d.clone(),
            None => std::env::var("VKFUSE_DEFINES").unwrap_or_default(),
        };
        let text = kernels::with_defines(source, &defines);
        let words = match self.timeline {
            Some(records) => {
                kernels::compile_source(label, &kernels::timeline::wrap(&text, records))?
            }
            None => kernels::compile_source(label, &text)?,
        };
        self.generated.insert(source.to_string(), words.clone());
        Ok(words)
    }
}

/// What lowering decided, for reports.
#[derive(Clone, Debug)]
pub struct LowerReport {
    /// The arena plan (offsets of every transient value).
    pub plan: Plan,
}

/// Lowers `p` to an unfused schedule.
pub fn lower(p: &Program, meta: &Meta, spirv: &mut SpirvCache) -> Result<Schedule, LowerError> {
    Ok(lower_with_report(p, meta, spirv, true)?.0)
}

/// Lowers `p` to an unfused schedule; `plan_memory = false` gives every value its own slot.
pub fn lower_with_report(
    p: &Program,
    meta: &Meta,
    spirv: &mut SpirvCache,
    plan_memory: bool,
) -> Result<(Schedule, LowerReport), LowerError> {
    let mut bufs = [
        Region {
            id: BufferId(0),
            size: 0,
        },
        Region {
            id: BufferId(1),
            size: 0,
        },
        Region {
            id: BufferId(2),
            size: 0,
        },
        Region {
            id: BufferId(3),
            size: 0,
        },
    ];
    let [weights, state, io, arena] = &mut bufs;
    let logits = p
        .output("logits")
        .ok_or(LowerError::Missing("a `logits` output"))?;
    let token = p
        .state_of_kind(StateKind::Token)
        .ok_or(LowerError::Missing("a token state"))?;
    let position = p
        .state_of_kind(StateKind::Position)
        .ok_or(LowerError::Missing("a position state"))?;

    // State slices; the token and position live in host-visible memory.
    let state_slices: Vec<Slice> = p
        .states
        .iter()
        .map(|s| match s.kind {
            StateKind::Token | StateKind::Position => io.alloc(s.ty.bytes() as u64),
            _ => state.alloc(s.ty.bytes() as u64),
        })
        .collect();
    let io_logits = io.alloc(p.ty(logits).bytes() as u64);

    let mut slices: Vec<Option<Slice>> = vec![None; p.values.len()];
    // The state each value aliases (read_state results and views of them).
    let mut alias: Vec<Option<usize>> = vec![None; p.values.len()];
    let mut uploads = vec![];
    let mut written: HashMap<usize, usize> = HashMap::new();
    let mut kernel_ids: HashMap<PipelineKey, KernelId> = HashMap::new();
    let mut kernels_out: Vec<KernelDecl> = vec![];
    let mut dispatches = vec![];

    for id in p.op_ids() {
        let op = p.op(id);
        let text = || p.op_text(id);
        for a in &op.args {
            if let Some(s) = alias[a.index()] {
                if written.contains_key(&s) {
                    return Err(LowerError::StateHazard {
                        op: id.to_string(),
                        text: text(),
                        state: p.states[s].name.clone(),
                    });
                }
            }
        }
        let arg = |v: &ValueId, slices: &[Option<Slice>]| {
            slices[v.index()].expect("SSA: defined before use")
        };
        let result_slice = match &op.kind {
            OpKind::Weight { name } => {
                let ty = p.ty(op.result.expect("weights have a result"));
                let s = weights.alloc(ty.bytes() as u64);
                uploads.push(WeightUpload {
                    tensor: name.clone(),
                    dst: Slice {
                        size: ty.bytes() as u64,
                        ..s
                    },
                });
                Some(s)
            }
            OpKind::WeightStack { pattern, count } => {
                let ty = p.ty(op.result.expect("weights have a result"));
                let s = weights.alloc(ty.bytes() as u64);
                let per = (ty.bytes() / count) as u64;
                for e in 0..*count {
                    let dst = Slice {
                        buffer: s.buffer,
                        offset: s.offset + e as u64 * per,
                        size: per,
                    };
                    uploads.push(WeightUpload {
                        tensor: pattern.replace("{}", &e.to_string()),
                        dst,
                    });
                }
                Some(s)
            }
            OpKind::ReadState { state } => {
                alias[op.result.expect("read_state has a result").index()] = Some(state.index());
                Some(state_slices[state.index()])
            }
            OpKind::Reshape { .. } => {
                let r = op.result.expect("reshape has a result");
                alias[r.index()] = alias[op.args[0].index()];
                Some(arg(&op.args[0], &slices))
            }
            _ => None,
        };
        if let Some(s) = result_slice {
            slices[op.result.expect("these ops have results").index()] = Some(s);
            continue;
        }
        let call = kernels::select(p, id).ok_or_else(|| LowerError::NoKernel {
            op: id.to_string(),
            text: text(),
        })?;
        let out = match &op.kind {
            OpKind::WriteState { state } | OpKind::KvWrite { state } => state_slices[state.index()],
            _ if op.result == Some(logits) => io_logits,
            _ => arena.alloc(p.ty(op.result.expect("compute ops have a result")).bytes() as u64),
        };
        if let Some(r) = op.result {
            slices[r.index()] = Some(out);
        }
        if let OpKind::WriteState { state } = &op.kind {
            written.insert(state.index(), id.index());
        }
        let mut bindings = vec![out];
        bindings.extend(op.args.iter().map(|a| arg(a, &slices)));
        let key = (
            call.kernel.to_string(),
            call.defines.clone(),
            call.spec_constants.clone(),
            call.push_constants.len(),
            call.bindings,
        );
        let kernel = match kernel_ids.get(&key) {
            Some(k) => *k,
            None => {
                let k = KernelId(kernels_out.len() as u32);
                let variant: Vec<String> = call
                    .defines
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                kernels_out.push(KernelDecl {
                    label: format!("{}[{}]", call.kernel, variant.join(",")),
                    spirv: spirv.get(&call)?,
                    bindings: call.bindings as u32,
                    push_constant_bytes: call.push_constants.len() as u32,
                    spec_constants: call.spec_constants.clone(),
                    subgroups: call.subgroups(),
                });
                kernel_ids.insert(key, k);
                k
            }
        };
        dispatches.push(Dispatch {
            kernel,
            bindings,
            push_constants: call.push_constants.clone(),
            workgroups: call.workgroups,
            label: text(),
            alternatives: vec![],
            ops: vec![id.index() as u32],
        });
    }

    // Binding 0 is what a dispatch writes (its result, or the state it updates); it reads the rest.
    let accesses: Vec<Access> = dispatches
        .iter()
        .map(|d: &Dispatch| Access {
            reads: d.bindings[1..].to_vec(),
            writes: vec![d.bindings[0]],
        })
        .collect();
    let regions = regions(&accesses);
    let mut slots: Vec<Option<Dispatch>> = dispatches.into_iter().map(Some).collect();
    let mut dispatches: Vec<Dispatch> = regions
        .order
        .iter()
        .map(|&i| slots[i].take().expect("a permutation"))
        .collect();

    // Arena values so far have distinct (naive) slots, so the regions above saw only true data
    // dependencies. Now place them from liveness measured in levels: dispatches of one level
    // run concurrently, so two values may share bytes only if a barrier separates every use of
    // one from every use of the other.
    let arena_id = arena.id;
    let mut requests: Vec<Request> = vec![];
    let mut index_of: HashMap<u64, usize> = HashMap::new();
    for (k, d) in dispatches.iter().enumerate() {
        let level = regions
            .levels
            .iter()
            .position(|l| l.contains(&(k as u32)))
            .expect("levels cover all") as u32;
        for b in d.bindings.iter().filter(|b| b.buffer == arena_id) {
            let i = *index_of.entry(b.offset).or_insert_with(|| {
                requests.push(Request {
                    bytes: b.size,
                    first: level,
                    last: level,
                });
                requests.len() - 1
            });
            requests[i].first = requests[i].first.min(level);
            requests[i].last = requests[i].last.max(level);
        }
    }
    let plan = if plan_memory {
        plan::plan(&requests, ALIGN)
    } else {
        plan::plan_naive(&requests, ALIGN)
    }
    .map_err(LowerError::Plan)?;
    plan::check(&requests, &plan, ALIGN).map_err(LowerError::Plan)?;
    for d in &mut dispatches {
        for b in d.bindings.iter_mut().filter(|b| b.buffer == arena_id) {
            b.offset = plan.offsets[index_of[&b.offset]];
        }
    }
    arena.size = plan.arena_bytes;
    let buffers = buffer_decls(bufs.iter().map(|r| r.size));
    let schedule = Schedule {
        meta: model_meta(p, meta, logits),
        buffers,
        weights: uploads,
        kernels: kernels_out,
        dispatches,
        levels: regions.levels,
        io: Io {
            token: state_slices[token.index()],
            token_encoding: TokenEncoding::Index,
            position: state_slices[position.index()],
            logits: io_logits,
        },
        persistent: vec![],
    };
    Ok((schedule, LowerReport { plan }))
}

/// The schedule's model facts; the KV capacity (max context) is the smallest cache's slots.
pub(crate) fn model_meta(p: &Program, meta: &Meta, logits: ValueId) -> ModelMeta {
    let capacity = p
        .states
        .iter()
        .filter(|s| s.kind == StateKind::KvCache)
        .map(|s| s.ty.shape.dims()[1] as u32)
        .min()
        .unwrap_or(u32::MAX);
    ModelMeta {
        architecture: meta.architecture.clone(),
        vocab_size: p.ty(logits).shape.numel() as u32,
        max_context: capacity,
        eos_token_ids: meta.eos_token_ids.clone(),
        tokenizer: meta.tokenizer.clone(),
    }
}

/// The id of the declaration of `label` with `spec_constants` in `decls`, declared if new with
/// the SPIR-V `spirv` returns (called only then): how the passes after the levels (prefetch,
/// zeros) add their kernels.
pub(crate) fn declare_kernel(
    decls: &mut Vec<KernelDecl>,
    label: String,
    spec_constants: Vec<u32>,
    bindings: usize,
    spirv: impl FnOnce() -> Result<Vec<u32>, KernelError>,
) -> Result<KernelId, KernelError> {
    if let Some(k) = decls
        .iter()
        .position(|k| k.label == label && k.spec_constants == spec_constants)
    {
        return Ok(KernelId(k as u32));
    }
    decls.push(KernelDecl {
        label,
        spirv: spirv()?,
        bindings: bindings as u32,
        push_constant_bytes: 0,
        spec_constants,
        subgroups: None,
    });
    Ok(KernelId(decls.len() as u32 - 1))
}

/// The four buffers every schedule declares, by `BufferId` (weights, state, io, arena), from
/// their sizes (at least 4 bytes: a buffer must have an address).
pub(crate) fn buffer_decls(sizes: impl IntoIterator<Item = u64>) -> Vec<BufferDecl> {
    let names = ["weights", "state", "io", "arena"];
    let roles = [
        BufferRole::Weights,
        BufferRole::State,
        BufferRole::Io,
        BufferRole::Arena,
    ];
    sizes
        .into_iter()
        .zip(names.iter().zip(roles))
        .map(|(size, (name, role))| BufferDecl {
            label: name.to_string(),
            size: size.max(4),
            role,
        })
        .collect()
}

impl TensorBytes for TensorStore {
    /// The checkpoint's bytes borrowed; a transposed or folded matrix made for this call.
    fn tensor_bytes(&self, tensor: &str) -> Result<Cow<'_, [u8]>, String> {
        match self.made_bytes(tensor) {
            Some(made) => made.map(Cow::Owned),
            None => self.bytes(tensor).map(Cow::Borrowed),
        }
        .map_err(|e| e.to_string())
    }

    fn tensor_len(&self, tensor: &str) -> Result<u64, String> {
        self.byte_len(tensor).map_err(|e| e.to_string())
    }
}
