//! The CPU reference interpreter: runs a [`Program`] one token at a time with its own state.
//!
//! It is the oracle for every backend, so it is kept plain: ops run in program order, each
//! written as the textbook formula (`ops.rs`), f32 values with f64 accumulation in reductions.

mod ops;
mod tensor;

pub use tensor::{Data, Tensor};

use crate::import::{ImportError, TensorStore};
use crate::ir::{DType, OpKind, Program, StateId, StateKind};
use std::collections::HashMap;

/// Where the interpreter reads weights from: a checkpoint, or (in kernel tests) values in memory.
pub trait WeightSource {
    /// The tensor `name` as f32, row-major.
    fn f32(&self, name: &str) -> Result<Vec<f32>, ImportError>;
}

impl<T: WeightSource + ?Sized> WeightSource for &T {
    fn f32(&self, name: &str) -> Result<Vec<f32>, ImportError> {
        (**self).f32(name)
    }
}

impl WeightSource for TensorStore {
    fn f32(&self, name: &str) -> Result<Vec<f32>, ImportError> {
        self.to_f32(name)
    }
}

impl WeightSource for HashMap<String, Vec<f32>> {
    fn f32(&self, name: &str) -> Result<Vec<f32>, ImportError> {
        self.get(name)
            .cloned()
            .ok_or_else(|| ImportError::MissingTensor {
                file: "<memory>".into(),
                tensor: name.to_string(),
            })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReferenceError {
    #[error(transparent)]
    Import(#[from] ImportError),
    #[error("the context is full: position {position} is past the KV capacity of {capacity} (compile with a larger --max-context)")]
    ContextFull { position: usize, capacity: usize },
    #[error("token id {token} is outside the vocabulary of {vocab}")]
    TokenOutOfRange { token: i64, vocab: usize },
    #[error("the program has no `logits` output")]
    NoLogits,
    #[error("state `{state}` needs {gib:.2} GiB of host memory for the reference backend, which cannot be allocated (lower --max-context)")]
    StateTooLarge { state: String, gib: f64 },
}

/// What one step produced.
#[derive(Clone, Debug)]
pub struct StepOutput {
    pub logits: Vec<f32>,
    /// The greedy next token (the step's argmax), already stored as the next input.
    pub next_token: i32,
}

pub struct Reference<'a> {
    program: &'a Program,
    tensors: Box<dyn WeightSource + 'a>,
    /// Weights converted to f32, by op index, loaded on first use.
    weights: Vec<Option<Tensor>>,
    state: Vec<Tensor>,
}

impl<'a> Reference<'a> {
    pub fn new(program: &'a Program, tensors: &'a dyn WeightSource) -> Reference<'a> {
        Reference::owning(program, tensors)
    }

    /// Like [`Reference::new`], keeping `tensors` (e.g. weights converted for this program).
    pub fn owning(program: &'a Program, tensors: impl WeightSource + 'a) -> Reference<'a> {
        let state = program
            .states
            .iter()
            .map(|s| Tensor::zeros(&s.ty.shape, !s.ty.dtype.is_float()))
            .collect();
        Reference::with_state(program, tensors, state)
    }

    fn with_state(
        program: &'a Program,
        tensors: impl WeightSource + 'a,
        state: Vec<Tensor>,
    ) -> Reference<'a> {
        Reference {
            program,
            tensors: Box::new(tensors),
            weights: vec![None; program.ops.len()],
            state,
        }
    }

    /// [`Reference::owning`], with a state the host cannot allocate (a huge KV capacity) an
    /// error naming it instead of an abort.
    pub fn try_owning(
        program: &'a Program,
        tensors: impl WeightSource + 'a,
    ) -> Result<Reference<'a>, ReferenceError> {
        let state = program
            .states
            .iter()
            .map(|s| {
                Tensor::try_zeros(&s.ty.shape, !s.ty.dtype.is_float()).ok_or_else(|| {
                    ReferenceError::StateTooLarge {
                        state: s.name.clone(),
                        gib: (s.ty.shape.numel() * 4) as f64 / f64::from(1u32 << 30),
                    }
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Reference::with_state(program, tensors, state))
    }

    /// Sets a state's value (tests start kernels from arbitrary state this way).
    pub fn set_state(&mut self, state: StateId, value: Tensor) {
        assert_eq!(
            value.shape,
            self.program.state(state).ty.shape,
            "set_state: shape mismatch"
        );
        self.state[state.index()] = value;
    }

    pub fn state(&self, state: StateId) -> &Tensor {
        &self.state[state.index()]
    }

    /// Runs one step and returns every value it computed (by `ValueId` index), for tests that
    /// compare single ops. State writes take effect as in [`Reference::step`].
    pub fn run_values(&mut self) -> Result<Vec<Option<Tensor>>, ReferenceError> {
        self.run()
    }

    fn scalar_state(&self, kind: StateKind) -> i32 {
        self.program
            .state_of_kind(kind)
            .map_or(0, |s| self.state[s.index()].i()[0])
    }

    /// The number of tokens processed so far.
    pub fn position(&self) -> usize {
        self.scalar_state(StateKind::Position) as usize
    }

    /// The KV capacity (the smallest cache), or `usize::MAX` for a model without KV caches.
    pub fn capacity(&self) -> usize {
        let caches = self
            .program
            .states
            .iter()
            .filter(|s| s.kind == StateKind::KvCache);
        caches
            .map(|s| s.ty.shape.dims()[1])
            .min()
            .unwrap_or(usize::MAX)
    }

    fn vocab(&self) -> usize {
        self.program
            .output("logits")
            .map_or(0, |v| self.program.ty(v).shape.numel())
    }

    /// Runs one step. `token` overrides the input token (teacher forcing); `None` feeds the
    /// previous step's argmax.
    pub fn step(&mut self, token: Option<u32>) -> Result<StepOutput, ReferenceError> {
        let (position, capacity) = (self.position(), self.capacity());
        if position >= capacity {
            return Err(ReferenceError::ContextFull { position, capacity });
        }
        if let Some(t) = token {
            let vocab = self.vocab();
            if t as usize >= vocab {
                return Err(ReferenceError::TokenOutOfRange {
                    token: t as i64,
                    vocab,
                });
            }
            if let Some(s) = self.program.state_of_kind(StateKind::Token) {
                self.state[s.index()] = Tensor::i32(&[1], vec![t as i32]);
            }
        }
        let values = self.run()?;
        let logits_id = self
            .program
            .output("logits")
            .ok_or(ReferenceError::NoLogits)?;
        let logits = values[logits_id.index()]
            .as_ref()
            .expect("outputs are defined")
            .f()
            .to_vec();
        let next_token = self.scalar_state(StateKind::Token);
        Ok(StepOutput { logits, next_token })
    }

    fn weight(&mut self, i: usize) -> Result<Tensor, ReferenceError> {
        if let Some(w) = &self.weights[i] {
            return Ok(w.clone());
        }
        let op = &self.program.ops[i];
        let ty = self.program.ty(op.result.expect("weights have a result"));
        let data = match &op.kind {
            OpKind::Weight { name } => self.tensors.f32(name)?,
            OpKind::WeightStack { pattern, count } => {
                let mut all = Vec::with_capacity(ty.shape.numel());
                for e in 0..*count {
                    all.extend(self.tensors.f32(&pattern.replace("{}", &e.to_string()))?);
                }
                all
            }
            _ => unreachable!("only called for weights"),
        };
        let t = Tensor::f32(ty.shape.dims(), data);
        self.weights[i] = Some(t.clone());
        Ok(t)
    }

    fn run(&mut self) -> Result<Vec<Option<Tensor>>, ReferenceError> {
        use OpKind::*;
        let p = self.program;
        let mut vals: Vec<Option<Tensor>> = vec![None; p.values.len()];
        let mut writes = vec![];
        for (i, op) in p.ops.iter().enumerate() {
            let a = |n: usize| {
                vals[op.args[n].index()]
                    .as_ref()
                    .expect("SSA: defined before use")
            };
            let out = match &op.kind {
                Weight { .. } | WeightStack { .. } => self.weight(i)?,
                ReadState { state } => self.state[state.index()].clone(),
                WriteState { state } => {
                    writes.push((state.index(), a(0).clone()));
                    continue;
                }
                KvWrite { state } => {
                    let f16 = self.program.state(*state).ty.dtype == DType::F16;
                    let cache = &mut self.state[state.index()];
                    let (hkv, cap, d) = (cache.dims()[0], cache.dims()[1], cache.dims()[2]);
                    let pos = a(1).i()[0] as usize;
                    let mut x = a(0).f().to_vec();
                    if f16 {
                        // An f16 cache holds the values rounded to the nearest f16, as kv_write
                        // stores them (the fused attention block rounds with the device's
                        // packHalf2x16, to nearest on lavapipe and the H100).
                        for v in &mut x {
                            *v = half::f16::from_f32(*v).to_f32();
                        }
                    }
                    if let Data::F32(c) = &mut cache.data {
                        for h in 0..hkv {
                            c[(h * cap + pos) * d..(h * cap + pos + 1) * d]
                                .copy_from_slice(&x[h * d..(h + 1) * d]);
                        }
                    }
                    cache.clone()
                }
                Embedding => {
                    let (table, tok) = (a(0), a(1).i()[0] as usize);
                    let h = table.dims()[1];
                    Tensor::f32(&[h], table.f()[tok * h..(tok + 1) * h].to_vec())
                }
                RmsNorm { eps, zero_centered } => {
                    ops::rms_norm(a(0), a(1).f(), eps.0, *zero_centered)
                }
                GatedRmsNorm { eps } => ops::gated_rms_norm(a(0), a(1).f(), a(2).f(), eps.0),
                L2Norm { eps } => ops::l2_norm(a(0), eps.0),
                Matvec => {
                    let o = a(0).dims()[0];
                    Tensor::f32(&[o], ops::matvec(a(0).f(), o, a(1).f()))
                }
                ExpertMatvec => ops::expert_matvec(a(0), a(1).i(), a(2)),
                Add => ops::binary(a(0), a(1), |x, y| x + y),
                Mul => ops::binary(a(0), a(1), |x, y| x * y),
                Div => ops::binary(a(0), a(1), |x, y| x / y),
                Silu => ops::unary(a(0), ops::silu),
                Sigmoid => ops::unary(a(0), ops::sigmoid),
                Softplus => ops::unary(a(0), ops::softplus),
                Exp => ops::unary(a(0), f32::exp),
                Neg => ops::unary(a(0), |x| -x),
                Rope { theta, rotary_dim } => ops::rope(a(0), a(1).i()[0], theta.0, *rotary_dim),
                Slice { axis, start, end } => ops::slice(a(0), *axis, *start, *end),
                Concat { axis } => ops::concat(a(0), a(1), *axis),
                Reshape { shape } => Tensor {
                    shape: shape.clone(),
                    data: a(0).data.clone(),
                },
                Attention { scale } => {
                    ops::attention(a(0), a(1), a(2), a(3).i()[0] as usize, scale.0)
                }
                CausalConv1d => ops::causal_conv1d(a(0), a(1).f(), a(2).f()),
                ConvShift => ops::conv_shift(a(0), a(1).f()),
                DeltaRuleUpdate => ops::delta_rule_update(a(0), a(1), a(2).f(), a(3).f(), a(4).f()),
                DeltaRuleReadout { scale } => ops::delta_rule_readout(a(0), a(1), scale.0),
                Softmax => ops::softmax(a(0)),
                TopK { k } => Tensor::i32(&[*k], ops::top_k(a(0).f(), *k)),
                Gather => {
                    let x = a(0).f();
                    let idx = a(1).i();
                    Tensor::f32(
                        &[idx.len()],
                        idx.iter()
                            .map(|&j| x[(j.max(0) as usize).min(x.len() - 1)])
                            .collect(),
                    )
                }
                Sum { axis } => ops::sum(a(0), *axis),
                Argmax => Tensor::i32(&[1], ops::top_k(a(0).f(), 1)),
                Increment => Tensor::i32(&[1], vec![a(0).i()[0] + 1]),
            };
            vals[op
                .result
                .expect("all but write_state have a result")
                .index()] = Some(out);
        }
        // State writes take effect after the step, as between two launches on the device.
        for (s, t) in writes {
            self.state[s] = t;
        }
        Ok(vals)
    }
}
