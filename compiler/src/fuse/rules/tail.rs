//! Family (e): the tail. The final norm folds into lm_head by family (a); here the argmax
//! writes the next token straight into its state, the position advance writes its state, and
//! both run in one dispatch; that dispatch then folds into the matvec computing the logits,
//! whose workgroups fold their rows into the token state as the argmax's key, and whose
//! workgroup 0 advances the position (one dependency level fewer per step).

use super::Rule;
use crate::fuse::lang::{FuseAnalysis, FuseGraph, FuseLang};
use egg::{rewrite, Applier, Id, MultiPattern, PatternAst, Rewrite, Subst, Symbol, Var};

/// The rules of this family.
pub fn rules() -> Vec<Rule> {
    let both: MultiPattern<FuseLang> = "?a = (argmax_write ?ts ?x), ?b = (inc_write ?ps ?p)"
        .parse()
        .expect("a valid multipattern");
    let into_matvec: MultiPattern<FuseLang> =
        "?t = (tail_step ?ts ?x ?ps ?p), ?x = (mvk ?e ?w ?xin ?pro ?ins)"
            .parse()
            .expect("a valid multipattern");
    vec![
        // write_state(s, argmax(x)) == argmax_write(s, x): no copy through a temporary
        rewrite!("argmax-writes-state"; "(write_state ?s (argmax ?x))" => "(argmax_write ?s ?x)"),
        // write_state(s, increment(p)) == inc_write(s, p)
        rewrite!("increment-writes-state";
            "(write_state ?s (increment ?p))" => "(inc_write ?s ?p)"),
        // argmax_write(ts, x), inc_write(ps, p) == fx0(t), fx1(t) with t = tail_step(ts, x, ps, p):
        // both effects in one dispatch
        Rewrite::new("tail-step", both, TailStep::new()).expect("valid rule"),
        // tail_step(ts, x, ps, p) with x = mvk(e, w, xin, pro, ins) == fx0(k), fx1(k) and
        // x == out(k) with k = mvk_step(e, w, xin, pro, ins, ts, ps, p): the argmax and the
        // position in the matvec's own dispatch (one part: its rows are x, in order)
        Rewrite::new("argmax-in-matvec", into_matvec, ArgmaxInMatvec::new()).expect("valid rule"),
    ]
}

/// The applier of `argmax-in-matvec`.
pub struct ArgmaxInMatvec {
    vars: [Var; 10],
}

impl ArgmaxInMatvec {
    fn new() -> Self {
        ArgmaxInMatvec {
            vars: [
                "?t", "?x", "?e", "?w", "?xin", "?pro", "?ins", "?ts", "?ps", "?p",
            ]
            .map(super::var),
        }
    }
}

impl Applier<FuseLang, FuseAnalysis> for ArgmaxInMatvec {
    fn apply_one(
        &self,
        g: &mut FuseGraph,
        _: Id,
        s: &Subst,
        _: Option<&PatternAst<FuseLang>>,
        _: Symbol,
    ) -> Vec<Id> {
        let [t, x, e, w, xin, pro, ins, ts, ps, p] = self.vars.map(|v| s[v]);
        const RULE: &str = "argmax-in-matvec";
        let parts = g[w].data.weights.as_ref().map_or(0, Vec::len);
        if parts != 1 {
            g.analysis.refuse(
                RULE,
                format!("the logits' matvec packs {parts} weights, not one"),
                vec![x],
            );
            return vec![];
        }
        if g[e].data.epi.is_some_and(|u| u.zipped > 0) {
            g.analysis
                .refuse(RULE, "the logits' matvec zips parts row by row", vec![x]);
            return vec![];
        }
        let k = g.add(FuseLang::MvkStep([e, w, xin, pro, ins, ts, ps, p]));
        let out = g.add(FuseLang::Out([k]));
        let (f0, f1) = (g.add(FuseLang::Fx0([k])), g.add(FuseLang::Fx1([k])));
        let (t0, t1) = (g.add(FuseLang::Fx0([t])), g.add(FuseLang::Fx1([t])));
        let mut changed = vec![];
        for (a, b) in [(x, out), (t0, f0), (t1, f1)] {
            if g.union(a, b) {
                changed.push(a);
            }
        }
        changed
    }
}

/// The applier of `tail-step` (a multipattern applier that reports only real changes, so
/// saturation is detected).
pub struct TailStep {
    vars: [Var; 6],
}

impl TailStep {
    fn new() -> Self {
        let v = |s: &str| s.parse().expect("a variable");
        TailStep {
            vars: [v("?a"), v("?b"), v("?ts"), v("?x"), v("?ps"), v("?p")],
        }
    }
}

impl Applier<FuseLang, FuseAnalysis> for TailStep {
    fn apply_one(
        &self,
        g: &mut FuseGraph,
        _: Id,
        s: &Subst,
        _: Option<&PatternAst<FuseLang>>,
        _: Symbol,
    ) -> Vec<Id> {
        let [a, b, ts, x, ps, p] = self.vars.map(|v| s[v]);
        if g.find(ts) == g.find(ps) {
            return vec![];
        }
        let t = g.add(FuseLang::TailStep([ts, x, ps, p]));
        let (f0, f1) = (g.add(FuseLang::Fx0([t])), g.add(FuseLang::Fx1([t])));
        let mut changed = vec![];
        if g.union(a, f0) {
            changed.push(a);
        }
        if g.union(b, f1) {
            changed.push(b);
        }
        changed
    }
}
