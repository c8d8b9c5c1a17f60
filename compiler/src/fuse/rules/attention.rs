//! Family (d): the attention block. Per-head q/k rms_norm, rope, the K and V writes at the
//! device position and attention decode over the cache become one dispatch: one workgroup per
//! kv head computes all its query heads. The workgroup writes its head's fresh K and V rows,
//! then `memoryBarrierBuffer(); barrier();` on `coherent` cache bindings makes those writes
//! visible to every invocation of the same workgroup before any reads them; no other workgroup
//! touches that head's rows in this dispatch, and older rows were written by earlier
//! submissions. So the attention reads exactly what the unfused kv_write would have left.
//!
//! Qwen3-Next's gated attention reads q and its output gate as column slices of one projection
//! (`[q heads, 2 head_dim]`, each row a head's q then its gate) and multiplies the output by
//! the gate's sigmoid: the block reads both from the projection's rows and applies the gate as
//! it stores, so neither the strided slices nor the multiply takes a level of its own.

use super::{dims, slice, var, Rule};
use crate::fuse::lang::{FuseAnalysis, FuseGraph, FuseLang};
use egg::{rewrite, Applier, Id, Pattern, PatternAst, Rewrite, Subst, Symbol, Var};

const GATED: &str = "attention-block-gated";

/// The rules of this family.
pub fn rules() -> Vec<Rule> {
    vec![
        // attention(rope(rms_norm(q)), kv_write(kc, rope(rms_norm(k))), kv_write(vc, v))
        //   == attn_block(q, k, v, kc, vc, norm q, norm k)
        rewrite!("attention-block-qk-norm";
            "(attention (rope (rms_norm ?q ?qw ?qa) ?pos ?r)
                        (kv_write ?kc (rope (rms_norm ?k ?kw ?ka) ?pos ?r) ?pos)
                        (kv_write ?vc ?v ?pos) ?pos ?s)"
            => "(attn_block ?q ?k ?v ?kc ?vc ?pos (norm ?qw ?qa) (norm ?kw ?ka) ?r ?s)"
            if block_fits("attention-block-qk-norm")),
        // attention(rope(q), kv_write(kc, rope(k)), kv_write(vc, v))
        //   == attn_block(q, k, v, kc, vc, nonorm, nonorm)
        rewrite!("attention-block";
            "(attention (rope ?q ?pos ?r) (kv_write ?kc (rope ?k ?pos ?r) ?pos)
                        (kv_write ?vc ?v ?pos) ?pos ?s)"
            => "(attn_block ?q ?k ?v ?kc ?vc ?pos nonorm nonorm ?r ?s)"
            if block_fits("attention-block")),
        // attn_block(x[:, :d], ..) * sigmoid(x[:, d:2d]) with x of [hq, 2d]
        //   == attn_gated(x, ..)
        Rewrite::new(GATED, gated_pattern(), Gated).expect("valid rule"),
    ]
}

fn gated_pattern() -> Pattern<FuseLang> {
    "(mul (attn_block ?q ?k ?v ?kc ?vc ?pos ?qn ?kn ?r ?s) (sigmoid ?gate))"
        .parse()
        .expect("a valid pattern")
}

/// The applier of `attention-block-gated`.
pub struct Gated;

/// The projection x of `[hq, 2d]` whose first `d` columns are q (`[hq, d]`) and whose last `d`
/// are `gate`; `Ok(None)` where they are no column slices (the block's class also holds the
/// unnormed form, whose q is the normed slice: nothing to refuse there), `Err` says why slices
/// do not line up.
fn gated_source(g: &FuseGraph, q: Id, gate: Id) -> Result<Option<Id>, String> {
    let (Some((x, q0, q1)), Some((xg, g0, g1))) = (slice(g, q, 1), slice(g, gate, 1)) else {
        return Ok(None);
    };
    let d = q1 - q0;
    match dims(g, x).as_deref() {
        Some(&[_, w]) if x == xg && q0 == 0 && g0 == d && g1 == 2 * d && w == 2 * d => Ok(Some(x)),
        _ => Err("q and the gate are not the two halves of one projection's rows".into()),
    }
}

impl Applier<FuseLang, FuseAnalysis> for Gated {
    fn apply_one(
        &self,
        g: &mut FuseGraph,
        eclass: Id,
        s: &Subst,
        _: Option<&PatternAst<FuseLang>>,
        _: Symbol,
    ) -> Vec<Id> {
        let [q, k, v, kc, vc, pos, qn, kn, r, sc, gate] = [
            "?q", "?k", "?v", "?kc", "?vc", "?pos", "?qn", "?kn", "?r", "?s", "?gate",
        ]
        .map(|n| g.find(s[var(n)]));
        let x = match gated_source(g, q, gate) {
            Ok(Some(x)) => x,
            Ok(None) => return vec![],
            Err(why) => {
                g.analysis.refuse(GATED, why, vec![eclass]);
                return vec![];
            }
        };
        let n = g.add(FuseLang::AttnGated([x, k, v, kc, vc, pos, qn, kn, r, sc]));
        if g.union(eclass, n) {
            vec![eclass]
        } else {
            vec![]
        }
    }
}

/// Most head_dim the block kernel handles (one invocation per element of a head).
pub const BLOCK_MAX_HEAD_DIM: usize = 256;

/// q is [hq, d], k and v [hkv, d] with hkv dividing hq, and d fits the kernel.
fn block_fits(rule: &'static str) -> impl Fn(&mut FuseGraph, Id, &Subst) -> bool {
    let v = |s: &str| -> Var { var(s) };
    let (q, k, vv) = (v("?q"), v("?k"), v("?v"));
    move |g, id, s| {
        let dims = |c: Id| g[c].data.ty.as_ref().map(|t| t.shape.dims().to_vec());
        let (Some(q), Some(k), Some(vd)) = (dims(s[q]), dims(s[k]), dims(s[vv])) else {
            return false;
        };
        let reason = if q.len() != 2 || k.len() != 2 || vd != k {
            Some("q, k and v are not [heads, head_dim] with k and v alike".to_string())
        } else if q[1] != k[1] || k[0] == 0 || q[0] % k[0] != 0 {
            Some("the kv heads do not divide the query heads".to_string())
        } else if q[1] > BLOCK_MAX_HEAD_DIM {
            Some(format!(
                "head_dim {} is past the block kernel's {BLOCK_MAX_HEAD_DIM}",
                q[1]
            ))
        } else {
            None
        };
        if let Some(r) = reason {
            g.analysis.refuse(rule, r, vec![id]);
            return false;
        }
        true
    }
}
