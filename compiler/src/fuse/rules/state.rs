//! Family (g): state updates in place. A recurrent state read at the start of the step, updated
//! by a kernel whose invocations each read and write only their own elements, then written back
//! (`write_state`), is updated in the state itself: the copy back disappears.

use super::{var, Rule};
use crate::fuse::lang::{FuseAnalysis, FuseGraph, FuseLang, LeafKind};
use egg::{Applier, Id, Pattern, PatternAst, Rewrite, Subst, Symbol};

/// The rules of this family.
pub fn rules() -> Vec<Rule> {
    let p: Pattern<FuseLang> = "(write_state ?st (delta_rule_update ?s ?k ?v ?g ?b))"
        .parse()
        .expect("a valid pattern");
    vec![
        // write_state(st, delta_rule_update(s, k, v, g, beta)) with s = st's value
        //   == fx0(u), and delta_rule_update(..) == state_after(u),
        //   with u = update_in_place(st, s, k, v, g, beta)
        // (delta_rule_update owns one state column per invocation: in place is safe)
        Rewrite::new("update-state-in-place", p, InPlace).expect("valid rule"),
    ]
}

/// The applier of `update-state-in-place`.
pub struct InPlace;

impl Applier<FuseLang, FuseAnalysis> for InPlace {
    fn apply_one(
        &self,
        g: &mut FuseGraph,
        eclass: Id,
        s: &Subst,
        _: Option<&PatternAst<FuseLang>>,
        _: Symbol,
    ) -> Vec<Id> {
        const RULE: &str = "update-state-in-place";
        let [st, sv, k, vv, gg, b] = ["?st", "?s", "?k", "?v", "?g", "?b"].map(|n| s[var(n)]);
        let leaf = |c: Id| {
            g[c].nodes.iter().find_map(|n| match n {
                FuseLang::Leaf(sym) => g.analysis.leaves.get(sym).cloned(),
                _ => None,
            })
        };
        let (Some(target), Some(value)) = (leaf(st), leaf(sv)) else {
            return vec![];
        };
        if target.kind != LeafKind::State
            || value.kind != LeafKind::StateValue
            || target.state.is_none()
            || target.state != value.state
        {
            g.analysis.refuse(
                RULE,
                "the update does not start from the state it writes",
                vec![eclass],
            );
            return vec![];
        }
        let update = g.lookup(FuseLang::DeltaRuleUpdate([sv, k, vv, gg, b]));
        let Some(update) = update else { return vec![] };
        // Nothing else may read the old state: it is overwritten where the update runs.
        let only_reader = g[sv].parents().all(|p| {
            g.find(p) == g.find(update)
                || g[p]
                    .nodes
                    .iter()
                    .all(|n| matches!(n, FuseLang::UpdateInPlace(_) | FuseLang::GdnStep(_)))
        });
        if !only_reader {
            g.analysis.refuse(
                RULE,
                "the old state is read by another op as well",
                vec![eclass],
            );
            return vec![];
        }
        // The kernel has a class of its own: `fx0` and `state_after` always mean it.
        let u = g.add(FuseLang::UpdateInPlace([st, sv, k, vv, gg, b]));
        let fx = g.add(FuseLang::Fx0([u]));
        let after = g.add(FuseLang::StateAfter([u]));
        let mut changed = vec![];
        if g.union(update, after) {
            changed.push(update);
        }
        if g.union(eclass, fx) {
            changed.push(eclass);
        }
        changed
    }
}
