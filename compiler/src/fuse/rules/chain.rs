//! Family (k): two matvecs chained in one kernel. A matvec whose input is another matvec
//! kernel's per-row result (SwiGLU's down projection after the fused gate/up) costs a second
//! dependency level, whose barrier and ramp the H100 charges ~5 µs for however few bytes it
//! moves. `mvchain` computes both in one level: each workgroup takes a block of the inner rows
//! and adds its share of every outer row into the output with float atomics (split-K), so the
//! inner result never reaches memory. The outer epilogue must be linear in the dot, `acc` or
//! `acc + in0` (the residual, added once).

use super::{list_items, Rule};
use crate::fuse::codegen::ChainSpec;
use crate::fuse::lang::{FuseGraph, FuseLang};
use crate::ir::DType;
use egg::{rewrite, Id, Subst, Var};

/// The rules of this family (all named `chain-*`: `FuseOptions::chain` turns them off).
pub fn rules() -> Vec<Rule> {
    vec![
        // mvk(e2, w2, mvk(e1, w1, x, p, nil), nonorm, i) == mvchain(e2, w2, e1, w1, x, p, i)
        rewrite!("chain-matvecs";
            "(mvk ?e2 ?w2 (mvk ?e1 ?w1 ?x ?p nil) nonorm ?i)"
            => "(mvchain ?e2 ?w2 ?e1 ?w1 ?x ?p ?i)"
            if chain_fits("chain-matvecs")),
    ]
}

/// Most inner columns: the normalised input is staged in shared memory (32 KiB).
pub const CHAIN_MAX_COLS: usize = 8192;

fn chain_fits(rule: &'static str) -> impl Fn(&mut FuseGraph, Id, &Subst) -> bool {
    let v = |s: &str| -> Var { s.parse().expect("a variable") };
    let (e2, w2, e1, w1, x, i) = (v("?e2"), v("?w2"), v("?e1"), v("?w1"), v("?x"), v("?i"));
    move |g, id, s| {
        let reason = why_not(g, s[e2], s[w2], s[e1], s[w1], s[x], s[i]);
        if let Some(r) = reason {
            g.analysis.refuse(rule, r, vec![id]);
            return false;
        }
        true
    }
}

/// Why the chained kernel cannot compute this pair, if it cannot.
fn why_not(g: &FuseGraph, e2: Id, w2: Id, e1: Id, w1: Id, x: Id, i: Id) -> Option<String> {
    let chainable = |d: DType| {
        matches!(
            d,
            DType::F32 | DType::F16 | DType::BF16 | DType::Q8_0 | DType::Q4_0
        )
    };
    let (Some(t1), Some(t2), Some(tx)) = (&g[w1].data.ty, &g[w2].data.ty, &g[x].data.ty) else {
        return Some("a type is unknown".into());
    };
    let parts = g[w1].data.weights.as_ref().map_or(0, Vec::len);
    let inner = g[e1].data.epi.unwrap_or_default();
    let (d1, d2) = (t1.shape.dims(), t2.shape.dims());
    let rows = if inner.zipped > 0 {
        d1[0] / parts.max(1)
    } else {
        d1[0]
    };
    if g[w2].data.weights.as_ref().map_or(0, Vec::len) != 1 {
        return Some("the outer weight is packed".into());
    }
    if inner.zipped == 0 && parts != 1 {
        return Some("the inner kernel stacks several weights (its rows are padded)".into());
    }
    if inner.extras > 0 {
        return Some("the inner epilogue reads extra inputs".into());
    }
    if !chainable(t1.dtype) || !chainable(t2.dtype) {
        return Some(format!(
            "weights of {} and {} (the chained kernel reads f32, f16, bf16, q8_0, q4_0)",
            t1.dtype, t2.dtype
        ));
    }
    if tx.dtype != DType::F32 {
        return Some(format!("the input is {}, not f32", tx.dtype));
    }
    if d2.len() != 2 || d2[1] != rows {
        return Some("the outer weight's columns are not the inner rows".into());
    }
    // Float outer weights are stored transposed and read 4 output rows per load.
    if t2.dtype.is_float() && d2[0] % 4 != 0 {
        return Some(format!(
            "{} outer rows are not a multiple of 4 (the transposed outer weights' loads)",
            d2[0]
        ));
    }
    if rows % ChainSpec::BLOCK != 0 {
        return Some(format!(
            "{rows} inner rows are not a multiple of {}",
            ChainSpec::BLOCK
        ));
    }
    if d1[1] % 8 != 0 || d1[1] > CHAIN_MAX_COLS {
        return Some(format!(
            "{} inner columns (a multiple of 8 up to {CHAIN_MAX_COLS})",
            d1[1]
        ));
    }
    let Some(items) = list_items(g, i) else {
        return Some("the extra inputs are no list".into());
    };
    let linear = match items.as_slice() {
        [] => g[e2].nodes.iter().any(|n| matches!(n, FuseLang::Acc)),
        [r] => {
            let full = g[*r]
                .data
                .ty
                .as_ref()
                .is_some_and(|t| t.shape.numel() == d2[0] && t.dtype != DType::I32);
            full && is_acc_plus_in0(g, e2)
        }
        _ => false,
    };
    if !linear {
        return Some("the outer epilogue is not acc or acc + in0".into());
    }
    None
}

/// Whether epilogue class `e` holds `add(in0, acc)` or `add(acc, in0)`.
fn is_acc_plus_in0(g: &FuseGraph, e: Id) -> bool {
    let has = |c: Id, want: &FuseLang| g[c].nodes.iter().any(|n| n == want);
    g[e].nodes.iter().any(|n| match n {
        FuseLang::EAdd([a, b]) => {
            (has(*a, &FuseLang::In0) && has(*b, &FuseLang::Acc))
                || (has(*a, &FuseLang::Acc) && has(*b, &FuseLang::In0))
        }
        _ => false,
    })
}
