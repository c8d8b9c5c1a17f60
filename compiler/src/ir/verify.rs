//! Shape and dtype inference for every op, and the program verifier.

use super::op::OpKind;
use super::program::{OpId, Program, StateKind, ValueId};
use super::types::{DType, Shape, Type};
use std::collections::HashSet;

/// A malformed program: which op, its text, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("op {op} `{text}`: {kind}")]
pub struct VerifyError {
    pub op: OpId,
    /// The op as text (filled in by the verifier; empty while building).
    pub text: String,
    pub kind: VerifyErrorKind,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum VerifyErrorKind {
    #[error("takes {expected} operands, got {got}")]
    Arity { expected: usize, got: usize },
    #[error("operand {0} is used before it is defined")]
    UndefinedValue(ValueId),
    #[error("operand {index} has type {got}, expected {expected}")]
    OperandType {
        index: usize,
        got: Type,
        expected: String,
    },
    #[error("shapes {0} and {1} do not broadcast")]
    Broadcast(Shape, Shape),
    #[error("{0}")]
    Attribute(String),
    #[error("declared type {declared} differs from the inferred {inferred}")]
    DeclaredType { declared: Type, inferred: Type },
    #[error("a weight needs a declared type")]
    MissingWeightType,
    #[error("refers to state #{0}, which is not declared")]
    UndeclaredState(usize),
    #[error("state `{0}` is written twice in one step")]
    StateWrittenTwice(String),
    #[error("state `{name}` is a {kind} state; this op needs {expected}")]
    StateKind {
        name: String,
        kind: &'static str,
        expected: &'static str,
    },
    #[error("op has no result")]
    NoResult,
    #[error("output `{0}` names an undefined value")]
    BadOutput(String),
}

type R<T> = Result<T, VerifyErrorKind>;

fn expect(cond: bool, index: usize, got: &Type, expected: impl FnOnce() -> String) -> R<()> {
    if cond {
        Ok(())
    } else {
        Err(VerifyErrorKind::OperandType {
            index,
            got: got.clone(),
            expected: expected(),
        })
    }
}

fn attr(cond: bool, msg: impl FnOnce() -> String) -> R<()> {
    if cond {
        Ok(())
    } else {
        Err(VerifyErrorKind::Attribute(msg()))
    }
}

/// numpy broadcasting of two shapes.
pub fn broadcast(a: &Shape, b: &Shape) -> Option<Shape> {
    let rank = a.rank().max(b.rank());
    let mut out = vec![0; rank];
    for (i, o) in out.iter_mut().enumerate() {
        let da = if i < rank - a.rank() {
            1
        } else {
            a.0[i - (rank - a.rank())]
        };
        let db = if i < rank - b.rank() {
            1
        } else {
            b.0[i - (rank - b.rank())]
        };
        *o = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(Shape(out))
}

/// The result type of `kind` applied to `args` in `p`, or why it does not fit.
/// `None` for ops without a result.
pub fn infer(
    p: &Program,
    kind: &OpKind,
    args: &[ValueId],
    declared: Option<&Type>,
) -> R<Option<Type>> {
    use OpKind::*;
    if args.len() != kind.arity() {
        return Err(VerifyErrorKind::Arity {
            expected: kind.arity(),
            got: args.len(),
        });
    }
    let t: Vec<&Type> = args.iter().map(|a| p.ty(*a)).collect();
    // Block-quantised values have no elements to index, slice or reshape: only a matvec or an
    // embedding reads them, as its operand 0 (checked there).
    if let Some(i) = t.iter().position(|ty| ty.dtype.is_quantized()) {
        if i != 0 || !matches!(kind, Matvec | ExpertMatvec | Embedding) {
            return Err(VerifyErrorKind::OperandType {
                index: i,
                got: t[i].clone(),
                expected:
                    "a value that is not block-quantised (only matvec, expert_matvec and embedding \
                           read q8_0 and q4_0, as operand 0)"
                        .into(),
            });
        }
    }
    let float = |i: usize| expect(t[i].dtype.is_float(), i, t[i], || "a float type".into());
    // The weight of a matvec or an embedding: float, or rows of a block-quantised format.
    let matrix = |i: usize| {
        expect(
            t[i].dtype.is_float() || t[i].dtype.is_quantized(),
            i,
            t[i],
            || "a float or block-quantised type".into(),
        )
    };
    let f32_ = |i: usize| expect(t[i].dtype == DType::F32, i, t[i], || "f32".into());
    let rank = |i: usize, r: usize| expect(t[i].shape.rank() == r, i, t[i], || format!("rank {r}"));
    let scalar_i32 = |i: usize| {
        expect(
            t[i].dtype == DType::I32 && t[i].shape.0 == [1],
            i,
            t[i],
            || "i32[1]".into(),
        )
    };
    let state = |s: super::StateId| {
        p.states
            .get(s.index())
            .ok_or(VerifyErrorKind::UndeclaredState(s.index()))
    };
    let dims = |i: usize| t[i].shape.dims();
    let same = |i: usize, j: usize| {
        expect(t[i].shape == t[j].shape, i, t[i], || {
            format!("the shape of operand {j} ({})", t[j].shape)
        })
    };

    let out = match kind {
        Weight { .. } | WeightStack { .. } => {
            let ty = declared.ok_or(VerifyErrorKind::MissingWeightType)?.clone();
            attr(ty.dtype.is_float() || ty.dtype.is_quantized(), || {
                format!("weights are float or block-quantised, not {}", ty.dtype)
            })?;
            if ty.dtype.is_quantized() {
                // A matrix, or a stack of them (one per expert).
                let rank = if matches!(kind, Weight { .. }) { 2 } else { 3 };
                attr(
                    ty.shape.rank() == rank && ty.shape.last().is_multiple_of(DType::BLOCK),
                    || {
                        format!(
                            "{} weights are matrices (or stacks of them) whose rows are whole \
                             blocks of {}, not {}",
                            ty.dtype,
                            DType::BLOCK,
                            ty.shape
                        )
                    },
                )?;
            }
            if let WeightStack { pattern, count } = kind {
                attr(pattern.contains("{}"), || {
                    format!("pattern `{pattern}` has no `{{}}`")
                })?;
                attr(ty.shape.0.first() == Some(count), || {
                    format!("stack of {count} has outer dim {:?}", ty.shape.0.first())
                })?;
            }
            return Ok(Some(ty));
        }
        ReadState { state: s } => state(*s)?.ty.clone(),
        WriteState { state: s } => {
            let decl = state(*s)?;
            expect(*t[0] == decl.ty, 0, t[0], || {
                format!("the type of state `{}` ({})", decl.name, decl.ty)
            })?;
            attr(decl.kind != StateKind::KvCache, || {
                "KV caches are written by kv_write".into()
            })?;
            return Ok(None);
        }
        KvWrite { state: s } => {
            let decl = state(*s)?;
            if decl.kind != StateKind::KvCache {
                return Err(VerifyErrorKind::StateKind {
                    name: decl.name.clone(),
                    kind: decl.kind.name(),
                    expected: "a kv_cache",
                });
            }
            let c = decl.ty.shape.dims();
            f32_(0)?;
            rank(0, 2)?;
            expect(c.len() == 3 && dims(0) == [c[0], c[2]], 0, t[0], || {
                format!("f32[{},{}]", c[0], c[2])
            })?;
            // f16 caches are written two elements per word.
            attr(decl.ty.dtype != DType::F16 || c[2] % 2 == 0, || {
                format!("an f16 KV cache needs an even head_dim, not {}", c[2])
            })?;
            scalar_i32(1)?;
            decl.ty.clone()
        }
        Embedding => {
            matrix(0)?;
            rank(0, 2)?;
            scalar_i32(1)?;
            Type::f32([dims(0)[1]])
        }
        RmsNorm { .. } | L2Norm { .. } | GatedRmsNorm { .. } => {
            f32_(0)?;
            if matches!(kind, GatedRmsNorm { .. }) {
                f32_(1)?;
                same(1, 0)?;
            }
            if !matches!(kind, L2Norm { .. }) {
                let w = args.len() - 1;
                float(w)?;
                let n = t[0].shape.last();
                expect(dims(w) == [n], w, t[w], || format!("[{n}]"))?;
            }
            t[0].clone()
        }
        Matvec => {
            matrix(0)?;
            rank(0, 2)?;
            f32_(1)?;
            let (o, i) = (dims(0)[0], dims(0)[1]);
            expect(dims(1) == [i], 1, t[1], || format!("f32[{i}]"))?;
            Type::f32([o])
        }
        ExpertMatvec => {
            matrix(0)?;
            rank(0, 3)?;
            expect(
                t[1].dtype == DType::I32 && t[1].shape.rank() == 1,
                1,
                t[1],
                || "i32[k]".into(),
            )?;
            f32_(2)?;
            let (o, i, k) = (dims(0)[1], dims(0)[2], dims(1)[0]);
            expect(dims(2) == [i] || dims(2) == [k, i], 2, t[2], || {
                format!("f32[{i}] or f32[{k},{i}]")
            })?;
            Type::f32([k, o])
        }
        Add | Mul | Div => {
            float(0)?;
            float(1)?;
            let s = broadcast(&t[0].shape, &t[1].shape).ok_or_else(|| {
                VerifyErrorKind::Broadcast(t[0].shape.clone(), t[1].shape.clone())
            })?;
            Type {
                dtype: DType::F32,
                shape: s,
            }
        }
        Silu | Sigmoid | Softplus | Exp | Neg | Softmax => {
            float(0)?;
            Type {
                dtype: DType::F32,
                shape: t[0].shape.clone(),
            }
        }
        Rope { rotary_dim, theta } => {
            f32_(0)?;
            rank(0, 2)?;
            scalar_i32(1)?;
            let d = dims(0)[1];
            attr(
                *rotary_dim % 2 == 0 && *rotary_dim > 0 && *rotary_dim <= d,
                || format!("rotary_dim {rotary_dim} must be even and in 2..={d}"),
            )?;
            attr(theta.0 > 0.0, || {
                format!("theta {} must be positive", theta)
            })?;
            t[0].clone()
        }
        Slice { axis, start, end } => {
            let d = dims(0);
            attr(*axis < d.len(), || {
                format!("axis {axis} out of range for {}", t[0].shape)
            })?;
            attr(start < end && *end <= d[*axis], || {
                format!("range {start}..{end} out of 0..{} on axis {axis}", d[*axis])
            })?;
            let mut s = d.to_vec();
            s[*axis] = end - start;
            Type::new(t[0].dtype, s)
        }
        Concat { axis } => {
            let (a, b) = (dims(0), dims(1));
            attr(*axis < a.len(), || {
                format!("axis {axis} out of range for {}", t[0].shape)
            })?;
            let fits = a.len() == b.len()
                && t[0].dtype == t[1].dtype
                && (0..a.len()).all(|i| i == *axis || a[i] == b[i]);
            expect(fits, 1, t[1], || {
                format!("{} matching operand 0 except on axis {axis}", t[0].dtype)
            })?;
            let mut s = a.to_vec();
            s[*axis] += b[*axis];
            Type::new(t[0].dtype, s)
        }
        Reshape { shape } => {
            attr(
                shape.numel() == t[0].shape.numel() && shape.rank() > 0,
                || format!("cannot reshape {} to {}", t[0].shape, shape),
            )?;
            Type {
                dtype: t[0].dtype,
                shape: shape.clone(),
            }
        }
        Attention { .. } => {
            f32_(0)?;
            rank(0, 2)?;
            let (hq, d) = (dims(0)[0], dims(0)[1]);
            for i in [1, 2] {
                // The caches: f32, or f16 (`--kv-cache f16`).
                let cache = matches!(t[i].dtype, DType::F32 | DType::F16);
                expect(cache, i, t[i], || "an f32 or f16 cache".into())?;
                rank(i, 3)?;
                let c = dims(i);
                expect(c[2] == d && c[0] > 0 && hq % c[0] == 0, i, t[i], || {
                    format!("[kv_heads dividing {hq}, capacity, {d}]")
                })?;
            }
            same(2, 1)?;
            scalar_i32(3)?;
            t[0].clone()
        }
        CausalConv1d | ConvShift => {
            f32_(0)?;
            rank(0, 2)?;
            let (c, km1) = (dims(0)[0], dims(0)[1]);
            f32_(1)?;
            expect(dims(1) == [c], 1, t[1], || format!("f32[{c}]"))?;
            if matches!(kind, CausalConv1d) {
                float(2)?;
                expect(dims(2) == [c, km1 + 1], 2, t[2], || {
                    format!("[{c},{}]", km1 + 1)
                })?;
                Type::f32([c])
            } else {
                t[0].clone()
            }
        }
        DeltaRuleUpdate => {
            for i in 0..5 {
                f32_(i)?;
            }
            rank(0, 3)?;
            let (hv, dk, dv) = (dims(0)[0], dims(0)[1], dims(0)[2]);
            rank(1, 2)?;
            let hk = dims(1)[0];
            expect(dims(1)[1] == dk && hk > 0 && hv % hk == 0, 1, t[1], || {
                format!("f32[heads dividing {hv}, {dk}]")
            })?;
            expect(dims(2) == [hv, dv], 2, t[2], || format!("f32[{hv},{dv}]"))?;
            expect(dims(3) == [hv], 3, t[3], || format!("f32[{hv}]"))?;
            expect(dims(4) == [hv], 4, t[4], || format!("f32[{hv}]"))?;
            t[0].clone()
        }
        DeltaRuleReadout { .. } => {
            f32_(0)?;
            f32_(1)?;
            rank(0, 3)?;
            let (hv, dk, dv) = (dims(0)[0], dims(0)[1], dims(0)[2]);
            rank(1, 2)?;
            let hk = dims(1)[0];
            expect(dims(1)[1] == dk && hk > 0 && hv % hk == 0, 1, t[1], || {
                format!("f32[heads dividing {hv}, {dk}]")
            })?;
            Type::f32([hv, dv])
        }
        TopK { k } => {
            f32_(0)?;
            rank(0, 1)?;
            attr(*k >= 1 && *k <= dims(0)[0], || {
                format!("k={k} out of 1..={}", dims(0)[0])
            })?;
            Type::i32([*k])
        }
        Gather => {
            f32_(0)?;
            rank(0, 1)?;
            expect(
                t[1].dtype == DType::I32 && t[1].shape.rank() == 1,
                1,
                t[1],
                || "i32[k]".into(),
            )?;
            Type::f32(dims(1).to_vec())
        }
        Sum { axis } => {
            f32_(0)?;
            attr(*axis < t[0].shape.rank(), || {
                format!("axis {axis} out of range for {}", t[0].shape)
            })?;
            let mut s = dims(0).to_vec();
            s.remove(*axis);
            Type::f32(if s.is_empty() { vec![1] } else { s })
        }
        Argmax => {
            f32_(0)?;
            rank(0, 1)?;
            Type::i32([1])
        }
        Increment => {
            scalar_i32(0)?;
            t[0].clone()
        }
    };
    if let Some(d) = declared {
        if *d != out {
            return Err(VerifyErrorKind::DeclaredType {
                declared: d.clone(),
                inferred: out,
            });
        }
    }
    Ok(Some(out))
}

impl Program {
    /// Checks every invariant of [`Program`]; the error names the first bad op.
    pub fn verify(&self) -> Result<(), VerifyError> {
        let mut written = HashSet::new();
        let mut defined = 0usize;
        for (i, op) in self.ops.iter().enumerate() {
            let id = OpId::new(i);
            let err = |kind| VerifyError {
                op: id,
                text: self.op_text(id),
                kind,
            };
            if let Some(&bad) = op.args.iter().find(|a| a.index() >= defined) {
                return Err(err(VerifyErrorKind::UndefinedValue(bad)));
            }
            // The stored result type must be what inference gives (weights: what was declared).
            let declared = op.result.and_then(|v| self.values.get(v.index())).cloned();
            infer(self, &op.kind, &op.args, declared.as_ref()).map_err(err)?;
            match (op.kind.has_result(), op.result) {
                (true, Some(v))
                    if v.index() == defined && self.defs.get(v.index()) == Some(&id) =>
                {
                    defined += 1
                }
                (false, None) => {}
                _ => return Err(err(VerifyErrorKind::NoResult)),
            }
            if let OpKind::WriteState { state } | OpKind::KvWrite { state } = op.kind {
                if !written.insert(state) {
                    return Err(err(VerifyErrorKind::StateWrittenTwice(
                        self.state(state).name.clone(),
                    )));
                }
            }
        }
        for (name, v) in &self.outputs {
            if v.index() >= self.values.len() {
                return Err(VerifyError {
                    op: OpId::new(self.ops.len()),
                    text: format!("output {name}"),
                    kind: VerifyErrorKind::BadOutput(name.clone()),
                });
            }
        }
        Ok(())
    }
}
