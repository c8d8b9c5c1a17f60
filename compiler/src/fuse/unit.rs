//! A unit of fusion: a contiguous range of ops (the head, the first instance of a template, or
//! the tail) turned into an e-graph whose leaves are named relative to the unit, so the result
//! of rewriting it applies to every instance of the template by op offset.
//!
//! Leaf names: `vN` is the value of unit op N (a weight, stacked weights or a state read),
//! `xN.A` an external value first used as argument A of unit op N, `sN` the state that unit
//! op N writes. In another instance, op N of that instance gives the same leaf's value.

use super::lang::{Attr, FuseAnalysis, FuseGraph, FuseLang, LeafInfo, LeafKind};
use crate::ir::{OpKind, Program, StateId, ValueId};
use egg::{Id, Symbol};
use std::collections::HashMap;
use std::ops::Range;

/// What a leaf refers to, relative to the unit's first op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LeafRef {
    /// The value defined by unit op `offset` (weight, weight_stack, read_state).
    Def { offset: usize },
    /// The external value passed as argument `arg` of unit op `offset`.
    Arg { offset: usize, arg: usize },
    /// The state that unit op `offset` writes (kv_write, write_state).
    StateOf { offset: usize },
}

impl LeafRef {
    /// The IR value this leaf is in the instance starting at op `start` (None for states).
    pub fn value(self, p: &Program, start: usize) -> Option<ValueId> {
        match self {
            LeafRef::Def { offset } => p.ops[start + offset].result,
            LeafRef::Arg { offset, arg } => Some(p.ops[start + offset].args[arg]),
            LeafRef::StateOf { .. } => None,
        }
    }

    /// The persistent state this leaf is, or aliases, in the instance starting at `start`.
    pub fn state(self, p: &Program, start: usize) -> Option<StateId> {
        let def_state = |v: ValueId| match p.def(v).kind {
            OpKind::ReadState { state } => Some(state),
            _ => None,
        };
        match self {
            LeafRef::StateOf { offset } => p.ops[start + offset].kind.state(),
            _ => self.value(p, start).and_then(def_state),
        }
    }
}

/// A class the unit must produce: a value used after the unit, or an effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Root {
    /// The value of unit op `offset`, read after the unit (or a program output).
    Value { offset: usize, class: Id },
    /// The effect of unit op `offset` (a state write).
    Effect { offset: usize, class: Id },
}

impl Root {
    pub fn class(&self) -> Id {
        match self {
            Root::Value { class, .. } | Root::Effect { class, .. } => *class,
        }
    }
    pub fn offset(&self) -> usize {
        match self {
            Root::Value { offset, .. } | Root::Effect { offset, .. } => *offset,
        }
    }
}

/// A unit's e-graph before and after saturation.
pub struct Unit {
    /// The ops of the representative instance.
    pub ops: Range<usize>,
    pub egraph: FuseGraph,
    /// The class of each op (None for ops that are leaves).
    pub op_class: Vec<Option<Id>>,
    /// The node each op was added as (children as they were then).
    pub op_node: Vec<Option<FuseLang>>,
    pub leaves: HashMap<Symbol, LeafRef>,
    pub roots: Vec<Root>,
}

fn attr(g: &mut FuseGraph, a: Attr) -> Id {
    g.add(FuseLang::Attr(a))
}

impl Unit {
    /// Builds the e-graph of ops `ops` of `p` (not yet rewritten).
    pub fn build(p: &Program, ops: Range<usize>) -> Unit {
        let start = ops.start;
        let mut g = FuseGraph::new(FuseAnalysis::default());
        let mut op_class: Vec<Option<Id>> = vec![None; ops.len()];
        let mut op_node: Vec<Option<FuseLang>> = vec![None; ops.len()];
        let mut leaves: HashMap<Symbol, LeafRef> = HashMap::new();
        let mut external: HashMap<ValueId, Id> = HashMap::new();
        let mut states: HashMap<StateId, Id> = HashMap::new();
        let mut class_of_value: HashMap<ValueId, Id> = HashMap::new();

        fn leaf(
            g: &mut FuseGraph,
            leaves: &mut HashMap<Symbol, LeafRef>,
            name: String,
            r: LeafRef,
            info: LeafInfo,
        ) -> Id {
            let s = Symbol::from(name);
            leaves.insert(s, r);
            g.analysis.leaves.insert(s, info);
            g.add(FuseLang::Leaf(s))
        }

        for i in ops.clone() {
            let o = i - start;
            let op = &p.ops[i];
            // Operands: classes of unit values, leaves for external ones.
            let mut args: Vec<Id> = Vec::with_capacity(op.args.len());
            for (a, v) in op.args.iter().enumerate() {
                if let Some(&c) = class_of_value.get(v) {
                    args.push(c);
                    continue;
                }
                let c = match external.get(v) {
                    Some(&c) => c,
                    None => {
                        let kind = match p.def(*v).kind {
                            OpKind::Weight { .. } => LeafKind::Weight,
                            OpKind::WeightStack { .. } => LeafKind::WeightStack,
                            OpKind::ReadState { .. } => LeafKind::StateValue,
                            _ => LeafKind::Value,
                        };
                        let state = match p.def(*v).kind {
                            OpKind::ReadState { state } => Some(state.index()),
                            _ => None,
                        };
                        let info = LeafInfo {
                            ty: p.ty(*v).clone(),
                            kind,
                            order: o,
                            state,
                        };
                        let c = leaf(
                            &mut g,
                            &mut leaves,
                            format!("x{o}.{a}"),
                            LeafRef::Arg { offset: o, arg: a },
                            info,
                        );
                        external.insert(*v, c);
                        c
                    }
                };
                args.push(c);
            }
            let mut state_leaf = |g: &mut FuseGraph, leaves: &mut HashMap<Symbol, LeafRef>, s| {
                *states.entry(s).or_insert_with(|| {
                    let info = LeafInfo {
                        ty: p.state(s).ty.clone(),
                        kind: LeafKind::State,
                        order: o,
                        state: Some(s.index()),
                    };
                    leaf(
                        g,
                        leaves,
                        format!("s{o}"),
                        LeafRef::StateOf { offset: o },
                        info,
                    )
                })
            };
            use FuseLang as L;
            let result_ty = op.result.map(|r| p.ty(r).clone());
            let node = match &op.kind {
                OpKind::Weight { .. } | OpKind::WeightStack { .. } | OpKind::ReadState { .. } => {
                    let kind = match op.kind {
                        OpKind::Weight { .. } => LeafKind::Weight,
                        OpKind::WeightStack { .. } => LeafKind::WeightStack,
                        _ => LeafKind::StateValue,
                    };
                    let info = LeafInfo {
                        ty: result_ty.clone().expect("sources have a result"),
                        kind,
                        order: o,
                        state: op.kind.state().map(|s| s.index()),
                    };
                    let c = leaf(
                        &mut g,
                        &mut leaves,
                        format!("v{o}"),
                        LeafRef::Def { offset: o },
                        info,
                    );
                    if let Some(r) = op.result {
                        class_of_value.insert(r, c);
                    }
                    continue;
                }
                OpKind::Matvec => L::Matvec([args[0], args[1]]),
                OpKind::RmsNorm { eps, zero_centered } => {
                    let a = attr(
                        &mut g,
                        Attr::Norm {
                            eps: *eps,
                            zero_centered: *zero_centered,
                        },
                    );
                    L::RmsNorm([args[0], args[1], a])
                }
                OpKind::Add => L::Add([args[0], args[1]]),
                OpKind::Mul => L::Mul([args[0], args[1]]),
                OpKind::Div => L::Div([args[0], args[1]]),
                OpKind::Silu => L::Silu([args[0]]),
                OpKind::Sigmoid => L::Sigmoid([args[0]]),
                OpKind::Exp => L::Exp([args[0]]),
                OpKind::Neg => L::Neg([args[0]]),
                OpKind::Softplus => L::Softplus([args[0]]),
                OpKind::DeltaRuleUpdate => {
                    L::DeltaRuleUpdate([args[0], args[1], args[2], args[3], args[4]])
                }
                OpKind::Reshape { shape } => {
                    let a = attr(&mut g, Attr::Shape(shape.clone()));
                    L::Reshape([args[0], a])
                }
                OpKind::Rope { theta, rotary_dim } => {
                    let a = attr(
                        &mut g,
                        Attr::Rope {
                            theta: *theta,
                            rotary_dim: *rotary_dim,
                        },
                    );
                    L::Rope([args[0], args[1], a])
                }
                OpKind::KvWrite { state } => {
                    let s = state_leaf(&mut g, &mut leaves, *state);
                    L::KvWrite([s, args[0], args[1]])
                }
                OpKind::Attention { scale } => {
                    let a = attr(&mut g, Attr::Scale(*scale));
                    L::Attention([args[0], args[1], args[2], args[3], a])
                }
                OpKind::Argmax => L::Argmax([args[0]]),
                OpKind::Increment => L::Increment([args[0]]),
                OpKind::WriteState { state } => {
                    let s = state_leaf(&mut g, &mut leaves, *state);
                    L::WriteState([s, args[0]])
                }
                kind => {
                    let sym = Symbol::from(format!("{}#{o}", kind.name()));
                    if let Some(t) = &result_ty {
                        g.analysis.others.insert(sym, t.clone());
                    }
                    g.analysis.other_ops.insert(sym, kind.clone());
                    L::Other(sym, args)
                }
            };
            let c = g.add(node.clone());
            op_class[o] = Some(c);
            op_node[o] = Some(node);
            if let Some(r) = op.result {
                class_of_value.insert(r, c);
            }
        }
        g.rebuild();

        // Roots: values read after the unit (or program outputs), and effects.
        let mut used_after = vec![false; p.values.len()];
        let mut used_inside = vec![false; p.values.len()];
        for (i, op) in p.ops.iter().enumerate() {
            for a in &op.args {
                if i >= ops.end {
                    used_after[a.index()] = true;
                } else if i >= ops.start {
                    used_inside[a.index()] = true;
                }
            }
        }
        for (_, v) in &p.outputs {
            used_after[v.index()] = true;
        }
        let mut roots = vec![];
        for i in ops.clone() {
            let o = i - start;
            let op = &p.ops[i];
            let Some(class) = op_class[o] else { continue };
            match (&op.kind, op.result) {
                (OpKind::WriteState { .. }, _) => roots.push(Root::Effect { offset: o, class }),
                (_, Some(r)) if used_after[r.index()] => {
                    roots.push(Root::Value { offset: o, class })
                }
                (OpKind::KvWrite { .. }, Some(r)) if !used_inside[r.index()] => {
                    roots.push(Root::Effect { offset: o, class })
                }
                _ => {}
            }
        }
        Unit {
            ops,
            egraph: g,
            op_class,
            op_node,
            leaves,
            roots,
        }
    }
}
