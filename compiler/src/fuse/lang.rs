//! The fusion e-graph's language: the IR ops that fusion rules look at, the fused forms the rules
//! introduce, and an `Other` catch-all for every op no rule touches.
//!
//! Leaves are unit-relative names ([`Leaf`](FuseLang::Leaf)) for external values, weights and
//! states, and attributes ([`Attr`]). The [`Facts`] analysis gives every tensor-valued e-class
//! its type, every weight (or packed weight) class its leaf weights, and every epilogue class
//! the accumulators and extra inputs it reads; rule conditions read nothing else.
//!
//! Three small sub-languages describe code, not tensors, and cost nothing by themselves:
//! prologues (`norm`, `nonorm`), lists of extra per-row inputs (`cons`, `nil`) and epilogue
//! expressions (`acc`, `acc0`.., `in0`.., `e.add`, `e.mul`, `e.silu`, `e.sigmoid`, and
//! `e.parts`, one expression per packed part of a stacked kernel).

use crate::ir::{DType, F32Attr, Shape, Type};
use egg::{define_language, Analysis, DidMerge, EGraph, Id, Symbol};
use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

define_language! {
    /// One node of the fusion e-graph. Argument order is given per variant.
    pub enum FuseLang {
        // ---- IR ops the rules look at (semantics as in `ir::OpKind`) ----
        // (matvec w x): w[O, I] · x[I]
        "matvec" = Matvec([Id; 2]),
        // (rms_norm x w attr): attr is `norm:EPS` or `norm1p:EPS` (zero-centred weight)
        "rms_norm" = RmsNorm([Id; 3]),
        // (add a b), (mul a b): elementwise with numpy broadcasting
        "add" = Add([Id; 2]),
        "mul" = Mul([Id; 2]),
        // (div a b): elementwise with numpy broadcasting
        "div" = Div([Id; 2]),
        // (silu a), (sigmoid a), (exp a), (neg a), (softplus a)
        "silu" = Silu([Id; 1]),
        "sigmoid" = Sigmoid([Id; 1]),
        "exp" = Exp([Id; 1]),
        "neg" = Neg([Id; 1]),
        "softplus" = Softplus([Id; 1]),
        // (delta_rule_update s k v g beta): the next recurrent state
        "delta_rule_update" = DeltaRuleUpdate([Id; 5]),
        // (reshape x shape): a view; shape is a `shape:AxB` attribute
        "reshape" = Reshape([Id; 2]),
        // (rope x pos attr): attr is `rope:THETA:ROTARY_DIM`
        "rope" = Rope([Id; 3]),
        // (kv_write cache x pos): cache is a state leaf; the result is the updated cache
        "kv_write" = KvWrite([Id; 3]),
        // (attention q k_cache v_cache pos scale): scale is a `scale:S` attribute
        "attention" = Attention([Id; 5]),
        // (argmax x) -> i32[1]
        "argmax" = Argmax([Id; 1]),
        // (increment p) -> i32[1]
        "increment" = Increment([Id; 1]),
        // (write_state s x): an effect (no value); s is a state leaf
        "write_state" = WriteState([Id; 2]),

        // ---- fused forms ----
        // (wcat a b): the rows of weight a then the rows of weight b, packed at compile time
        "wcat" = WCat([Id; 2]),
        // (rows w y): the rows of stacked kernel output y that weight leaf w computed (a view)
        "rows" = Rows([Id; 2]),
        // (mvk epi w x prologue extras): the matvec-family kernel: for every output row, the
        // dots of the (packed) weight rows with the prologue applied to x, then `epi` over
        // those accumulators and the row's extra inputs
        "mvk" = Mvk([Id; 5]),
        // prologue: (norm w attr) = rms_norm of x with weight w, computed in every workgroup
        "norm" = Norm([Id; 2]),
        "nonorm" = NoNorm,
        // extra per-row inputs of a kernel, in epilogue index order: (cons a rest), nil
        "cons" = Cons([Id; 2]),
        "nil" = Nil,
        // epilogue expressions: `acc` is the row's dot (stacked parts); `accK` is part K's dot
        // for this row (parts zipped row by row); `inK` is the row's element of extra input K
        "acc" = Acc,
        "acc0" = Acc0,
        "acc1" = Acc1,
        "acc2" = Acc2,
        "acc3" = Acc3,
        "in0" = In0,
        "in1" = In1,
        "in2" = In2,
        "in3" = In3,
        // (e.add a b), (e.mul a b), (e.div a b), (e.silu a), (e.sigmoid a), (e.exp a),
        // (e.neg a), (e.softplus a)
        "e.add" = EAdd([Id; 2]),
        "e.mul" = EMul([Id; 2]),
        "e.div" = EDiv([Id; 2]),
        "e.silu" = ESilu([Id; 1]),
        "e.sigmoid" = ESigmoid([Id; 1]),
        "e.exp" = EExp([Id; 1]),
        "e.neg" = ENeg([Id; 1]),
        "e.softplus" = ESoftplus([Id; 1]),
        // (e.parts e0 e1 ..): the epilogue of a stacked kernel part by part: the rows of packed
        // part K compute eK (each reads `acc`, the row's dot), one expression per part
        "e.parts" = EParts(Box<[Id]>),
        // (ewk epi inputs): the elementwise kernel: element i is `epi` over element i of every
        // input (inK; a one-element input is read for every i)
        "ewk" = Ewk([Id; 2]),
        // (update_in_place st s k v g beta): delta_rule_update(s, ..) computed into state st
        // itself (s is st's value at the start of the step); an effect, read by `state_after`
        "update_in_place" = UpdateInPlace([Id; 6]),
        // (state_after u): the state that in-place kernel u updated, read after u ran (a view)
        "state_after" = StateAfter([Id; 1]),
        // (attn_block q k v k_cache v_cache pos q_norm k_norm rope scale): per kv head, q/k
        // norm (a prologue or nonorm) and rope, K and V written at the position, then
        // attention over the cache including the fresh row; the value is the attention output
        "attn_block" = AttnBlock([Id; 10]),
        // (attn_gated x k v k_cache v_cache pos q_norm k_norm rope scale): x is [q heads,
        // 2 head_dim], each row a head's q then its output gate; the value is attn_block's over
        // q = x[:, :head_dim], times sigmoid(x[:, head_dim:]) (Qwen3-Next's gated attention)
        "attn_gated" = AttnGated([Id; 10]),
        // (argmax_write s x): the argmax of x written straight into state s (an effect)
        "argmax_write" = ArgmaxWrite([Id; 2]),
        // (inc_write s p): p + 1 written straight into state s (an effect)
        "inc_write" = IncWrite([Id; 2]),
        // (tail_step token_state x position_state p): both effects above in one kernel
        "tail_step" = TailStep([Id; 4]),
        // (mvk_step epi w x prologue extras token_state position_state p): (mvk epi w x
        // prologue extras), whose value `out` is the logits, and (tail_step token_state that
        // position_state p) in the same kernel: fx0 is the token's write, fx1 the position's
        "mvk_step" = MvkStep([Id; 8]),
        // (fx0 k), (fx1 k): the first and second effect of multi-effect kernel k
        "fx0" = Fx0([Id; 1]),
        "fx1" = Fx1([Id; 1]),
        // (gdn_step x conv_state conv_w conv_state_out rec_state rec_state_out norm_w
        //   g_epi g_inputs beta_epi beta_inputs layout): one Gated DeltaNet decode step, one
        // workgroup per key head: the causal conv of that head's q, k, v channels of the
        // projection x (conv state shifted in place), silu, l2 norms of q and k, the gates
        // g = g_epi and beta = beta_epi over their inputs per value head, the delta rule
        // updating the recurrent state in place, the readout and the gated rms norm with z
        // (also read from x). The value is the norm's output; fx0 is the conv state's write,
        // fx1 the recurrent state's. `layout` is a `gdn:..` attribute.
        "gdn_step" = GdnStep([Id; 12]),
        // (out k): the value kernel k computes, where k has effects or several outputs and a
        // class of its own
        "out" = Out([Id; 1]),
        // (route logits shape): the MoE router after its matvec in one workgroup: softmax,
        // top-k (k = the shape's one dim) and the chosen probabilities renormalised; the value
        // is the weights, `route_ids` the chosen expert indices
        "route" = Route([Id; 2]),
        // (route_ids k): the expert indices route kernel k chose (a view of its output)
        "route_ids" = RouteIds([Id; 1]),
        // (expert_sum w idx x wts): sum over j of expert_matvec(w, idx, x)[j] * wts[j], the
        // experts' down projections weighted and summed in one kernel
        "expert_sum" = ExpertSum([Id; 4]),
        // (expert_glu wg wu idx x): silu(expert_matvec(wg, idx, x)) * expert_matvec(wu, idx, x),
        // both stacks packed and read by one kernel
        "expert_glu" = ExpertGlu([Id; 4]),
        // (expert_glu_routed wg wu logits shape x): (expert_glu wg wu (route_ids (route logits
        // shape)) x), each workgroup routing for itself from the logits (no router kernel)
        "expert_glu_routed" = ExpertGluRouted([Id; 5]),
        // (expert_sum_routed epi w logits shape x extras): `epi` (an epilogue as mvk's, `acc`
        // the row's weighted sum) over (expert_sum w (route_ids r) x (out r)) with
        // r = (route logits shape) and the row's extra inputs, each workgroup routing for
        // itself from the logits
        "expert_sum_routed" = ExpertSumRouted([Id; 6]),
        // (expert_sum_epi epi w idx x wts extras): `epi` over (expert_sum w idx x wts), the
        // indices and weights read from a router kernel, and the row's extra inputs
        "expert_sum_epi" = ExpertSumEpi([Id; 6]),
        // (mvchain e2 w2 e1 w1 x prologue extras2): (mvk e2 w2 (mvk e1 w1 x prologue nil)
        // nonorm extras2) in one kernel: the inner rows split over workgroups, each adding its
        // share of every outer row into the output (float atomics; `fused_chain.glsl`)
        "mvchain" = MvChain([Id; 7]),

        // ---- leaves and the rest ----
        Attr(Attr),
        Leaf(Symbol),
        // an op no rule touches, named `kind#offset` (its op in the unit): a kernel of its own
        Other(Symbol, Vec<Id>),
    }
}

impl FuseLang {
    /// Nodes that only describe code or compile-time data (no tensor of their own).
    pub fn is_code(&self) -> bool {
        use FuseLang::*;
        matches!(
            self,
            Attr(_)
                | NoNorm
                | Norm(_)
                | Cons(_)
                | Nil
                | Acc
                | Acc0
                | Acc1
                | Acc2
                | Acc3
                | In0
                | In1
                | In2
                | In3
                | EAdd(_)
                | EMul(_)
                | EDiv(_)
                | ESilu(_)
                | ESigmoid(_)
                | EExp(_)
                | ENeg(_)
                | ESoftplus(_)
                | EParts(_)
        )
    }

    /// Nodes that select or reinterpret memory of another value, or pack weights at compile
    /// time: no dispatch.
    pub fn is_view(&self) -> bool {
        matches!(
            self,
            FuseLang::Reshape(_)
                | FuseLang::StateAfter(_)
                | FuseLang::Rows(_)
                | FuseLang::WCat(_)
                | FuseLang::Fx0(_)
                | FuseLang::Fx1(_)
                | FuseLang::Out(_)
                | FuseLang::RouteIds(_)
        )
    }

    /// Nodes that are one dispatch each.
    pub fn is_kernel(&self) -> bool {
        !self.is_code() && !self.is_view() && !matches!(self, FuseLang::Leaf(_))
    }

    /// The fused forms (introduced by rules, never by the trace).
    pub fn is_fused(&self) -> bool {
        matches!(
            self,
            FuseLang::Mvk(_)
                | FuseLang::Ewk(_)
                | FuseLang::UpdateInPlace(_)
                | FuseLang::AttnBlock(_)
                | FuseLang::AttnGated(_)
                | FuseLang::ArgmaxWrite(_)
                | FuseLang::IncWrite(_)
                | FuseLang::TailStep(_)
                | FuseLang::MvkStep(_)
                | FuseLang::GdnStep(_)
                | FuseLang::Route(_)
                | FuseLang::ExpertSum(_)
                | FuseLang::ExpertGlu(_)
                | FuseLang::ExpertGluRouted(_)
                | FuseLang::ExpertSumRouted(_)
                | FuseLang::ExpertSumEpi(_)
                | FuseLang::MvChain(_)
        )
    }

    /// The epilogue accumulator a leaf names: `acc` is `Some(None)`, `accK` is `Some(Some(K))`.
    pub fn acc_index(&self) -> Option<Option<u8>> {
        match self {
            FuseLang::Acc => Some(None),
            FuseLang::Acc0 => Some(Some(0)),
            FuseLang::Acc1 => Some(Some(1)),
            FuseLang::Acc2 => Some(Some(2)),
            FuseLang::Acc3 => Some(Some(3)),
            _ => None,
        }
    }

    /// The extra input an `inK` leaf names.
    pub fn in_index(&self) -> Option<u8> {
        match self {
            FuseLang::In0 => Some(0),
            FuseLang::In1 => Some(1),
            FuseLang::In2 => Some(2),
            FuseLang::In3 => Some(3),
            _ => None,
        }
    }

    /// `accK` for part K (K < [`MAX_ZIPPED`]).
    pub fn acc_part(k: usize) -> FuseLang {
        match k {
            0 => FuseLang::Acc0,
            1 => FuseLang::Acc1,
            2 => FuseLang::Acc2,
            _ => FuseLang::Acc3,
        }
    }

    /// `inK` for extra input K (K < [`MAX_EXTRAS`]).
    pub fn extra(k: usize) -> FuseLang {
        match k {
            0 => FuseLang::In0,
            1 => FuseLang::In1,
            2 => FuseLang::In2,
            _ => FuseLang::In3,
        }
    }
}

/// Most parts a zipped kernel combines row by row (`acc0`..`acc3`).
pub const MAX_ZIPPED: usize = 4;
/// Most extra per-row inputs of one kernel (`in0`..`in3`).
pub const MAX_EXTRAS: usize = 4;
/// Most weights packed side by side into one stacked kernel.
pub const MAX_PARTS: usize = 8;

/// An op attribute as an e-graph leaf, written without spaces: `norm:1e-6`, `norm1p:1e-6`,
/// `rope:10000.0:32`, `scale:0.17677669`, `shape:4x32`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Attr {
    /// rms_norm's eps and whether the weight is zero-centred (`x̂·(1+w)`).
    Norm { eps: F32Attr, zero_centered: bool },
    /// rope's theta and rotary dim.
    Rope { theta: F32Attr, rotary_dim: usize },
    /// attention's scale.
    Scale(F32Attr),
    /// reshape's target shape.
    Shape(Shape),
    /// Where a Gated DeltaNet step finds its operands (`gdn_step`).
    Gdn(GdnLayout),
}

/// How a fused Gated DeltaNet step reads its operands. The projection x is `[key heads, width]`
/// row-major; per key head, q, k, v (its value heads side by side) and z start at the given
/// columns. Each gate input is read per value head h either at h (`Direct`) or, for a column
/// slice of a `[key heads, width]` tensor reshaped to one element per value head, at
/// `(h / n) * width + start + h % n`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GdnLayout {
    pub width: usize,
    pub q: usize,
    pub k: usize,
    pub v: usize,
    pub z: usize,
    /// The l2 norms' eps (q and k alike).
    pub l2_eps: F32Attr,
    /// The readout's scale.
    pub scale: F32Attr,
    /// The gated rms norm's eps.
    pub norm_eps: F32Attr,
    /// The g inputs', then the beta inputs' index maps.
    pub gate_inputs: Vec<GateIndex>,
}

/// How a gate input is read for value head h.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GateIndex {
    /// At h.
    Direct,
    /// At `(h / n) * width + start + h % n`.
    Columns {
        width: usize,
        start: usize,
        n: usize,
    },
}

impl fmt::Display for GateIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GateIndex::Direct => f.write_str("h"),
            GateIndex::Columns { width, start, n } => write!(f, "{width}.{start}.{n}"),
        }
    }
}

impl FromStr for GateIndex {
    type Err = String;
    fn from_str(s: &str) -> Result<GateIndex, String> {
        if s == "h" {
            return Ok(GateIndex::Direct);
        }
        let n: Vec<usize> = s
            .split('.')
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map_err(|_| format!("`{s}` is no gate index"))?;
        match n.as_slice() {
            [width, start, n] => Ok(GateIndex::Columns {
                width: *width,
                start: *start,
                n: *n,
            }),
            _ => Err(format!("`{s}` is no gate index")),
        }
    }
}

impl fmt::Display for Attr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Attr::Norm {
                eps,
                zero_centered: false,
            } => write!(f, "norm:{eps}"),
            Attr::Norm {
                eps,
                zero_centered: true,
            } => write!(f, "norm1p:{eps}"),
            Attr::Rope { theta, rotary_dim } => write!(f, "rope:{theta}:{rotary_dim}"),
            Attr::Scale(s) => write!(f, "scale:{s}"),
            Attr::Shape(s) => {
                let dims: Vec<String> = s.dims().iter().map(usize::to_string).collect();
                write!(f, "shape:{}", dims.join("x"))
            }
            Attr::Gdn(l) => {
                let gates: Vec<String> = l.gate_inputs.iter().map(|g| g.to_string()).collect();
                write!(
                    f,
                    "gdn:{}:{}:{}:{}:{}:{}:{}:{}:{}",
                    l.width,
                    l.q,
                    l.k,
                    l.v,
                    l.z,
                    l.l2_eps,
                    l.scale,
                    l.norm_eps,
                    gates.join(",")
                )
            }
        }
    }
}

impl FromStr for Attr {
    type Err = String;
    fn from_str(s: &str) -> Result<Attr, String> {
        let bad = || format!("`{s}` is not an attribute");
        let f32_of = |t: &str| t.parse::<f32>().map(F32Attr).map_err(|_| bad());
        let mut parts = s.split(':');
        let head = parts.next().ok_or_else(bad)?;
        let rest: Vec<&str> = parts.collect();
        match (head, rest.as_slice()) {
            ("norm", [eps]) => Ok(Attr::Norm {
                eps: f32_of(eps)?,
                zero_centered: false,
            }),
            ("norm1p", [eps]) => Ok(Attr::Norm {
                eps: f32_of(eps)?,
                zero_centered: true,
            }),
            ("rope", [theta, rot]) => Ok(Attr::Rope {
                theta: f32_of(theta)?,
                rotary_dim: rot.parse().map_err(|_| bad())?,
            }),
            ("scale", [v]) => Ok(Attr::Scale(f32_of(v)?)),
            ("gdn", [w, q, k, v, z, l2, scale, eps, gates]) => {
                let n = |t: &str| t.parse::<usize>().map_err(|_| bad());
                Ok(Attr::Gdn(GdnLayout {
                    width: n(w)?,
                    q: n(q)?,
                    k: n(k)?,
                    v: n(v)?,
                    z: n(z)?,
                    l2_eps: f32_of(l2)?,
                    scale: f32_of(scale)?,
                    norm_eps: f32_of(eps)?,
                    gate_inputs: gates
                        .split(',')
                        .filter(|g| !g.is_empty())
                        .map(str::parse)
                        .collect::<Result<_, _>>()?,
                }))
            }
            ("shape", [dims]) => {
                let dims: Result<Vec<usize>, _> = dims.split('x').map(str::parse).collect();
                Ok(Attr::Shape(Shape::new(dims.map_err(|_| bad())?)))
            }
            _ => Err(bad()),
        }
    }
}

/// What a leaf stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LeafKind {
    /// A weight tensor (2-D weights can be packed).
    Weight,
    /// Stacked expert weights (never packed).
    WeightStack,
    /// An activation computed outside the unit.
    Value,
    /// The value of a persistent state read at the start of the step (aliases the state).
    StateValue,
    /// A persistent state itself, as written by `kv_write` and `write_state`.
    State,
}

/// A leaf's type, kind and order (rules that pack weights keep trace order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeafInfo {
    pub ty: Type,
    pub kind: LeafKind,
    pub order: usize,
    /// The persistent state a `State` or `StateValue` leaf is (an index among the program's
    /// states in the representative instance), so rules can tell two leaves alias.
    pub state: Option<usize>,
}

/// Why a rule matched but did not apply, for `--explain`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Refusal {
    pub rule: &'static str,
    pub reason: String,
    /// The e-classes the match was about (canonicalised when reported).
    pub classes: Vec<Id>,
}

/// The facts of one e-class.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Facts {
    /// The type of a tensor-valued class.
    pub ty: Option<Type>,
    /// For a weight leaf or a `wcat`: the weight leaves, in row order.
    pub weights: Option<Vec<Symbol>>,
    /// For an epilogue expression: what it reads.
    pub epi: Option<EpiUse>,
    /// For an extras list: its length.
    pub list_len: Option<usize>,
}

/// The accumulators and extra inputs an epilogue expression reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EpiUse {
    /// Reads `acc` (the row of a stacked kernel).
    pub stacked: bool,
    /// Reads `accK` for K < this (parts zipped row by row); 0 when none.
    pub zipped: u8,
    /// Reads `inK` for K < this; 0 when none.
    pub extras: u8,
}

impl EpiUse {
    fn join(a: EpiUse, b: EpiUse) -> EpiUse {
        EpiUse {
            stacked: a.stacked || b.stacked,
            zipped: a.zipped.max(b.zipped),
            extras: a.extras.max(b.extras),
        }
    }
    /// Whether the expression mixes `acc` with `accK` (no kernel computes that).
    pub fn is_mixed(&self) -> bool {
        self.stacked && self.zipped > 0
    }
}

/// The e-graph analysis: leaf and opaque-op types come from the unit being fused.
#[derive(Debug, Default)]
pub struct FuseAnalysis {
    pub leaves: HashMap<Symbol, LeafInfo>,
    /// Result types of `Other` nodes, by their symbol.
    pub others: HashMap<Symbol, Type>,
    /// The IR op (with its attributes) of every `Other` node, by its symbol.
    pub other_ops: HashMap<Symbol, crate::ir::OpKind>,
    /// Rule matches refused by a condition (interior mutability: conditions see `&EGraph`).
    pub refusals: RefCell<Vec<Refusal>>,
}

impl FuseAnalysis {
    pub fn refuse(&self, rule: &'static str, reason: impl Into<String>, classes: Vec<Id>) {
        let r = Refusal {
            rule,
            reason: reason.into(),
            classes,
        };
        let mut list = self.refusals.borrow_mut();
        if !list.contains(&r) {
            list.push(r);
        }
    }
}

pub type FuseGraph = EGraph<FuseLang, FuseAnalysis>;

fn broadcast(a: &Type, b: &Type) -> Option<Type> {
    crate::ir::verify::broadcast(&a.shape, &b.shape).map(|s| Type {
        dtype: DType::F32,
        shape: s,
    })
}

/// Rows of a (packed) weight class: the sum of its leaves' first dims.
pub fn weight_rows(g: &FuseGraph, w: Id) -> Option<usize> {
    g[w].data.ty.as_ref().map(|t| t.shape.dims()[0])
}

impl Analysis<FuseLang> for FuseAnalysis {
    type Data = Facts;

    fn make(g: &mut FuseGraph, node: &FuseLang) -> Facts {
        use FuseLang::*;
        let ty = |i: &Id| g[*i].data.ty.clone();
        let f32_of = |dims: Vec<usize>| Some(Type::f32(dims));
        let mut facts = Facts::default();
        match node {
            Leaf(s) => {
                if let Some(info) = g.analysis.leaves.get(s) {
                    facts.ty = Some(info.ty.clone());
                    if info.kind == LeafKind::Weight && info.ty.shape.rank() == 2 {
                        facts.weights = Some(vec![*s]);
                    }
                }
            }
            Other(s, _) => facts.ty = g.analysis.others.get(s).cloned(),
            Matvec([w, _]) => facts.ty = ty(w).and_then(|t| f32_of(vec![t.shape.dims()[0]])),
            RmsNorm([x, _, _]) | Silu([x]) | Sigmoid([x]) | Exp([x]) | Neg([x]) | Softplus([x])
            | Rope([x, _, _]) => {
                facts.ty = ty(x).map(|t| Type {
                    dtype: DType::F32,
                    shape: t.shape,
                })
            }
            Add([a, b]) | Mul([a, b]) | Div([a, b]) => {
                facts.ty = match (ty(a), ty(b)) {
                    (Some(a), Some(b)) => broadcast(&a, &b),
                    _ => None,
                }
            }
            Reshape([x, s]) => {
                let shape = g[*s].nodes.iter().find_map(|n| match n {
                    Attr(crate::fuse::lang::Attr::Shape(s)) => Some(s.clone()),
                    _ => None,
                });
                facts.ty = match (ty(x), shape) {
                    (Some(t), Some(shape)) => Some(Type {
                        dtype: t.dtype,
                        shape,
                    }),
                    _ => None,
                }
            }
            KvWrite([cache, _, _]) => facts.ty = ty(cache),
            DeltaRuleUpdate([s, ..]) => facts.ty = ty(s),
            UpdateInPlace(_) => {}
            // The gated norm's output: [value heads, value head dim] of the recurrent state.
            GdnStep([_, _, _, _, st, ..]) => {
                facts.ty = ty(st).and_then(|t| {
                    let d = t.shape.dims();
                    (d.len() == 3).then(|| Type::f32([d[0], d[2]]))
                })
            }
            Out([k]) => facts.ty = ty(k),
            Route([_, s]) => {
                facts.ty = g[*s].nodes.iter().find_map(|n| match n {
                    Attr(crate::fuse::lang::Attr::Shape(s)) => Some(Type::f32(s.dims().to_vec())),
                    _ => None,
                })
            }
            // One row of the stacked weights' outputs.
            ExpertSum([w, ..]) => facts.ty = ty(w).and_then(|t| f32_of(vec![t.shape.dims()[1]])),
            // [chosen experts, rows of one expert].
            ExpertGlu([w, _, idx, _]) => {
                facts.ty = match (ty(w), ty(idx)) {
                    (Some(w), Some(i)) => f32_of(vec![i.shape.numel(), w.shape.dims()[1]]),
                    _ => None,
                }
            }
            ExpertSumRouted([_, w, ..]) | ExpertSumEpi([_, w, ..]) => {
                facts.ty = ty(w).and_then(|t| f32_of(vec![t.shape.dims()[1]]))
            }
            ExpertGluRouted([w, _, _, shape, _]) => {
                let k = g[*shape].nodes.iter().find_map(|n| match n {
                    Attr(crate::fuse::lang::Attr::Shape(s)) => Some(s.numel()),
                    _ => None,
                });
                facts.ty = match (ty(w), k) {
                    (Some(w), Some(k)) => f32_of(vec![k, w.shape.dims()[1]]),
                    _ => None,
                }
            }
            RouteIds([k]) => {
                facts.ty = ty(k).map(|t| Type::i32(t.shape.dims().to_vec()));
            }
            StateAfter([u]) => {
                facts.ty = g[*u].nodes.iter().find_map(|n| match n {
                    UpdateInPlace([st, ..]) => g[*st].data.ty.clone(),
                    _ => None,
                })
            }
            Ewk([_, ins]) => {
                // The largest input's elements (inputs are rows of one length, or scalars).
                let mut best: Option<Type> = None;
                let mut l = *ins;
                while let Some((a, rest)) = g[l].nodes.iter().find_map(|n| match n {
                    Cons([a, r]) => Some((*a, *r)),
                    _ => None,
                }) {
                    if let Some(t) = ty(&a) {
                        if best
                            .as_ref()
                            .is_none_or(|b| t.shape.numel() > b.shape.numel())
                        {
                            best = Some(t);
                        }
                    }
                    l = rest;
                }
                facts.ty = best.map(|t| Type::f32(t.shape.dims().to_vec()));
            }
            Attention([q, ..]) | AttnBlock([q, ..]) => facts.ty = ty(q),
            AttnGated([x, ..]) => {
                facts.ty = ty(x).and_then(|t| match *t.shape.dims() {
                    [h, w] if w % 2 == 0 => Some(Type::new(t.dtype, [h, w / 2])),
                    _ => None,
                })
            }
            Argmax(_) | Increment(_) => facts.ty = Some(Type::i32([1])),
            WCat([a, b]) => {
                if let (Some(ta), Some(tb)) = (ty(a), ty(b)) {
                    let (da, db) = (ta.shape.dims(), tb.shape.dims());
                    if ta.dtype == tb.dtype && da.len() == 2 && db.len() == 2 && da[1] == db[1] {
                        facts.ty = Some(Type::new(ta.dtype, [da[0] + db[0], da[1]]));
                    }
                }
                if let (Some(wa), Some(wb)) = (&g[*a].data.weights, &g[*b].data.weights) {
                    facts.weights = Some(wa.iter().chain(wb).copied().collect());
                }
            }
            Rows([w, _]) | MvChain([_, w, ..]) => {
                facts.ty = ty(w).and_then(|t| f32_of(vec![t.shape.dims()[0]]))
            }
            Mvk([e, w, ..]) | MvkStep([e, w, ..]) => {
                let epi = g[*e].data.epi.unwrap_or_default();
                let parts = g[*w].data.weights.as_ref().map_or(1, Vec::len).max(1);
                facts.ty = ty(w).and_then(|t| {
                    let rows = t.shape.dims()[0];
                    if epi.zipped > 0 {
                        f32_of(vec![rows / parts])
                    } else {
                        f32_of(vec![rows])
                    }
                });
            }
            Nil => facts.list_len = Some(0),
            Cons([_, rest]) => facts.list_len = g[*rest].data.list_len.map(|n| n + 1),
            Acc => {
                facts.epi = Some(EpiUse {
                    stacked: true,
                    ..EpiUse::default()
                })
            }
            Acc0 | Acc1 | Acc2 | Acc3 => {
                let k = node.acc_index().flatten().unwrap_or(0);
                facts.epi = Some(EpiUse {
                    zipped: k + 1,
                    ..EpiUse::default()
                })
            }
            In0 | In1 | In2 | In3 => {
                facts.epi = Some(EpiUse {
                    extras: node.in_index().unwrap_or(0) + 1,
                    ..EpiUse::default()
                })
            }
            EAdd([a, b]) | EMul([a, b]) | EDiv([a, b]) => {
                facts.epi = Some(EpiUse::join(
                    g[*a].data.epi.unwrap_or_default(),
                    g[*b].data.epi.unwrap_or_default(),
                ))
            }
            ESilu([a]) | ESigmoid([a]) | EExp([a]) | ENeg([a]) | ESoftplus([a]) => {
                facts.epi = g[*a].data.epi
            }
            EParts(items) => {
                facts.epi = items
                    .iter()
                    .map(|i| g[*i].data.epi.unwrap_or_default())
                    .reduce(EpiUse::join)
            }
            WriteState(_) | ArgmaxWrite(_) | IncWrite(_) | TailStep(_) | Fx0(_) | Fx1(_)
            | Attr(_) | NoNorm | Norm(_) => {}
        }
        facts
    }

    fn merge(&mut self, a: &mut Facts, b: Facts) -> DidMerge {
        fn fill<T>(x: &mut Option<T>, y: Option<T>) -> (bool, bool) {
            match (x.is_some(), y) {
                (false, Some(y)) => {
                    *x = Some(y);
                    (true, false)
                }
                (true, None) => (false, true),
                _ => (false, false),
            }
        }
        let r = [
            fill(&mut a.ty, b.ty),
            fill(&mut a.weights, b.weights),
            fill(&mut a.epi, b.epi),
            fill(&mut a.list_len, b.list_len),
        ];
        DidMerge(r.iter().any(|x| x.0), r.iter().any(|x| x.1))
    }
}
