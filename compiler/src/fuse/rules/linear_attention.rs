//! Family (h): the linear-attention step. Everything of a Gated DeltaNet decode step between its
//! projections and its output projection (the causal conv with its state shifted, silu, the l2
//! norms of q and k, the gates, the gated delta rule on the recurrent state with key heads
//! repeated over value heads, the readout and the gated rms norm with silu(z)) becomes one
//! kernel with one workgroup per key head.
//!
//! The match is structural: op kinds and how values flow between them, never tensor names. The
//! columns where q, k, v and z sit in the projection, the gates' expressions (the elementwise
//! kernels the elementwise family built) and where each gate input is read are recorded in the
//! fused node and generate the kernel. Each workgroup owns its key head's conv channels (q, k and
//! the value heads that share the key head) and those value heads' state columns, so both states
//! are updated in place without any other workgroup touching them.

use super::{dims, list_items, make_list, other, slice, var, Rule};
use crate::fuse::lang::{
    Attr, FuseAnalysis, FuseGraph, FuseLang, GateIndex, GdnLayout, LeafInfo, LeafKind,
};
use crate::ir::OpKind;
use egg::{Applier, Id, Pattern, PatternAst, Rewrite, Subst, Symbol};

const RULE: &str = "linear-attention-step";

/// The rules of this family.
pub fn rules() -> Vec<Rule> {
    let p: Pattern<FuseLang> = "(delta_rule_update ?s ?k ?v ?g ?beta)"
        .parse()
        .expect("a valid pattern");
    vec![
        // gated_rms_norm(delta_rule_readout(u, l2_norm(q)), z, nw)
        //   with u = delta_rule_update(s, l2_norm(k), v, g, beta), [q | k | v] = the silu of the
        //   causal conv (state cs) of [q | k | v] column slices of x, z a column slice of x,
        //   write_state(cs, conv_shift(cs, [q | k | v] of x)) and write_state(s, u)
        //   == out(K), and the two writes == fx0(K), fx1(K),
        //   with K = gdn_step(x, cs, conv_w, cs, s, s, nw, g's expression, beta's, layout)
        Rewrite::new(RULE, p, Step).expect("valid rule"),
    ]
}

/// The applier of `linear-attention-step`.
pub struct Step;

/// A class reading `c` through an `Other` node of kind `name` with `c` as argument `arg`.
fn reader(g: &FuseGraph, c: Id, name: &str, arg: usize) -> Option<(Id, OpKind, Vec<Id>)> {
    let c = g.find(c);
    g[c].parents().find_map(|p| {
        let p = g.find(p);
        let (op, args) = other(g, p, name)?;
        (args.get(arg).map(|a| g.find(*a)) == Some(c)).then_some((p, op, args))
    })
}

/// The class writing `c` into a state, and the state leaf's class.
fn state_write(g: &FuseGraph, c: Id) -> Option<(Id, Id)> {
    let c = g.find(c);
    g[c].parents().find_map(|p| {
        let p = g.find(p);
        g[p].nodes.iter().find_map(|n| match n {
            FuseLang::WriteState([st, x]) if g.find(*x) == c => Some((p, *st)),
            _ => None,
        })
    })
}

/// What `c` is a reshape of.
fn reshaped(g: &FuseGraph, c: Id) -> Option<Id> {
    g[c].nodes.iter().find_map(|n| match n {
        FuseLang::Reshape([x, _]) => Some(*x),
        _ => None,
    })
}

fn leaf(g: &FuseGraph, c: Id) -> Option<LeafInfo> {
    g[c].nodes.iter().find_map(|n| match n {
        FuseLang::Leaf(s) => g.analysis.leaves.get(s).cloned(),
        _ => None,
    })
}

/// Every reader of the old state `c` is one of `allowed` or a kernel that updates it in place.
fn only_read_by(g: &FuseGraph, c: Id, allowed: &[Id]) -> bool {
    g[c].parents().all(|p| {
        let p = g.find(p);
        allowed.iter().any(|a| g.find(*a) == p)
            || g[p]
                .nodes
                .iter()
                .all(|n| matches!(n, FuseLang::UpdateInPlace(_) | FuseLang::GdnStep(_)))
    })
}

/// A gate (one value per value head): an elementwise kernel of its class whose inputs are all
/// leaves of one value per value head or column slices of a `[key heads, width]` tensor; its
/// expression, the inputs' sources and how each is read.
fn gate(g: &FuseGraph, c: Id, hv: usize) -> Option<(Id, Vec<Id>, Vec<GateIndex>)> {
    g[c].nodes.iter().find_map(|n| {
        let FuseLang::Ewk([e, ins]) = n else {
            return None;
        };
        let mut sources = vec![];
        let mut index = vec![];
        for item in list_items(g, *ins)? {
            let numel = g[item].data.ty.as_ref()?.shape.numel();
            if leaf(g, item).is_some() && numel == hv {
                sources.push(item);
                index.push(GateIndex::Direct);
                continue;
            }
            let (rows2d, start, end) = slice(g, reshaped(g, item)?, 1)?;
            let d = dims(g, rows2d)?;
            let n = end - start;
            if numel != hv || d.len() != 2 || d[0] * n != hv {
                return None;
            }
            sources.push(reshaped(g, rows2d)?);
            index.push(GateIndex::Columns {
                width: d[1],
                start,
                n,
            });
        }
        Some((*e, sources, index))
    })
}

/// Everything the fused step reads, found from the delta rule update `u`.
struct Found {
    y: Id,
    conv_root: Id,
    rec_root: Id,
    node: [Id; 7],
    gates: [(Id, Vec<Id>); 2],
    layout: GdnLayout,
}

/// Walks from the update to every op of the step; `Err` says why it is not one.
fn find(g: &FuseGraph, u: Id, s: &Subst) -> Result<Option<Found>, String> {
    let [sv, k, v, gg, beta] = ["?s", "?k", "?v", "?g", "?beta"].map(|n| g.find(s[var(n)]));
    let Some(sl) = leaf(g, sv).filter(|l| l.kind == LeafKind::StateValue) else {
        return Err("the update does not start from a state read".into());
    };
    let Some((rec_root, rst)) = state_write(g, u) else {
        return Err("the updated state is not written back".into());
    };
    if leaf(g, rst).map(|l| (l.kind, l.state)) != Some((LeafKind::State, sl.state)) {
        return Err("the update is written to another state".into());
    }
    let Some((o, OpKind::DeltaRuleReadout { scale }, ro)) = reader(g, u, "delta_rule_readout", 0)
    else {
        return Err("the updated state is not read out".into());
    };
    let Some((y, OpKind::GatedRmsNorm { eps: norm_eps }, gn)) = reader(g, o, "gated_rms_norm", 0)
    else {
        return Err("the readout is not normed by a gated rms norm".into());
    };
    // A step already built for this update: one kernel per step, never two.
    if g[y].nodes.iter().any(|n| matches!(n, FuseLang::Out(_))) {
        return Ok(None);
    }
    let (z, nw) = (g.find(gn[1]), gn[2]);
    let l2 = |c: Id| match other(g, c, "l2_norm") {
        Some((OpKind::L2Norm { eps }, a)) => Some((eps, g.find(a[0]))),
        _ => None,
    };
    let (Some((eq, qr)), Some((ek, kr))) = (l2(g.find(ro[1])), l2(k)) else {
        return Err("q and k are not l2-normed".into());
    };
    if eq != ek {
        return Err("q and k are normed with different eps".into());
    }
    // q, k, v: reshaped consecutive slices of one activation of the causal conv.
    let conv_slice = |c: Id| reshaped(g, c).and_then(|r| slice(g, r, 0));
    let (Some((act, q0, q1)), Some((act_k, k0, k1)), Some((act_v, v0, v1))) =
        (conv_slice(qr), conv_slice(kr), conv_slice(v))
    else {
        return Err("q, k and v are not slices of one activation".into());
    };
    let channels = dims(g, act).map_or(0, |d| d.iter().product());
    if act != act_k || act != act_v || q0 != 0 || q1 != k0 || k1 != v0 || v1 != channels {
        return Err("q, k and v are not the activation's channels in order".into());
    }
    let conv = g[act].nodes.iter().find_map(|n| match n {
        FuseLang::Silu([c]) => Some(g.find(*c)),
        _ => None,
    });
    let Some((_, cc)) = conv.and_then(|c| other(g, c, "causal_conv1d")) else {
        return Err("the activation is not silu of a causal conv".into());
    };
    let (cs, mixed, cw) = (g.find(cc[0]), g.find(cc[1]), cc[2]);
    let Some(csl) = leaf(g, cs).filter(|l| l.kind == LeafKind::StateValue) else {
        return Err("the conv does not read a state".into());
    };
    // The conv's input: [q | k | v] column slices of x reshaped to [key heads, width].
    let cat = |c: Id| match other(g, c, "concat") {
        Some((OpKind::Concat { axis: 0 }, a)) => Some((g.find(a[0]), g.find(a[1]))),
        _ => None,
    };
    let cols = |c: Id| reshaped(g, c).and_then(|r| slice(g, r, 1));
    let parts = cat(mixed).and_then(|(qk, vm)| Some((cat(qk)?, vm)));
    let Some(((qm, km), vm)) = parts else {
        return Err("the conv input is not [q | k] | v".into());
    };
    let (Some((xr, qo, qe)), Some((xk, ko, ke)), Some((xv, vo, ve)), Some((xz, zo, ze))) =
        (cols(qm), cols(km), cols(vm), cols(z))
    else {
        return Err("q, k, v and z are not column slices of the projection".into());
    };
    let (Some(xd), Some(sd), Some(x)) = (dims(g, xr), dims(g, sv), reshaped(g, xr)) else {
        return Err("the projection is not reshaped to [key heads, width]".into());
    };
    if xr != xk || xr != xv || xr != xz || xd.len() != 2 || sd.len() != 3 {
        return Err("q, k, v and z come from different projections".into());
    }
    let (hk, width, hv, dk, dv) = (xd[0], xd[1], sd[0], sd[1], sd[2]);
    let r = hv / hk.max(1);
    let f32_x = g[x]
        .data
        .ty
        .as_ref()
        .is_some_and(|t| t.dtype == crate::ir::DType::F32 && t.shape.numel() == hk * width);
    if !f32_x
        || hk * r != hv
        || qe - qo != dk
        || ke - ko != dk
        || ve - vo != r * dv
        || ze - zo != r * dv
        || q1 != hk * dk
        || dims(g, z) != Some(vec![hv, dv])
    {
        return Err("the heads of q, k, v, z and the state do not line up".into());
    }
    // The conv state: shifted by the same input and written back to itself.
    let shift = reader(g, mixed, "conv_shift", 1).filter(|(_, _, a)| g.find(a[0]) == cs);
    let Some((shift, _, _)) = shift else {
        return Err("the conv state is not shifted by the conv's input".into());
    };
    let Some((conv_root, cst)) = state_write(g, shift) else {
        return Err("the shifted conv state is not written back".into());
    };
    if leaf(g, cst).map(|l| (l.kind, l.state)) != Some((LeafKind::State, csl.state)) {
        return Err("the conv state is written to another state".into());
    }
    let conv = conv.unwrap_or(cs);
    if !only_read_by(g, cs, &[conv, shift]) || !only_read_by(g, sv, &[u]) {
        return Err("an old state is read by another op as well".into());
    }
    let (Some((ge, gsrc, gidx)), Some((be, bsrc, bidx))) = (gate(g, gg, hv), gate(g, beta, hv))
    else {
        // Not yet (the elementwise family builds the gates' kernels) or not at all.
        return Ok(None);
    };
    let layout = GdnLayout {
        width,
        q: qo,
        k: ko,
        v: vo,
        z: zo,
        l2_eps: eq,
        scale,
        norm_eps,
        gate_inputs: gidx.into_iter().chain(bidx).collect(),
    };
    Ok(Some(Found {
        y,
        conv_root,
        rec_root,
        node: [x, cs, cw, cst, sv, rst, nw],
        gates: [(ge, gsrc), (be, bsrc)],
        layout,
    }))
}

impl Applier<FuseLang, FuseAnalysis> for Step {
    fn apply_one(
        &self,
        g: &mut FuseGraph,
        eclass: Id,
        s: &Subst,
        _: Option<&PatternAst<FuseLang>>,
        _: Symbol,
    ) -> Vec<Id> {
        let f = match find(g, g.find(eclass), s) {
            Ok(Some(f)) => f,
            Ok(None) => return vec![],
            Err(why) => {
                g.analysis.refuse(RULE, why, vec![eclass]);
                return vec![];
            }
        };
        let [x, cs, cw, cst, sv, rst, nw] = f.node;
        let [(ge, gsrc), (be, bsrc)] = f.gates;
        let gl = make_list(g, &gsrc);
        let bl = make_list(g, &bsrc);
        let lay = g.add(FuseLang::Attr(Attr::Gdn(f.layout)));
        // The kernel has a class of its own: `out`, `fx0` and `fx1` always mean it.
        let k = g.add(FuseLang::GdnStep([
            x, cs, cw, cst, sv, rst, nw, ge, gl, be, bl, lay,
        ]));
        let out = g.add(FuseLang::Out([k]));
        let fx0 = g.add(FuseLang::Fx0([k]));
        let fx1 = g.add(FuseLang::Fx1([k]));
        let mut changed = vec![];
        for (c, n) in [(f.y, out), (f.conv_root, fx0), (f.rec_root, fx1)] {
            if g.union(c, n) {
                changed.push(c);
            }
        }
        changed
    }
}
