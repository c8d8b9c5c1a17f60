//! Fusion: every rule as `before => after` on small expressions (the rewritten form is in the
//! same e-class, and extraction picks it: no rule rewrites to a costlier form), then the fused
//! program of every fixture and of the hand-written toy trace as reviewed snapshots.

use egg::{Id, Language, RecExpr, Runner};
use std::path::Path;
use vkfuse_compiler::fuse::cost::DeviceCost;
use vkfuse_compiler::fuse::extract::{extract, Extraction};
use vkfuse_compiler::fuse::lang::{FuseAnalysis, FuseGraph, FuseLang, LeafInfo, LeafKind};
use vkfuse_compiler::fuse::rules::rules;
use vkfuse_compiler::fuse::{lower_fused, FuseOptions, FusionReport};
use vkfuse_compiler::ir::{DType, Program, Type};
use vkfuse_compiler::lower::{Meta, SpirvCache};
use vkfuse_compiler::{import, trace};
use vkfuse_runtime::schedule::{Regions, Schedule, TokenEncoding};

// ---------------------------------------------------------------------------------------------
// Rules, one expression at a time.

/// The leaves the rule tests use, in trace order.
fn env() -> FuseAnalysis {
    use LeafKind::*;
    let bf = |d: &[usize]| Type::new(DType::BF16, d.to_vec());
    let leaves: Vec<(&str, Type, LeafKind)> = vec![
        ("x", Type::f32([16]), Value),
        ("h", Type::f32([16]), Value),
        ("a", Type::f32([32]), Value),
        ("m", Type::f32([40]), Value),
        ("y", Type::f32([16]), Value),
        ("nw", bf(&[16]), Weight),
        ("wq", bf(&[32, 16]), Weight),
        ("wk", bf(&[16, 16]), Weight),
        ("wv", bf(&[16, 16]), Weight),
        ("wh", Type::new(DType::F16, [16, 16]), Weight),
        ("wg", bf(&[40, 16]), Weight),
        ("wu", bf(&[40, 16]), Weight),
        ("wd", bf(&[16, 40]), Weight),
        ("wo", bf(&[16, 32]), Weight),
        ("w1", bf(&[1, 16]), Weight),
        ("qh", Type::f32([4, 8]), Value),
        ("kh", Type::f32([2, 8]), Value),
        ("vh", Type::f32([2, 8]), Value),
        ("kc", Type::f32([2, 64, 8]), State),
        ("vc", Type::f32([2, 64, 8]), State),
        ("pos", Type::i32([1]), StateValue),
        ("qn", bf(&[8]), Weight),
        ("kn", bf(&[8]), Weight),
        ("logits", Type::f32([50]), Value),
        ("tok", Type::i32([1]), State),
        ("posst", Type::i32([1]), State),
        ("alog", bf(&[4]), Weight),
        ("dt", bf(&[4]), Weight),
        ("b4", Type::f32([4]), Value),
        ("c4", Type::f32([4]), Value),
        ("r1", Type::f32([1]), Value),
        ("m2", Type::f32([2, 8]), Value),
        ("col", Type::f32([2, 1]), Value),
        ("rs", Type::f32([4, 8, 8]), State),
        ("rsv", Type::f32([4, 8, 8]), StateValue),
        ("kr", Type::f32([2, 8]), Value),
        ("vr", Type::f32([4, 8]), Value),
        ("wg2", bf(&[32, 16]), Weight),
        ("wu2", bf(&[32, 16]), Weight),
        ("wd2", bf(&[16, 32]), Weight),
    ];
    // Which persistent state each state leaf is (rs and rsv are one state).
    let state_of = |name: &str| match name {
        "kc" => Some(0),
        "vc" => Some(1),
        "tok" => Some(2),
        "posst" | "pos" => Some(3),
        "rs" | "rsv" => Some(4),
        _ => None,
    };
    let mut a = FuseAnalysis::default();
    for (order, (name, ty, kind)) in leaves.into_iter().enumerate() {
        let state = state_of(name);
        let info = LeafInfo {
            ty,
            kind,
            order,
            state,
        };
        a.leaves.insert(name.into(), info);
    }
    a
}

fn saturated(roots_of: &[&str]) -> (FuseGraph, Vec<Id>) {
    saturated_in(env(), roots_of)
}

fn saturated_in(env: FuseAnalysis, roots_of: &[&str]) -> (FuseGraph, Vec<Id>) {
    let mut g = FuseGraph::new(env);
    let roots: Vec<Id> = roots_of
        .iter()
        .map(|e| g.add_expr(&e.parse().expect("a valid expression")))
        .collect();
    let runner = Runner::default()
        .with_egraph(g)
        .with_iter_limit(20)
        .with_node_limit(20_000)
        .run(&rules());
    let g = runner.egraph;
    let roots = roots.iter().map(|r| g.find(*r)).collect();
    (g, roots)
}

/// The expression extraction chose for `root`.
fn chosen(g: &FuseGraph, ex: &Extraction, root: Id) -> String {
    fn add(g: &FuseGraph, ex: &Extraction, c: Id, out: &mut RecExpr<FuseLang>) -> Id {
        let node = ex.node(g, c).clone();
        let node = node.map_children(|ch| add(g, ex, ch, out));
        out.add(node)
    }
    let mut e = RecExpr::default();
    add(g, ex, root, &mut e);
    e.to_string()
}

/// The price of the expressions alone, unrewritten.
fn price_in(env: FuseAnalysis, exprs: &[&str]) -> f64 {
    let mut g = FuseGraph::new(env);
    let roots: Vec<Id> = exprs
        .iter()
        .map(|e| g.add_expr(&e.parse().expect("a valid expression")))
        .collect();
    g.rebuild();
    extract(&g, &roots, &DeviceCost::default()).cost.us
}

/// `before` rewrites to `after` (each expression to the one at its index): they share an
/// e-class, extraction picks `after`, and `after` costs less than `before`.
fn rewrites(before: &[&str], after: &[&str]) {
    rewrites_in(env, before, after)
}

fn rewrites_in(env: fn() -> FuseAnalysis, before: &[&str], after: &[&str]) {
    let (g, roots) = saturated_in(env(), before);
    let ex = extract(&g, &roots, &DeviceCost::default());
    for ((b, a), r) in before.iter().zip(after).zip(&roots) {
        let want: RecExpr<FuseLang> = a.parse().expect("a valid expression");
        let found = g.lookup_expr(&want);
        assert_eq!(found, Some(*r), "`{b}` is not equivalent to `{a}`");
        assert_eq!(chosen(&g, &ex, *r), want.to_string(), "extraction of `{b}`");
    }
    let (pb, pa) = (price_in(env(), before), price_in(env(), after));
    assert!(
        pa < pb,
        "`{after:?}` ({pa} µs) is not cheaper than `{before:?}` ({pb} µs)"
    );
}

/// `e` is left as it is (what the rules may add is not chosen), and `rule` says why.
fn stays(before: &[&str], rule: &str, reason: &str) {
    let (g, roots) = saturated(before);
    let ex = extract(&g, &roots, &DeviceCost::default());
    for (b, r) in before.iter().zip(&roots) {
        let want: RecExpr<FuseLang> = b.parse().expect("a valid expression");
        let got = chosen(&g, &ex, *r);
        assert!(
            got == want.to_string() || !got.contains("wcat"),
            "`{b}` became `{got}`"
        );
    }
    assert_refused(&g, rule, reason);
}

/// `rule` refused a match in `g`, saying `reason`.
fn assert_refused(g: &FuseGraph, rule: &str, reason: &str) {
    let refusals = g.analysis.refusals.borrow();
    assert!(
        refusals
            .iter()
            .any(|x| x.rule == rule && x.reason.contains(reason)),
        "no refusal of {rule} with `{reason}`: {refusals:?}"
    );
}

macro_rules! rule_test {
    ($name:ident: $before:literal => $after:literal) => {
        #[test]
        fn $name() {
            rewrites(&[$before], &[$after]);
        }
    };
    ($name:ident: [$($before:literal),+] => [$($after:literal),+]) => {
        #[test]
        fn $name() {
            rewrites(&[$($before),+], &[$($after),+]);
        }
    };
}

// (a) norm → matvec
rule_test!(should_fold_the_norm_into_the_matvec:
    "(matvec wq (rms_norm x nw norm:1e-6))" => "(mvk acc wq x (norm nw norm:1e-6) nil)");
rule_test!(should_fold_a_zero_centred_norm_into_the_matvec:
    "(matvec wq (rms_norm x nw norm1p:1e-6))" => "(mvk acc wq x (norm nw norm1p:1e-6) nil)");

#[test]
fn should_see_a_matvec_as_the_plain_matvec_kernel() {
    let (g, roots) = saturated(&["(matvec wq x)"]);
    let k: RecExpr<FuseLang> = "(mvk acc wq x nonorm nil)".parse().unwrap();
    assert_eq!(g.lookup_expr(&k), Some(roots[0]));
}

// (b) horizontal merges
rule_test!(should_merge_q_k_v_into_one_kernel_over_packed_weights:
    ["(matvec wq (rms_norm x nw norm:1e-6))",
     "(matvec wk (rms_norm x nw norm:1e-6))",
     "(matvec wv (rms_norm x nw norm:1e-6))"]
    => ["(rows wq (mvk acc (wcat (wcat wq wk) wv) x (norm nw norm:1e-6) nil))",
        "(rows wk (mvk acc (wcat (wcat wq wk) wv) x (norm nw norm:1e-6) nil))",
        "(rows wv (mvk acc (wcat (wcat wq wk) wv) x (norm nw norm:1e-6) nil))"]);
rule_test!(should_merge_two_matvecs_reading_one_input:
    ["(matvec wk x)", "(matvec wv x)"]
    => ["(rows wk (mvk acc (wcat wk wv) x nonorm nil))",
        "(rows wv (mvk acc (wcat wk wv) x nonorm nil))"]);
// The MoE router and the shared expert's sigmoid gate: one kernel, each part its own epilogue.
rule_test!(should_merge_matvecs_whose_parts_keep_their_own_epilogues:
    ["(matvec wk (rms_norm x nw norm:1e-6))", "(sigmoid (matvec w1 (rms_norm x nw norm:1e-6)))"]
    => ["(rows wk (mvk (e.parts acc (e.sigmoid acc)) (wcat wk w1) x (norm nw norm:1e-6) nil))",
        "(rows w1 (mvk (e.parts acc (e.sigmoid acc)) (wcat wk w1) x (norm nw norm:1e-6) nil))"]);
rule_test!(should_keep_one_epilogue_when_every_part_has_it:
    ["(sigmoid (matvec wk x))", "(sigmoid (matvec wv x))"]
    => ["(rows wk (mvk (e.sigmoid acc) (wcat wk wv) x nonorm nil))",
        "(rows wv (mvk (e.sigmoid acc) (wcat wk wv) x nonorm nil))"]);

#[test]
fn should_refuse_to_pack_weights_of_different_dtypes() {
    stays(
        &["(matvec wk x)", "(matvec wh x)"],
        "merge-matvecs",
        "different dtypes",
    );
}

#[test]
fn should_not_merge_matvecs_reading_different_inputs() {
    let (g, roots) = saturated(&["(matvec wk x)", "(matvec wv h)"]);
    let ex = extract(&g, &roots, &DeviceCost::default());
    for r in &roots {
        assert!(!chosen(&g, &ex, *r).contains("wcat"));
    }
}

// (c) epilogues
rule_test!(should_fold_the_residual_add_into_the_matvec:
    "(add h (matvec wo a))" => "(mvk (e.add in0 acc) wo a nonorm (cons h nil))");
rule_test!(should_fold_a_residual_add_on_the_right:
    "(add (matvec wo a) h)" => "(mvk (e.add acc in0) wo a nonorm (cons h nil))");
rule_test!(should_fold_swiglu_into_one_kernel_over_zipped_gate_and_up:
    "(mul (silu (matvec wg (rms_norm x nw norm:1e-6))) (matvec wu (rms_norm x nw norm:1e-6)))"
    => "(mvk (e.mul (e.silu acc0) acc1) (wcat wg wu) x (norm nw norm:1e-6) nil)");
rule_test!(should_fold_a_sigmoid_gate_into_the_matvec:
    "(mul y (sigmoid (matvec wk x)))"
    => "(mvk (e.mul in0 (e.sigmoid acc)) wk x nonorm (cons y nil))");
rule_test!(should_fold_a_scalar_gate_as_a_broadcast_input:
    "(mul (matvec wd m) (sigmoid (matvec w1 x)))"
    => "(mvk (e.mul acc in0) wd m nonorm (cons (mvk (e.sigmoid acc) w1 x nonorm nil) nil))");
rule_test!(should_chain_epilogues_over_several_extra_inputs:
    "(add h (add y (matvec wo a)))"
    => "(mvk (e.add in1 (e.add in0 acc)) wo a nonorm (cons y (cons h nil)))");

#[test]
fn should_refuse_to_broadcast_a_one_row_kernel_into_a_vector() {
    stays(
        &["(mul (matvec wd m) (sigmoid (matvec w1 x)))"],
        "fold-mul-extra",
        "would broadcast",
    );
}

// (k) a matvec chained into the kernel feeding it
rule_test!(should_chain_the_down_projection_into_the_swiglu_kernel:
    "(add h (matvec wd2 (mul (silu (matvec wg2 (rms_norm x nw norm:1e-6))) (matvec wu2 (rms_norm x nw norm:1e-6)))))"
    => "(mvchain (e.add in0 acc) wd2 (e.mul (e.silu acc0) acc1) (wcat wg2 wu2) x (norm nw norm:1e-6) (cons h nil))");

#[test]
fn should_refuse_to_chain_inner_rows_the_workgroups_cannot_split() {
    // 40 gate/up rows: not whole blocks of 32.
    let (g, _) = saturated(&[
        "(add h (matvec wd (mul (silu (matvec wg (rms_norm x nw norm:1e-6))) (matvec wu (rms_norm x nw norm:1e-6)))))",
    ]);
    assert_refused(
        &g,
        "chain-matvecs",
        "40 inner rows are not a multiple of 32",
    );
}

#[test]
fn should_refuse_to_zip_parts_of_different_heights() {
    // Stacked, each part under its own epilogue, they may still share a kernel; zipped not.
    let (g, roots) = saturated(&["(mul (silu (matvec wq x)) (matvec wk x))"]);
    let ex = extract(&g, &roots, &DeviceCost::default());
    let got = chosen(&g, &ex, roots[0]);
    assert!(!got.contains("acc0"), "zipped: `{got}`");
    assert_refused(&g, "zip-parts", "differ in height");
}

// (d) the attention block
rule_test!(should_fuse_qk_norm_rope_kv_write_and_attention_into_one_block:
    "(attention (rope (rms_norm qh qn norm:1e-6) pos rope:10000.0:8)
                (kv_write kc (rope (rms_norm kh kn norm:1e-6) pos rope:10000.0:8) pos)
                (kv_write vc vh pos) pos scale:0.35355338)"
    => "(attn_block qh kh vh kc vc pos (norm qn norm:1e-6) (norm kn norm:1e-6) rope:10000.0:8 scale:0.35355338)");
rule_test!(should_fuse_rope_kv_write_and_attention_without_norms:
    "(attention (rope qh pos rope:10000.0:8) (kv_write kc (rope kh pos rope:10000.0:8) pos)
                (kv_write vc vh pos) pos scale:0.35355338)"
    => "(attn_block qh kh vh kc vc pos nonorm nonorm rope:10000.0:8 scale:0.35355338)");

/// The rule tests' leaves, plus Qwen3-Next's q projection of 4 heads of 8 (`qg`, each row a
/// head's q then its output gate, and `qo`, another) and its column slices (`slice#N`).
fn gated_env() -> FuseAnalysis {
    use vkfuse_compiler::ir::OpKind;
    let mut a = env();
    for (i, name) in ["qg", "qo"].into_iter().enumerate() {
        let info = LeafInfo {
            ty: Type::f32([4, 16]),
            kind: LeafKind::Value,
            order: 100 + i,
            state: None,
        };
        a.leaves.insert(name.into(), info);
    }
    let slice = |start, end| OpKind::Slice {
        axis: 1,
        start,
        end,
    };
    for (sym, op) in [("slice#1", slice(0, 8)), ("slice#2", slice(8, 16))] {
        a.others.insert(sym.into(), Type::f32([4, 8]));
        a.other_ops.insert(sym.into(), op);
    }
    a
}

/// The gated block's attention over q = `q`, times sigmoid(`gate`).
fn gated_attention(q: &str, gate: &str) -> String {
    format!(
        "(mul (attention (rope (rms_norm {q} qn norm:1e-6) pos rope:10000.0:8)
                         (kv_write kc (rope (rms_norm kh kn norm:1e-6) pos rope:10000.0:8) pos)
                         (kv_write vc vh pos) pos scale:0.35355338)
              (sigmoid {gate}))"
    )
}

// attn_block(x[:, :d], ..) * sigmoid(x[:, d:2d]) == attn_gated(x, ..)
#[test]
fn should_read_q_and_the_output_gate_from_one_projection_in_the_block() {
    rewrites_in(
        gated_env,
        &[&gated_attention("(slice#1 qg)", "(slice#2 qg)")],
        &["(attn_gated qg kh vh kc vc pos (norm qn norm:1e-6) (norm kn norm:1e-6) rope:10000.0:8 scale:0.35355338)"],
    );
}

#[test]
fn should_refuse_a_gate_that_is_not_the_other_half_of_q_s_rows() {
    for (q, gate) in [
        // The halves swapped: q would be read from the gate's columns.
        ("(slice#2 qg)", "(slice#1 qg)"),
        // The gate from another projection.
        ("(slice#1 qg)", "(slice#2 qo)"),
    ] {
        let (g, roots) = saturated_in(gated_env(), &[&gated_attention(q, gate)]);
        let ex = extract(&g, &roots, &DeviceCost::default());
        let got = chosen(&g, &ex, roots[0]);
        assert!(!got.contains("attn_gated"), "{q}, {gate}: `{got}`");
        assert_refused(&g, "attention-block-gated", "two halves of one projection");
    }
}

// (e) the tail
rule_test!(should_write_the_argmax_and_the_position_in_one_dispatch:
    ["(write_state tok (argmax logits))", "(write_state posst (increment pos))"]
    => ["(fx0 (tail_step tok logits posst pos))", "(fx1 (tail_step tok logits posst pos))"]);
rule_test!(should_write_the_argmax_straight_into_the_token:
    "(write_state tok (argmax logits))" => "(argmax_write tok logits)");

// (f) elementwise chains
rule_test!(should_fuse_an_elementwise_chain_into_one_kernel:
    "(mul (neg (exp alog)) (softplus (add b4 dt)))"
    => "(ewk (e.mul (e.neg (e.exp in0)) (e.softplus (e.add in1 in2))) (cons alog (cons b4 (cons dt nil))))");
rule_test!(should_read_a_shared_input_once_in_a_fused_chain:
    "(mul (sigmoid b4) (silu b4))"
    => "(ewk (e.mul (e.sigmoid in0) (e.silu in0)) (cons b4 nil))");
rule_test!(should_broadcast_a_scalar_in_an_elementwise_chain:
    "(div (exp c4) (add r1 (sigmoid r1)))"
    => "(ewk (e.div (e.exp in0) (e.add in1 (e.sigmoid in1))) (cons c4 (cons r1 nil)))");

#[test]
fn should_refuse_an_elementwise_kernel_for_a_broadcast_over_rows() {
    stays(
        &["(mul (silu m2) col)"],
        "elementwise-mul",
        "broadcast over rows",
    );
}

// (g) state updates in place
rule_test!(should_update_the_recurrent_state_in_place:
    ["(write_state rs (delta_rule_update rsv kr vr b4 c4))", "(delta_rule_update rsv kr vr b4 c4)"]
    => ["(fx0 (update_in_place rs rsv kr vr b4 c4))",
        "(state_after (update_in_place rs rsv kr vr b4 c4))"]);

#[test]
fn should_not_update_in_place_a_state_read_elsewhere() {
    stays(
        &[
            "(write_state rs (delta_rule_update rsv kr vr b4 c4))",
            "(delta_rule_update rsv kr vr b4 c4)",
            "(exp rsv)",
        ],
        "update-state-in-place",
        "read by another op",
    );
}

// (h) the linear-attention step

/// The rule tests' leaves, plus a Gated DeltaNet layer's (1 key head, 2 value heads of 2x2,
/// conv kernel 4) and the ops of its step that no other rule looks at (`kind#N`).
fn gdn_env() -> FuseAnalysis {
    use vkfuse_compiler::ir::{F32Attr, OpKind};
    let mut a = env();
    let bf = |d: &[usize]| Type::new(DType::BF16, d.to_vec());
    let leaves = [
        ("xp", Type::f32([12]), LeafKind::Value, None),
        ("bap", Type::f32([4]), LeafKind::Value, None),
        ("ccs", Type::f32([8, 3]), LeafKind::StateValue, Some(5)),
        ("ccst", Type::f32([8, 3]), LeafKind::State, Some(5)),
        ("ccw", bf(&[8, 4]), LeafKind::Weight, None),
        ("rsg", Type::f32([2, 2, 2]), LeafKind::StateValue, Some(6)),
        ("rsgs", Type::f32([2, 2, 2]), LeafKind::State, Some(6)),
        ("gnw", bf(&[2]), LeafKind::Weight, None),
        ("al", bf(&[2]), LeafKind::Weight, None),
        ("dtb", bf(&[2]), LeafKind::Weight, None),
    ];
    for (i, (name, ty, kind, state)) in leaves.into_iter().enumerate() {
        let order = 100 + i;
        let info = LeafInfo {
            ty,
            kind,
            order,
            state,
        };
        a.leaves.insert(name.into(), info);
    }
    let slice = |axis, start, end| OpKind::Slice { axis, start, end };
    let eps = F32Attr(1e-6);
    let others = [
        ("slice#1", Type::f32([1, 2]), slice(1, 0, 2)),
        ("slice#2", Type::f32([1, 2]), slice(1, 2, 4)),
        ("slice#3", Type::f32([1, 4]), slice(1, 4, 8)),
        ("slice#4", Type::f32([1, 4]), slice(1, 8, 12)),
        ("concat#5", Type::f32([4]), OpKind::Concat { axis: 0 }),
        ("concat#6", Type::f32([8]), OpKind::Concat { axis: 0 }),
        ("causal_conv1d#7", Type::f32([8]), OpKind::CausalConv1d),
        ("slice#8", Type::f32([2]), slice(0, 0, 2)),
        ("slice#9", Type::f32([2]), slice(0, 2, 4)),
        ("slice#10", Type::f32([4]), slice(0, 4, 8)),
        ("l2_norm#11", Type::f32([1, 2]), OpKind::L2Norm { eps }),
        ("l2_norm#12", Type::f32([1, 2]), OpKind::L2Norm { eps }),
        ("slice#13", Type::f32([1, 2]), slice(1, 0, 2)),
        ("slice#14", Type::f32([1, 2]), slice(1, 2, 4)),
        ("conv_shift#15", Type::f32([8, 3]), OpKind::ConvShift),
        (
            "delta_rule_readout#16",
            Type::f32([2, 2]),
            OpKind::DeltaRuleReadout {
                scale: F32Attr(0.5),
            },
        ),
        (
            "gated_rms_norm#17",
            Type::f32([2, 2]),
            OpKind::GatedRmsNorm { eps },
        ),
    ];
    for (sym, ty, op) in others {
        a.others.insert(sym.into(), ty);
        a.other_ops.insert(sym.into(), op);
    }
    a
}

/// The step as the trace writes it: conv state written, recurrent state written, the output.
const GDN_BEFORE: [&str; 3] = [
    "(write_state ccst (conv_shift#15 ccs (concat#6 (concat#5 (reshape (slice#1 (reshape xp shape:1x12)) shape:2) (reshape (slice#2 (reshape xp shape:1x12)) shape:2)) (reshape (slice#3 (reshape xp shape:1x12)) shape:4))))",
    "(write_state rsgs (delta_rule_update rsg (l2_norm#12 (reshape (slice#9 (silu (causal_conv1d#7 ccs (concat#6 (concat#5 (reshape (slice#1 (reshape xp shape:1x12)) shape:2) (reshape (slice#2 (reshape xp shape:1x12)) shape:2)) (reshape (slice#3 (reshape xp shape:1x12)) shape:4)) ccw))) shape:1x2)) (reshape (slice#10 (silu (causal_conv1d#7 ccs (concat#6 (concat#5 (reshape (slice#1 (reshape xp shape:1x12)) shape:2) (reshape (slice#2 (reshape xp shape:1x12)) shape:2)) (reshape (slice#3 (reshape xp shape:1x12)) shape:4)) ccw))) shape:2x2) (mul (neg (exp al)) (softplus (add (reshape (slice#14 (reshape bap shape:1x4)) shape:2) dtb))) (sigmoid (reshape (slice#13 (reshape bap shape:1x4)) shape:2))))",
    "(gated_rms_norm#17 (delta_rule_readout#16 (delta_rule_update rsg (l2_norm#12 (reshape (slice#9 (silu (causal_conv1d#7 ccs (concat#6 (concat#5 (reshape (slice#1 (reshape xp shape:1x12)) shape:2) (reshape (slice#2 (reshape xp shape:1x12)) shape:2)) (reshape (slice#3 (reshape xp shape:1x12)) shape:4)) ccw))) shape:1x2)) (reshape (slice#10 (silu (causal_conv1d#7 ccs (concat#6 (concat#5 (reshape (slice#1 (reshape xp shape:1x12)) shape:2) (reshape (slice#2 (reshape xp shape:1x12)) shape:2)) (reshape (slice#3 (reshape xp shape:1x12)) shape:4)) ccw))) shape:2x2) (mul (neg (exp al)) (softplus (add (reshape (slice#14 (reshape bap shape:1x4)) shape:2) dtb))) (sigmoid (reshape (slice#13 (reshape bap shape:1x4)) shape:2))) (l2_norm#11 (reshape (slice#8 (silu (causal_conv1d#7 ccs (concat#6 (concat#5 (reshape (slice#1 (reshape xp shape:1x12)) shape:2) (reshape (slice#2 (reshape xp shape:1x12)) shape:2)) (reshape (slice#3 (reshape xp shape:1x12)) shape:4)) ccw))) shape:1x2))) (reshape (slice#4 (reshape xp shape:1x12)) shape:2x2) gnw)",
];

/// One kernel: the gates' expressions and where their inputs sit (`h`: per value head; `4.2.2`:
/// columns 2.. of a 4-wide row per key head, 2 value heads each) are part of it.
const GDN_KERNEL: &str = "(gdn_step xp ccs ccw ccst rsg rsgs gnw (e.mul (e.neg (e.exp in0)) (e.softplus (e.add in1 in2))) (cons al (cons bap (cons dtb nil))) (e.sigmoid in0) (cons bap nil) gdn:12:0:2:4:8:1e-6:0.5:1e-6:h,4.2.2,h,4.0.2)";

#[test]
fn should_fuse_the_linear_attention_step_into_one_kernel() {
    let after = ["fx0", "fx1", "out"].map(|f| format!("({f} {GDN_KERNEL})"));
    let after: Vec<&str> = after.iter().map(String::as_str).collect();
    rewrites_in(gdn_env, &GDN_BEFORE, &after);
}

#[test]
fn should_not_fuse_a_linear_attention_step_whose_old_state_is_read_elsewhere() {
    let mut before = GDN_BEFORE.to_vec();
    before.push("(exp ccs)");
    let (g, roots) = saturated_in(gdn_env(), &before);
    let ex = extract(&g, &roots, &DeviceCost::default());
    assert!(!chosen(&g, &ex, roots[2]).contains("gdn_step"));
    let refusals = g.analysis.refusals.borrow();
    assert!(
        refusals
            .iter()
            .any(|r| r.rule == "linear-attention-step" && r.reason.contains("old state")),
        "{refusals:?}"
    );
}

// (i) the MoE router

/// The rule tests' leaves, plus 8 router logits and the router's ops (`kind#N`).
fn route_env() -> FuseAnalysis {
    use vkfuse_compiler::ir::OpKind;
    let mut a = env();
    let info = LeafInfo {
        ty: Type::f32([8]),
        kind: LeafKind::Value,
        order: 200,
        state: None,
    };
    a.leaves.insert("lg".into(), info);
    let others = [
        ("softmax#20", Type::f32([8]), OpKind::Softmax),
        ("top_k#21", Type::i32([2]), OpKind::TopK { k: 2 }),
        ("gather#22", Type::f32([2]), OpKind::Gather),
        ("sum#23", Type::f32([1]), OpKind::Sum { axis: 0 }),
    ];
    for (sym, ty, op) in others {
        a.others.insert(sym.into(), ty);
        a.other_ops.insert(sym.into(), op);
    }
    a
}

#[test]
fn should_route_top_k_experts_in_one_kernel() {
    rewrites_in(
        route_env,
        &[
            "(div (gather#22 (softmax#20 lg) (top_k#21 (softmax#20 lg))) (sum#23 (gather#22 (softmax#20 lg) (top_k#21 (softmax#20 lg)))))",
            "(top_k#21 (softmax#20 lg))",
        ],
        &["(out (route lg shape:2))", "(route_ids (route lg shape:2))"],
    );
}

// (j) the experts' weighted sum

/// The rule tests' leaves, plus 8 experts of [16 x 4] (down) and [4 x 16] (gate, up), 2 chosen,
/// and their ops (`kind#N`).
fn experts_env() -> FuseAnalysis {
    use vkfuse_compiler::ir::OpKind;
    let mut a = env();
    let leaves = [
        (
            "wstk",
            Type::new(DType::BF16, [8, 16, 4]),
            LeafKind::WeightStack,
        ),
        ("ids", Type::i32([2]), LeafKind::Value),
        ("mx", Type::f32([2, 4]), LeafKind::Value),
        ("wts", Type::f32([2]), LeafKind::Value),
        (
            "wgs",
            Type::new(DType::BF16, [8, 4, 16]),
            LeafKind::WeightStack,
        ),
        (
            "wus",
            Type::new(DType::BF16, [8, 4, 16]),
            LeafKind::WeightStack,
        ),
        ("xin", Type::f32([16]), LeafKind::Value),
    ];
    for (i, (name, ty, kind)) in leaves.into_iter().enumerate() {
        let info = LeafInfo {
            ty,
            kind,
            order: 300 + i,
            state: None,
        };
        a.leaves.insert(name.into(), info);
    }
    let others = [
        ("expert_matvec#30", Type::f32([2, 16]), OpKind::ExpertMatvec),
        ("sum#31", Type::f32([16]), OpKind::Sum { axis: 0 }),
        ("expert_matvec#32", Type::f32([2, 4]), OpKind::ExpertMatvec),
        ("expert_matvec#33", Type::f32([2, 4]), OpKind::ExpertMatvec),
    ];
    for (sym, ty, op) in others {
        a.others.insert(sym.into(), ty);
        a.other_ops.insert(sym.into(), op);
    }
    a
}

#[test]
fn should_weight_and_sum_the_experts_in_their_down_kernel() {
    rewrites_in(
        experts_env,
        &["(sum#31 (mul (expert_matvec#30 wstk ids mx) (reshape wts shape:2x1)))"],
        &["(expert_sum wstk ids mx wts)"],
    );
}

#[test]
fn should_compute_the_experts_swiglu_in_one_kernel() {
    rewrites_in(
        experts_env,
        &["(mul (silu (expert_matvec#32 wgs ids xin)) (expert_matvec#33 wus ids xin))"],
        &["(expert_glu wgs wus ids xin)"],
    );
}

/// [`experts_env`] with [`route_env`]'s router logits (8 of them, for the 8 experts).
fn routed_experts_env() -> FuseAnalysis {
    let mut a = experts_env();
    let lg = route_env().leaves.remove(&"lg".into()).expect("the logits");
    a.leaves.insert("lg".into(), lg);
    a
}

#[test]
fn should_route_in_the_expert_kernels_and_drop_the_router() {
    rewrites_in(
        routed_experts_env,
        &[
            "(expert_glu wgs wus (route_ids (route lg shape:2)) xin)",
            "(expert_sum wstk (route_ids (route lg shape:2)) mx (out (route lg shape:2)))",
        ],
        &[
            "(expert_glu_routed wgs wus lg shape:2 xin)",
            "(expert_sum_routed acc wstk lg shape:2 mx nil)",
        ],
    );
}

#[test]
fn should_add_the_shared_expert_and_the_residual_as_the_routed_sums_are_written() {
    // sum + shared, then residual + that (Qwen3-Next's MoE block): one kernel, in that order.
    let mut env = routed_experts_env();
    for (i, name) in ["shr", "res"].into_iter().enumerate() {
        let info = LeafInfo {
            ty: Type::f32([16]),
            kind: LeafKind::Value,
            order: 400 + i,
            state: None,
        };
        env.leaves.insert(name.into(), info);
    }
    let (g, roots) = saturated_in(
        env,
        &["(add res (add (expert_sum wstk (route_ids (route lg shape:2)) mx (out (route lg shape:2))) shr))"],
    );
    let ex = extract(&g, &roots, &DeviceCost::default());
    assert_eq!(
        chosen(&g, &ex, roots[0]),
        "(expert_sum_routed (e.add in1 (e.add acc in0)) wstk lg shape:2 mx (cons shr (cons res nil)))"
    );
}

#[test]
fn should_not_add_a_broadcast_row_into_the_routed_sums() {
    // An addend of another length than the sums' rows would broadcast: the kernel writes rows.
    let mut env = routed_experts_env();
    let info = LeafInfo {
        ty: Type::f32([2, 16]),
        kind: LeafKind::Value,
        order: 400,
        state: None,
    };
    env.leaves.insert("wide".into(), info);
    let (g, roots) = saturated_in(
        env,
        &["(add wide (expert_sum wstk (route_ids (route lg shape:2)) mx (out (route lg shape:2))))"],
    );
    let ex = extract(&g, &roots, &DeviceCost::default());
    assert!(!chosen(&g, &ex, roots[0]).contains("e.add"));
    assert_refused(&g, "fold-add-into-expert-sum", "would broadcast to [2,16]");
}

#[test]
fn should_not_route_an_expert_sum_whose_weights_come_from_another_router() {
    // The indices of one router and the weights of another: no one routing computes both.
    let (g, roots) = saturated_in(
        routed_experts_env(),
        &["(expert_sum wstk (route_ids (route lg shape:2)) mx (out (route lg shape:3)))"],
    );
    let ex = extract(&g, &roots, &DeviceCost::default());
    assert!(!chosen(&g, &ex, roots[0]).contains("routed"));
}

// ---------------------------------------------------------------------------------------------
// Whole programs.

fn fixture(name: &str) -> Program {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/models")
        .join(name);
    let model = import::load(&dir).unwrap();
    trace::trace(&model, &trace::TraceOptions::default()).unwrap()
}

fn toy3() -> Program {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/traces");
    let text = std::fs::read_to_string(dir.join("toy3.ir")).unwrap();
    vkfuse_compiler::ir::parse(&text).unwrap()
}

fn meta() -> Meta {
    Meta {
        architecture: "test".into(),
        eos_token_ids: vec![],
        tokenizer: None,
    }
}

#[test]
fn should_fuse_each_dense_layer_into_five_dispatches_and_zero_all_chains_in_one() {
    for (name, layers) in [("qwen3-tied", 2), ("qwen3-untied", 3), ("llama-gqa", 2)] {
        let p = fixture(name);
        let (s, r) = lower_fused(
            &p,
            &meta(),
            &mut SpirvCache::default(),
            &FuseOptions::default(),
        )
        .unwrap();
        s.validate().unwrap();
        assert_eq!(r.per_template(), vec![("T0".to_string(), 5, layers)]);
        // Level 0 holds the embedding and, where the MLP is chained (its hidden size a
        // multiple of 32: not llama-gqa's 200), the zeroing of every layer's chain output,
        // merged into one dispatch (fuse::zeros); after it every layer runs the same pipelines
        // in the same order, and the tail's argmax and position advance run in lm_head's
        // dispatch, which leaves the token state holding the argmax's key; level 1 (layer 0's
        // first) also sets that key back to zero (embedding, zeros, layers, the key's reset,
        // lm_head).
        let chained = usize::from(name != "llama-gqa");
        assert_eq!(
            s.dispatches.len(),
            5 * layers + 3 - chained * layers + chained,
            "{name}\n{r}"
        );
        assert_eq!(s.io.token_encoding, TokenEncoding::Key, "{name}");
        let reset = s.levels[1].end as usize - 1;
        assert_eq!(
            s.dispatches[reset].bindings,
            vec![s.io.token],
            "{name}: the key's reset"
        );
        let first = s.levels[0].end as usize;
        assert_eq!(first, 1 + chained, "{name}: level 0\n{r}");
        if chained == 1 {
            let zero = &s.dispatches[1];
            assert_eq!(
                zero.bindings.len(),
                layers,
                "{name}: one zeroed slice per layer"
            );
        }
        let per = 5 - chained;
        let ids: Vec<u32> = s.dispatches[first..]
            .iter()
            .enumerate()
            .filter(|&(i, _)| first + i != reset)
            .map(|(_, d)| d.kernel.0)
            .collect();
        for l in 1..layers {
            assert_eq!(ids[0..per], ids[per * l..per * (l + 1)], "{name} layer {l}");
        }
    }
}

/// `vkfuse bench --profile` times each fused kernel against the unfused dispatches of the ops
/// it names (`Dispatch::ops`): every op the unfused step of `p` dispatches must be named by
/// exactly one dispatch of `fused`, and a fused kernel names only ops of the trace. (Called by
/// `fused_program_snapshots`, which lowers the same programs: one fused lowering each.)
fn assert_each_unfused_op_named_once(name: &str, p: &Program, fused: &Schedule) {
    let plain = vkfuse_compiler::lower::lower(p, &meta(), &mut SpirvCache::default()).unwrap();
    for d in &plain.dispatches {
        assert_eq!(d.ops.len(), 1, "{name}: unfused `{}`", d.label);
    }
    let mut named = std::collections::HashMap::<u32, usize>::new();
    for d in &fused.dispatches {
        for &o in &d.ops {
            assert!(
                (o as usize) < p.ops.len(),
                "{name}: `{}` names op {o}",
                d.label
            );
            *named.entry(o).or_default() += 1;
        }
    }
    for d in &plain.dispatches {
        let o = d.ops[0];
        assert_eq!(
            named.get(&o),
            Some(&1),
            "{name}: op {o} (`{}`) in fused dispatches",
            d.label
        );
    }
    // The fused kernels name their ops.
    let mut fused_kernels = fused
        .dispatches
        .iter()
        .filter(|d| fused.kernels[d.kernel.index()].label.starts_with("fused_"))
        .peekable();
    assert!(fused_kernels.peek().is_some(), "{name}");
    assert!(fused_kernels.all(|d| !d.ops.is_empty()), "{name}");
}

#[test]
fn fused_program_snapshots() {
    for name in ["qwen3-tied", "qwen3-untied", "llama-gqa", "qwen3-next"] {
        let p = fixture(name);
        let (s, r) = lower_fused(
            &p,
            &meta(),
            &mut SpirvCache::default(),
            &FuseOptions::default(),
        )
        .unwrap();
        s.validate().unwrap();
        assert_each_unfused_op_named_once(name, &p, &s);
        insta::assert_snapshot!(format!("fused-{name}"), fusion_text(&s, &r));
    }
    let (s, r) = lower_fused(
        &toy3(),
        &meta(),
        &mut SpirvCache::default(),
        &FuseOptions::default(),
    )
    .unwrap();
    s.validate().unwrap();
    insta::assert_snapshot!("fused-toy3", fusion_text(&s, &r));
}

/// What a fusion snapshot holds: the templates and fused program (the report), the regions
/// (dispatches by dependency level, with their bindings) and the arena's buffer plan.
fn fusion_text(s: &Schedule, r: &FusionReport) -> String {
    let plan = r.plan.as_ref().expect("fusion plans the arena by default");
    format!("{r}\n{}\n{plan}", Regions(s))
}

#[test]
fn should_compile_the_same_schedule_twice() {
    let p = fixture("qwen3-next");
    let once = || {
        lower_fused(
            &p,
            &meta(),
            &mut SpirvCache::default(),
            &FuseOptions::default(),
        )
        .unwrap()
        .0
    };
    assert_eq!(once(), once());
}

#[test]
fn should_fuse_the_same_when_tensor_names_change() {
    let p = fixture("qwen3-tied");
    let mut q = p.clone();
    for op in &mut q.ops {
        if let OpKind::Weight { name } = &mut op.kind {
            *name = format!("renamed/{}", name.chars().rev().collect::<String>());
        }
    }
    let report = |p: &Program| {
        lower_fused(
            p,
            &meta(),
            &mut SpirvCache::default(),
            &FuseOptions::default(),
        )
        .unwrap()
        .1
        .to_string()
    };
    assert_eq!(report(&p), report(&q));
}

#[test]
#[ignore = "measures compile time of a model given by VKFUSE_MODEL"]
fn fusion_time_of_a_model() {
    let dir = std::env::var("VKFUSE_MODEL").expect("VKFUSE_MODEL=model dir");
    let model = import::load(Path::new(&dir)).unwrap();
    let p = trace::trace(&model, &trace::TraceOptions::default()).unwrap();
    let t = std::time::Instant::now();
    let f = vkfuse_compiler::fuse::fuse(&p, &FuseOptions::default()).unwrap();
    let fuse_time = t.elapsed();
    let t = std::time::Instant::now();
    let s = vkfuse_compiler::fuse::schedule::lower_units(
        &p,
        &meta(),
        &mut SpirvCache::default(),
        &FuseOptions::default(),
        &f,
    )
    .unwrap();
    eprintln!(
        "fuse {fuse_time:?}, lower {:?}: {} dispatches, {} levels",
        t.elapsed(),
        s.dispatches.len(),
        s.levels.len()
    );
}

// ---------------------------------------------------------------------------------------------
// Fused against unfused on the device, on shapes the fixtures do not have: scalar (unaligned)
// loads, f32/f16/bf16 weights, partial rope, zero-centred norms, 4-row workgroups, MHA and GQA.
// Unfused vs fused is the third oracle of DESIGN.md: same kernels' arithmetic up to the order
// fusion changes, so the logits agree to ~1e-6 and the greedy tokens exactly.

use std::borrow::Cow;
use std::collections::HashMap;
use vkfuse_compiler::import::layout;
use vkfuse_compiler::ir::{F32Attr, OpKind, StateKind, ValueId};
use vkfuse_runtime::session::{Eager, Loaded, TensorBytes};

/// The shape of a small dense model built op by op.
struct Shapes {
    dtype: DType,
    hidden: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    rot: usize,
    inter: usize,
    vocab: usize,
    layers: usize,
    qk_norm: bool,
    zero_centered: bool,
    /// KV slots, and the tokens run through both schedules (at most `capacity`).
    capacity: usize,
    tokens: usize,
}

/// A Llama/Qwen3-like decode step of `s`, as the dense tracer would emit it.
fn dense(s: &Shapes, weights: &mut Weights) -> Program {
    let mut p = Program::new();
    let token = p.add_state("token", StateKind::Token, Type::i32([1]));
    let position = p.add_state("position", StateKind::Position, Type::i32([1]));
    let mut caches = vec![];
    for l in 0..s.layers {
        let c = Type::f32([s.hkv, s.capacity, s.d]);
        caches.push((
            p.add_state(format!("k{l}"), StateKind::KvCache, c.clone()),
            p.add_state(format!("v{l}"), StateKind::KvCache, c),
        ));
    }
    let op =
        |p: &mut Program, kind: OpKind, args: &[ValueId]| p.value(kind, args.to_vec()).unwrap();
    let mut weight = |p: &mut Program, name: String, dims: &[usize], norm: bool| {
        weights.add(&name, s.dtype, dims, norm);
        let ty = Type::new(s.dtype, dims.to_vec());
        p.push(OpKind::Weight { name }, vec![], Some(ty))
            .unwrap()
            .unwrap()
    };
    let norm_kind = OpKind::RmsNorm {
        eps: F32Attr(1e-6),
        zero_centered: s.zero_centered,
    };
    let tok = op(&mut p, OpKind::ReadState { state: token }, &[]);
    let pos = op(&mut p, OpKind::ReadState { state: position }, &[]);
    let table = weight(&mut p, "embed".into(), &[s.vocab, s.hidden], false);
    let mut h = op(&mut p, OpKind::Embedding, &[table, tok]);
    let reshape = |p: &mut Program, x: ValueId, dims: &[usize]| {
        p.value(
            OpKind::Reshape {
                shape: vkfuse_compiler::ir::Shape::new(dims.to_vec()),
            },
            vec![x],
        )
        .unwrap()
    };
    let rope = OpKind::Rope {
        theta: F32Attr(10000.0),
        rotary_dim: s.rot,
    };
    for (l, (kc, vc)) in caches.iter().enumerate() {
        let w_in = weight(&mut p, format!("{l}.in"), &[s.hidden], true);
        let x = op(&mut p, norm_kind.clone(), &[h, w_in]);
        let wq = weight(&mut p, format!("{l}.q"), &[s.hq * s.d, s.hidden], false);
        let q = op(&mut p, OpKind::Matvec, &[wq, x]);
        let wk = weight(&mut p, format!("{l}.k"), &[s.hkv * s.d, s.hidden], false);
        let k = op(&mut p, OpKind::Matvec, &[wk, x]);
        let wv = weight(&mut p, format!("{l}.v"), &[s.hkv * s.d, s.hidden], false);
        let v = op(&mut p, OpKind::Matvec, &[wv, x]);
        let mut q = reshape(&mut p, q, &[s.hq, s.d]);
        let mut k = reshape(&mut p, k, &[s.hkv, s.d]);
        let v = reshape(&mut p, v, &[s.hkv, s.d]);
        if s.qk_norm {
            let qn = weight(&mut p, format!("{l}.qn"), &[s.d], true);
            q = op(&mut p, norm_kind.clone(), &[q, qn]);
            let kn = weight(&mut p, format!("{l}.kn"), &[s.d], true);
            k = op(&mut p, norm_kind.clone(), &[k, kn]);
        }
        let q = op(&mut p, rope.clone(), &[q, pos]);
        let k = op(&mut p, rope.clone(), &[k, pos]);
        let kw = op(&mut p, OpKind::KvWrite { state: *kc }, &[k, pos]);
        let vw = op(&mut p, OpKind::KvWrite { state: *vc }, &[v, pos]);
        let scale = F32Attr(1.0 / (s.d as f32).sqrt());
        let a = op(&mut p, OpKind::Attention { scale }, &[q, kw, vw, pos]);
        let a = reshape(&mut p, a, &[s.hq * s.d]);
        let wo = weight(&mut p, format!("{l}.o"), &[s.hidden, s.hq * s.d], false);
        let o = op(&mut p, OpKind::Matvec, &[wo, a]);
        h = op(&mut p, OpKind::Add, &[h, o]);
        let w_post = weight(&mut p, format!("{l}.post"), &[s.hidden], true);
        let x = op(&mut p, norm_kind.clone(), &[h, w_post]);
        let wg = weight(&mut p, format!("{l}.gate"), &[s.inter, s.hidden], false);
        let g = op(&mut p, OpKind::Matvec, &[wg, x]);
        let wu = weight(&mut p, format!("{l}.up"), &[s.inter, s.hidden], false);
        let u = op(&mut p, OpKind::Matvec, &[wu, x]);
        let g = op(&mut p, OpKind::Silu, &[g]);
        let m = op(&mut p, OpKind::Mul, &[g, u]);
        let wd = weight(&mut p, format!("{l}.down"), &[s.hidden, s.inter], false);
        let d = op(&mut p, OpKind::Matvec, &[wd, m]);
        h = op(&mut p, OpKind::Add, &[h, d]);
    }
    let w_final = weight(&mut p, "final".into(), &[s.hidden], true);
    let x = op(&mut p, norm_kind, &[h, w_final]);
    let lm = weight(&mut p, "lm_head".into(), &[s.vocab, s.hidden], false);
    let logits = op(&mut p, OpKind::Matvec, &[lm, x]);
    let next = op(&mut p, OpKind::Argmax, &[logits]);
    p.push(OpKind::WriteState { state: token }, vec![next], None)
        .unwrap();
    let pos1 = op(&mut p, OpKind::Increment, &[pos]);
    p.push(OpKind::WriteState { state: position }, vec![pos1], None)
        .unwrap();
    p.outputs.push(("logits".into(), logits));
    p.verify().unwrap();
    p
}

/// Deterministic random weights by name, with their dtype and shape (for the derived layouts
/// fused kernels ask for: `import::layout`).
#[derive(Default)]
struct Weights(HashMap<String, (DType, Vec<usize>, Vec<u8>)>, u64);

impl Weights {
    fn add(&mut self, name: &str, dtype: DType, dims: &[usize], norm: bool) {
        let n: usize = dims.iter().product();
        let scale = if norm {
            0.2
        } else {
            2.0 / (*dims.last().unwrap() as f32).sqrt()
        };
        let mut bytes = vec![];
        for _ in 0..n {
            self.1 = self
                .1
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = ((self.1 >> 40) as f32 / (1u64 << 24) as f32) - 0.5;
            let v = if norm { 1.0 + u * scale } else { u * scale };
            match dtype {
                DType::F32 => bytes.extend(v.to_le_bytes()),
                DType::F16 => bytes.extend(half::f16::from_f32(v).to_le_bytes()),
                DType::BF16 => bytes.extend(half::bf16::from_f32(v).to_le_bytes()),
                DType::I32 | DType::Q8_0 | DType::Q4_0 => {
                    unreachable!("checkpoint weights are floats")
                }
            }
        }
        self.0
            .insert(name.to_string(), (dtype, dims.to_vec(), bytes));
    }
}

impl TensorBytes for Weights {
    fn tensor_bytes(&self, tensor: &str) -> Result<Cow<'_, [u8]>, String> {
        if let Some(of) = layout::transposed_of(tensor) {
            let (dtype, dims, bytes) = self.0.get(of).ok_or_else(|| format!("no tensor {of}"))?;
            return layout::transpose(bytes, *dtype, dims[0], dims[1]).map(Cow::Owned);
        }
        self.0
            .get(tensor)
            .map(|(_, _, b)| Cow::Borrowed(b.as_slice()))
            .ok_or_else(|| format!("no tensor {tensor}"))
    }
}

fn run(eager: &mut Eager, tokens: &[u32]) -> Vec<(Vec<f32>, u32)> {
    tokens
        .iter()
        .map(|&t| {
            let o = eager.step(Some(t)).unwrap();
            (o.logits, o.next_token)
        })
        .collect()
}

fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
        .sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

/// Checks the fused schedule of `s` against the unfused one; by default it has 5 dispatches
/// per layer, the embedding, lm_head (which picks the token and advances the position) and the
/// reset of the token key lm_head leaves.
fn fused_equals_unfused(s: &Shapes) {
    fused_equals_unfused_with(s, &FuseOptions::default(), Some(5 * s.layers + 3));
}

fn fused_equals_unfused_with(s: &Shapes, opts: &FuseOptions, dispatches: Option<usize>) {
    use vkfuse_runtime::{Device, Instance, InstanceOptions, Requirements};
    let mut weights = Weights::default();
    let p = dense(s, &mut weights);
    let unfused = vkfuse_compiler::lower::lower(&p, &meta(), &mut SpirvCache::default()).unwrap();
    let (fused, report) = lower_fused(&p, &meta(), &mut SpirvCache::default(), opts).unwrap();
    if let Some(n) = dispatches {
        assert_eq!(fused.dispatches.len(), n, "dispatches:\n{report}");
    }
    eprintln!(
        "{} dispatches (unfused {})",
        fused.dispatches.len(),
        unfused.dispatches.len()
    );
    let instance = Instance::new(&InstanceOptions::validated()).unwrap();
    let log = instance.validation_log();
    {
        let adapter = instance.select_adapter(None).unwrap();
        let eager = |schedule| {
            let device = Device::new(&instance, &adapter, &Requirements::none()).unwrap();
            Eager::new(Loaded::new(device, schedule, &weights).unwrap()).unwrap()
        };
        let tokens: Vec<u32> = (0..s.tokens)
            .map(|i| (i * 7 + 3) as u32 % s.vocab as u32)
            .collect();
        let want = run(&mut eager(unfused), &tokens);
        let got = run(&mut eager(fused), &tokens);
        for (i, ((gl, gt), (wl, wt))) in got.iter().zip(&want).enumerate() {
            let e = rel_l2(gl, wl);
            assert!(e < 1e-5, "position {i}: relative L2 {e:.2e}");
            assert_eq!(gt, wt, "position {i}: next token");
        }
    }
    assert!(log.is_clean(), "validation errors:\n{}", log.report());
}

#[test]
fn should_match_unfused_with_f32_weights_and_partial_rope() {
    fused_equals_unfused(&Shapes {
        dtype: DType::F32,
        hidden: 20,
        hq: 3,
        hkv: 1,
        d: 12,
        rot: 8,
        inter: 36,
        vocab: 70,
        layers: 2,
        qk_norm: true,
        zero_centered: false,
        capacity: 16,
        tokens: 10,
    });
}

#[test]
fn should_match_unfused_with_unaligned_bf16_rows_and_a_wide_lm_head() {
    fused_equals_unfused(&Shapes {
        dtype: DType::BF16,
        hidden: 20,
        hq: 4,
        hkv: 2,
        d: 10,
        rot: 10,
        inter: 30,
        vocab: 4100,
        layers: 2,
        qk_norm: true,
        zero_centered: true,
        capacity: 16,
        tokens: 10,
    });
}

#[test]
fn should_stay_correct_when_saturation_stops_early() {
    // Whatever the limits cut, every extracted form is an equality: only fewer fusions.
    for iters in [1, 2, 3] {
        let opts = FuseOptions {
            iter_limit: iters,
            ..FuseOptions::default()
        };
        let shapes = Shapes {
            dtype: DType::BF16,
            hidden: 32,
            hq: 4,
            hkv: 2,
            d: 8,
            rot: 8,
            inter: 48,
            vocab: 60,
            layers: 2,
            qk_norm: true,
            zero_centered: false,
            capacity: 16,
            tokens: 10,
        };
        fused_equals_unfused_with(&shapes, &opts, None);
    }
}

#[test]
fn should_match_unfused_with_a_vocabulary_past_the_unrolled_argmax() {
    // 40000 logits: the argmax folded into lm_head runs over 10000 workgroups (4 rows each)
    // and every one of its 64 buckets, against the unfused argmax kernel (the fixtures'
    // vocabularies fill a few dozen workgroups).
    fused_equals_unfused(&Shapes {
        dtype: DType::BF16,
        hidden: 16,
        hq: 2,
        hkv: 1,
        d: 8,
        rot: 8,
        inter: 24,
        vocab: 40000,
        layers: 1,
        qk_norm: true,
        zero_centered: false,
        capacity: 16,
        tokens: 10,
    });
}

#[test]
fn should_match_unfused_past_one_attention_tile() {
    // 300 positions take the attention block through the running max and sum carried from one
    // score tile to the next (16 slots at this head of 8), which the fixtures' ~30 positions
    // barely reach. Unsplit: this head's cache is far below a split's worth of bytes.
    fused_equals_unfused(&Shapes {
        dtype: DType::BF16,
        hidden: 32,
        hq: 4,
        hkv: 2,
        d: 8,
        rot: 8,
        inter: 48,
        vocab: 60,
        layers: 1,
        qk_norm: true,
        zero_centered: false,
        capacity: 320,
        tokens: 300,
    });
}

/// Two small layers over a 100-slot cache, `tokens` steps: enough positions for three splits
/// of 32+ slots.
fn split_shapes(tokens: usize) -> Shapes {
    Shapes {
        dtype: DType::BF16,
        hidden: 32,
        hq: 4,
        hkv: 2,
        d: 8,
        rot: 8,
        inter: 48,
        vocab: 60,
        layers: 2,
        qk_norm: true,
        zero_centered: false,
        capacity: 100,
        tokens,
    }
}

#[test]
fn should_match_unfused_with_the_attention_split_over_the_context() {
    // Three splits forced, 100 steps on the same state buffer: one split up to 32 positions, two,
    // then three; chunks past the 16-slot tiles of a head of 8. Every step is checked, so a
    // counter left non-zero by a step (combining too early in the next) fails here.
    let opts = FuseOptions {
        attention_splits: Some(3),
        ..FuseOptions::default()
    };
    let shapes = split_shapes(100);
    fused_equals_unfused_with(&shapes, &opts, Some(5 * shapes.layers + 3));
}

#[test]
fn should_replay_a_split_attention_block_as_eager_and_chain_alike() {
    // Replay records the split block once: its logits are eager's bit for bit over 90 steps
    // (the combine's order does not depend on which split arrives last), and greedy chains of
    // K = 8 steps per submit give K = 1's tokens (counters stay clean inside one submit).
    use vkfuse_runtime::session::Replay;
    use vkfuse_runtime::{Device, Instance, InstanceOptions, Requirements};
    let shapes = split_shapes(90);
    let opts = FuseOptions {
        attention_splits: Some(3),
        ..FuseOptions::default()
    };
    let mut weights = Weights::default();
    let p = dense(&shapes, &mut weights);
    let (fused, _) = lower_fused(&p, &meta(), &mut SpirvCache::default(), &opts).unwrap();
    let instance = Instance::new(&InstanceOptions::validated()).unwrap();
    let log = instance.validation_log();
    {
        let adapter = instance.select_adapter(None).unwrap();
        let device = Device::new(&instance, &adapter, &Requirements::none()).unwrap();
        let load = |s| Loaded::new(device.clone(), s, &weights).unwrap();
        let mut eager = Eager::new(load(fused.clone())).unwrap();
        let mut replay = Replay::new(load(fused)).unwrap();
        for i in 0..shapes.tokens {
            let t = (i * 7 + 3) as u32 % shapes.vocab as u32;
            let e = eager.step(Some(t)).unwrap();
            let r = replay.step(Some(t)).unwrap();
            assert_eq!(
                r.logits, e.logits,
                "position {i}: replay differs from eager"
            );
        }
        let greedy = |replay: &mut Replay, k: u32| {
            replay.reset().unwrap();
            let first = replay.step(Some(5)).unwrap().next_token;
            replay.greedy_tokens(Some(first), 80, k).unwrap()
        };
        let one = greedy(&mut replay, 1);
        assert_eq!(
            greedy(&mut replay, 8),
            one,
            "K = 8 tokens differ from K = 1"
        );
    }
    assert!(log.is_clean(), "validation errors:\n{}", log.report());
}

// The MLP chained (gate/up then down in one kernel, the down weights transposed at compile
// time): f32 weights read 16 bytes per act row and chunk, 16-bit ones 8 (the fixtures).
#[test]
fn should_match_unfused_with_a_chained_f32_mlp() {
    let s = Shapes {
        dtype: DType::F32,
        hidden: 24,
        hq: 2,
        hkv: 1,
        d: 8,
        rot: 8,
        inter: 64,
        vocab: 40,
        layers: 2,
        qk_norm: true,
        zero_centered: false,
        capacity: 16,
        tokens: 8,
    };
    // 4 dispatches per layer, the zeroing of both chains' outputs, embedding, lm_head and the
    // token key's reset.
    fused_equals_unfused_with(&s, &FuseOptions::default(), Some(4 * s.layers + 4));
}

#[test]
fn should_match_unfused_with_f16_multi_head_attention_without_qk_norm() {
    fused_equals_unfused(&Shapes {
        dtype: DType::F16,
        hidden: 64,
        hq: 8,
        hkv: 8,
        d: 8,
        rot: 4,
        inter: 72,
        vocab: 50,
        layers: 3,
        qk_norm: false,
        zero_centered: false,
        capacity: 16,
        tokens: 10,
    });
}

#[test]
#[ignore = "runs the model given by VKFUSE_MODEL fused and unfused on the default device"]
fn fused_matches_unfused_on_a_model() {
    use vkfuse_runtime::{Device, Instance, InstanceOptions, Requirements};
    let dir = std::env::var("VKFUSE_MODEL").expect("VKFUSE_MODEL=model dir");
    let model = import::load(Path::new(&dir)).unwrap();
    let p = trace::trace(
        &model,
        &trace::TraceOptions {
            max_context: Some(512),
            ..Default::default()
        },
    )
    .unwrap();
    let unfused = vkfuse_compiler::lower::lower(&p, &meta(), &mut SpirvCache::default()).unwrap();
    let t = std::time::Instant::now();
    let (fused, report) = lower_fused(
        &p,
        &meta(),
        &mut SpirvCache::default(),
        &FuseOptions::default(),
    )
    .unwrap();
    eprintln!("lower_fused {:?}\n{report}", t.elapsed());
    let instance = Instance::new(&InstanceOptions::validated()).unwrap();
    let log = instance.validation_log();
    {
        let adapter = instance.select_adapter(None).unwrap();
        let eager = |schedule| {
            let device = Device::new(&instance, &adapter, &Requirements::none()).unwrap();
            Eager::new(Loaded::new(device, schedule, &model.tensors).unwrap()).unwrap()
        };
        let tokens: Vec<u32> = (0..40).map(|i| (i * 7919 + 3) as u32 % 150_000).collect();
        for (name, schedule) in [("unfused", unfused), ("fused", fused)] {
            let mut e = eager(schedule);
            let out = run(&mut e, &tokens);
            let ns = e.gpu_ns().unwrap_or(0.0) / tokens.len() as f64;
            eprintln!(
                "{name}: {} dispatches, {:.1} GPU µs/token (eager)",
                e.loaded().schedule.dispatches.len(),
                ns / 1e3
            );
            std::fs::write(
                format!("/tmp/logits-{name}.bin"),
                out.iter()
                    .flat_map(|(l, t)| {
                        l.iter()
                            .flat_map(|x| x.to_le_bytes())
                            .chain((*t as f32).to_le_bytes())
                    })
                    .collect::<Vec<u8>>(),
            )
            .unwrap();
        }
        let read = |name: &str| -> Vec<f32> {
            std::fs::read(format!("/tmp/logits-{name}.bin"))
                .unwrap()
                .chunks(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        };
        let (a, b) = (read("fused"), read("unfused"));
        let row = a.len() / tokens.len();
        let mut worst: f64 = 0.0;
        for i in 0..tokens.len() {
            let (ra, rb) = (&a[i * row..(i + 1) * row], &b[i * row..(i + 1) * row]);
            worst = worst.max(rel_l2(&ra[..row - 1], &rb[..row - 1]));
            assert_eq!(ra[row - 1], rb[row - 1], "position {i}: next token");
        }
        eprintln!(
            "fused vs unfused: worst relative L2 {worst:.2e} over {} positions",
            tokens.len()
        );
        assert!(worst < 1e-4);
    }
    assert!(log.is_clean(), "validation errors:\n{}", log.report());
}
