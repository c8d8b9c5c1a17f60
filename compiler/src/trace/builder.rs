//! The trace builder's vocabulary: weights checked against the checkpoint, and short calls for
//! the ops the families share (norms, projections, attention, the step's head and tail).

use super::TraceError;
use crate::import::Model;
use crate::ir::{DType, F32Attr, OpKind, Program, Shape, StateKind, Type, ValueId};

pub struct Tracer<'m> {
    pub model: &'m Model,
    pub p: Program,
    pub capacity: usize,
    /// The KV caches' element type (f32 or f16).
    pub kv_dtype: DType,
    pub pos: Option<ValueId>,
    /// Fold the norm weights before matvecs into those matvecs' columns
    /// ([`super::TraceOptions::fold_norms`]; [`Self::pre_norm`]).
    pub fold_norms: bool,
    /// Values of weights already emitted, by tensor name (a tied lm_head reuses the embedding).
    weights: Vec<(String, ValueId)>,
}

type R<T> = Result<T, TraceError>;

impl<'m> Tracer<'m> {
    pub fn new(model: &'m Model, capacity: usize) -> Tracer<'m> {
        Tracer {
            model,
            p: Program::new(),
            capacity,
            kv_dtype: DType::F32,
            pos: None,
            fold_norms: false,
            weights: vec![],
        }
    }

    pub fn finish(self) -> Program {
        self.p
    }

    pub fn op(&mut self, kind: OpKind, args: &[ValueId]) -> R<ValueId> {
        Ok(self.p.value(kind, args.to_vec())?)
    }

    /// The weight `name`, checked to have `shape` in the checkpoint.
    pub fn weight(&mut self, name: &str, shape: &[usize]) -> R<ValueId> {
        if let Some((_, v)) = self.weights.iter().find(|(n, _)| n == name) {
            return Ok(*v);
        }
        let info = self.model.tensors.expect(name, shape)?;
        let ty = Type::new(info.dtype, shape.to_vec());
        let v = self.p.push(
            OpKind::Weight {
                name: name.to_string(),
            },
            vec![],
            Some(ty),
        )?;
        let v = v.expect("weights have a result");
        self.weights.push((name.to_string(), v));
        Ok(v)
    }

    /// `count` tensors named `pattern` with `{}` = 0..count, each of `shape`, stacked.
    pub fn weight_stack(&mut self, pattern: &str, count: usize, shape: &[usize]) -> R<ValueId> {
        let mut dtype = None;
        for e in 0..count {
            let info = self
                .model
                .tensors
                .expect(&pattern.replace("{}", &e.to_string()), shape)?;
            dtype.get_or_insert(info.dtype);
        }
        let mut dims = vec![count];
        dims.extend_from_slice(shape);
        let ty = Type::new(dtype.unwrap_or(DType::F32), dims);
        let kind = OpKind::WeightStack {
            pattern: pattern.to_string(),
            count,
        };
        Ok(self
            .p
            .push(kind, vec![], Some(ty))?
            .expect("weights have a result"))
    }

    pub fn state(&mut self, name: String, kind: StateKind, ty: Type) -> crate::ir::StateId {
        self.p.add_state(name, kind, ty)
    }

    pub fn reshape(&mut self, x: ValueId, dims: &[usize]) -> R<ValueId> {
        self.op(
            OpKind::Reshape {
                shape: Shape::new(dims),
            },
            &[x],
        )
    }

    pub fn slice(&mut self, x: ValueId, axis: usize, start: usize, end: usize) -> R<ValueId> {
        self.op(OpKind::Slice { axis, start, end }, &[x])
    }

    pub fn rms_norm(&mut self, x: ValueId, weight: &str, zero_centered: bool) -> R<ValueId> {
        let n = self.p.ty(x).shape.last();
        let w = self.weight(weight, &[n])?;
        let eps = F32Attr(self.model.config.rms_norm_eps);
        self.op(OpKind::RmsNorm { eps, zero_centered }, &[x, w])
    }

    /// The rms norm of `h` by weight `norm` (not zero-centred) where only matvecs read its
    /// result, and the norm weight those matvecs fold into their columns: where
    /// [`Self::fold_norms`], the norm keeps a weight of ones and this returns `Some(norm)`
    /// for [`Self::linear_folded`].
    pub fn pre_norm<'n>(&mut self, h: ValueId, norm: &'n str) -> R<(ValueId, Option<&'n str>)> {
        if self.fold_norms {
            let x = self.rms_norm(h, &crate::import::layout::ones(norm), false)?;
            return Ok((x, Some(norm)));
        }
        Ok((self.rms_norm(h, norm, false)?, None))
    }

    /// `W·x (+ b)` for the linear layer `prefix` (`prefix.weight`, optional `prefix.bias`).
    pub fn linear(&mut self, prefix: &str, x: ValueId, out: usize, bias: bool) -> R<ValueId> {
        self.linear_folded(prefix, x, out, bias, None)
    }

    /// [`Self::linear`] with `W` replaced, where `norm` names a norm weight, by `W` with that
    /// weight folded into its columns ([`crate::import::layout::folded`]).
    pub fn linear_folded(
        &mut self,
        prefix: &str,
        x: ValueId,
        out: usize,
        bias: bool,
        norm: Option<&str>,
    ) -> R<ValueId> {
        let inp = self.p.ty(x).shape.numel();
        let w = self.weight(&folded_or(format!("{prefix}.weight"), norm), &[out, inp])?;
        let y = self.op(OpKind::Matvec, &[w, x])?;
        if bias {
            let b = self.weight(&format!("{prefix}.bias"), &[out])?;
            return self.op(OpKind::Add, &[y, b]);
        }
        Ok(y)
    }

    /// `down(silu(gate(x)) * up(x))`; gate and up with norm weight `norm` folded into their
    /// columns where one is named ([`Self::pre_norm`]).
    pub fn swiglu_mlp(
        &mut self,
        prefix: &str,
        x: ValueId,
        inter: usize,
        bias: bool,
        norm: Option<&str>,
    ) -> R<ValueId> {
        let hidden = self.p.ty(x).shape.numel();
        let g = self.linear_folded(&format!("{prefix}.gate_proj"), x, inter, bias, norm)?;
        let u = self.linear_folded(&format!("{prefix}.up_proj"), x, inter, bias, norm)?;
        let g = self.op(OpKind::Silu, &[g])?;
        let m = self.op(OpKind::Mul, &[g, u])?;
        self.linear(&format!("{prefix}.down_proj"), m, hidden, bias)
    }

    pub fn add(&mut self, a: ValueId, b: ValueId) -> R<ValueId> {
        self.op(OpKind::Add, &[a, b])
    }

    /// Reads the token and position and looks the token up: the step's first ops.
    pub fn head(&mut self) -> R<ValueId> {
        let c = &self.model.config;
        let (vocab, hidden) = (c.vocab_size, c.hidden_size);
        let token = self.state("token".into(), StateKind::Token, Type::i32([1]));
        let pos = self.state("position".into(), StateKind::Position, Type::i32([1]));
        let tok = self.op(OpKind::ReadState { state: token }, &[])?;
        self.pos = Some(self.op(OpKind::ReadState { state: pos }, &[])?);
        let table = self.weight("model.embed_tokens.weight", &[vocab, hidden])?;
        self.op(OpKind::Embedding, &[table, tok])
    }

    /// Final norm, lm_head, greedy next token, position advance.
    pub fn tail(&mut self, h: ValueId, zero_centered: bool) -> R<()> {
        let c = &self.model.config;
        let (vocab, hidden, tied) = (c.vocab_size, c.hidden_size, c.tie_word_embeddings);
        // Tied: the embedding table, even where the checkpoint also holds an lm_head.weight
        // (transformers ties them after loading; `Model::warnings` says so).
        let shared = tied;
        // A table shared with the embedding stays unfolded: folded, lm_head would be a second
        // copy of it (the Qwen3-0.6B shape in q4_0: +311 MB of bf16 embedding beside the q4_0
        // lm_head, for +0.6% on an H200: docs/perf.md session 36).
        let (x, fold) = if zero_centered || shared {
            (self.rms_norm(h, "model.norm.weight", zero_centered)?, None)
        } else {
            self.pre_norm(h, "model.norm.weight")?
        };
        let lm = if shared {
            "model.embed_tokens.weight"
        } else {
            "lm_head.weight"
        };
        let w = self.weight(&folded_or(lm.to_string(), fold), &[vocab, hidden])?;
        let logits = self.op(OpKind::Matvec, &[w, x])?;
        let next = self.op(OpKind::Argmax, &[logits])?;
        let token = self
            .p
            .state_of_kind(StateKind::Token)
            .expect("head() declared it");
        let position = self
            .p
            .state_of_kind(StateKind::Position)
            .expect("head() declared it");
        self.p
            .push(OpKind::WriteState { state: token }, vec![next], None)?;
        let pos = self.pos.expect("head() read it");
        let pos1 = self.op(OpKind::Increment, &[pos])?;
        self.p
            .push(OpKind::WriteState { state: position }, vec![pos1], None)?;
        self.p.outputs.push(("logits".into(), logits));
        Ok(())
    }

    /// Grouped-query attention of one token over a KV cache: `q[hq, d]`, `k, v[hkv, d]`
    /// (normed and rotated as the family wants) -> `[hq, d]`. Declares the layer's caches.
    pub fn attention(&mut self, q: ValueId, k: ValueId, v: ValueId) -> R<ValueId> {
        let kt = self.p.ty(k).clone();
        let (hkv, d) = (kt.shape.0[0], kt.shape.0[1]);
        if self.kv_dtype == DType::F16 && d % 2 != 0 {
            return Err(TraceError::KvCacheOddHead { head_dim: d });
        }
        let n = self
            .p
            .states
            .iter()
            .filter(|s| s.kind == StateKind::KvCache)
            .count()
            / 2;
        let cache_ty = Type::new(self.kv_dtype, [hkv, self.capacity, d]);
        let kc = self.state(format!("k_cache_{n}"), StateKind::KvCache, cache_ty.clone());
        let vc = self.state(format!("v_cache_{n}"), StateKind::KvCache, cache_ty);
        let pos = self.pos.expect("head() read it");
        let kw = self.op(OpKind::KvWrite { state: kc }, &[k, pos])?;
        let vw = self.op(OpKind::KvWrite { state: vc }, &[v, pos])?;
        let scale = F32Attr(1.0 / (d as f32).sqrt());
        self.op(OpKind::Attention { scale }, &[q, kw, vw, pos])
    }

    pub fn rope(&mut self, x: ValueId) -> R<ValueId> {
        let rope = &self.model.config.rope;
        let kind = OpKind::Rope {
            theta: F32Attr(rope.theta),
            rotary_dim: rope.rotary_dim,
        };
        let pos = self.pos.expect("head() read it");
        self.op(kind, &[x, pos])
    }
}

/// Matrix `name`, or its name with norm weight `norm` folded into its columns where one is
/// named ([`crate::import::layout::folded`]).
fn folded_or(name: String, norm: Option<&str>) -> String {
    match norm {
        Some(norm) => crate::import::layout::folded(&name, norm),
        None => name,
    }
}
