//! Family (b): horizontal merges. Matvecs that read the same (normalised) input become one
//! kernel over their weights packed side by side at compile time (q/k/v; gate/up; the
//! linear-attention input projections; the router with the shared expert's projections). The
//! packed kernel's output is stacked, each part at an aligned offset, so every original result
//! is a view (`rows`) of it. Parts of equal height can instead be zipped row by row, which
//! lets one epilogue combine them (SwiGLU).

use super::{leaf_class, leaves_of, var, Rule};
use crate::fuse::lang::{FuseAnalysis, FuseGraph, FuseLang, MAX_PARTS, MAX_ZIPPED};
use egg::{Applier, Id, MultiPattern, Pattern, PatternAst, Rewrite, Subst, Symbol, Var};

/// The rules of this family.
pub fn rules() -> Vec<Rule> {
    let merge: MultiPattern<FuseLang> = "?a = (mvk acc ?p ?x ?n nil), ?b = (mvk acc ?w ?x ?n nil)"
        .parse()
        .expect("a valid multipattern");
    let zip: Pattern<FuseLang> = "(rows ?w (mvk acc ?p ?x ?n nil))"
        .parse()
        .expect("a valid pattern");
    vec![
        // matvec(P, x), matvec(W, x) == rows(P, mvk(wcat(P, W), x)), rows(W, mvk(wcat(P, W), x)):
        // two kernels reading the same input and prologue become one over the packed weights
        Rewrite::new("merge-matvecs", merge, MergeMatvecs::new()).expect("valid rule"),
        // rows(Wk, mvk(acc, wcat(W0..Wn), x)) == mvk(accK, wcat(W0..Wn), x) when all parts have
        // the same height: part K's rows, computed with the other parts' rows zipped alongside
        Rewrite::new("zip-parts", zip, ZipParts::new()).expect("valid rule"),
    ]
}

/// The applier of `merge-matvecs`: appends weight leaf `?w` to the packed weights `?p`.
pub struct MergeMatvecs {
    a: Var,
    b: Var,
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
        let (x, n) = (s[self.x], s[self.n]);
        let cat = g.add(FuseLang::WCat([p, w]));
        let acc = g.add(FuseLang::Acc);
        let nil = g.add(FuseLang::Nil);
        let k = g.add(FuseLang::Mvk([acc, cat, x, n, nil]));
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
