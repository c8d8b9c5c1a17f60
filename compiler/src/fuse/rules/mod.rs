//! The fusion rules, one file per family. Every rule is named in kebab-case and states its
//! identity in a comment above it; conditions refuse what a kernel cannot compute (and say why,
//! for `--explain`). No rule rewrites to a costlier form: each one replaces dispatches by fewer
//! (see `docs/rules.md`), and extraction keeps the original wherever the fused form is not
//! cheaper.

pub mod attention;
pub mod chain;
pub mod elementwise;
pub mod epilogue;
pub mod experts;
pub mod horizontal;
pub mod linear_attention;
pub mod norm_matvec;
pub mod route;
pub mod state;
pub mod tail;

use super::lang::{FuseAnalysis, FuseGraph, FuseLang};
use egg::{Id, Rewrite, Symbol};

pub type Rule = Rewrite<FuseLang, FuseAnalysis>;

/// Every rule, family by family (expert kernels routing for themselves as by default:
/// [`experts::own_routing_max`]).
pub fn rules() -> Vec<Rule> {
    rules_routing_own(experts::own_routing_max(None))
}

/// Every rule, the expert kernels routing for themselves among at most `own_max` experts.
pub fn rules_routing_own(own_max: usize) -> Vec<Rule> {
    let mut r = norm_matvec::rules();
    r.extend(horizontal::rules());
    r.extend(epilogue::rules());
    r.extend(attention::rules());
    r.extend(tail::rules());
    r.extend(elementwise::rules());
    r.extend(state::rules());
    r.extend(linear_attention::rules());
    r.extend(route::rules());
    r.extend(experts::rules(own_max));
    r.extend(chain::rules());
    r
}

/// The weight leaves of a (packed) weight class, when it is one.
/// The pattern variable `name` (`"?x"`), for appliers reading their substitution.
pub(crate) fn var(name: &str) -> egg::Var {
    name.parse().expect("a pattern variable")
}

pub(crate) fn leaves_of(g: &FuseGraph, w: Id) -> Option<Vec<Symbol>> {
    g[w].data.weights.clone()
}

/// The `Other` node of IR op kind `name` in class `c`: its op (with attributes) and arguments.
pub(crate) fn other(g: &FuseGraph, c: Id, name: &str) -> Option<(crate::ir::OpKind, Vec<Id>)> {
    g[c].nodes.iter().find_map(|n| match n {
        FuseLang::Other(sym, args) => {
            let op = g.analysis.other_ops.get(sym)?;
            (op.name() == name).then(|| (op.clone(), args.clone()))
        }
        _ => None,
    })
}

/// `c` as `slice(x, axis, start, end)`: (x, start, end).
pub(crate) fn slice(g: &FuseGraph, c: Id, axis: usize) -> Option<(Id, usize, usize)> {
    match other(g, c, "slice")? {
        (
            crate::ir::OpKind::Slice {
                axis: a,
                start,
                end,
            },
            args,
        ) if a == axis => Some((g.find(args[0]), start, end)),
        _ => None,
    }
}

/// The dims of tensor class `c`, where its type is known.
pub(crate) fn dims(g: &FuseGraph, c: Id) -> Option<Vec<usize>> {
    g[c].data.ty.as_ref().map(|t| t.shape.dims().to_vec())
}

/// The class of leaf `s`.
pub(crate) fn leaf_class(g: &FuseGraph, s: Symbol) -> Option<Id> {
    g.lookup(FuseLang::Leaf(s))
}

/// The items of an extras list class (`cons` ... `nil`), or None when it is not one.
pub(crate) fn list_items(g: &FuseGraph, mut l: Id) -> Option<Vec<Id>> {
    let mut items = vec![];
    loop {
        let class = &g[l];
        if class.nodes.iter().any(|n| matches!(n, FuseLang::Nil)) {
            return Some(items);
        }
        let (head, rest) = class.nodes.iter().find_map(|n| match n {
            FuseLang::Cons([a, b]) => Some((*a, *b)),
            _ => None,
        })?;
        items.push(head);
        l = rest;
        if items.len() > 64 {
            return None;
        }
    }
}

/// Whether a value of type `r` can be the next extra input of a kernel of output type
/// `kernel` whose epilogue then gives class `class` (of type `out`): no broadcast, and `r` a
/// row of the output's length or a scalar; else a refusal by `rule`.
pub(crate) fn fits_as_extra(
    g: &FuseGraph,
    rule: &'static str,
    class: Id,
    [kernel, r, out]: [&crate::ir::Type; 3],
) -> bool {
    if kernel.shape != out.shape {
        g.analysis.refuse(
            rule,
            format!(
                "the kernel's output {} would broadcast to {}",
                kernel.shape, out.shape
            ),
            vec![class],
        );
        return false;
    }
    if r.shape.numel() != kernel.shape.numel() && r.shape.numel() != 1 {
        g.analysis.refuse(
            rule,
            format!("the extra input {} is neither a row nor a scalar", r.shape),
            vec![class],
        );
        return false;
    }
    true
}

/// Extras list `list` with `r` appended, and the `inK` leaf that reads it; None (a refusal by
/// `rule` of `class`) when the kernel already reads as many extra inputs as it may.
pub(crate) fn append_extra(
    g: &mut FuseGraph,
    list: Id,
    r: Id,
    rule: &'static str,
    class: Id,
) -> Option<(Id, Id)> {
    let mut items = list_items(g, list)?;
    if items.len() >= super::lang::MAX_EXTRAS {
        g.analysis.refuse(
            rule,
            format!(
                "a kernel reads at most {} extra inputs",
                super::lang::MAX_EXTRAS
            ),
            vec![class],
        );
        return None;
    }
    let k = g.add(FuseLang::extra(items.len()));
    items.push(r);
    Some((k, make_list(g, &items)))
}

/// Builds an extras list class from its items.
pub(crate) fn make_list(g: &mut FuseGraph, items: &[Id]) -> Id {
    let mut l = g.add(FuseLang::Nil);
    for &a in items.iter().rev() {
        l = g.add(FuseLang::Cons([a, l]));
    }
    l
}
