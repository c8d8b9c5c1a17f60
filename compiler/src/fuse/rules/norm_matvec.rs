//! Family (a): norm → matvec. The normalised input is computed inside the matvec kernel: every
//! workgroup reduces x² over the (small) input itself and scales its dot products, so the
//! normalised vector never goes through memory and its dispatch and barrier disappear.

use super::Rule;
use crate::fuse::lang::FuseGraph;
use egg::{rewrite, Id, Subst, Var};

/// The rules of this family.
pub fn rules() -> Vec<Rule> {
    vec![
        // matvec(w, x) == mvk(acc, w, x, nonorm, nil): a matvec is the matvec kernel with no
        // prologue and the identity epilogue (same cost; the form the other rules extend)
        rewrite!("matvec-kernel"; "(matvec ?w ?x)" => "(mvk acc ?w ?x nonorm nil)"),
        // rms_norm(x, nw) then matvec(W, ·) == norm_matvec(W, x, nw): the norm becomes the
        // kernel's prologue, whatever its epilogue
        rewrite!("norm-into-matvec";
            "(mvk ?e ?w (rms_norm ?x ?nw ?a) nonorm ?i)" => "(mvk ?e ?w ?x (norm ?nw ?a) ?i)"
            if norm_over_whole_input("?x", "?w")),
    ]
}

/// The norm reduces the whole input vector (one row of length I), not rows of a matrix.
fn norm_over_whole_input(x: &str, w: &str) -> impl Fn(&mut FuseGraph, Id, &Subst) -> bool {
    let (x, w): (Var, Var) = (x.parse().unwrap(), w.parse().unwrap());
    move |g, _, s| {
        let (tx, tw) = (g[s[x]].data.ty.clone(), g[s[w]].data.ty.clone());
        let ok = matches!((&tx, &tw), (Some(tx), Some(tw))
            if tx.shape.rank() == 1 && tw.shape.rank() == 2 && tw.shape.dims()[1] == tx.shape.dims()[0]);
        if !ok {
            g.analysis.refuse(
                "norm-into-matvec",
                "the norm runs over rows of a matrix, not over the matvec's whole input",
                vec![s[x]],
            );
        }
        ok
    }
}
