//! Writes a random-weight Hugging Face model directory of a real shape, for compile-time and
//! speed measurements (weights too large to commit or carry are generated where they are used).
//!
//! cargo run --release -p vkfuse-compiler --example random_model -- qwen3-0.6b OUT_DIR
//! cargo run --release -p vkfuse-compiler --example random_model -- qwen3-next-small OUT_DIR
//!
//! Shapes: `qwen3-0.6b` (Qwen3-0.6B exactly); `qwen3-next-small` and `qwen3-next-tiny`
//! (Qwen3-Next's hybrid pattern scaled down, see [`hybrid`]); `qwen3-next-80b-4l` (its full
//! widths in 4 layers).

use half::bf16;
use safetensors::tensor::{Dtype, TensorView};
use std::path::Path;

struct Shape {
    hidden: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    inter: usize,
    vocab: usize,
}

const QWEN3_0_6B: Shape = Shape {
    hidden: 1024,
    layers: 28,
    heads: 16,
    kv_heads: 8,
    head_dim: 128,
    inter: 3072,
    vocab: 151936,
};

/// xorshift64*: fast, deterministic, good enough for weights.
pub(crate) struct Rng(pub(crate) u64);
impl Rng {
    pub(crate) fn next(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let bits = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40;
        bits as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

pub(crate) fn tensor(rng: &mut Rng, n: usize, center: f32, spread: f32) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * 2);
    for _ in 0..n {
        out.extend_from_slice(&bf16::from_f32(center + spread * rng.next()).to_le_bytes());
    }
    out
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(shape_name), Some(out)) = (args.get(1), args.get(2)) else {
        return Err("usage: random_model SHAPE OUT_DIR (SHAPE: qwen3-0.6b, qwen3-next-small, qwen3-next-tiny or qwen3-next-80b-4l)".into());
    };
    let s = match shape_name.as_str() {
        "qwen3-0.6b" => QWEN3_0_6B,
        "qwen3-next-small" => return hybrid::write(&hybrid::SMALL, Path::new(out)),
        "qwen3-next-tiny" => return hybrid::write(&hybrid::TINY, Path::new(out)),
        "qwen3-next-80b-4l" => return hybrid::write(&hybrid::WIDE, Path::new(out)),
        other => {
            return Err(format!(
                "unknown shape {other} (known: qwen3-0.6b, qwen3-next-small, qwen3-next-tiny, qwen3-next-80b-4l)"
            )
            .into())
        }
    };
    let out = Path::new(out);
    std::fs::create_dir_all(out)?;
    let config = serde_json::json!({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "hidden_size": s.hidden, "num_hidden_layers": s.layers, "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads, "head_dim": s.head_dim, "intermediate_size": s.inter,
        "vocab_size": s.vocab, "tie_word_embeddings": true, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 40960, "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
        "hidden_act": "silu", "dtype": "bfloat16", "bos_token_id": 151643, "eos_token_id": 151645
    });
    std::fs::write(
        out.join("config.json"),
        serde_json::to_string_pretty(&config)?,
    )?;
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let (h, d) = (s.hidden, s.head_dim);
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = vec![];
    let mut add = |name: String, dims: Vec<usize>, center: f32, spread: f32, rng: &mut Rng| {
        let n = dims.iter().product();
        tensors.push((name, dims, tensor(rng, n, center, spread)));
    };
    add(
        "model.embed_tokens.weight".into(),
        vec![s.vocab, h],
        0.0,
        0.05,
        &mut rng,
    );
    for l in 0..s.layers {
        let p = format!("model.layers.{l}");
        let w = 1.0 / (h as f32).sqrt();
        add(
            format!("{p}.input_layernorm.weight"),
            vec![h],
            1.0,
            0.1,
            &mut rng,
        );
        add(
            format!("{p}.self_attn.q_proj.weight"),
            vec![s.heads * d, h],
            0.0,
            w,
            &mut rng,
        );
        add(
            format!("{p}.self_attn.k_proj.weight"),
            vec![s.kv_heads * d, h],
            0.0,
            w,
            &mut rng,
        );
        add(
            format!("{p}.self_attn.v_proj.weight"),
            vec![s.kv_heads * d, h],
            0.0,
            w,
            &mut rng,
        );
        add(
            format!("{p}.self_attn.o_proj.weight"),
            vec![h, s.heads * d],
            0.0,
            w,
            &mut rng,
        );
        add(
            format!("{p}.self_attn.q_norm.weight"),
            vec![d],
            1.0,
            0.1,
            &mut rng,
        );
        add(
            format!("{p}.self_attn.k_norm.weight"),
            vec![d],
            1.0,
            0.1,
            &mut rng,
        );
        add(
            format!("{p}.post_attention_layernorm.weight"),
            vec![h],
            1.0,
            0.1,
            &mut rng,
        );
        add(
            format!("{p}.mlp.gate_proj.weight"),
            vec![s.inter, h],
            0.0,
            w,
            &mut rng,
        );
        add(
            format!("{p}.mlp.up_proj.weight"),
            vec![s.inter, h],
            0.0,
            w,
            &mut rng,
        );
        add(
            format!("{p}.mlp.down_proj.weight"),
            vec![h, s.inter],
            0.0,
            1.0 / (s.inter as f32).sqrt(),
            &mut rng,
        );
    }
    add("model.norm.weight".into(), vec![h], 1.0, 0.1, &mut rng);
    save(&tensors, out)
}

/// Writes bf16 tensors as `model.safetensors` in `out` and says how much.
pub(crate) fn save(
    tensors: &[(String, Vec<usize>, Vec<u8>)],
    out: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, dims, data)| Ok((n.clone(), TensorView::new(Dtype::BF16, dims.clone(), data)?)))
        .collect::<Result<_, safetensors::SafeTensorError>>()?;
    safetensors::serialize_to_file(views, None, &out.join("model.safetensors"))?;
    let bytes: usize = tensors.iter().map(|t| t.2.len()).sum();
    println!(
        "wrote {} ({} tensors, {:.3} GB)",
        out.display(),
        tensors.len(),
        bytes as f64 / 1e9
    );
    Ok(())
}

/// Qwen3-Next's hybrid pattern at a size that fits a short measurement: 3 Gated DeltaNet
/// layers to 1 gated full-attention layer, every layer a sparse MoE block (top-k experts
/// renormalised, plus a shared expert behind a sigmoid gate), zero-centred norms, partial rope
/// (a quarter of the head), untied lm_head and Qwen's 151936 vocabulary.
///
/// `SMALL` keeps Qwen3-Next-80B-A3B's per-head sizes (key and value heads of 128, two value
/// heads per key head, conv kernel 4, full-attention heads of 256 with 8 q to 2 kv heads,
/// expert and shared-expert intermediate 512) and halves the width (hidden 1024 for 2048),
/// with 8 layers (of 48), 64 experts (of 512) and top-8 (of 10).
mod hybrid {
    use super::{save, tensor, Rng};
    use std::path::Path;

    pub struct Hybrid {
        pub hidden: usize,
        pub layers: usize,
        pub heads: usize,
        pub kv_heads: usize,
        pub head_dim: usize,
        pub k_heads: usize,
        pub v_heads: usize,
        pub k_dim: usize,
        pub v_dim: usize,
        pub conv: usize,
        pub experts: usize,
        pub top_k: usize,
        pub expert_inter: usize,
        pub shared_inter: usize,
        pub vocab: usize,
    }

    pub const SMALL: Hybrid = Hybrid {
        hidden: 1024,
        layers: 8,
        heads: 8,
        kv_heads: 2,
        head_dim: 256,
        k_heads: 8,
        v_heads: 16,
        k_dim: 128,
        v_dim: 128,
        conv: 4,
        experts: 64,
        top_k: 8,
        expert_inter: 512,
        shared_inter: 512,
        vocab: 151936,
    };

    /// Qwen3-Next-80B-A3B's widths exactly (hidden 2048, 16 key and 32 value heads of 128 in
    /// the linear attention, 16 q and 2 kv heads of 256, 512 experts, top-10) in 4 layers of
    /// 48: the sizes its kernels take (the router's 512 logits pick by rounds, 16 key heads),
    /// ~14 GB of bf16 weights, for a GPU.
    pub const WIDE: Hybrid = Hybrid {
        hidden: 2048,
        layers: 4,
        heads: 16,
        kv_heads: 2,
        head_dim: 256,
        k_heads: 16,
        v_heads: 32,
        k_dim: 128,
        v_dim: 128,
        conv: 4,
        experts: 512,
        top_k: 10,
        expert_inter: 512,
        shared_inter: 512,
        vocab: 151936,
    };

    /// The same pattern at a size lavapipe runs in seconds (checks the bench script).
    pub const TINY: Hybrid = Hybrid {
        hidden: 64,
        layers: 4,
        heads: 4,
        kv_heads: 2,
        head_dim: 32,
        k_heads: 2,
        v_heads: 4,
        k_dim: 16,
        v_dim: 16,
        conv: 4,
        experts: 8,
        top_k: 2,
        expert_inter: 32,
        shared_inter: 48,
        vocab: 1000,
    };

    pub fn write(s: &Hybrid, out: &Path) -> Result<(), Box<dyn std::error::Error>> {
        std::fs::create_dir_all(out)?;
        let layer_types: Vec<&str> = (0..s.layers)
            .map(|l| {
                if l % 4 == 3 {
                    "full_attention"
                } else {
                    "linear_attention"
                }
            })
            .collect();
        let config = serde_json::json!({
            "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
            "hidden_size": s.hidden, "num_hidden_layers": s.layers,
            "num_attention_heads": s.heads, "num_key_value_heads": s.kv_heads,
            "head_dim": s.head_dim, "intermediate_size": s.expert_inter * 4,
            "layer_types": layer_types, "linear_conv_kernel_dim": s.conv,
            "linear_key_head_dim": s.k_dim, "linear_value_head_dim": s.v_dim,
            "linear_num_key_heads": s.k_heads, "linear_num_value_heads": s.v_heads,
            "num_experts": s.experts, "num_experts_per_tok": s.top_k,
            "moe_intermediate_size": s.expert_inter,
            "shared_expert_intermediate_size": s.shared_inter, "norm_topk_prob": true,
            "decoder_sparse_step": 1, "mlp_only_layers": [],
            "vocab_size": s.vocab, "tie_word_embeddings": false, "rms_norm_eps": 1e-6,
            "attention_bias": false, "partial_rotary_factor": 0.25,
            "max_position_embeddings": 262144,
            "rope_parameters": {"rope_theta": 10000000.0, "rope_type": "default",
                                "partial_rotary_factor": 0.25},
            "hidden_act": "silu", "dtype": "bfloat16",
            // Qwen's ids where the vocabulary holds them; the tiny shape's last two ids else.
            "bos_token_id": if s.vocab > 151645 { 151643 } else { s.vocab - 2 },
            "eos_token_id": if s.vocab > 151645 { 151645 } else { s.vocab - 1 }
        });
        std::fs::write(
            out.join("config.json"),
            serde_json::to_string_pretty(&config)?,
        )?;
        let mut rng = Rng(0x5eed_1234_abcd_0002);
        let h = s.hidden;
        let w = 1.0 / (h as f32).sqrt();
        let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = vec![];
        let mut add = |name: String, dims: Vec<usize>, center: f32, spread: f32| {
            let n = dims.iter().product();
            tensors.push((name, dims, tensor(&mut rng, n, center, spread)));
        };
        add(
            "model.embed_tokens.weight".into(),
            vec![s.vocab, h],
            0.0,
            0.05,
        );
        for (l, &kind) in layer_types.iter().enumerate() {
            let p = format!("model.layers.{l}");
            // Zero-centred norms: the weight is an offset from 1.
            add(format!("{p}.input_layernorm.weight"), vec![h], 0.0, 0.1);
            add(
                format!("{p}.post_attention_layernorm.weight"),
                vec![h],
                0.0,
                0.1,
            );
            if kind == "linear_attention" {
                let a = format!("{p}.linear_attn");
                let (kd, vd) = (s.k_heads * s.k_dim, s.v_heads * s.v_dim);
                add(
                    format!("{a}.in_proj_qkvz.weight"),
                    vec![2 * kd + 2 * vd, h],
                    0.0,
                    w,
                );
                add(
                    format!("{a}.in_proj_ba.weight"),
                    vec![2 * s.v_heads, h],
                    0.0,
                    w,
                );
                add(
                    format!("{a}.conv1d.weight"),
                    vec![2 * kd + vd, 1, s.conv],
                    0.0,
                    0.5,
                );
                add(format!("{a}.A_log"), vec![s.v_heads], 0.0, 1.0);
                add(format!("{a}.dt_bias"), vec![s.v_heads], 0.0, 1.0);
                add(format!("{a}.norm.weight"), vec![s.v_dim], 1.0, 0.1);
                let wo = 1.0 / (vd as f32).sqrt();
                add(format!("{a}.out_proj.weight"), vec![h, vd], 0.0, wo);
            } else {
                let a = format!("{p}.self_attn");
                let (q, kv) = (s.heads * s.head_dim, s.kv_heads * s.head_dim);
                add(format!("{a}.q_proj.weight"), vec![2 * q, h], 0.0, w);
                add(format!("{a}.k_proj.weight"), vec![kv, h], 0.0, w);
                add(format!("{a}.v_proj.weight"), vec![kv, h], 0.0, w);
                add(
                    format!("{a}.o_proj.weight"),
                    vec![h, q],
                    0.0,
                    1.0 / (q as f32).sqrt(),
                );
                add(format!("{a}.q_norm.weight"), vec![s.head_dim], 0.0, 0.1);
                add(format!("{a}.k_norm.weight"), vec![s.head_dim], 0.0, 0.1);
            }
            let m = format!("{p}.mlp");
            add(format!("{m}.gate.weight"), vec![s.experts, h], 0.0, w);
            let wd = 1.0 / (s.expert_inter as f32).sqrt();
            for e in 0..s.experts {
                let (i, x) = (s.expert_inter, format!("{m}.experts.{e}"));
                add(format!("{x}.gate_proj.weight"), vec![i, h], 0.0, w);
                add(format!("{x}.up_proj.weight"), vec![i, h], 0.0, w);
                add(format!("{x}.down_proj.weight"), vec![h, i], 0.0, wd);
            }
            let (i, x) = (s.shared_inter, format!("{m}.shared_expert"));
            add(format!("{x}.gate_proj.weight"), vec![i, h], 0.0, w);
            add(format!("{x}.up_proj.weight"), vec![i, h], 0.0, w);
            add(
                format!("{x}.down_proj.weight"),
                vec![h, i],
                0.0,
                1.0 / (i as f32).sqrt(),
            );
            add(format!("{m}.shared_expert_gate.weight"), vec![1, h], 0.0, w);
        }
        add("model.norm.weight".into(), vec![h], 0.0, 0.1);
        add("lm_head.weight".into(), vec![s.vocab, h], 0.0, w);
        save(&tensors, out)
    }
}
