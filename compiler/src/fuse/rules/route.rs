//! Family (i): the MoE router. After the router's matvec, softmax over the experts, top-k of
//! the probabilities, the chosen probabilities gathered and renormalised (`norm_topk_prob`)
//! become one single-workgroup kernel that writes the weights and the expert indices; the
//! expert kernels read the indices on the device.

use super::{other, var, Rule};
use crate::fuse::codegen::RouteSpec;
use crate::fuse::lang::{Attr, FuseAnalysis, FuseGraph, FuseLang};
use crate::ir::{OpKind, Shape};
use egg::{Applier, Id, Pattern, PatternAst, Rewrite, Subst, Symbol};

const RULE: &str = "route-top-k";

/// The rules of this family.
pub fn rules() -> Vec<Rule> {
    let p: Pattern<FuseLang> = "(div ?w ?total)".parse().expect("a valid pattern");
    vec![
        // div(gather(p, i), sum(gather(p, i))) with p = softmax(logits), i = top_k(p)
        //   == out(K), and i == route_ids(K), with K = route(logits, shape:k)
        // (the kernel ranks exp(logit - max), softmax's exact order: where rounding p ties two
        // different values, top_k takes the lower index and the kernel the larger value)
        Rewrite::new(RULE, p, Route).expect("valid rule"),
    ]
}

/// The applier of `route-top-k`.
pub struct Route;

impl Applier<FuseLang, FuseAnalysis> for Route {
    fn apply_one(
        &self,
        g: &mut FuseGraph,
        eclass: Id,
        s: &Subst,
        _: Option<&PatternAst<FuseLang>>,
        _: Symbol,
    ) -> Vec<Id> {
        let (w, total) = (g.find(s[var("?w")]), g.find(s[var("?total")]));
        let Some((_, ga)) = other(g, w, "gather") else {
            return vec![];
        };
        let (probs, idx) = (g.find(ga[0]), g.find(ga[1]));
        let summed = match other(g, total, "sum") {
            Some((OpKind::Sum { axis: 0 }, a)) => g.find(a[0]) == w,
            _ => false,
        };
        let topk = match other(g, idx, "top_k") {
            Some((OpKind::TopK { k }, a)) if g.find(a[0]) == probs => Some(k),
            _ => None,
        };
        let logits = other(g, probs, "softmax").map(|(_, a)| a[0]);
        let (true, Some(k), Some(logits)) = (summed, topk, logits) else {
            g.analysis.refuse(
                RULE,
                "not the renormalised top-k of a softmax",
                vec![eclass],
            );
            return vec![];
        };
        let n = match g[logits].data.ty.as_ref() {
            Some(t) if t.shape.rank() == 1 => t.shape.numel(),
            _ => {
                g.analysis
                    .refuse(RULE, "the router logits are not one row", vec![eclass]);
                return vec![];
            }
        };
        if !RouteSpec::fits(n, k) {
            // The unfused softmax and top_k take any size.
            g.analysis.refuse(
                RULE,
                format!(
                    "the top {k} of {n} experts would take {} bytes of shared memory, past {}",
                    RouteSpec::shared_bytes(n, k),
                    crate::fuse::codegen::ROUTE_SHARED_MAX
                ),
                vec![eclass],
            );
            return vec![];
        }
        let shape = g.add(FuseLang::Attr(Attr::Shape(Shape::new(vec![k]))));
        // The kernel has a class of its own: `out` and `route_ids` always mean it.
        let r = g.add(FuseLang::Route([logits, shape]));
        let out = g.add(FuseLang::Out([r]));
        let ids = g.add(FuseLang::RouteIds([r]));
        let mut changed = vec![];
        for (c, n) in [(eclass, out), (idx, ids)] {
            if g.union(c, n) {
                changed.push(c);
            }
        }
        changed
    }
}
