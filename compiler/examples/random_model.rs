//! Writes a random-weight Hugging Face model directory of a real shape, for compile-time and
//! speed measurements (weights too large to commit or carry are generated where they are used).
//!
//! cargo run --release -p vkfuse-compiler --example random_model -- qwen3-0.6b OUT_DIR

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
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let bits = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40;
        bits as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

fn tensor(rng: &mut Rng, n: usize, center: f32, spread: f32) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * 2);
    for _ in 0..n {
        out.extend_from_slice(&bf16::from_f32(center + spread * rng.next()).to_le_bytes());
    }
    out
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(shape_name), Some(out)) = (args.get(1), args.get(2)) else {
        return Err("usage: random_model qwen3-0.6b OUT_DIR".into());
    };
    let s = match shape_name.as_str() {
        "qwen3-0.6b" => QWEN3_0_6B,
        other => return Err(format!("unknown shape {other} (known: qwen3-0.6b)").into()),
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
