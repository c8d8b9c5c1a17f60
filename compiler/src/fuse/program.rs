//! The fused program of a unit: the extraction turned into kernels over unit-level values, in
//! an order that respects data and state dependencies. It is built once per template and
//! instantiated for every instance by op offset ([`super::schedule`]).

use super::ablate;
use super::codegen::{
    self, AttnSpec, ChainSpec, ElementwiseSpec, Epi, ExpertSpec, ExtraSpec, GdnSpec, Generated,
    MatvecSpec, NormSpec, RouteSpec, Routing, TailSpec,
};
use super::cost::Cost;
use super::extract::Extraction;
use super::lang::{Attr, FuseGraph, FuseLang};
use super::rules::list_items;
use super::unit::{LeafRef, Root, Unit};
use crate::ir::{DType, OpKind, Program, StateId, Type};
use egg::{Id, Language};
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::ops::Range;

/// A value of the fused program; slices are found per instance.
#[derive(Clone, Debug, PartialEq)]
pub enum UValue {
    /// A leaf of the unit (weight, external value, state).
    Leaf { leaf: LeafRef, ty: Type },
    /// The output (binding 0) of a kernel, `bytes` long.
    Out { kernel: usize, ty: Type, bytes: u64 },
    /// A view of another value `byte_offset` bytes in.
    View {
        of: usize,
        byte_offset: u64,
        ty: Type,
    },
    /// Weight leaves packed row after row at compile time.
    Packed { parts: Vec<usize>, ty: Type },
    /// Weight leaf `of` (a matrix) stored transposed at compile time (`import::layout`).
    Transposed { of: usize },
    /// State `of` after kernel `writer` updated it in place.
    Written { of: usize, writer: usize },
    /// The effect of a kernel (no value).
    Effect { kernel: usize },
}

/// What a kernel computes.
#[derive(Clone, Debug, PartialEq)]
pub enum KernelKind {
    /// Unit op `offset`'s own unfused kernel (`kernels::select`).
    Unfused {
        offset: usize,
    },
    /// Unit op `offset`'s own kernel, writing its result into a state in place.
    InPlace {
        offset: usize,
    },
    Matvec(MatvecSpec),
    Elementwise(ElementwiseSpec),
    Attention(AttnSpec),
    Tail(TailSpec),
    Gdn(GdnSpec),
    Route(RouteSpec),
    ExpertSum(ExpertSpec),
    ExpertGlu(ExpertSpec),
    /// Two matvecs in one kernel, accumulating into its output (zeroed by a `Zero` kernel).
    Chain(ChainSpec),
    /// Zeroes `words` words of binding 0, which a `Chain` kernel then accumulates into: the
    /// value's slot is allocated here, its producer is the chain kernel.
    Zero {
        words: usize,
    },
}

/// The extra buffers of a kernel whose workgroups combine by last arrival (the split attention
/// block, the multi-workgroup tail, the linear-attention step in parts): each workgroup writes
/// its partial to the scratch (or, the step, its output) and counts itself; the last combines
/// and sets the counters back to zero. Both are bound after
/// the kernel's other bindings, the scratch first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arrival {
    /// Bytes of the partials (transient: placed in the arena, live in the kernel's level; 0:
    /// no scratch binding).
    pub scratch_bytes: u64,
    /// Bytes of the arrival counters (a zeroed state slice every such kernel may share: each
    /// leaves it zero, and no two run at once, since each binds it writable and a barrier
    /// separates writers of one slice, with handoffs too); a split attention block with bands
    /// also binds its bands' polled partials after the counters ([`UKernel::arrival`]).
    pub counter_bytes: u64,
}

impl KernelKind {
    /// The scratch and counters the kernel binds, if it combines by last arrival.
    pub fn arrival(&self) -> Option<Arrival> {
        match self {
            KernelKind::Attention(spec) if spec.splits > 1 => Some(Arrival {
                scratch_bytes: spec.partial_bytes(),
                counter_bytes: spec.counter_bytes(),
            }),
            KernelKind::Tail(spec) if codegen::tail_groups(spec) > 1 => Some(Arrival {
                scratch_bytes: 8 * codegen::tail_groups(spec) as u64,
                counter_bytes: 4,
            }),
            KernelKind::Gdn(spec) if spec.parts > 1 => Some(Arrival {
                scratch_bytes: 0,
                counter_bytes: 4 * spec.hk as u64,
            }),
            _ => None,
        }
    }
}

/// One kernel of the fused program.
#[derive(Clone, Debug, PartialEq)]
pub struct UKernel {
    pub kind: KernelKind,
    /// The value bound at each binding.
    pub bindings: Vec<usize>,
    /// The bindings it writes (the rest it only reads).
    pub writes: Vec<usize>,
    /// The unit ops it computes (offsets, ascending).
    pub covers: Vec<usize>,
    /// The generated source of a fused kernel.
    pub generated: Option<Generated>,
    /// Other grids of it for short positions, by ascending first position not served
    /// (`Dispatch::alternatives`): the attention block's bands.
    pub alternatives: Vec<(u32, Generated)>,
}

impl UKernel {
    /// The scratch and counters it binds, if it combines by last arrival ([`KernelKind::arrival`]):
    /// an attention block with bands binds, after its counters, the words its bands' splits
    /// publish their partials in where they combine by polling (fused_attention.glsl's
    /// `polled()`), sized for the block's own splits, which no band exceeds.
    pub fn arrival(&self) -> Option<Arrival> {
        let mut a = self.kind.arrival()?;
        if let KernelKind::Attention(spec) = &self.kind {
            if !self.alternatives.is_empty() {
                a.counter_bytes += spec.partial_bytes();
            }
        }
        Some(a)
    }
}

/// Saturation figures of a unit.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Saturation {
    pub iterations: usize,
    pub nodes: usize,
    pub classes: usize,
    pub stop: String,
}

/// A rule match refused by a condition, located by unit op offsets.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct RefusalAt {
    pub rule: &'static str,
    pub reason: String,
    pub ops: Vec<usize>,
}

/// A fused form extraction did not take, because it costs more where it is.
#[derive(Clone, Debug, PartialEq)]
pub struct KeptAt {
    /// The unit ops of the class.
    pub ops: Vec<usize>,
    /// The fused node's name.
    pub fused: String,
    /// The unit's estimate with the fused form, and as extracted (µs).
    pub fused_us: f64,
    pub chosen_us: f64,
}

/// The fused program of one unit.
#[derive(Clone, Debug)]
pub struct FusedUnit {
    /// `head`, `T0`, `T1`, .., `tail`.
    pub label: String,
    /// The ops of the representative instance.
    pub ops: Range<usize>,
    pub values: Vec<UValue>,
    /// In execution order.
    pub kernels: Vec<UKernel>,
    /// (unit op offset, value) for every value read after the unit.
    pub outputs: Vec<(usize, usize)>,
    /// Kernel names of the unit's ops (for reports).
    pub op_names: Vec<&'static str>,
    pub cost: Cost,
    /// The same unit without fusion (one kernel per compute op).
    pub unfused: Cost,
    pub saturation: Saturation,
    pub refusals: Vec<RefusalAt>,
    pub kept: Vec<KeptAt>,
}

/// Why a unit's extraction could not become kernels (a bug in a rule or in extraction).
#[derive(Debug, thiserror::Error)]
pub enum ProgramError {
    #[error("unit {unit}: {message} (please report)")]
    Internal { unit: String, message: String },
    /// Attention bands given in the options that the attention block cannot take.
    #[error("attention bands: {0}")]
    Bands(String),
}

struct Builder<'a> {
    p: &'a Program,
    opts: &'a super::schedule::FuseOptions,
    unit: &'a Unit,
    ex: &'a Extraction,
    g: &'a FuseGraph,
    label: &'a str,
    values: Vec<UValue>,
    kernels: Vec<UKernel>,
    memo: HashMap<Id, usize>,
}

impl Builder<'_> {
    /// The attention block's grids for short positions ([`super::bands`]), as (first position
    /// not served, kernel): the options' bands, an error where one cannot apply (the block
    /// unsplit, or a band with more splits than the block's scratch holds); else the weights'
    /// default bands that can. Bands that no position reaches (starting at or past the
    /// capacity) and trailing ones on the block's own grid (its splits, workgroup and walk)
    /// are dropped, and a band that compiles to the kernel of the band before (a workgroup
    /// raised to the head's width) extends that band.
    fn attention_bands(
        &self,
        spec: &AttnSpec,
        walk: bool,
    ) -> Result<Vec<(u32, Generated)>, ProgramError> {
        let given = self.opts.attention_bands.as_ref();
        let bands = match given {
            Some(b) => b.clone(),
            None => super::bands::for_program(self.p, spec.workgroup, spec.splits),
        };
        let head = spec.head_dim.next_power_of_two() as u32;
        // The bands' highest splits wait for the others inside the dispatch, one per head: sound
        // where the device holds more of its workgroups than there are heads, which one per
        // compute unit at least gives (kernels/glsl/handoff.glsl); and only for bands of the
        // splits where polling was measured faster (bands::MAX_POLLED_SPLITS).
        let room = spec.hq < self.opts.device.compute_units;
        let mut out: Vec<(u32, AttnSpec)> = vec![];
        let mut from = 0u32;
        for b in bands {
            let fits = spec.splits > 1 && (2..=spec.splits).contains(&b.splits);
            if !fits && given.is_some() {
                return Err(ProgramError::Bands(match spec.splits {
                    0 | 1 => format!(
                        "band {b} needs a split attention block, and this one runs unsplit \
                         (--attention-splits, or the shapes' default)"
                    ),
                    s => format!(
                        "band {b} has more splits than the attention block's {s}, whose \
                         scratch it uses"
                    ),
                }));
            }
            if !fits || from as usize >= spec.capacity {
                continue;
            }
            from = b.below;
            // At least the head, as the block's own.
            let band = AttnSpec {
                splits: b.splits,
                workgroup: b.workgroup.max(head),
                polled_combine: room && b.splits <= super::bands::MAX_POLLED_SPLITS,
                subgroup_walk: walk && codegen::subgroup_walk_fits(b.below as usize, b.splits),
                ..spec.clone()
            };
            // A band on the kernel of the one before (a half-width band raised to the head's
            // width) is that band over both ranges. Bounds out of order are left for the
            // schedule's validation to refuse.
            match out.last_mut() {
                Some(last) if last.1 == band && last.0 < b.below => last.0 = b.below,
                _ => out.push((b.below, band)),
            }
        }
        while out.last().is_some_and(|(_, b)| {
            b.splits == spec.splits
                && b.workgroup == spec.workgroup
                && b.subgroup_walk == spec.subgroup_walk
        }) {
            out.pop();
        }
        Ok(out
            .into_iter()
            .map(|(below, band)| {
                (
                    below,
                    ablate::apply(&self.opts.ablate, codegen::attention(&band)),
                )
            })
            .collect())
    }

    fn err(&self, message: impl Into<String>) -> ProgramError {
        ProgramError::Internal {
            unit: self.label.to_string(),
            message: message.into(),
        }
    }

    fn node(&self, c: Id) -> Result<&FuseLang, ProgramError> {
        self.ex
            .choice
            .get(&self.g.find(c))
            .ok_or_else(|| self.err(format!("class {c} has no chosen node")))
    }

    fn ty(&self, c: Id) -> Result<Type, ProgramError> {
        self.g[c]
            .data
            .ty
            .clone()
            .ok_or_else(|| self.err(format!("class {c} has no type")))
    }

    fn attr(&self, c: Id) -> Result<Attr, ProgramError> {
        self.g[c]
            .nodes
            .iter()
            .find_map(|n| match n {
                FuseLang::Attr(a) => Some(a.clone()),
                _ => None,
            })
            .ok_or_else(|| self.err(format!("class {c} is no attribute")))
    }

    fn push_value(&mut self, v: UValue) -> usize {
        self.values.push(v);
        self.values.len() - 1
    }

    fn push_kernel(&mut self, k: UKernel) -> usize {
        self.kernels.push(k);
        self.kernels.len() - 1
    }

    /// Whether value `v` is (a view of) the output of a kernel that can publish its output as
    /// handoff words: the attention block, the linear-attention step or a matvec
    /// (`kernels/glsl/handoff.glsl`).
    fn published(&self, v: usize) -> bool {
        match &self.values[v] {
            UValue::View { of, .. } => self.published(*of),
            UValue::Out { kernel, .. } => matches!(
                self.kernels.get(*kernel).map(|k| &k.kind),
                Some(KernelKind::Attention(_) | KernelKind::Gdn(_) | KernelKind::Matvec(_))
            ),
            _ => false,
        }
    }

    /// A kernel writing binding 0 as its result of type `ty`.
    fn with_out(
        &mut self,
        kind: KernelKind,
        ty: Type,
        bytes: u64,
        inputs: Vec<usize>,
        generated: Option<Generated>,
    ) -> usize {
        let k = self.kernels.len();
        let out = self.push_value(UValue::Out {
            kernel: k,
            ty,
            bytes,
        });
        let mut bindings = vec![out];
        bindings.extend(inputs);
        self.push_kernel(UKernel {
            kind,
            bindings,
            writes: vec![0],
            covers: vec![],
            generated,
            alternatives: vec![],
        });
        out
    }

    fn epi(&self, c: Id) -> Result<Epi, ProgramError> {
        use FuseLang::*;
        let n = self.node(c)?.clone();
        let b = |i: &Id| -> Result<Box<Epi>, ProgramError> { Ok(Box::new(self.epi(*i)?)) };
        Ok(match &n {
            Acc => Epi::Acc,
            Acc0 | Acc1 | Acc2 | Acc3 => Epi::Part(n.acc_index().flatten().unwrap_or(0)),
            In0 | In1 | In2 | In3 => Epi::In(n.in_index().unwrap_or(0)),
            EAdd([x, y]) => Epi::Add(b(x)?, b(y)?),
            EMul([x, y]) => Epi::Mul(b(x)?, b(y)?),
            EDiv([x, y]) => Epi::Div(b(x)?, b(y)?),
            ESilu([x]) => Epi::Silu(b(x)?),
            ESigmoid([x]) => Epi::Sigmoid(b(x)?),
            EExp([x]) => Epi::Exp(b(x)?),
            ENeg([x]) => Epi::Neg(b(x)?),
            ESoftplus([x]) => Epi::Softplus(b(x)?),
            EParts(items) => Epi::Parts(
                items
                    .iter()
                    .map(|i| self.epi(*i))
                    .collect::<Result<_, _>>()?,
            ),
            other => return Err(self.err(format!("`{other}` in an epilogue"))),
        })
    }

    /// Whether class `c` is a weight of ones (`import::layout::ones`: a norm weight folded into
    /// the matrices after it). Judged on the representative instance: discovery's signatures
    /// tell a ones weight from another (`discover::op_signature`), so the unit's instances
    /// agree.
    fn is_ones(&self, c: Id) -> Result<bool, ProgramError> {
        let FuseLang::Leaf(s) = self.node(c)? else {
            return Ok(false);
        };
        let Some(&LeafRef::Def { offset }) = self.unit.leaves.get(s) else {
            return Ok(false);
        };
        Ok(matches!(
            &self.p.ops[self.unit.ops.start + offset].kind,
            OpKind::Weight { name } if crate::import::layout::ones_of(name).is_some()
        ))
    }

    /// The norm prologue a `norm`/`nonorm` class describes, with its weight's value.
    fn prologue(&mut self, c: Id) -> Result<Option<(NormSpec, usize)>, ProgramError> {
        match self.node(c)?.clone() {
            FuseLang::NoNorm => Ok(None),
            FuseLang::Norm([w, a]) => {
                let Attr::Norm { eps, zero_centered } = self.attr(a)? else {
                    return Err(self.err("a norm without its eps"));
                };
                let dtype = self.ty(w)?.dtype;
                let ones = self.is_ones(w)?;
                let v = self.value(w)?;
                Ok(Some((
                    NormSpec {
                        eps,
                        zero_centered,
                        dtype,
                        ones,
                    },
                    v,
                )))
            }
            other => Err(self.err(format!("`{other}` as a prologue"))),
        }
    }

    /// The IR-order operands of an unfused node, and its binding 0 when that is a state.
    fn unfused_operands(n: &FuseLang) -> (Option<Id>, Vec<Id>) {
        use FuseLang::*;
        match n {
            Matvec([a, b]) | Add([a, b]) | Mul([a, b]) | Div([a, b]) => (None, vec![*a, *b]),
            RmsNorm([x, w, _]) => (None, vec![*x, *w]),
            Silu([a]) | Sigmoid([a]) | Exp([a]) | Neg([a]) | Softplus([a]) | Argmax([a])
            | Increment([a]) => (None, vec![*a]),
            DeltaRuleUpdate(args) => (None, args.to_vec()),
            Rope([x, pos, _]) => (None, vec![*x, *pos]),
            Attention([q, k, v, pos, _]) => (None, vec![*q, *k, *v, *pos]),
            KvWrite([s, x, pos]) => (Some(*s), vec![*x, *pos]),
            WriteState([s, x]) => (Some(*s), vec![*x]),
            Other(_, args) => (None, args.clone()),
            _ => unreachable!("only called for IR ops with a kernel"),
        }
    }

    fn value(&mut self, c: Id) -> Result<usize, ProgramError> {
        let c = self.g.find(c);
        if let Some(&v) = self.memo.get(&c) {
            return Ok(v);
        }
        let n = self.node(c)?.clone();
        use FuseLang::*;
        let v = match &n {
            Leaf(s) => {
                let leaf = *self
                    .unit
                    .leaves
                    .get(s)
                    .ok_or_else(|| self.err(format!("unknown leaf {s}")))?;
                let ty = self.ty(c)?;
                self.push_value(UValue::Leaf { leaf, ty })
            }
            Reshape([x, _]) => {
                let of = self.value(*x)?;
                let ty = self.ty(c)?;
                self.push_value(UValue::View {
                    of,
                    byte_offset: 0,
                    ty,
                })
            }
            Rows([w, y]) => {
                let of = self.value(*y)?;
                let UValue::Out { kernel, .. } = self.values[of] else {
                    return Err(self.err("rows of something that is no kernel output"));
                };
                let KernelKind::Matvec(spec) = &self.kernels[kernel].kind else {
                    return Err(self.err("rows of a kernel that is no matvec"));
                };
                let (offsets, _) = spec.layout();
                let leaf = match self.g[*w].data.weights.as_deref() {
                    Some([s]) => *s,
                    _ => return Err(self.err("rows of a packed weight")),
                };
                let parts = match self.node(*y)? {
                    Mvk([_, pw, ..]) => self.g[*pw].data.weights.clone().unwrap_or_default(),
                    _ => vec![],
                };
                let k = parts
                    .iter()
                    .position(|s| *s == leaf)
                    .ok_or_else(|| self.err("rows of a weight the kernel does not pack"))?;
                let ty = self.ty(c)?;
                self.push_value(UValue::View {
                    of,
                    byte_offset: offsets[k] as u64 * 4,
                    ty,
                })
            }
            WCat(_) => {
                let leaves = self.g[c]
                    .data
                    .weights
                    .clone()
                    .ok_or_else(|| self.err("packed weights without leaves"))?;
                let mut parts = vec![];
                for s in leaves {
                    let lc = self
                        .g
                        .lookup(FuseLang::Leaf(s))
                        .ok_or_else(|| self.err("a packed leaf is missing"))?;
                    let ty = self.ty(lc)?;
                    let leaf = self.unit.leaves[&s];
                    parts.push(self.push_value(UValue::Leaf { leaf, ty }));
                }
                let ty = self.ty(c)?;
                self.push_value(UValue::Packed { parts, ty })
            }
            Fx0([k]) | Fx1([k]) => self.value(*k)?,
            Mvk([e, w, x, pro, ins]) | MvkStep([e, w, x, pro, ins, ..]) => {
                let items = list_items(self.g, *ins).ok_or_else(|| self.err("bad extras"))?;
                let (mut spec, mut inputs) = self.matvec_spec(*e, *w, *x, *pro, items)?;
                // The step's token state, position state and position, bound after the rest.
                let states = match &n {
                    MvkStep([.., ts, ps, pv]) => vec![*ts, *ps, *pv],
                    _ => vec![],
                };
                spec.step = !states.is_empty();
                for s in states {
                    inputs.push(self.value(s)?);
                }
                let step = spec.step;
                let (_, len) = spec.layout();
                let generated = ablate::apply(&self.opts.ablate, codegen::matvec(&spec));
                let ty = self.ty(c)?;
                let out = self.with_out(
                    KernelKind::Matvec(spec),
                    ty,
                    len as u64 * 4,
                    inputs,
                    Some(generated),
                );
                if step {
                    // It writes binding 0 (the logits), the token state and the position state.
                    let kernel = self.kernels.len() - 1;
                    let n = self.kernels[kernel].bindings.len();
                    self.kernels[kernel].writes = vec![0, n - 3, n - 2];
                }
                out
            }
            MvChain([_, w2, e1, w1, x, pro, ins]) => {
                let (inner, mut inputs) = self.matvec_spec(*e1, *w1, *x, *pro, vec![])?;
                let t2 = self.ty(*w2)?;
                // The kernel reads the outer weights transposed (`ChainSpec::outer_dtype`).
                let w2v = self.value(*w2)?;
                if !matches!(self.values[w2v], UValue::Leaf { .. }) {
                    return Err(self.err("a chained outer weight that is no weight leaf"));
                }
                inputs.push(self.push_value(UValue::Transposed { of: w2v }));
                let items = list_items(self.g, *ins).ok_or_else(|| self.err("bad extras"))?;
                // The residual, when the outer epilogue is `acc + in0` (chain-matvecs' condition).
                let add_in = match items.as_slice() {
                    [] => None,
                    [r] => {
                        inputs.push(self.value(*r)?);
                        Some(ExtraSpec {
                            dtype: self.ty(*r)?.dtype,
                            scalar: false,
                        })
                    }
                    _ => return Err(self.err("a chained matvec with several extra inputs")),
                };
                let spec = ChainSpec {
                    inner,
                    outer_dtype: t2.dtype,
                    out_rows: t2.shape.dims()[0],
                    add_in,
                };
                let ty = self.ty(c)?;
                let words = spec.out_rows;
                // The zero kernel runs first and allocates the slot; the chain kernel is the
                // value's producer (see `order`).
                let zero = self.push_kernel(UKernel {
                    kind: KernelKind::Zero { words },
                    bindings: vec![],
                    writes: vec![0],
                    covers: vec![],
                    generated: Some(codegen::zero(&[words])),
                    alternatives: vec![],
                });
                let generated = ablate::apply(&self.opts.ablate, codegen::chain(&spec));
                let out = self.with_out(
                    KernelKind::Chain(spec),
                    ty,
                    words as u64 * 4,
                    inputs,
                    Some(generated),
                );
                self.kernels[zero].bindings = vec![out];
                out
            }
            AttnBlock([q, k, vv, kc, vc, pos, qn, kn, rope, scale])
            | AttnGated([q, k, vv, kc, vc, pos, qn, kn, rope, scale]) => {
                // Gated: q is the projection [hq, 2 head_dim], each row q then the gate.
                let gated = matches!(n, AttnGated(_));
                let (tq, tk, tc) = (self.ty(*q)?, self.ty(*k)?, self.ty(*kc)?);
                let super::lang::Attr::Rope { theta, rotary_dim } = self.attr(*rope)? else {
                    return Err(self.err("attention block without rope attributes"));
                };
                let super::lang::Attr::Scale(scale) = self.attr(*scale)? else {
                    return Err(self.err("attention block without its scale"));
                };
                let mut inputs = vec![];
                for i in [q, k, vv, kc, vc, pos] {
                    inputs.push(self.value(*i)?);
                }
                let qn = self.prologue(*qn)?;
                let kn = self.prologue(*kn)?;
                let qk_norm = match (qn, kn) {
                    (Some((nq, vq)), Some((nk, vk))) => {
                        inputs.push(vq);
                        inputs.push(vk);
                        Some((nq, nk.dtype))
                    }
                    (None, None) => None,
                    _ => return Err(self.err("attention block with one of two norms")),
                };
                let (hq, head_dim) = (tq.shape.dims()[0], tk.shape.dims()[1]);
                let capacity = tc.shape.dims()[1];
                let splits = self.opts.attention_splits.unwrap_or_else(|| {
                    let units = self.opts.device.compute_units;
                    codegen::attention_splits(hq, head_dim, capacity, units)
                });
                // The subgroup walk where the format gains by it; the block's own grid takes it
                // where it serves short positions in one pass, the bands decide for themselves.
                let walk = subgroup_walk(self.p, self.opts.f16_dots, head_dim);
                let spec = AttnSpec {
                    kv_dtype: tc.dtype,
                    hq,
                    hkv: tk.shape.dims()[0],
                    head_dim,
                    capacity,
                    scale,
                    qk_norm,
                    theta,
                    rotary_dim,
                    splits: splits.max(1),
                    min_chunk: codegen::ATTENTION_MIN_CHUNK,
                    // At least the head (one invocation per element in the prologue).
                    workgroup: self
                        .opts
                        .attention_wg
                        .unwrap_or_else(|| match splits {
                            0 | 1 => codegen::attention_wg(head_dim),
                            _ => codegen::attention_split_wg(head_dim),
                        })
                        .max(head_dim.next_power_of_two() as u32),
                    polled_combine: false,
                    // Measured with the block formats' f16 dots, where it gains (and against
                    // bf16, where it loses): those schedules only, not float weights under a
                    // forced `--dots f16`.
                    early_tile: self.opts.f16_dots
                        && super::prefetch::matvec_dtype(self.p).is_quantized(),
                    subgroup_walk: walk && codegen::subgroup_walk_fits(capacity, splits.max(1)),
                    gated,
                };
                let generated = ablate::apply(&self.opts.ablate, codegen::attention(&spec));
                let alternatives = self.attention_bands(&spec, walk)?;
                let ty = self.ty(c)?;
                let bytes = ty.bytes() as u64;
                let out = self.with_out(
                    KernelKind::Attention(spec),
                    ty,
                    bytes,
                    inputs,
                    Some(generated),
                );
                let kernel = self.kernels.len() - 1;
                self.kernels[kernel].writes = vec![0, 4, 5];
                self.kernels[kernel].alternatives = alternatives;
                out
            }
            ArgmaxWrite([s, x]) | IncWrite([s, x]) => {
                let spec = match &n {
                    ArgmaxWrite(_) => TailSpec::Argmax {
                        n: self.ty(*x)?.shape.numel(),
                    },
                    _ => TailSpec::Advance,
                };
                let bindings = vec![self.value(*s)?, self.value(*x)?];
                self.effect(KernelKind::Tail(spec), bindings, vec![0], &spec)
            }
            TailStep([ts, x, ps, pv]) => {
                let spec = TailSpec::Step {
                    n: self.ty(*x)?.shape.numel(),
                };
                let mut bindings = vec![];
                for i in [ts, x, ps, pv] {
                    bindings.push(self.value(*i)?);
                }
                self.effect(KernelKind::Tail(spec), bindings, vec![0, 2], &spec)
            }
            Ewk([e, ins]) => {
                let epi = self.epi(*e)?;
                let items = list_items(self.g, *ins).ok_or_else(|| self.err("bad inputs"))?;
                let ty = self.ty(c)?;
                let n_out = ty.shape.numel();
                let mut spec = ElementwiseSpec {
                    n: n_out,
                    inputs: vec![],
                    epi,
                };
                let mut inputs = vec![];
                for it in items {
                    let (extra, v) = self.extra_input(it, n_out)?;
                    spec.inputs.push(extra);
                    inputs.push(v);
                }
                let generated = codegen::elementwise(&spec);
                let bytes = (ty.bytes() as u64).max(4).div_ceil(4) * 4;
                self.with_out(
                    KernelKind::Elementwise(spec),
                    ty,
                    bytes,
                    inputs,
                    Some(generated),
                )
            }
            StateAfter([u]) | Out([u]) => self.value(*u)?,
            Route([logits, _]) => {
                let ty = self.ty(c)?;
                let spec = RouteSpec {
                    n: self.ty(*logits)?.shape.numel(),
                    k: ty.shape.numel(),
                };
                let inputs = vec![self.value(*logits)?];
                let bytes = (spec.ids_offset() + spec.k) as u64 * 4;
                let generated = codegen::route(&spec);
                self.with_out(KernelKind::Route(spec), ty, bytes, inputs, Some(generated))
            }
            ExpertSum([w, idx, x, wts]) => {
                let k = self.ty(*idx)?.shape.numel();
                let spec = self.expert_spec(*w, k, Routing::Read)?;
                let mut inputs = vec![];
                for i in [w, idx, x, wts] {
                    inputs.push(self.value(*i)?);
                }
                let generated = codegen::expert_sum(&spec);
                self.expert_out(c, KernelKind::ExpertSum(spec), inputs, generated)?
            }
            ExpertSumRouted([e, w, logits, _, x, extras]) => {
                let n = self.ty(*logits)?.shape.numel();
                let k = self.ty(*x)?.shape.dims()[0];
                let spec = self.expert_spec(*w, k, Routing::Own { n })?;
                self.expert_sum_epi(c, spec, *e, &[*w, *logits, *x], *extras)?
            }
            ExpertSumEpi([e, w, idx, x, wts, extras]) => {
                let k = self.ty(*idx)?.shape.numel();
                let spec = self.expert_spec(*w, k, Routing::Read)?;
                self.expert_sum_epi(c, spec, *e, &[*w, *idx, *x, *wts], *extras)?
            }
            ExpertGlu([wg, wu, idx, x]) => {
                let k = self.ty(*idx)?.shape.numel();
                self.expert_glu(c, [*wg, *wu, *idx, *x], k, Routing::Read)?
            }
            ExpertGluRouted([wg, wu, logits, _, x]) => {
                let n = self.ty(*logits)?.shape.numel();
                let k = self.ty(c)?.shape.dims()[0];
                self.expert_glu(c, [*wg, *wu, *logits, *x], k, Routing::Own { n })?
            }
            RouteIds([k]) => {
                let of = self.value(*k)?;
                let UValue::Out { kernel, .. } = self.values[of] else {
                    return Err(self.err("expert indices of something that is no kernel output"));
                };
                let KernelKind::Route(spec) = &self.kernels[kernel].kind else {
                    return Err(self.err("expert indices of a kernel that is no router"));
                };
                let byte_offset = spec.ids_offset() as u64 * 4;
                let ty = self.ty(c)?;
                self.push_value(UValue::View {
                    of,
                    byte_offset,
                    ty,
                })
            }
            GdnStep([x, _, cw, cst, sv, rst, nw, ge, gl, be, bl, lay]) => {
                let super::lang::Attr::Gdn(layout) = self.attr(*lay)? else {
                    return Err(self.err("a linear-attention step without its layout"));
                };
                let (tx, tcs, ts) = (self.ty(*x)?, self.ty(*cst)?, self.ty(*sv)?);
                let (sd, cd) = (ts.shape.dims(), tcs.shape.dims());
                let hk = tx.shape.numel() / layout.width.max(1);
                let mut spec = GdnSpec {
                    hk,
                    r: sd[0] / hk.max(1),
                    dk: sd[1],
                    dv: sd[2],
                    km1: cd[1],
                    parts: 1,
                    layout,
                    conv_dtype: self.ty(*cw)?.dtype,
                    norm_dtype: self.ty(*nw)?.dtype,
                    g: self.epi(*ge)?,
                    g_inputs: vec![],
                    beta: self.epi(*be)?,
                    beta_inputs: vec![],
                };
                let mut inputs = vec![];
                for i in [cst, rst, x, cw, nw] {
                    inputs.push(self.value(*i)?);
                }
                for (list, beta) in [(gl, false), (bl, true)] {
                    let items = list_items(self.g, *list).ok_or_else(|| self.err("bad gates"))?;
                    for it in items {
                        let dt = self.ty(it)?.dtype;
                        if beta {
                            spec.beta_inputs.push(dt);
                        } else {
                            spec.g_inputs.push(dt);
                        }
                        inputs.push(self.value(it)?);
                    }
                }
                spec.parts = codegen::gdn_parts(spec.r, spec.dv, self.opts.gdn_parts);
                let generated = codegen::gdn(&spec);
                let ty = self.ty(c)?;
                let bytes = ty.bytes() as u64;
                let out = self.with_out(KernelKind::Gdn(spec), ty, bytes, inputs, Some(generated));
                let kernel = self.kernels.len() - 1;
                self.kernels[kernel].writes = vec![0, 1, 2];
                out
            }
            UpdateInPlace([st, args @ ..]) => {
                // The unit op computing the update: the delta_rule_update of these operands.
                let want: Vec<Id> = args.iter().map(|a| self.g.find(*a)).collect();
                let offset = (0..self.unit.op_node.len())
                    .find(|&o| match &self.unit.op_node[o] {
                        Some(DeltaRuleUpdate(ops)) => {
                            ops.iter().map(|a| self.g.find(*a)).collect::<Vec<_>>() == want
                        }
                        _ => false,
                    })
                    .ok_or_else(|| self.err("an in-place update without its op"))?;
                let sv = self.value(*st)?;
                let mut bindings = vec![sv];
                for a in args {
                    bindings.push(self.value(*a)?);
                }
                let k = self.push_kernel(UKernel {
                    kind: KernelKind::InPlace { offset },
                    bindings,
                    writes: vec![0],
                    covers: vec![],
                    generated: None,
                    alternatives: vec![],
                });
                self.push_value(UValue::Written { of: sv, writer: k })
            }
            _ if n.is_kernel() => self.unfused(c, &n)?,
            other => return Err(self.err(format!("`{other}` cannot be a value"))),
        };
        self.memo.insert(c, v);
        Ok(v)
    }

    /// The expert SwiGLU kernel writing class `c`: stacks `wg` and `wu` packed, `route` (the
    /// router's indices, or its logits where the kernel routes for itself) and input `x`.
    fn expert_glu(
        &mut self,
        c: Id,
        [wg, wu, route, x]: [Id; 4],
        k: usize,
        routing: Routing,
    ) -> Result<usize, ProgramError> {
        let spec = self.expert_spec(wg, k, routing)?;
        // Gate experts then up experts, packed into one binding at compile time.
        let parts = vec![self.value(wg)?, self.value(wu)?];
        let packed = self.push_value(UValue::Packed {
            parts,
            ty: Type::new(spec.dtype, [2 * spec.e, spec.o, spec.i]),
        });
        let inputs = vec![packed, self.value(route)?, self.value(x)?];
        let generated = codegen::expert_glu(&spec);
        self.expert_out(c, KernelKind::ExpertGlu(spec), inputs, generated)
    }

    /// The shape of a kernel over `k` chosen experts of stack `w`.
    fn expert_spec(&self, w: Id, k: usize, routing: Routing) -> Result<ExpertSpec, ProgramError> {
        let tw = self.ty(w)?;
        let d = tw.shape.dims();
        if d.len() != 3 {
            return Err(self.err("expert weights that are no stack"));
        }
        Ok(ExpertSpec {
            dtype: tw.dtype,
            e: d[0],
            o: d[1],
            i: d[2],
            k,
            routing,
            epi: Epi::Acc,
            extras: vec![],
        })
    }

    /// The weighted expert sum of `spec` writing class `c`'s value through epilogue `e`: its own
    /// inputs `own` (in binding order), then the extra inputs of list `extras`.
    fn expert_sum_epi(
        &mut self,
        c: Id,
        mut spec: ExpertSpec,
        e: Id,
        own: &[Id],
        extras: Id,
    ) -> Result<usize, ProgramError> {
        spec.epi = self.epi(e)?;
        let mut inputs = vec![];
        for &i in own {
            inputs.push(self.value(i)?);
        }
        let items = list_items(self.g, extras).ok_or_else(|| self.err("bad inputs"))?;
        for it in items {
            let (extra, v) = self.extra_input(it, spec.o)?;
            spec.extras.push(extra);
            inputs.push(v);
        }
        let generated = codegen::expert_sum(&spec);
        self.expert_out(c, KernelKind::ExpertSum(spec), inputs, generated)
    }

    /// An expert kernel writing class `c`'s value.
    fn expert_out(
        &mut self,
        c: Id,
        kind: KernelKind,
        inputs: Vec<usize>,
        generated: Generated,
    ) -> Result<usize, ProgramError> {
        let ty = self.ty(c)?;
        let bytes = ty.bytes() as u64;
        Ok(self.with_out(kind, ty, bytes, inputs, Some(generated)))
    }

    fn effect(
        &mut self,
        kind: KernelKind,
        bindings: Vec<usize>,
        writes: Vec<usize>,
        spec: &TailSpec,
    ) -> usize {
        let k = self.push_kernel(UKernel {
            kind,
            bindings,
            writes,
            covers: vec![],
            generated: Some(codegen::tail(spec)),
            alternatives: vec![],
        });
        self.push_value(UValue::Effect { kernel: k })
    }

    /// The spec of a matvec-family kernel and its inputs (weights, x, norm weight, extras).
    fn matvec_spec(
        &mut self,
        e: Id,
        w: Id,
        x: Id,
        pro: Id,
        items: Vec<Id>,
    ) -> Result<(MatvecSpec, Vec<usize>), ProgramError> {
        let epi = self.epi(e)?;
        let wt = self.ty(w)?;
        let leaves = self.g[w]
            .data
            .weights
            .clone()
            .ok_or_else(|| self.err("a matvec whose weights are no leaves"))?;
        let mut part_rows = vec![];
        for s in &leaves {
            let info = &self.g.analysis.leaves[s];
            part_rows.push(info.ty.shape.dims()[0]);
        }
        let wv = self.value(w)?;
        let xv = self.value(x)?;
        let norm = self.prologue(pro)?;
        let zipped = self.g[e].data.epi.is_some_and(|u| u.zipped > 0);
        // A per-part epilogue selects by the stacked row: one expression per part.
        let counts = epi.part_counts();
        if counts.iter().any(|&n| zipped || n != part_rows.len()) {
            return Err(self.err(format!(
                "epilogue `{epi}` does not select among the {} stacked parts",
                part_rows.len()
            )));
        }
        let mut spec = MatvecSpec {
            dtype: wt.dtype,
            cols: wt.shape.dims()[1],
            part_rows,
            zipped,
            norm: norm.as_ref().map(|(n, _)| n.clone()),
            extras: vec![],
            epi,
            step: false,
            x_published: self.published(xv),
        };
        let rows = spec.rows();
        let mut inputs = vec![wv, xv];
        if let Some((_, nv)) = norm {
            inputs.push(nv);
        }
        for it in items {
            let (extra, v) = self.extra_input(it, rows)?;
            spec.extras.push(extra);
            inputs.push(v);
        }
        Ok((spec, inputs))
    }

    /// An extra input of a kernel of `n` output elements and its value: a one-element input
    /// beside more outputs is read as a scalar (every element reads element 0).
    fn extra_input(&mut self, it: Id, n: usize) -> Result<(ExtraSpec, usize), ProgramError> {
        let t = self.ty(it)?;
        let extra = ExtraSpec {
            dtype: t.dtype,
            scalar: t.shape.numel() == 1 && n != 1,
        };
        Ok((extra, self.value(it)?))
    }

    /// An explicit IR node lowered as the unit op it came from.
    fn unfused(&mut self, c: Id, n: &FuseLang) -> Result<usize, ProgramError> {
        let canon = |m: &FuseLang| {
            let mut m = m.clone();
            m.update_children(|i| self.g.find(i));
            m
        };
        let target = canon(n);
        let offset = (0..self.unit.op_node.len())
            .find(|&o| {
                self.unit.op_class[o].is_some_and(|oc| self.g.find(oc) == c)
                    && self.unit.op_node[o].as_ref().map(canon).as_ref() == Some(&target)
            })
            .ok_or_else(|| self.err(format!("no op of the unit computes `{n}`")))?;
        let (state, operands) = Self::unfused_operands(n);
        let mut inputs = vec![];
        for a in operands {
            inputs.push(self.value(a)?);
        }
        let kind = KernelKind::Unfused { offset };
        Ok(match state {
            Some(s) => {
                let sv = self.value(s)?;
                let mut bindings = vec![sv];
                bindings.extend(inputs);
                let k = self.push_kernel(UKernel {
                    kind,
                    bindings,
                    writes: vec![0],
                    covers: vec![],
                    generated: None,
                    alternatives: vec![],
                });
                if matches!(n, FuseLang::KvWrite(_)) {
                    self.push_value(UValue::Written { of: sv, writer: k })
                } else {
                    self.push_value(UValue::Effect { kernel: k })
                }
            }
            None => {
                let ty = self.ty(c)?;
                let bytes = (ty.bytes() as u64).max(4).div_ceil(4) * 4;
                self.with_out(kind, ty, bytes, inputs, None)
            }
        })
    }
}

impl FusedUnit {
    /// The fused program of `unit` (representative instance starting at `unit.ops.start`).
    pub fn new(
        p: &Program,
        unit: &Unit,
        ex: &Extraction,
        label: &str,
        saturation: Saturation,
        unfused: Cost,
        opts: &super::schedule::FuseOptions,
    ) -> Result<FusedUnit, ProgramError> {
        let dev = &opts.device;
        let g = &unit.egraph;
        let mut b = Builder {
            p,
            opts,
            unit,
            ex,
            g,
            label,
            values: vec![],
            kernels: vec![],
            memo: HashMap::new(),
        };
        let mut outputs = vec![];
        for r in &unit.roots {
            let v = b.value(r.class())?;
            if let Root::Value { offset, .. } = r {
                outputs.push((*offset, v));
            }
        }
        let order = b.order()?;
        let (values, kernels) = (b.values, b.kernels);
        // Renumber kernels in execution order.
        let mut new_index = vec![0; kernels.len()];
        for (i, &k) in order.iter().enumerate() {
            new_index[k] = i;
        }
        let mut slots: Vec<Option<UKernel>> = kernels.into_iter().map(Some).collect();
        let mut kernels: Vec<UKernel> = order
            .iter()
            .map(|&k| slots[k].take().expect("a permutation"))
            .collect();
        let values: Vec<UValue> = values
            .into_iter()
            .map(|v| match v {
                UValue::Out { kernel, ty, bytes } => UValue::Out {
                    kernel: new_index[kernel],
                    ty,
                    bytes,
                },
                UValue::Written { of, writer } => UValue::Written {
                    of,
                    writer: new_index[writer],
                },
                UValue::Effect { kernel } => UValue::Effect {
                    kernel: new_index[kernel],
                },
                v => v,
            })
            .collect();

        // Which kernel computes each op: its class's producer, or (for ops absorbed into a
        // fused kernel) the kernel of the first op that consumes it.
        let n = unit.ops.len();
        let start = unit.ops.start;
        let mut assigned: Vec<Option<usize>> = vec![None; n];
        for o in (0..n).rev() {
            let Some(c) = unit.op_class[o] else { continue };
            let c = g.find(c);
            assigned[o] = match b.memo.get(&c) {
                Some(&v) => producer(&values, v),
                None => p.ops[start + o].result.and_then(|r| {
                    (o + 1..n).find_map(|u| {
                        if p.ops[start + u].args.contains(&r) {
                            assigned[u]
                        } else {
                            None
                        }
                    })
                }),
            };
        }
        for (o, a) in assigned.iter().enumerate() {
            if let Some(k) = a {
                kernels[*k].covers.push(o);
            }
        }
        let mut refusals: Vec<RefusalAt> = g
            .analysis
            .refusals
            .borrow()
            .iter()
            .map(|r| {
                let classes: BTreeSet<Id> = r.classes.iter().map(|c| g.find(*c)).collect();
                let ops: Vec<usize> = (0..n)
                    .filter(|&o| unit.op_class[o].is_some_and(|c| classes.contains(&g.find(c))))
                    .collect();
                RefusalAt {
                    rule: r.rule,
                    reason: r.reason.clone(),
                    ops,
                }
            })
            .filter(|r| !r.ops.is_empty())
            .collect();
        refusals.sort();
        refusals.dedup();
        let class_ops = |c: Id| -> Vec<usize> {
            (0..n)
                .filter(|&o| unit.op_class[o].is_some_and(|oc| g.find(oc) == c))
                .collect()
        };
        let mut kept = vec![];
        for &c in &ex.reachable {
            let chosen = &ex.choice[&c];
            if !chosen.is_kernel() || chosen.is_fused() {
                continue;
            }
            for alt in g[c].nodes.iter().filter(|m| m.is_fused()) {
                let mut alt = alt.clone();
                alt.update_children(|i| g.find(i));
                let mut trial = ex.choice.clone();
                trial.insert(c, alt.clone());
                let fused_us = super::extract::price(g, &ex.roots, &trial, dev)
                    .map_or(f64::INFINITY, |p| p.us);
                // A tie is the same kernel under another name (an op as a one-op elementwise
                // kernel), not a fusion given up.
                if fused_us <= ex.cost.us + 1e-9 {
                    continue;
                }
                kept.push(KeptAt {
                    ops: class_ops(c),
                    fused: alt.to_string(),
                    fused_us,
                    chosen_us: ex.cost.us,
                });
            }
        }
        Ok(FusedUnit {
            label: label.to_string(),
            ops: unit.ops.clone(),
            values,
            kernels,
            outputs,
            op_names: unit.ops.clone().map(|i| p.ops[i].kind.name()).collect(),
            cost: ex.cost,
            unfused,
            saturation,
            refusals,
            kept,
        })
    }
}

/// Whether the attention block of heads of `head_dim` may walk its slots in subgroups
/// (`AttnSpec::subgroup_walk`, attend_subgroups.glsl; in the grids
/// [`codegen::subgroup_walk_fits`] names): for q4_0 matvecs with f16 dots and for 16-bit float
/// ones, whose q/k/v matvecs take 8 rows a workgroup (`kernels::matvec_tuning`). On an H200 at
/// 256 tokens it gained 1.4-1.9% for q4_0 (docs/perf.md, session 40) and 1.7-2.5% for bf16
/// with 8-row q/k/v, where with 4 rows bf16 lost 2.5%; beside q8_0's 4-row q/k/v it lost 6.5%,
/// and with 8 rows there q8_0 lost 2.2% (session 41). Only heads of 32 to 128, a multiple of
/// 32: another head never fits the walk's layout on 8- or 32-wide subgroups (the kernel would
/// carry it unused), and a head of 256 would take its fold's 16 KiB of shared memory beside
/// attend()'s arrays, past lavapipe's 32 KiB.
/// `VKFUSE_ATTN_SG=1` or `=0` lifts or sets the format's condition at compile time (the A/B knob
/// of those measurements); the head's and the grids' stay.
fn subgroup_walk(p: &Program, f16_dots: bool, head_dim: usize) -> bool {
    let format = match std::env::var("VKFUSE_ATTN_SG").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        // matvec_dtype names every 16-bit float format BF16.
        _ => match super::prefetch::matvec_dtype(p) {
            DType::Q4_0 => f16_dots,
            DType::BF16 => true,
            _ => false,
        },
    };
    format && head_dim.is_multiple_of(32) && (32..=128).contains(&head_dim)
}

/// The kernel whose run makes value `v` available.
pub fn producer(values: &[UValue], v: usize) -> Option<usize> {
    match &values[v] {
        UValue::Out { kernel, .. } | UValue::Effect { kernel } => Some(*kernel),
        UValue::Written { writer, .. } => Some(*writer),
        UValue::View { of, .. } => producer(values, *of),
        UValue::Leaf { .. } | UValue::Packed { .. } | UValue::Transposed { .. } => None,
    }
}

impl Builder<'_> {
    /// The state a value is (or views) before any write of this step.
    fn raw_state(&self, v: usize) -> Option<StateId> {
        match &self.values[v] {
            UValue::Leaf { leaf, .. } => leaf.state(self.p, self.unit.ops.start),
            UValue::View { of, .. } => self.raw_state(*of),
            _ => None,
        }
    }

    /// Kernels in an order where producers run before consumers and every read of a state
    /// runs before the kernel that overwrites it; ties go to construction order.
    fn order(&self) -> Result<Vec<usize>, ProgramError> {
        let n = self.kernels.len();
        let mut edges: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); n];
        for (k, kern) in self.kernels.iter().enumerate() {
            // A zero kernel runs before the chain kernel that accumulates into its output.
            if let (KernelKind::Zero { .. }, Some(&v)) = (&kern.kind, kern.bindings.first()) {
                if let Some(pk) = producer(&self.values, v) {
                    edges[k].insert(pk);
                }
            }
            for (i, &v) in kern.bindings.iter().enumerate() {
                if kern.writes.contains(&i) {
                    continue;
                }
                if let Some(pk) = producer(&self.values, v) {
                    if pk != k {
                        edges[pk].insert(k);
                    }
                }
            }
        }
        for (w, kw) in self.kernels.iter().enumerate() {
            for &i in &kw.writes {
                let Some(s) = self.raw_state(kw.bindings[i]) else {
                    continue;
                };
                for (r, kr) in self.kernels.iter().enumerate() {
                    if r == w {
                        continue;
                    }
                    let reads = kr
                        .bindings
                        .iter()
                        .enumerate()
                        .any(|(j, &v)| !kr.writes.contains(&j) && self.raw_state(v) == Some(s));
                    if reads {
                        edges[r].insert(w);
                    }
                }
            }
        }
        // One writer per state: two kernels updating one state (in place or as a copy) would
        // apply the step twice.
        let mut writer: HashMap<StateId, usize> = HashMap::new();
        for (w, kw) in self.kernels.iter().enumerate() {
            for &i in &kw.writes {
                if let Some(s) = self.raw_state(kw.bindings[i]) {
                    if writer.insert(s, w).is_some_and(|other| other != w) {
                        return Err(self.err(format!("two kernels write state {s}")));
                    }
                }
            }
        }
        let mut indegree = vec![0; n];
        for e in &edges {
            for &t in e {
                indegree[t] += 1;
            }
        }
        let mut ready: BTreeSet<usize> = (0..n).filter(|&k| indegree[k] == 0).collect();
        let mut order = vec![];
        while let Some(k) = ready.pop_first() {
            order.push(k);
            for &t in &edges[k] {
                indegree[t] -= 1;
                if indegree[t] == 0 {
                    ready.insert(t);
                }
            }
        }
        if order.len() != n {
            return Err(self.err("the kernels' dependencies form a cycle"));
        }
        Ok(order)
    }
}

/// How an expert kernel's description ends: where it routes for itself, from what.
fn routed(e: &ExpertSpec) -> String {
    match e.routing {
        Routing::Read => String::new(),
        Routing::Own { n } => format!(", routed in each workgroup from {n} logits"),
    }
}

impl UKernel {
    /// A one-line description.
    pub fn describe(&self, op_names: &[&str]) -> String {
        match &self.kind {
            KernelKind::Unfused { offset } => op_names[*offset].to_string(),
            KernelKind::InPlace { offset } => format!("{} in place", op_names[*offset]),
            KernelKind::Matvec(spec) => format!("matvec {}", spec.describe()),
            KernelKind::Elementwise(spec) => format!("elementwise {}", spec.epi),
            KernelKind::Attention(a) => format!(
                "attention block: {} q heads per kv head, head_dim {}, rope {}{}{}",
                a.hq / a.hkv,
                a.head_dim,
                a.rotary_dim,
                match &a.qk_norm {
                    Some((n, _)) if n.zero_centered => ", q/k norm1p",
                    Some(_) => ", q/k norm",
                    None => "",
                },
                if a.splits > 1 {
                    format!(", context in {} splits", a.splits)
                } else {
                    String::new()
                } + if a.kv_dtype == DType::F16 {
                    ", f16 cache"
                } else {
                    ""
                } + if a.gated { ", output gated" } else { "" }
            ),
            KernelKind::Tail(TailSpec::Argmax { .. }) => "argmax -> token".to_string(),
            KernelKind::Tail(TailSpec::Advance) => "position + 1".to_string(),
            KernelKind::Tail(TailSpec::Step { .. }) => "argmax -> token, position + 1".to_string(),
            KernelKind::Gdn(spec) => format!("linear-attention step: {}", spec.describe()),
            KernelKind::ExpertSum(e) => format!(
                "experts weighted and summed: {} of {} experts [{}x{}]{}{}",
                e.k,
                e.e,
                e.o,
                e.i,
                if e.epi.is_identity() {
                    String::new()
                } else {
                    format!(": {}", e.epi)
                },
                routed(e)
            ),
            KernelKind::ExpertGlu(e) => format!(
                "experts silu(gate) * up: {} of {} experts [{}x{}] x 2{}",
                e.k,
                e.e,
                e.o,
                e.i,
                routed(e)
            ),
            KernelKind::Route(r) => {
                format!("router: softmax, top {} of {}, renormalised", r.k, r.n)
            }
            KernelKind::Chain(spec) => format!("chain {}", spec.describe()),
            KernelKind::Zero { words } => format!("zero {words} words (the chain's output)"),
        }
    }

    pub fn is_fused(&self) -> bool {
        !matches!(self.kind, KernelKind::Unfused { .. })
    }

    /// The unit op whose own kernel runs (unfused, or in place).
    pub fn own_op(&self) -> Option<usize> {
        match self.kind {
            KernelKind::Unfused { offset } | KernelKind::InPlace { offset } => Some(offset),
            _ => None,
        }
    }
}

impl FusedUnit {
    /// `#N kind` for unit op `offset` (N: the op in the representative instance).
    pub fn op(&self, offset: usize) -> String {
        format!("#{} {}", self.ops.start + offset, self.op_names[offset])
    }
}

/// `1 dispatch`, `2 dispatches`.
pub fn plural(n: usize, one: &str) -> String {
    match (n, one.ends_with("ch")) {
        (1, _) => format!("1 {one}"),
        (_, true) => format!("{n} {one}es"),
        _ => format!("{n} {one}s"),
    }
}

impl fmt::Display for FusedUnit {
    /// The unit's kernels, each with the ops (of the representative instance) it computes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} (ops {:?}): {} in {} (unfused {} in {})",
            self.label,
            self.ops,
            plural(self.kernels.len(), "dispatch"),
            plural(self.cost.levels, "level"),
            plural(self.unfused.dispatches, "dispatch"),
            plural(self.unfused.levels, "level"),
        )?;
        for (i, k) in self.kernels.iter().enumerate() {
            let covers: Vec<String> = k
                .covers
                .iter()
                .filter(|&&o| !matches!(self.op_names[o], "reshape"))
                .map(|&o| self.op(o))
                .collect();
            writeln!(f, "  k{i} {}", k.describe(&self.op_names))?;
            writeln!(f, "       <- {}", covers.join(", "))?;
        }
        Ok(())
    }
}

/// The kind of an IR op as a short name (for reports of ops that are no kernel).
pub fn is_compute(kind: &OpKind) -> bool {
    !crate::kernels::is_alias(kind)
}
