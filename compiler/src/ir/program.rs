//! A program: the flat SSA op list of one decode step, with its persistent state.

use super::op::OpKind;
use super::types::Type;
use super::verify::{infer, VerifyError, VerifyErrorKind};
use std::fmt;

macro_rules! typed_id {
    ($(#[$m:meta])* $name:ident, $prefix:literal) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(u32);
        impl $name {
            pub fn new(index: usize) -> Self {
                Self(u32::try_from(index).expect("IR tables hold fewer than 2^32 entries"))
            }
            pub fn index(self) -> usize {
                self.0 as usize
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

typed_id!(
    /// An SSA value, written `%N`: the result of exactly one op.
    ValueId, "%"
);
typed_id!(
    /// An op's place in the program, written `#N` in messages.
    OpId, "#"
);
typed_id!(
    /// A persistent state slot; written by name (`$k_cache_3`) in the text form.
    StateId, "state#"
);

/// What a persistent state holds; decides how it is initialised and advanced between steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StateKind {
    /// The current position, `i32[1]`, 0 before the first token.
    Position,
    /// The token fed to the step, `i32[1]`; written by the host or by the previous step's argmax.
    Token,
    /// A KV cache `[kv_heads, capacity, head_dim]`, written in place by `kv_write`.
    KvCache,
    /// A causal-conv window `[channels, kernel-1]`, zero at the start.
    Conv,
    /// A recurrent (delta-rule) state `[heads, k_dim, v_dim]`, zero at the start.
    Recurrent,
}

impl StateKind {
    pub fn name(self) -> &'static str {
        match self {
            StateKind::Position => "position",
            StateKind::Token => "token",
            StateKind::KvCache => "kv_cache",
            StateKind::Conv => "conv",
            StateKind::Recurrent => "recurrent",
        }
    }
    pub fn from_name(s: &str) -> Option<StateKind> {
        [
            Self::Position,
            Self::Token,
            Self::KvCache,
            Self::Conv,
            Self::Recurrent,
        ]
        .into_iter()
        .find(|k| k.name() == s)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateDecl {
    pub name: String,
    pub kind: StateKind,
    pub ty: Type,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    pub kind: OpKind,
    pub args: Vec<ValueId>,
    pub result: Option<ValueId>,
}

/// One decode step. Invariants (checked by [`Program::verify`], kept by [`Program::push`]):
/// values are defined before use, every value has exactly one defining op, every op's operand
/// types fit its kind, state ops name declared states of matching type, and each state is
/// written at most once per step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Program {
    pub states: Vec<StateDecl>,
    pub ops: Vec<Op>,
    /// Type of each value, indexed by `ValueId`.
    pub values: Vec<Type>,
    /// The op that defines each value, indexed by `ValueId`.
    pub defs: Vec<OpId>,
    /// Named results read by the host (`logits`).
    pub outputs: Vec<(String, ValueId)>,
}

impl Program {
    pub fn new() -> Program {
        Program::default()
    }

    pub fn add_state(&mut self, name: impl Into<String>, kind: StateKind, ty: Type) -> StateId {
        self.states.push(StateDecl {
            name: name.into(),
            kind,
            ty,
        });
        StateId::new(self.states.len() - 1)
    }

    pub fn state(&self, id: StateId) -> &StateDecl {
        &self.states[id.index()]
    }

    pub fn state_by_name(&self, name: &str) -> Option<StateId> {
        self.states
            .iter()
            .position(|s| s.name == name)
            .map(StateId::new)
    }

    /// The first state of a kind (the position and token states are unique).
    pub fn state_of_kind(&self, kind: StateKind) -> Option<StateId> {
        self.states
            .iter()
            .position(|s| s.kind == kind)
            .map(StateId::new)
    }

    pub fn ty(&self, v: ValueId) -> &Type {
        &self.values[v.index()]
    }

    pub fn op(&self, id: OpId) -> &Op {
        &self.ops[id.index()]
    }

    pub fn def(&self, v: ValueId) -> &Op {
        self.op(self.defs[v.index()])
    }

    pub fn op_ids(&self) -> impl Iterator<Item = OpId> + '_ {
        (0..self.ops.len()).map(OpId::new)
    }

    /// Appends an op after checking its operands; `declared` is the result type of a weight
    /// (the only ops whose type is not inferred) and is checked against inference otherwise.
    pub fn push(
        &mut self,
        kind: OpKind,
        args: Vec<ValueId>,
        declared: Option<Type>,
    ) -> Result<Option<ValueId>, VerifyError> {
        let op_id = OpId::new(self.ops.len());
        let err = |kind| VerifyError {
            op: op_id,
            text: String::new(),
            kind,
        };
        if let Some(&bad) = args.iter().find(|a| a.index() >= self.values.len()) {
            return Err(err(VerifyErrorKind::UndefinedValue(bad)));
        }
        let result_ty = infer(self, &kind, &args, declared.as_ref()).map_err(err)?;
        let result = result_ty.map(|ty| {
            self.values.push(ty);
            self.defs.push(op_id);
            ValueId::new(self.values.len() - 1)
        });
        self.ops.push(Op { kind, args, result });
        Ok(result)
    }

    /// Like [`Program::push`] for ops with a result; trace builders use it.
    pub fn value(&mut self, kind: OpKind, args: Vec<ValueId>) -> Result<ValueId, VerifyError> {
        let name = kind.name();
        self.push(kind, args, None)?.ok_or(VerifyError {
            op: OpId::new(self.ops.len()),
            text: name.to_string(),
            kind: VerifyErrorKind::NoResult,
        })
    }

    pub fn output(&self, name: &str) -> Option<ValueId> {
        self.outputs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| *v)
    }

    /// Bytes of all persistent state.
    pub fn state_bytes(&self) -> usize {
        self.states.iter().map(|s| s.ty.bytes()).sum()
    }
}
