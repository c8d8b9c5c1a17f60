//! The operations of one decode step.
//!
//! Every op takes its operands as values (`args`, in the order documented on each variant) and
//! carries its compile-time attributes in the variant. Semantics are defined by the CPU reference
//! interpreter (`crate::reference`); the comment on each variant states them in short.
//! Reductions (norms, softmax, top-k, argmax) work over the innermost axis.

use super::types::{F32Attr, Shape};
use super::StateId;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    // ---- sources and persistent state ----
    /// `weight "name"`: a tensor of the model, referenced by name. No args.
    Weight {
        name: String,
    },
    /// `weight_stack "pattern" count=N`: tensors `pattern` with `{}` replaced by 0..N, stacked
    /// on a new outer axis (MoE experts stored one tensor per expert). No args.
    WeightStack {
        pattern: String,
        count: usize,
    },
    /// `read_state $s`: the value of persistent state `s` at the start of the step. No args.
    ReadState {
        state: StateId,
    },
    /// `write_state $s, x`: `s` holds `x` from the next step on. No result.
    WriteState {
        state: StateId,
    },
    /// `kv_write $cache, x[kv_heads, d], pos`: writes `x` at slot `pos` of cache state
    /// `[kv_heads, capacity, d]` in place; the result is the updated cache (it aliases the state).
    KvWrite {
        state: StateId,
    },

    // ---- compute ----
    /// `embedding table[V, H], token: i32[1]` -> `f32[H]`: row `token` of the table.
    Embedding,
    /// `rms_norm x[.., N], w[N]` -> x̂·w, or x̂·(1+w) when `zero_centered`; x̂ = x/sqrt(mean(x²)+eps).
    RmsNorm {
        eps: F32Attr,
        zero_centered: bool,
    },
    /// `gated_rms_norm x[.., N], z[.., N], w[N]` -> x̂·w·silu(z).
    GatedRmsNorm {
        eps: F32Attr,
    },
    /// `l2_norm x[.., N]` -> x / sqrt(sum(x²) + eps).
    L2Norm {
        eps: F32Attr,
    },
    /// `matvec w[O, I], x[I]` -> `f32[O]` = w·x (w row-major, as safetensors stores it).
    Matvec,
    /// `expert_matvec w[E, O, I], idx: i32[k], x[I] or x[k, I]` -> f32[k, O]:
    /// row j is `w[idx[j]]·x` (or `·x[j]`); the expert is chosen by a value on the device.
    ExpertMatvec,
    /// Elementwise with numpy broadcasting: `add a, b`, `mul a, b`, `div a, b`.
    Add,
    Mul,
    Div,
    /// Elementwise unary.
    Silu,
    Sigmoid,
    Softplus,
    Exp,
    Neg,
    /// `rope x[heads, d], pos: i32[1]`: transformers' rotate-half rotation of the first
    /// `rotary_dim` dims of each head at position `pos`; `inv_freq[i] = theta^(-2i/rotary_dim)`.
    Rope {
        theta: F32Attr,
        rotary_dim: usize,
    },
    /// `slice x axis=a start=s end=e`: the view x[.., s..e, ..] along axis a.
    Slice {
        axis: usize,
        start: usize,
        end: usize,
    },
    /// `concat a, b axis=a`.
    Concat {
        axis: usize,
    },
    /// `reshape x shape=[..]`: same elements, new shape.
    Reshape {
        shape: Shape,
    },
    /// `attention q[hq, d], k_cache[hkv, C, d], v_cache[hkv, C, d], pos: i32[1]`
    /// -> f32[hq, d]: softmax(scale·q·kᵀ) over slots 0..=pos, then ·v; head h reads kv head
    /// h / (hq/hkv) (grouped-query attention).
    Attention {
        scale: F32Attr,
    },
    /// `causal_conv1d state[C, K-1], x[C], w[C, K]` -> `f32[C]`: depthwise convolution over the
    /// window [state | x] (oldest first).
    CausalConv1d,
    /// `conv_shift state[C, K-1], x[C]` -> f32[C, K-1]: the window without its oldest column.
    ConvShift,
    /// `delta_rule_update s[hv, dk, dv], k[hk, dk], v[hv, dv], g[hv], beta[hv]` -> new state:
    /// s' = s·exp(g); s'' = s' + k ⊗ (beta·(v - s'ᵀk)); value head h uses key head h / (hv/hk).
    DeltaRuleUpdate,
    /// `delta_rule_readout s[hv, dk, dv], q[hk, dk]` -> f32[hv, dv] = scale · sᵀq.
    DeltaRuleReadout {
        scale: F32Attr,
    },
    /// `softmax x[.., N]` over the last axis.
    Softmax,
    /// `top_k x[N] k=K` -> `i32[K]`: indices of the K largest, largest first, ties to the lower
    /// index.
    TopK {
        k: usize,
    },
    /// `gather x[N], idx: i32[K]` -> `f32[K]`.
    Gather,
    /// `sum x axis=a`: the sum over axis a (a rank-1 input gives `[1]`).
    Sum {
        axis: usize,
    },
    /// `argmax x[N]` -> `i32[1]`; ties to the lower index.
    Argmax,
    /// `increment x: i32[1]` -> x + 1 (the position advance).
    Increment,
}

impl OpKind {
    /// The model tensors a `weight` or `weight_stack` reads, in stacking order (one per
    /// expert); `None` for every other op.
    pub fn tensors(&self) -> Option<Vec<String>> {
        match self {
            OpKind::Weight { name } => Some(vec![name.clone()]),
            OpKind::WeightStack { pattern, count } => Some(
                (0..*count)
                    .map(|e| pattern.replace("{}", &e.to_string()))
                    .collect(),
            ),
            _ => None,
        }
    }

    /// The op's name in the text form.
    pub fn name(&self) -> &'static str {
        use OpKind::*;
        match self {
            Weight { .. } => "weight",
            WeightStack { .. } => "weight_stack",
            ReadState { .. } => "read_state",
            WriteState { .. } => "write_state",
            KvWrite { .. } => "kv_write",
            Embedding => "embedding",
            RmsNorm { .. } => "rms_norm",
            GatedRmsNorm { .. } => "gated_rms_norm",
            L2Norm { .. } => "l2_norm",
            Matvec => "matvec",
            ExpertMatvec => "expert_matvec",
            Add => "add",
            Mul => "mul",
            Div => "div",
            Silu => "silu",
            Sigmoid => "sigmoid",
            Softplus => "softplus",
            Exp => "exp",
            Neg => "neg",
            Rope { .. } => "rope",
            Slice { .. } => "slice",
            Concat { .. } => "concat",
            Reshape { .. } => "reshape",
            Attention { .. } => "attention",
            CausalConv1d => "causal_conv1d",
            ConvShift => "conv_shift",
            DeltaRuleUpdate => "delta_rule_update",
            DeltaRuleReadout { .. } => "delta_rule_readout",
            Softmax => "softmax",
            TopK { .. } => "top_k",
            Gather => "gather",
            Sum { .. } => "sum",
            Argmax => "argmax",
            Increment => "increment",
        }
    }

    /// How many value operands the op takes.
    pub fn arity(&self) -> usize {
        use OpKind::*;
        match self {
            Weight { .. } | WeightStack { .. } | ReadState { .. } => 0,
            WriteState { .. } => 1,
            KvWrite { .. } => 2,
            Silu
            | Sigmoid
            | Softplus
            | Exp
            | Neg
            | L2Norm { .. }
            | Slice { .. }
            | Reshape { .. }
            | Softmax
            | TopK { .. }
            | Sum { .. }
            | Argmax
            | Increment => 1,
            Embedding
            | RmsNorm { .. }
            | Matvec
            | Add
            | Mul
            | Div
            | Rope { .. }
            | Concat { .. }
            | ConvShift
            | DeltaRuleReadout { .. }
            | Gather => 2,
            GatedRmsNorm { .. } | ExpertMatvec | CausalConv1d => 3,
            Attention { .. } => 4,
            DeltaRuleUpdate => 5,
        }
    }

    /// Whether the op defines a value (all but `write_state`).
    pub fn has_result(&self) -> bool {
        !matches!(self, OpKind::WriteState { .. })
    }

    /// The persistent state the op reads or writes, if any.
    pub fn state(&self) -> Option<StateId> {
        match self {
            OpKind::ReadState { state }
            | OpKind::WriteState { state }
            | OpKind::KvWrite { state } => Some(*state),
            _ => None,
        }
    }

    /// Pure elementwise ops (one output element from the same-index input elements).
    pub fn is_elementwise(&self) -> bool {
        use OpKind::*;
        matches!(
            self,
            Add | Mul | Div | Silu | Sigmoid | Softplus | Exp | Neg
        )
    }

    /// Ops that only reinterpret or select memory (no arithmetic).
    pub fn is_view(&self) -> bool {
        matches!(
            self,
            OpKind::Slice { .. } | OpKind::Reshape { .. } | OpKind::Concat { .. }
        )
    }

    /// Every op name, for the parser and for coverage tests.
    pub const NAMES: &'static [&'static str] = &[
        "weight",
        "weight_stack",
        "read_state",
        "write_state",
        "kv_write",
        "embedding",
        "rms_norm",
        "gated_rms_norm",
        "l2_norm",
        "matvec",
        "expert_matvec",
        "add",
        "mul",
        "div",
        "silu",
        "sigmoid",
        "softplus",
        "exp",
        "neg",
        "rope",
        "slice",
        "concat",
        "reshape",
        "attention",
        "causal_conv1d",
        "conv_shift",
        "delta_rule_update",
        "delta_rule_readout",
        "softmax",
        "top_k",
        "gather",
        "sum",
        "argmax",
        "increment",
    ];
}
