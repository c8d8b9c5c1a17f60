//! Family (e): the tail. The final norm folds into lm_head by family (a); here the argmax
//! writes the next token straight into its state, the position advance writes its state, and
//! both run in one single-workgroup dispatch.

use super::Rule;
use crate::fuse::lang::{FuseAnalysis, FuseGraph, FuseLang};
use egg::{rewrite, Applier, Id, MultiPattern, PatternAst, Rewrite, Subst, Symbol, Var};

/// The rules of this family.
pub fn rules() -> Vec<Rule> {
    let both: MultiPattern<FuseLang> = "?a = (argmax_write ?ts ?x), ?b = (inc_write ?ps ?p)"
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
    ]
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
