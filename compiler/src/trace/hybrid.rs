//! Qwen3-Next: Gated DeltaNet (linear attention) layers and gated full-attention layers, each
//! followed by a sparse MoE block with a shared expert. Norms are zero-centred (`x̂·(1+w)`),
//! except the gated norm on the DeltaNet output. Layouts follow transformers'
//! `modeling_qwen3_next.py` (head-grouped `in_proj_qkvz` / `in_proj_ba`).

use super::builder::Tracer;
use super::TraceError;
use crate::import::{HybridConfig, LayerType, ModelConfig};
use crate::ir::{F32Attr, OpKind, StateKind, Type, ValueId};

type R<T> = Result<T, TraceError>;

pub fn trace(t: &mut Tracer<'_>) -> R<()> {
    let c = t.model.config.clone();
    let hy = c
        .hybrid
        .clone()
        .expect("the importer fills `hybrid` for Qwen3Next");
    let mut h = t.head()?;
    for layer in 0..c.num_layers {
        let pre = format!("model.layers.{layer}");
        let x = t.rms_norm(h, &format!("{pre}.input_layernorm.weight"), true)?;
        let a = match hy.layer_types[layer] {
            LayerType::LinearAttention => {
                gated_delta_net(t, &c, &hy, &format!("{pre}.linear_attn"), x)?
            }
            LayerType::FullAttention => gated_attention(t, &c, &format!("{pre}.self_attn"), x)?,
        };
        h = t.add(h, a)?;
        let x = t.rms_norm(h, &format!("{pre}.post_attention_layernorm.weight"), true)?;
        let m = if hy.is_moe_layer(layer) {
            sparse_moe(t, &hy, &format!("{pre}.mlp"), x)?
        } else {
            t.swiglu_mlp(&format!("{pre}.mlp"), x, c.intermediate_size, false, None)?
        };
        h = t.add(h, m)?;
    }
    t.tail(h, true)
}

/// Full attention with a sigmoid output gate: `q_proj` yields `[q_h | gate_h]` per head.
fn gated_attention(t: &mut Tracer<'_>, c: &ModelConfig, pre: &str, x: ValueId) -> R<ValueId> {
    let (hq, hkv, d) = (c.num_attention_heads, c.num_kv_heads, c.head_dim);
    let qg = t.linear(&format!("{pre}.q_proj"), x, hq * d * 2, c.attention_bias)?;
    let qg = t.reshape(qg, &[hq, 2 * d])?;
    let q = t.slice(qg, 1, 0, d)?;
    let gate = t.slice(qg, 1, d, 2 * d)?;
    let k = t.linear(&format!("{pre}.k_proj"), x, hkv * d, c.attention_bias)?;
    let v = t.linear(&format!("{pre}.v_proj"), x, hkv * d, c.attention_bias)?;
    let k = t.reshape(k, &[hkv, d])?;
    let v = t.reshape(v, &[hkv, d])?;
    let q = t.rms_norm(q, &format!("{pre}.q_norm.weight"), true)?;
    let k = t.rms_norm(k, &format!("{pre}.k_norm.weight"), true)?;
    let q = t.rope(q)?;
    let k = t.rope(k)?;
    let a = t.attention(q, k, v)?;
    let g = t.op(OpKind::Sigmoid, &[gate])?;
    let a = t.op(OpKind::Mul, &[a, g])?;
    let a = t.reshape(a, &[hq * d])?;
    t.linear(&format!("{pre}.o_proj"), a, c.hidden_size, c.attention_bias)
}

/// One decode step of Gated DeltaNet: projections, causal conv update with its state, q/k
/// l2-norm, the gated delta rule on the recurrent state, gated RMSNorm, out_proj.
fn gated_delta_net(
    t: &mut Tracer<'_>,
    c: &ModelConfig,
    hy: &HybridConfig,
    pre: &str,
    x: ValueId,
) -> R<ValueId> {
    let (hk, hv) = (hy.linear_num_key_heads, hy.linear_num_value_heads);
    let (dk, dv, kern) = (
        hy.linear_key_head_dim,
        hy.linear_value_head_dim,
        hy.linear_conv_kernel_dim,
    );
    let r = hv / hk;
    let (key_dim, value_dim) = (hk * dk, hv * dv);
    let conv_dim = 2 * key_dim + value_dim;
    let group = 2 * dk + 2 * r * dv;

    // Projections, grouped per key head: [q_g | k_g | v (r heads) | z (r heads)] and [b (r) | a (r)].
    let qkvz = t.linear(&format!("{pre}.in_proj_qkvz"), x, hk * group, false)?;
    let ba = t.linear(&format!("{pre}.in_proj_ba"), x, 2 * hv, false)?;
    let qkvz = t.reshape(qkvz, &[hk, group])?;
    let q = t.slice(qkvz, 1, 0, dk)?;
    let k = t.slice(qkvz, 1, dk, 2 * dk)?;
    let v = t.slice(qkvz, 1, 2 * dk, 2 * dk + r * dv)?;
    let z = t.slice(qkvz, 1, 2 * dk + r * dv, group)?;
    let ba = t.reshape(ba, &[hk, 2 * r])?;
    let b = t.slice(ba, 1, 0, r)?;
    let a = t.slice(ba, 1, r, 2 * r)?;

    // Causal conv over the channels [q (all heads) | k | v], then silu.
    let q = t.reshape(q, &[key_dim])?;
    let k = t.reshape(k, &[key_dim])?;
    let v = t.reshape(v, &[value_dim])?;
    let qk = t.op(OpKind::Concat { axis: 0 }, &[q, k])?;
    let mixed = t.op(OpKind::Concat { axis: 0 }, &[qk, v])?;
    let n =
        t.p.states
            .iter()
            .filter(|s| s.kind == StateKind::Conv)
            .count();
    let conv_state = t.state(
        format!("conv_state_{n}"),
        StateKind::Conv,
        Type::f32([conv_dim, kern - 1]),
    );
    let cs = t.op(OpKind::ReadState { state: conv_state }, &[])?;
    let w = t.weight(&format!("{pre}.conv1d.weight"), &[conv_dim, 1, kern])?;
    let w = t.reshape(w, &[conv_dim, kern])?;
    let conv = t.op(OpKind::CausalConv1d, &[cs, mixed, w])?;
    let shifted = t.op(OpKind::ConvShift, &[cs, mixed])?;
    t.p.push(
        OpKind::WriteState { state: conv_state },
        vec![shifted],
        None,
    )?;
    let conv = t.op(OpKind::Silu, &[conv])?;
    let q = t.slice(conv, 0, 0, key_dim)?;
    let k = t.slice(conv, 0, key_dim, 2 * key_dim)?;
    let v = t.slice(conv, 0, 2 * key_dim, conv_dim)?;
    let q = t.reshape(q, &[hk, dk])?;
    let k = t.reshape(k, &[hk, dk])?;
    let v = t.reshape(v, &[hv, dv])?;
    let eps = F32Attr(1e-6);
    let q = t.op(OpKind::L2Norm { eps }, &[q])?;
    let k = t.op(OpKind::L2Norm { eps }, &[k])?;

    // Gates: beta = sigmoid(b); g = -exp(A_log) * softplus(a + dt_bias).
    let b = t.reshape(b, &[hv])?;
    let beta = t.op(OpKind::Sigmoid, &[b])?;
    let a = t.reshape(a, &[hv])?;
    let a_log = t.weight(&format!("{pre}.A_log"), &[hv])?;
    let dt_bias = t.weight(&format!("{pre}.dt_bias"), &[hv])?;
    let decay = t.op(OpKind::Exp, &[a_log])?;
    let decay = t.op(OpKind::Neg, &[decay])?;
    let a = t.op(OpKind::Add, &[a, dt_bias])?;
    let a = t.op(OpKind::Softplus, &[a])?;
    let g = t.op(OpKind::Mul, &[decay, a])?;

    // The gated delta rule on the recurrent state [hv, dk, dv].
    let n =
        t.p.states
            .iter()
            .filter(|s| s.kind == StateKind::Recurrent)
            .count();
    let rec = t.state(
        format!("recurrent_state_{n}"),
        StateKind::Recurrent,
        Type::f32([hv, dk, dv]),
    );
    let s = t.op(OpKind::ReadState { state: rec }, &[])?;
    let s = t.op(OpKind::DeltaRuleUpdate, &[s, k, v, g, beta])?;
    t.p.push(OpKind::WriteState { state: rec }, vec![s], None)?;
    let scale = F32Attr(1.0 / (dk as f32).sqrt());
    let o = t.op(OpKind::DeltaRuleReadout { scale }, &[s, q])?;

    // Gated RMSNorm per value head with silu(z), then out_proj.
    let z = t.reshape(z, &[hv, dv])?;
    let nw = t.weight(&format!("{pre}.norm.weight"), &[dv])?;
    let eps = F32Attr(c.rms_norm_eps);
    let y = t.op(OpKind::GatedRmsNorm { eps }, &[o, z, nw])?;
    let y = t.reshape(y, &[value_dim])?;
    t.linear(&format!("{pre}.out_proj"), y, c.hidden_size, false)
}

/// Sparse MoE: softmax router over all experts, top-k (renormalised if `norm_topk_prob`),
/// experts chosen on the device by index, plus a shared expert behind a sigmoid gate.
fn sparse_moe(t: &mut Tracer<'_>, hy: &HybridConfig, pre: &str, x: ValueId) -> R<ValueId> {
    let hidden = t.p.ty(x).shape.numel();
    let (e, k, inter) = (
        hy.num_experts,
        hy.num_experts_per_tok,
        hy.moe_intermediate_size,
    );
    let logits = t.linear(&format!("{pre}.gate"), x, e, false)?;
    let probs = t.op(OpKind::Softmax, &[logits])?;
    let idx = t.op(OpKind::TopK { k }, &[probs])?;
    let mut w = t.op(OpKind::Gather, &[probs, idx])?;
    if hy.norm_topk_prob {
        let total = t.op(OpKind::Sum { axis: 0 }, &[w])?;
        w = t.op(OpKind::Div, &[w, total])?;
    }
    let wg = t.weight_stack(
        &format!("{pre}.experts.{{}}.gate_proj.weight"),
        e,
        &[inter, hidden],
    )?;
    let wu = t.weight_stack(
        &format!("{pre}.experts.{{}}.up_proj.weight"),
        e,
        &[inter, hidden],
    )?;
    let wd = t.weight_stack(
        &format!("{pre}.experts.{{}}.down_proj.weight"),
        e,
        &[hidden, inter],
    )?;
    let g = t.op(OpKind::ExpertMatvec, &[wg, idx, x])?;
    let u = t.op(OpKind::ExpertMatvec, &[wu, idx, x])?;
    let g = t.op(OpKind::Silu, &[g])?;
    let m = t.op(OpKind::Mul, &[g, u])?;
    let d = t.op(OpKind::ExpertMatvec, &[wd, idx, m])?;
    let w = t.reshape(w, &[k, 1])?;
    let d = t.op(OpKind::Mul, &[d, w])?;
    let routed = t.op(OpKind::Sum { axis: 0 }, &[d])?;

    let shared = t.swiglu_mlp(
        &format!("{pre}.shared_expert"),
        x,
        hy.shared_expert_intermediate_size,
        false,
        None,
    )?;
    let sg = t.linear(&format!("{pre}.shared_expert_gate"), x, 1, false)?;
    let sg = t.op(OpKind::Sigmoid, &[sg])?;
    let shared = t.op(OpKind::Mul, &[shared, sg])?;
    t.add(routed, shared)
}
