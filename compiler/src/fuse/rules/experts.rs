//! Family (j): the experts' weighted sum. The routed experts' down projections, each scaled by
//! its routing weight and summed over the experts, become one kernel: every workgroup walks the
//! chosen experts (indices read on the device) for its rows, adding in expert order as the
//! unfused sum does. Expert kernels fed by the router kernel then route for themselves from
//! its logits (`route_pick.glsl`), so that the router's single-workgroup level goes, where the
//! experts are few ([`OWN_ROUTING_MAX`]).

use super::{append_extra, fits_as_extra, other, var, Rule};
use crate::fuse::lang::{FuseAnalysis, FuseGraph, FuseLang};
use crate::ir::OpKind;
use egg::{rewrite, Applier, Id, Pattern, PatternAst, Rewrite, Subst, Symbol};

const RULE: &str = "weighted-expert-sum";
const GLU: &str = "expert-swiglu";
const FOLD: &str = "fold-add-into-expert-sum";
const FOLD_LEFT: &str = "fold-add-into-expert-sum-left";
const FOLD_READ: &str = "fold-add-into-read-expert-sum";
const FOLD_READ_LEFT: &str = "fold-add-into-read-expert-sum-left";
const FOLD_MORE: &str = "fold-another-add-into-read-expert-sum";
const FOLD_MORE_LEFT: &str = "fold-another-add-into-read-expert-sum-left";

/// The rules of this family, the expert kernels routing for themselves among at most
/// `own_max` experts.
pub fn rules(own_max: usize) -> Vec<Rule> {
    let p: Pattern<FuseLang> = "(mul ?d (reshape ?wts ?shape))"
        .parse()
        .expect("a valid pattern");
    let glu: Pattern<FuseLang> = "(mul (silu ?g) ?u)".parse().expect("a valid pattern");
    vec![
        // sum(mul(expert_matvec(w, idx, x), reshape(wts, [k, 1])), axis 0)
        //   == expert_sum(w, idx, x, wts)
        Rewrite::new(RULE, p, WeightedSum).expect("valid rule"),
        // mul(silu(expert_matvec(wg, idx, x)), expert_matvec(wu, idx, x))
        //   == expert_glu(wg, wu, idx, x)
        Rewrite::new(GLU, glu, SwiGlu).expect("valid rule"),
        // expert_glu(wg, wu, route_ids(route(l, s)), x) == expert_glu_routed(wg, wu, l, s, x)
        rewrite!("route-in-expert-glu";
            "(expert_glu ?wg ?wu (route_ids (route ?l ?s)) ?x)"
            => "(expert_glu_routed ?wg ?wu ?l ?s ?x)"
            if few_experts("route-in-expert-glu", "?l", own_max)),
        // expert_sum(w, route_ids(r), x, out(r)) == expert_sum_routed(acc, w, l, s, x, []) with
        // r = route(l, s): the indices and the weights of one router
        rewrite!("route-in-expert-sum";
            "(expert_sum ?w (route_ids (route ?l ?s)) ?x (out (route ?l ?s)))"
            => "(expert_sum_routed acc ?w ?l ?s ?x nil)"
            if few_experts("route-in-expert-sum", "?l", own_max)),
        // add(r, expert_sum_routed(e, .., [i..])) == expert_sum_routed(add(inK, e), .., [i.., r]):
        // the shared expert's output and the residual added as the sums are written
        fold(
            FOLD,
            "(add ?r (expert_sum_routed ?e ?w ?a ?b ?c ?i))",
            Sum::Routed,
            false,
        ),
        // add(expert_sum_routed(e, .., [i..]), r) == expert_sum_routed(add(e, inK), .., [i.., r])
        fold(
            FOLD_LEFT,
            "(add (expert_sum_routed ?e ?w ?a ?b ?c ?i) ?r)",
            Sum::Routed,
            true,
        ),
        // The same where the sum reads a router kernel's indices and weights (more experts than
        // OWN_ROUTING_MAX), so that the shared expert's down runs beside the experts there too:
        // add(r, expert_sum(w, idx, x, wts)) == expert_sum_epi(add(in0, acc), w, idx, x, wts, [r])
        fold(
            FOLD_READ,
            "(add ?r (expert_sum ?w ?a ?b ?c))",
            Sum::Read,
            false,
        ),
        // add(expert_sum(w, idx, x, wts), r) == expert_sum_epi(add(acc, in0), w, idx, x, wts, [r])
        fold(
            FOLD_READ_LEFT,
            "(add (expert_sum ?w ?a ?b ?c) ?r)",
            Sum::Read,
            true,
        ),
        // add(r, expert_sum_epi(e, .., [i..])) == expert_sum_epi(add(inK, e), .., [i.., r])
        fold(
            FOLD_MORE,
            "(add ?r (expert_sum_epi ?e ?w ?a ?b ?c ?i))",
            Sum::Epi,
            false,
        ),
        // add(expert_sum_epi(e, .., [i..]), r) == expert_sum_epi(add(e, inK), .., [i.., r])
        fold(
            FOLD_MORE_LEFT,
            "(add (expert_sum_epi ?e ?w ?a ?b ?c ?i) ?r)",
            Sum::Epi,
            true,
        ),
    ]
}

/// A `fold-add-into-*` rule of `pattern` (the addend `?r`; the sum's weights `?w`, its next
/// three children `?a ?b ?c`, and where it has them its epilogue `?e` and extras `?i`).
fn fold(name: &'static str, pattern: &str, sum: Sum, kernel_left: bool) -> Rule {
    let pattern = pattern
        .parse::<Pattern<FuseLang>>()
        .expect("a valid pattern");
    Rewrite::new(
        name,
        pattern,
        FoldAdd {
            name,
            sum,
            kernel_left,
        },
    )
    .expect("valid rule")
}

/// The most experts that every expert workgroup picks its own among (`route_pick.glsl`); with
/// more, the router's one workgroup picks them once a step and the expert kernels read its
/// indices and weights, a level more. Each workgroup's pick costs it about 3 µs at 64 experts
/// (where the level it saves is worth more: qwen3-next-small +15% in session 46), but at
/// Qwen3-Next-80B's 512 experts, top 10, the expert levels took ~40 and ~48 µs a layer against
/// a few µs of weights: routed once, `qwen3-next-80b-4l` q4_0 went from 1928 to 2828 tokens/s
/// on an H200 (docs/perf.md, session 49). With the picks a tournament of subgroups (session 50)
/// every workgroup picking still lost there: 2357 against 3109 tokens/s.
/// `VKFUSE_OWN_ROUTING_MAX=n` (read at compile time) moves the bound, the A/B knob of those
/// measurements ([`own_routing_max`]).
pub const OWN_ROUTING_MAX: usize = 64;

/// The bound asked for (`FuseOptions::own_routing_max`), else `VKFUSE_OWN_ROUTING_MAX`, else
/// [`OWN_ROUTING_MAX`].
pub fn own_routing_max(asked: Option<usize>) -> usize {
    asked
        .or_else(|| crate::kernels::knob("VKFUSE_OWN_ROUTING_MAX").map(|m| m as usize))
        .unwrap_or(OWN_ROUTING_MAX)
}

/// Whether router logits `l` are at most `max`, few enough for each expert workgroup to pick
/// from them.
fn few_experts(
    rule: &'static str,
    l: &str,
    max: usize,
) -> impl Fn(&mut FuseGraph, Id, &Subst) -> bool {
    let l: egg::Var = l.parse().unwrap();
    move |g, _, s| {
        let n = g[s[l]].data.ty.as_ref().map_or(0, |t| t.shape.numel());
        let ok = n <= max;
        if !ok {
            g.analysis.refuse(
                rule,
                "too many experts for every workgroup to route among",
                vec![s[l]],
            );
        }
        ok
    }
}

/// The applier of `weighted-expert-sum`.
pub struct WeightedSum;

impl Applier<FuseLang, FuseAnalysis> for WeightedSum {
    fn apply_one(
        &self,
        g: &mut FuseGraph,
        eclass: Id,
        s: &Subst,
        _: Option<&PatternAst<FuseLang>>,
        _: Symbol,
    ) -> Vec<Id> {
        let (d, wts) = (g.find(s[var("?d")]), g.find(s[var("?wts")]));
        let Some((_, em)) = other(g, d, "expert_matvec") else {
            return vec![];
        };
        let dims = |c: Id| g[c].data.ty.as_ref().map(|t| t.shape.dims().to_vec());
        let (w, idx, x) = (em[0], em[1], em[2]);
        let k = dims(idx).map_or(0, |d| d.iter().product());
        let per_expert = dims(x).is_some_and(|d| d.len() == 2 && d[0] == k);
        let weights = dims(wts) == Some(vec![k]) && dims(eclass).is_some_and(|d| d.len() == 2);
        let sums: Vec<Id> = g[eclass]
            .parents()
            .map(|p| g.find(p))
            .filter(|&p| match other(g, p, "sum") {
                Some((OpKind::Sum { axis: 0 }, a)) => g.find(a[0]) == g.find(eclass),
                _ => false,
            })
            .collect();
        let Some(&sum) = sums.first() else {
            return vec![];
        };
        if !per_expert || !weights {
            g.analysis.refuse(
                RULE,
                "not one input row and one weight per chosen expert",
                vec![eclass],
            );
            return vec![];
        }
        let fused = g.add(FuseLang::ExpertSum([w, idx, x, wts]));
        if g.union(sum, fused) {
            vec![sum]
        } else {
            vec![]
        }
    }
}

/// The applier of `expert-swiglu`.
pub struct SwiGlu;

impl Applier<FuseLang, FuseAnalysis> for SwiGlu {
    fn apply_one(
        &self,
        g: &mut FuseGraph,
        eclass: Id,
        s: &Subst,
        _: Option<&PatternAst<FuseLang>>,
        _: Symbol,
    ) -> Vec<Id> {
        let (gate, up) = (g.find(s[var("?g")]), g.find(s[var("?u")]));
        let (Some((_, ga)), Some((_, ua))) = (
            other(g, gate, "expert_matvec"),
            other(g, up, "expert_matvec"),
        ) else {
            return vec![];
        };
        let ty = |c: Id| g[c].data.ty.clone();
        let same_experts = g.find(ga[1]) == g.find(ua[1]) && g.find(ga[2]) == g.find(ua[2]);
        let same_weights = ty(ga[0]).is_some_and(|t| Some(t) == ty(ua[0]));
        let one_input = ty(ga[2]).is_some_and(|t| t.shape.rank() == 1);
        if !(same_experts && same_weights && one_input) {
            g.analysis.refuse(
                GLU,
                "gate and up differ in experts, input or weight shape",
                vec![eclass],
            );
            return vec![];
        }
        let fused = g.add(FuseLang::ExpertGlu([ga[0], ua[0], ga[1], ga[2]]));
        if g.union(eclass, fused) {
            vec![eclass]
        } else {
            vec![]
        }
    }
}

/// The weighted sum a `fold-add-into-*` rule adds into.
#[derive(Clone, Copy)]
enum Sum {
    /// `expert_sum_routed`: routing for itself, with an epilogue and extras.
    Routed,
    /// `expert_sum`: reading a router kernel's indices and weights, no epilogue yet.
    Read,
    /// `expert_sum_epi`: `expert_sum` with an epilogue and extras.
    Epi,
}

/// The applier of the `fold-add-into-*` rules: an addend that fits as an extra input
/// (`fits_as_extra`) becomes the sum kernel's next extra input.
pub struct FoldAdd {
    name: &'static str,
    sum: Sum,
    kernel_left: bool,
}

impl Applier<FuseLang, FuseAnalysis> for FoldAdd {
    fn apply_one(
        &self,
        g: &mut FuseGraph,
        eclass: Id,
        s: &Subst,
        _: Option<&PatternAst<FuseLang>>,
        _: Symbol,
    ) -> Vec<Id> {
        let name = self.name;
        let [r, w, a, b, c] = ["?r", "?w", "?a", "?b", "?c"].map(|v| s[var(v)]);
        // The sum's epilogue and extras where it has them (a plain sum's are `acc` and none,
        // added below once the addend fits).
        let (kernel, epi_extras) = match self.sum {
            Sum::Read => (FuseLang::ExpertSum([w, a, b, c]), None),
            Sum::Routed | Sum::Epi => {
                let [e, i] = ["?e", "?i"].map(|v| s[var(v)]);
                let kernel = match self.sum {
                    Sum::Routed => FuseLang::ExpertSumRouted([e, w, a, b, c, i]),
                    _ => FuseLang::ExpertSumEpi([e, w, a, b, c, i]),
                };
                (kernel, Some((e, i)))
            }
        };
        let Some(tk) = g.lookup(kernel).and_then(|k| g[k].data.ty.clone()) else {
            return vec![];
        };
        let (Some(tr), Some(tout)) = (g[r].data.ty.clone(), g[eclass].data.ty.clone()) else {
            return vec![];
        };
        if !fits_as_extra(g, name, eclass, [&tk, &tr, &tout]) {
            return vec![];
        }
        let (e, i) = epi_extras.unwrap_or_else(|| (g.add(FuseLang::Acc), g.add(FuseLang::Nil)));
        let Some((k, list)) = append_extra(g, i, r, name, eclass) else {
            return vec![];
        };
        let (x, y) = if self.kernel_left { (e, k) } else { (k, e) };
        let epi = g.add(FuseLang::EAdd([x, y]));
        let folded = match self.sum {
            Sum::Routed => FuseLang::ExpertSumRouted([epi, w, a, b, c, list]),
            Sum::Read | Sum::Epi => FuseLang::ExpertSumEpi([epi, w, a, b, c, list]),
        };
        let folded = g.add(folded);
        if g.union(eclass, folded) {
            vec![eclass]
        } else {
            vec![]
        }
    }
}
