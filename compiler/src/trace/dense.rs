//! Llama and Qwen3: pre-norm decoder layers of GQA attention and a SwiGLU MLP.
//! Qwen3 adds a per-head RMSNorm on q and k before RoPE.

use super::builder::Tracer;
use super::TraceError;
use crate::import::{Family, RopeScaling};
use crate::ir::OpKind;

pub fn trace(t: &mut Tracer<'_>) -> Result<(), TraceError> {
    let c = t.model.config.clone();
    if c.rope.scaling != RopeScaling::None {
        return Err(crate::import::ImportError::Unsupported {
            file: t.model.dir.join("config.json"),
            // config.json names it in `rope_scaling` or in `rope_parameters`.
            field: "rope_type".into(),
            message: format!(
                "{}: scaled RoPE is not supported yet; vkfuse decodes the default RoPE only",
                c.rope
            ),
        }
        .into());
    }
    let (hq, hkv, d) = (c.num_attention_heads, c.num_kv_heads, c.head_dim);
    let qk_norm = c.family == Family::Qwen3;
    let mut h = t.head()?;
    for layer in 0..c.num_layers {
        let pre = format!("model.layers.{layer}");
        let norm = format!("{pre}.input_layernorm.weight");
        let (x, fold) = t.pre_norm(h, &norm)?;
        let q = t.linear_folded(
            &format!("{pre}.self_attn.q_proj"),
            x,
            hq * d,
            c.attention_bias,
            fold,
        )?;
        let k = t.linear_folded(
            &format!("{pre}.self_attn.k_proj"),
            x,
            hkv * d,
            c.attention_bias,
            fold,
        )?;
        let v = t.linear_folded(
            &format!("{pre}.self_attn.v_proj"),
            x,
            hkv * d,
            c.attention_bias,
            fold,
        )?;
        let mut q = t.reshape(q, &[hq, d])?;
        let mut k = t.reshape(k, &[hkv, d])?;
        let v = t.reshape(v, &[hkv, d])?;
        if qk_norm {
            q = t.rms_norm(q, &format!("{pre}.self_attn.q_norm.weight"), false)?;
            k = t.rms_norm(k, &format!("{pre}.self_attn.k_norm.weight"), false)?;
        }
        let q = t.rope(q)?;
        let k = t.rope(k)?;
        let a = t.attention(q, k, v)?;
        let a = t.reshape(a, &[hq * d])?;
        let o = t.linear(
            &format!("{pre}.self_attn.o_proj"),
            a,
            c.hidden_size,
            c.attention_bias,
        )?;
        h = t.add(h, o)?;
        let norm = format!("{pre}.post_attention_layernorm.weight");
        let (x, fold) = t.pre_norm(h, &norm)?;
        let m = t.swiglu_mlp(
            &format!("{pre}.mlp"),
            x,
            c.intermediate_size,
            c.mlp_bias,
            fold,
        )?;
        h = t.op(OpKind::Add, &[h, m])?;
    }
    t.tail(h, false)
}
