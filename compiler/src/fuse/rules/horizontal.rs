//! Family (b): horizontal merges. Matvecs that read the same (normalised) input become one
//! kernel over their weights packed side by side at compile time (q/k/v; gate/up; the
//! linear-attention input projections; the router with the shared expert's projections). The
//! packed kernel's output is stacked, each part at an aligned offset, so every original result
//! is a view (`rows`) of it. Each part keeps its own epilogue (`e.parts`, selected by row), so a
//! matvec whose result only passes through a sigmoid (the shared expert's gate) merges with one
//! that has none (the router). Parts of equal height can instead be zipped row by row, which
//! lets one epilogue combine them (SwiGLU).

use super::{leaf_class, leaves_of, var, Rule};
use crate::fuse::lang::{FuseAnalysis, FuseGraph, FuseLang, MAX_PARTS, MAX_ZIPPED};
use egg::{Applier, Id, MultiPattern, Pattern, PatternAst, Rewrite, Subst, Symbol, Var};

/// The rules of this family.
pub fn rules() -> Vec<Rule> {
    let merge: MultiPattern<FuseLang> = "?a = (mvk ?ea ?p ?x ?n nil), ?b = (mvk ?eb ?w ?x ?n nil)"
        .parse()
        .expect("a valid multipattern");
    let zip: Pattern<FuseLang> = "(rows ?w (mvk acc ?p ?x ?n nil))"
        .parse()
        .expect("a valid pattern");
    vec![
        // mvk(ea, P, x), mvk(eb, W, x) == rows(P, mvk(parts(ea, eb), wcat(P, W), x)),
        // rows(W, mvk(parts(ea, eb), wcat(P, W), x)): two kernels reading the same input and
        // prologue become one over the packed weights, each part's rows under its own epilogue
        // (plain matvecs: ea = eb = acc, the epilogue stays `acc`)
        Rewrite::new("merge-matvecs", merge, MergeMatvecs::new()).expect("valid rule"),
        // rows(Wk, mvk(acc, wcat(W0..Wn), x)) == mvk(accK, wcat(W0..Wn), x) when all parts have
        // the same height: part K's rows, computed with the other parts' rows zipped alongside
        Rewrite::new("zip-parts", zip, ZipParts::new()).expect("valid rule"),
    ]
}

/// The applier of `merge-matvecs`: appends weight leaf `?w` to the packed weights `?p`, and
/// epilogue `?eb` to `?ea`'s parts.
pub struct MergeMatvecs {
    a: Var,
    b: Var,
    ea: Var,
    eb: Var,
    p: Var,
    w: Var,
    x: Var,
    n: Var,
}

impl MergeMatvecs {
    fn new() -> Self {
        MergeMatvecs {
            a: var("?a"),
            b: var("?b"),
            ea: var("?ea"),
            eb: var("?eb"),
            p: var("?p"),
            w: var("?w"),
            x: var("?x"),
            n: var("?n"),
        }
    }
}

impl Applier<FuseLang, FuseAnalysis> for MergeMatvecs {
    fn apply_one(
        &self,
        g: &mut FuseGraph,
        _: Id,
        s: &Subst,
        _: Option<&PatternAst<FuseLang>>,
        _: Symbol,
    ) -> Vec<Id> {
        const RULE: &str = "merge-matvecs";
        let (a, b, p, w) = (s[self.a], s[self.b], s[self.p], s[self.w]);
        let (Some(packed), Some(single)) = (leaves_of(g, p), leaves_of(g, w)) else {
            return vec![];
        };
        // Only append one weight at a time, in trace order: one packing per ordered subset.
        let [leaf] = single.as_slice() else {
            return vec![];
        };
        let order = |sym: &Symbol| g.analysis.leaves.get(sym).map_or(0, |l| l.order);
        if g.find(a) == g.find(b)
            || packed.contains(leaf)
            || packed.iter().any(|q| order(q) >= order(leaf))
        {
            return vec![];
        }
        let (Some(tp), Some(tw)) = (g[p].data.ty.clone(), g[w].data.ty.clone()) else {
            return vec![];
        };
        if tp.dtype != tw.dtype {
            g.analysis.refuse(
                RULE,
                format!(
                    "weights of different dtypes ({} and {})",
                    tp.dtype, tw.dtype
                ),
                vec![a, b],
            );
            return vec![];
        }
        if tp.shape.dims()[1] != tw.shape.dims()[1] {
            g.analysis.refuse(RULE, "input widths differ", vec![a, b]);
            return vec![];
        }
        if packed.len() >= MAX_PARTS {
            g.analysis.refuse(
                RULE,
                format!("a kernel packs at most {MAX_PARTS} weights"),
                vec![a, b],
            );
            return vec![];
        }
        let Some(epi) = per_part_epilogue(g, s[self.ea], packed.len(), s[self.eb]) else {
            return vec![];
        };
        let (x, n) = (s[self.x], s[self.n]);
        let cat = g.add(FuseLang::WCat([p, w]));
        let nil = g.add(FuseLang::Nil);
        let k = g.add(FuseLang::Mvk([epi, cat, x, n, nil]));
        let mut changed = vec![];
        // Every earlier part stays available as rows of the bigger kernel.
        if packed.len() == 1 {
            let r = g.add(FuseLang::Rows([p, k]));
            if g.union(a, r) {
                changed.push(a);
            }
        } else {
            for q in &packed {
                let Some(qc) = leaf_class(g, *q) else {
                    continue;
                };
                let old = g.add(FuseLang::Rows([qc, a]));
                let new = g.add(FuseLang::Rows([qc, k]));
                if g.union(old, new) {
                    changed.push(old);
                }
            }
        }
        let r = g.add(FuseLang::Rows([w, k]));
        if g.union(b, r) {
            changed.push(b);
        }
        changed
    }
}

/// The epilogue of `parts` packed parts under `ea` (one expression for all, or `e.parts`) and
/// one more under `eb`: the same expression when all parts agree, else `e.parts`. None when
/// either reads anything but the row's stacked dot (zipped parts are a different kernel, and
/// extra inputs index the rows of the whole output).
fn per_part_epilogue(g: &mut FuseGraph, ea: Id, parts: usize, eb: Id) -> Option<Id> {
    let stacked_only = |e: Id| {
        g[e].data
            .epi
            .is_some_and(|u| u.stacked && u.zipped == 0 && u.extras == 0)
    };
    if !stacked_only(ea) || !stacked_only(eb) {
        return None;
    }
    let (ea, eb) = (g.find(ea), g.find(eb));
    let mut items = g[ea]
        .nodes
        .iter()
        .find_map(|node| match node {
            FuseLang::EParts(items) => Some(items.to_vec()),
            _ => None,
        })
        .unwrap_or_else(|| vec![ea; parts]);
    if items.len() != parts {
        return None;
    }
    items.push(eb);
    if items.iter().all(|&e| g.find(e) == g.find(items[0])) {
        return Some(items[0]);
    }
    Some(g.add(FuseLang::EParts(items.into())))
}

/// The applier of `zip-parts`.
pub struct ZipParts {
    w: Var,
    p: Var,
    x: Var,
    n: Var,
}

impl ZipParts {
    fn new() -> Self {
        ZipParts {
            w: var("?w"),
            p: var("?p"),
            x: var("?x"),
            n: var("?n"),
        }
    }
}

impl Applier<FuseLang, FuseAnalysis> for ZipParts {
    fn apply_one(
        &self,
        g: &mut FuseGraph,
        eclass: Id,
        s: &Subst,
        _: Option<&PatternAst<FuseLang>>,
        _: Symbol,
    ) -> Vec<Id> {
        const RULE: &str = "zip-parts";
        let (w, p) = (s[self.w], s[self.p]);
        let (Some(parts), Some(single)) = (leaves_of(g, p), leaves_of(g, w)) else {
            return vec![];
        };
        let ([leaf], true) = (single.as_slice(), parts.len() > 1) else {
            return vec![];
        };
        let Some(k) = parts.iter().position(|q| q == leaf) else {
            return vec![];
        };
        let height = |sym: &Symbol| g.analysis.leaves.get(sym).map(|l| l.ty.shape.dims()[0]);
        if parts.iter().any(|q| height(q) != height(leaf)) {
            g.analysis
                .refuse(RULE, "the packed parts differ in height", vec![eclass]);
            return vec![];
        }
        if parts.len() > MAX_ZIPPED {
            g.analysis.refuse(
                RULE,
                format!("a kernel zips at most {MAX_ZIPPED} parts"),
                vec![eclass],
            );
            return vec![];
        }
        let (x, n) = (s[self.x], s[self.n]);
        let acc = g.add(FuseLang::acc_part(k));
        let nil = g.add(FuseLang::Nil);
        let zipped = g.add(FuseLang::Mvk([acc, p, x, n, nil]));
        if g.union(eclass, zipped) {
            vec![eclass]
        } else {
            vec![]
        }
    }
}
