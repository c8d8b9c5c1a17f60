//! Family (d): the attention block. Per-head q/k rms_norm, rope, the K and V writes at the
//! device position and attention decode over the cache become one dispatch: one workgroup per
//! kv head computes all its query heads. The workgroup writes its head's fresh K and V rows,
//! then `memoryBarrierBuffer(); barrier();` on `coherent` cache bindings makes those writes
//! visible to every invocation of the same workgroup before any reads them; no other workgroup
//! touches that head's rows in this dispatch, and older rows were written by earlier
//! submissions. So the attention reads exactly what the unfused kv_write would have left.

use super::Rule;
use crate::fuse::lang::FuseGraph;
use egg::{rewrite, Id, Subst, Var};

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
    ]
}

/// Most head_dim the block kernel handles (one invocation per element of a head).
pub const BLOCK_MAX_HEAD_DIM: usize = 256;

/// q is [hq, d], k and v [hkv, d] with hkv dividing hq, and d fits the kernel.
fn block_fits(rule: &'static str) -> impl Fn(&mut FuseGraph, Id, &Subst) -> bool {
    let v = |s: &str| -> Var { s.parse().expect("a variable") };
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
