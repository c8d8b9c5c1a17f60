//! Family (c): elementwise epilogues folded into the matvec kernel: residual adds, SwiGLU
//! (`silu(gate)·up` over zipped parts), sigmoid gates. The epilogue is an expression over the
//! row's accumulators and its extra inputs; codegen turns it into GLSL.

use super::{append_extra, fits_as_extra, Rule};
use crate::fuse::lang::{FuseAnalysis, FuseGraph, FuseLang};
use egg::{rewrite, Applier, Id, Pattern, PatternAst, Rewrite, Subst, Symbol, Var};

/// The rules of this family.
pub fn rules() -> Vec<Rule> {
    let fold = |name: &'static str, pat: &str, op: Op, kernel_left: bool| {
        let p: Pattern<FuseLang> = pat.parse().expect("a valid pattern");
        Rewrite::new(name, p, FoldExtra::new(name, op, kernel_left)).expect("valid rule")
    };
    vec![
        // silu(mvk(e, ..)) == mvk(silu(e), ..)
        rewrite!("fold-silu"; "(silu (mvk ?e ?w ?x ?n ?i))" => "(mvk (e.silu ?e) ?w ?x ?n ?i)"),
        // sigmoid(mvk(e, ..)) == mvk(sigmoid(e), ..)
        rewrite!("fold-sigmoid";
            "(sigmoid (mvk ?e ?w ?x ?n ?i))" => "(mvk (e.sigmoid ?e) ?w ?x ?n ?i)"),
        // add(r, mvk(e, .., [i..])) == mvk(add(inK, e), .., [i.., r]): r (a residual, a bias)
        // becomes the kernel's extra input K, read at the row
        fold(
            "fold-add-extra",
            "(add ?r (mvk ?e ?w ?x ?n ?i))",
            Op::Add,
            false,
        ),
        // add(mvk(e, .., [i..]), r) == mvk(add(e, inK), .., [i.., r])
        fold(
            "fold-add-extra-left",
            "(add (mvk ?e ?w ?x ?n ?i) ?r)",
            Op::Add,
            true,
        ),
        // mul(r, mvk(e, .., [i..])) == mvk(mul(inK, e), .., [i.., r]): a gate r applied in place
        fold(
            "fold-mul-extra",
            "(mul ?r (mvk ?e ?w ?x ?n ?i))",
            Op::Mul,
            false,
        ),
        // mul(mvk(e, .., [i..]), r) == mvk(mul(e, inK), .., [i.., r])
        fold(
            "fold-mul-extra-left",
            "(mul (mvk ?e ?w ?x ?n ?i) ?r)",
            Op::Mul,
            true,
        ),
        // mul(mvk(e1, w, x), mvk(e2, w, x)) == mvk(mul(e1, e2), w, x): one kernel computes both
        // (with zipped parts: silu(acc0)·acc1 is SwiGLU)
        rewrite!("combine-mul";
            "(mul (mvk ?e1 ?w ?x ?n ?i) (mvk ?e2 ?w ?x ?n ?i))" => "(mvk (e.mul ?e1 ?e2) ?w ?x ?n ?i)"
            if same_row_space("combine-mul")),
        // add(mvk(e1, w, x), mvk(e2, w, x)) == mvk(add(e1, e2), w, x)
        rewrite!("combine-add";
            "(add (mvk ?e1 ?w ?x ?n ?i) (mvk ?e2 ?w ?x ?n ?i))" => "(mvk (e.add ?e1 ?e2) ?w ?x ?n ?i)"
            if same_row_space("combine-add")),
    ]
}

/// Both epilogues index the same rows: both stacked, or both over zipped parts.
fn same_row_space(rule: &'static str) -> impl Fn(&mut FuseGraph, Id, &Subst) -> bool {
    let (e1, e2): (Var, Var) = ("?e1".parse().unwrap(), "?e2".parse().unwrap());
    move |g, id, s| {
        let (a, b) = (g[s[e1]].data.epi, g[s[e2]].data.epi);
        let (Some(a), Some(b)) = (a, b) else {
            return false;
        };
        let ok =
            (a.stacked || a.zipped > 0) && (b.stacked || b.zipped > 0) && (a.stacked == b.stacked);
        if !ok {
            g.analysis.refuse(
                rule,
                "one side reads stacked rows and the other zipped parts",
                vec![id],
            );
        }
        ok
    }
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Add,
    Mul,
}

/// The applier of the `fold-*-extra` rules.
pub struct FoldExtra {
    name: &'static str,
    op: Op,
    kernel_left: bool,
    vars: [Var; 6],
}

impl FoldExtra {
    fn new(name: &'static str, op: Op, kernel_left: bool) -> Self {
        let v = |s: &str| s.parse().expect("a variable");
        FoldExtra {
            name,
            op,
            kernel_left,
            vars: [v("?r"), v("?e"), v("?w"), v("?x"), v("?n"), v("?i")],
        }
    }
}

impl Applier<FuseLang, FuseAnalysis> for FoldExtra {
    fn apply_one(
        &self,
        g: &mut FuseGraph,
        eclass: Id,
        s: &Subst,
        _: Option<&PatternAst<FuseLang>>,
        _: Symbol,
    ) -> Vec<Id> {
        let [r, e, w, x, n, i] = self.vars.map(|v| s[v]);
        let (Some(tr), Some(tout)) = (g[r].data.ty.clone(), g[eclass].data.ty.clone()) else {
            return vec![];
        };
        // The kernel's output: the class of the matched mvk has the same type as the node.
        let kernel_ty = {
            let node = FuseLang::Mvk([e, w, x, n, i]);
            g.lookup(node).and_then(|k| g[k].data.ty.clone())
        };
        let Some(tk) = kernel_ty else { return vec![] };
        if !fits_as_extra(g, self.name, eclass, [&tk, &tr, &tout]) {
            return vec![];
        }
        let Some((k, list)) = append_extra(g, i, r, self.name, eclass) else {
            return vec![];
        };
        let (a, b) = if self.kernel_left { (e, k) } else { (k, e) };
        let epi = g.add(match self.op {
            Op::Add => FuseLang::EAdd([a, b]),
            Op::Mul => FuseLang::EMul([a, b]),
        });
        let folded = g.add(FuseLang::Mvk([epi, w, x, n, list]));
        if g.union(eclass, folded) {
            vec![eclass]
        } else {
            vec![]
        }
    }
}
