//! Family (f): elementwise chains. Every elementwise op is also an elementwise kernel over its
//! inputs (same cost); a kernel whose input is another elementwise kernel's output inlines it,
//! so a chain (exp, neg, add, softplus, mul in Qwen3-Next's gate) becomes one dispatch with a
//! generated expression. Inputs are rows of the output's length or scalars; numpy broadcasts
//! over rows (`[2,64] · [2,1]`) are refused.

use super::{list_items, make_list, var, Rule};
use crate::fuse::lang::{FuseAnalysis, FuseGraph, FuseLang, MAX_EXTRAS};
use egg::{rewrite, Applier, Id, Language, Pattern, PatternAst, Rewrite, Subst, Symbol};

/// The rules of this family.
pub fn rules() -> Vec<Rule> {
    let binary = |name: &'static str, pat: &str, op: fn([Id; 2]) -> FuseLang| {
        let p: Pattern<FuseLang> = pat.parse().expect("a valid pattern");
        Rewrite::new(name, p, BinaryKernel { name, op }).expect("valid rule")
    };
    let inline: Pattern<FuseLang> = "(ewk ?e ?i)".parse().expect("a valid pattern");
    vec![
        // silu(a) == ewk(silu(in0), [a])
        rewrite!("elementwise-silu"; "(silu ?a)" => "(ewk (e.silu in0) (cons ?a nil))"),
        // sigmoid(a) == ewk(sigmoid(in0), [a])
        rewrite!("elementwise-sigmoid"; "(sigmoid ?a)" => "(ewk (e.sigmoid in0) (cons ?a nil))"),
        // exp(a) == ewk(exp(in0), [a])
        rewrite!("elementwise-exp"; "(exp ?a)" => "(ewk (e.exp in0) (cons ?a nil))"),
        // neg(a) == ewk(neg(in0), [a])
        rewrite!("elementwise-neg"; "(neg ?a)" => "(ewk (e.neg in0) (cons ?a nil))"),
        // softplus(a) == ewk(softplus(in0), [a])
        rewrite!("elementwise-softplus";
            "(softplus ?a)" => "(ewk (e.softplus in0) (cons ?a nil))"),
        // add(a, b) == ewk(add(in0, in1), [a, b]) when a and b are rows or scalars
        binary("elementwise-add", "(add ?a ?b)", FuseLang::EAdd),
        // mul(a, b) == ewk(mul(in0, in1), [a, b])
        binary("elementwise-mul", "(mul ?a ?b)", FuseLang::EMul),
        // div(a, b) == ewk(div(in0, in1), [a, b])
        binary("elementwise-div", "(div ?a ?b)", FuseLang::EDiv),
        // ewk(e, [.., ewk(f, [j..]), ..]) == ewk(e[inK := f], [.., j..]): the inner kernel's
        // expression is computed where its output was read
        Rewrite::new("inline-elementwise", inline, Inline).expect("valid rule"),
    ]
}

fn numel(g: &FuseGraph, c: Id) -> Option<usize> {
    g[c].data.ty.as_ref().map(|t| t.shape.numel())
}

/// The applier of `elementwise-add`, `-mul`, `-div`.
pub struct BinaryKernel {
    name: &'static str,
    op: fn([Id; 2]) -> FuseLang,
}

impl Applier<FuseLang, FuseAnalysis> for BinaryKernel {
    fn apply_one(
        &self,
        g: &mut FuseGraph,
        eclass: Id,
        s: &Subst,
        _: Option<&PatternAst<FuseLang>>,
        _: Symbol,
    ) -> Vec<Id> {
        let (a, b) = (s[var("?a")], s[var("?b")]);
        let (Some(na), Some(nb), Some(n)) = (numel(g, a), numel(g, b), numel(g, eclass)) else {
            return vec![];
        };
        if (na != n && na != 1) || (nb != n && nb != 1) {
            g.analysis.refuse(
                self.name,
                "the operands broadcast over rows, not element by element",
                vec![eclass],
            );
            return vec![];
        }
        let (i0, i1) = (g.add(FuseLang::In0), g.add(FuseLang::In1));
        let e = g.add((self.op)([i0, i1]));
        let list = make_list(g, &[a, b]);
        let k = g.add(FuseLang::Ewk([e, list]));
        if g.union(eclass, k) {
            vec![eclass]
        } else {
            vec![]
        }
    }
}

/// A copy of epilogue term `c` with every `inK` replaced by `leaf(K)`.
pub(crate) fn substitute(g: &mut FuseGraph, c: Id, leaf: &dyn Fn(&mut FuseGraph, u8) -> Id) -> Id {
    let node = g[c].nodes[0].clone();
    if let Some(k) = node.in_index() {
        return leaf(g, k);
    }
    let node = node.map_children(|ch| substitute(g, ch, leaf));
    g.add(node)
}

/// The applier of `inline-elementwise`.
pub struct Inline;

impl Applier<FuseLang, FuseAnalysis> for Inline {
    fn apply_one(
        &self,
        g: &mut FuseGraph,
        eclass: Id,
        s: &Subst,
        _: Option<&PatternAst<FuseLang>>,
        _: Symbol,
    ) -> Vec<Id> {
        const RULE: &str = "inline-elementwise";
        let (e, i) = (s[var("?e")], s[var("?i")]);
        let (Some(items), Some(n)) = (list_items(g, i), numel(g, eclass)) else {
            return vec![];
        };
        let mut changed = vec![];
        for (k, &item) in items.iter().enumerate() {
            let inner = g[item].nodes.iter().find_map(|m| match m {
                FuseLang::Ewk([f, j]) => Some((*f, *j)),
                _ => None,
            });
            let Some((f, j)) = inner else { continue };
            let (Some(inner_items), Some(inner_n)) = (list_items(g, j), numel(g, item)) else {
                continue;
            };
            if inner_n != n && inner_n != 1 {
                continue;
            }
            // The merged inputs: the outer ones but K, then the inner ones, without repeats.
            let mut merged: Vec<Id> = vec![];
            let index = |c: Id, merged: &mut Vec<Id>| -> usize {
                let c = g.find(c);
                match merged.iter().position(|&m| m == c) {
                    Some(p) => p,
                    None => {
                        merged.push(c);
                        merged.len() - 1
                    }
                }
            };
            let outer_map: Vec<Option<usize>> = items
                .iter()
                .enumerate()
                .map(|(x, &it)| (x != k).then(|| index(it, &mut merged)))
                .collect();
            let inner_map: Vec<usize> = inner_items
                .iter()
                .map(|&it| index(it, &mut merged))
                .collect();
            if merged.len() > MAX_EXTRAS {
                g.analysis.refuse(
                    RULE,
                    format!("an elementwise kernel reads at most {MAX_EXTRAS} inputs"),
                    vec![eclass],
                );
                continue;
            }
            let inner_epi = substitute(g, f, &|g, x| g.add(FuseLang::extra(inner_map[x as usize])));
            let outer_epi = substitute(g, e, &|g, x| match outer_map[x as usize] {
                Some(m) => g.add(FuseLang::extra(m)),
                None => inner_epi,
            });
            let list = make_list(g, &merged);
            let fused = g.add(FuseLang::Ewk([outer_epi, list]));
            if g.union(eclass, fused) {
                changed.push(eclass);
            }
        }
        changed
    }
}
