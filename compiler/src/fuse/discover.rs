//! Repeated-subsequence discovery on the flat trace: the layers are found, never named.
//!
//! 1. **Blocks.** The trace is cut wherever exactly one activation is live across the cut (the
//!    residual stream); weights (constants) and the position (read once, used everywhere) do
//!    not count. A dense layer is two blocks (attention, MLP).
//! 2. **Signatures.** Each op gets a canonical signature with every name abstracted: weights by
//!    type, states by kind and type, operands by distance inside the block or, for inputs from
//!    outside, by type. Renaming or permuting tensor names changes nothing.
//! 3. **Units.** The smallest block count `u` whose window repeats back to back is the layer
//!    length; from the first repeat on, the blocks are chopped into units of `u` blocks and
//!    what is left is the tail. Units with equal signatures form one template.
//! 4. **Check.** Every instance is confirmed isomorphic to its template's first instance
//!    (`petgraph::algo::is_isomorphic_matching` on the op graphs, matching op signatures and
//!    operand positions), so a hash collision can never merge different code.

use crate::ir::{OpKind, Program, StateKind, ValueId};
use petgraph::graph::DiGraph;
use std::collections::hash_map::DefaultHasher;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Range;

/// A template (a kind of layer), written `T0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TemplateId(pub u32);

impl fmt::Display for TemplateId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "T{}", self.0)
    }
}

/// One occurrence of a template: a contiguous range of ops.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instance {
    pub template: TemplateId,
    pub ops: Range<usize>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    /// Ops per instance.
    pub len: usize,
    /// Indices into [`Segmentation::instances`].
    pub instances: Vec<usize>,
    /// A one-line sketch of the ops (kinds in order, views omitted).
    pub sketch: String,
}

/// The trace split into a head, template instances in order, and a tail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segmentation {
    pub head: Range<usize>,
    pub instances: Vec<Instance>,
    pub tail: Range<usize>,
    pub templates: Vec<Template>,
    /// Blocks per unit (0 when nothing repeats).
    pub unit_blocks: usize,
}

/// The canonical signature of op `i` inside a block starting at `start`.
fn op_signature(p: &Program, i: usize, start: usize) -> String {
    let op = &p.ops[i];
    let mut s = match &op.kind {
        // A norm weight folded away (`import::layout::ones`) is another op: the fused kernels
        // over it read none (`NW_ONES`), so it must not share a unit with a real one.
        OpKind::Weight { name } if crate::import::layout::ones_of(name).is_some() => {
            "weight ones".to_string()
        }
        OpKind::Weight { .. } => "weight".to_string(),
        OpKind::WeightStack { count, .. } => format!("weight_stack count={count}"),
        OpKind::ReadState { state } | OpKind::WriteState { state } | OpKind::KvWrite { state } => {
            let d = p.state(*state);
            format!("{} ${}:{}", op.kind.name(), d.kind.name(), d.ty)
        }
        _ => {
            // The op text without operands: its name and attributes.
            let text = p.op_text(crate::ir::OpId::new(i));
            let mut parts = text
                .split(' ')
                .filter(|t| !t.starts_with('%') && !t.starts_with('$'));
            let head = parts.next().unwrap_or_default().to_string();
            parts.fold(head, |acc, t| acc + " " + t)
        }
    };
    if let Some(r) = op.result {
        s += &format!(" -> {}", p.ty(r));
    }
    for a in &op.args {
        let def = p.defs[a.index()].index();
        if def >= start {
            s += &format!(" L{}", i - def);
        } else if is_position(p, *a) {
            s += " Xposition";
        } else {
            s += &format!(" X{}", p.ty(*a));
        }
    }
    s
}

fn is_position(p: &Program, v: ValueId) -> bool {
    matches!(p.def(v).kind, OpKind::ReadState { state } if p.state(state).kind == StateKind::Position)
}

fn is_constant(p: &Program, v: ValueId) -> bool {
    matches!(
        p.def(v).kind,
        OpKind::Weight { .. } | OpKind::WeightStack { .. }
    ) || is_position(p, v)
}

/// Cut points: op indices `i` such that exactly one non-constant value defined before `i` is
/// used at or after `i`, an f32 (the stream), returned with that value. A weight belongs to the
/// block that uses it, so there is no cut right after a weight.
pub fn cuts(p: &Program) -> Vec<(usize, ValueId)> {
    let n = p.ops.len();
    let mut last_use = vec![0usize; p.values.len()];
    for (i, op) in p.ops.iter().enumerate() {
        for a in &op.args {
            last_use[a.index()] = i;
        }
    }
    // Values become live at cut def+1 and stop being live at cut last_use+1.
    let mut born: Vec<Vec<ValueId>> = vec![vec![]; n + 1];
    let mut dies: Vec<Vec<ValueId>> = vec![vec![]; n + 1];
    for v in 0..p.values.len() {
        let id = ValueId::new(v);
        let def = p.defs[v].index();
        if is_constant(p, id) || last_use[v] <= def {
            continue;
        }
        born[def + 1].push(id);
        dies[last_use[v] + 1].push(id);
    }
    let mut live: std::collections::BTreeSet<ValueId> = Default::default();
    let mut out = vec![];
    for i in 1..n {
        live.extend(born[i].iter().copied());
        for d in &dies[i] {
            live.remove(d);
        }
        let after_weight = matches!(
            p.ops[i - 1].kind,
            OpKind::Weight { .. } | OpKind::WeightStack { .. }
        );
        if let (1, Some(&v)) = (live.len(), live.iter().next()) {
            if p.ty(v).dtype == crate::ir::DType::F32 && !after_weight {
                out.push((i, v));
            }
        }
    }
    out
}

fn hash_of<T: Hash>(t: &T) -> u64 {
    let mut h = DefaultHasher::new();
    t.hash(&mut h);
    h.finish()
}

/// The op graph of a range: nodes are canonical op signatures (without operand references),
/// edges run from a definition to each use, weighted by operand position.
fn op_graph(p: &Program, ops: Range<usize>) -> DiGraph<String, usize> {
    let mut g = DiGraph::new();
    let nodes: Vec<_> = ops
        .clone()
        .map(|i| {
            let sig = op_signature(p, i, ops.start);
            let core = sig
                .split(" L")
                .next()
                .unwrap_or_default()
                .split(" X")
                .next()
                .unwrap_or_default()
                .to_string();
            g.add_node(core)
        })
        .collect();
    for i in ops.clone() {
        for (pos, a) in p.ops[i].args.iter().enumerate() {
            let def = p.defs[a.index()].index();
            if ops.contains(&def) {
                g.add_edge(nodes[def - ops.start], nodes[i - ops.start], pos);
            }
        }
    }
    g
}

/// Finds the templates of `p`.
pub fn discover(p: &Program) -> Segmentation {
    let n = p.ops.len();
    let cut_list = cuts(p);
    let mut bounds = vec![0];
    bounds.extend(cut_list.iter().map(|(i, _)| *i));
    bounds.push(n);
    // The live value at each bound (none at the program's ends).
    let stream_at = |op: usize| {
        cut_list
            .iter()
            .find(|(i, _)| *i == op)
            .map(|(_, v)| p.ty(*v).clone())
    };
    // A layer is a residual update: its output is an `add`.
    let residual_at = |op: usize| {
        cut_list
            .iter()
            .any(|(i, v)| *i == op && matches!(p.def(*v).kind, OpKind::Add))
    };
    let blocks: Vec<Range<usize>> = bounds.windows(2).map(|w| w[0]..w[1]).collect();
    let block_sig: Vec<u64> = blocks
        .iter()
        .map(|b| {
            hash_of(
                &b.clone()
                    .map(|i| op_signature(p, i, b.start))
                    .collect::<Vec<_>>(),
            )
        })
        .collect();

    // The smallest unit length (in blocks) that repeats back to back, and where it first does.
    let nb = blocks.len();
    let found = (1..=nb / 2).find_map(|u| {
        (0..=nb - 2 * u)
            .find(|&b| block_sig[b..b + u] == block_sig[b + u..b + 2 * u])
            .map(|b| (u, b))
    });
    let Some((u, first)) = found else {
        return Segmentation {
            head: 0..n,
            instances: vec![],
            tail: n..n,
            templates: vec![],
            unit_blocks: 0,
        };
    };
    // Units run from the first repeat while each maps the residual stream to itself: a unit
    // must start and end at a cut whose live value has the stream's type, and end with a
    // residual `add`. The tail (a norm, then logits) cannot pass for a layer.
    let stream = stream_at(blocks[first].start);
    let mut count = 0;
    while first + (count + 1) * u <= nb {
        let (start, end) = (
            blocks[first + count * u].start,
            blocks[first + (count + 1) * u - 1].end,
        );
        if stream.is_none()
            || stream_at(start) != stream
            || stream_at(end) != stream
            || !residual_at(end)
        {
            break;
        }
        count += 1;
    }
    let mut templates: Vec<Template> = vec![];
    let mut keys: Vec<u64> = vec![];
    let mut instances = vec![];
    for k in 0..count {
        let bs = first + k * u;
        let ops = blocks[bs].start..blocks[bs + u - 1].end;
        let key = hash_of(&block_sig[bs..bs + u].to_vec());
        let t = match keys.iter().position(|&x| x == key) {
            Some(t)
                if {
                    let rep = &instances[templates[t].instances[0]];
                    let (a, b) = (op_graph(p, ops.clone()), op_graph(p, Instance::ops(rep)));
                    petgraph::algo::is_isomorphic_matching(&a, &b, |x, y| x == y, |x, y| x == y)
                } =>
            {
                t
            }
            _ => {
                keys.push(key);
                let sketch = ops
                    .clone()
                    .map(|i| p.ops[i].kind.name())
                    .filter(|k| {
                        !matches!(
                            *k,
                            "weight" | "weight_stack" | "reshape" | "slice" | "read_state"
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(" ");
                templates.push(Template {
                    len: ops.len(),
                    instances: vec![],
                    sketch,
                });
                templates.len() - 1
            }
        };
        templates[t].instances.push(instances.len());
        instances.push(Instance {
            template: TemplateId(t as u32),
            ops,
        });
    }
    let head = 0..blocks[first].start;
    let tail = instances.last().map_or(n, |i: &Instance| i.ops.end)..n;
    Segmentation {
        head,
        instances,
        tail,
        templates,
        unit_blocks: u,
    }
}

impl Instance {
    fn ops(i: &Instance) -> Range<usize> {
        i.ops.clone()
    }
}

impl fmt::Display for Segmentation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "head: ops {:?} ({} ops)", self.head, self.head.len())?;
        for (t, tpl) in self.templates.iter().enumerate() {
            let at: Vec<String> = tpl
                .instances
                .iter()
                .map(|&i| format!("{:?}", self.instances[i].ops))
                .collect();
            writeln!(
                f,
                "{}: {} ops x {} instances, {} blocks each, at {}",
                TemplateId(t as u32),
                tpl.len,
                tpl.instances.len(),
                self.unit_blocks,
                at.join(" ")
            )?;
            writeln!(f, "    {}", tpl.sketch)?;
        }
        let order: Vec<String> = self
            .instances
            .iter()
            .map(|i| i.template.to_string())
            .collect();
        writeln!(f, "order: {}", order.join(" "))?;
        writeln!(f, "tail: ops {:?} ({} ops)", self.tail, self.tail.len())
    }
}
