//! The Hugging Face importer: good model directories resolve to the values transformers would
//! use, and every bad one fails with an error naming the file and the field or tensor at fault.
//! Model directories are built in a temp folder (config.json written by hand, weights by
//! `safetensors::serialize`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use half::{bf16, f16};
use proptest::prelude::*;
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use vkfuse_compiler::import::{
    load, Family, ImportError, LayerType, Model, ModelConfig, RopeConfig, RopeScaling, TensorStore,
};
use vkfuse_compiler::ir::DType;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = std::env::temp_dir().join(format!(
            "vkfuse-import-{tag}-{}-{n}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&path).expect("create temp dir");
        TempDir(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    fn write(&self, name: &str, bytes: impl AsRef<[u8]>) {
        std::fs::write(self.0.join(name), bytes).expect("write test file");
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Value `i` of every test tensor: small multiples of 1/4, exact in f16 and bf16.
fn value(i: usize) -> f32 {
    ((i % 64) as f32 - 32.0) * 0.25
}

/// Little-endian bytes of `numel` test values in `dtype` (zeros for the non-float dtypes).
fn data(dtype: Dtype, numel: usize) -> Vec<u8> {
    match dtype {
        Dtype::F32 => (0..numel).flat_map(|i| value(i).to_le_bytes()).collect(),
        Dtype::F16 => (0..numel)
            .flat_map(|i| f16::from_f32(value(i)).to_le_bytes())
            .collect(),
        Dtype::BF16 => (0..numel)
            .flat_map(|i| bf16::from_f32(value(i)).to_le_bytes())
            .collect(),
        other => vec![0u8; numel * other.bitsize() / 8],
    }
}

/// A safetensors file holding `tensors` (name, dtype, shape) filled with [`value`]s.
fn safetensors_file(tensors: &[(String, Dtype, Vec<usize>)]) -> Vec<u8> {
    let buffers: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, d, s)| data(*d, s.iter().product()))
        .collect();
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .zip(&buffers)
        .map(|((n, d, s), b)| {
            (
                n.clone(),
                TensorView::new(*d, s.clone(), b).expect("consistent test tensor"),
            )
        })
        .collect();
    safetensors::serialize(views, None).expect("serialize")
}

fn t(name: &str, dtype: Dtype, shape: &[usize]) -> (String, Dtype, Vec<usize>) {
    (name.to_string(), dtype, shape.to_vec())
}

/// The weights a dense (Llama / Qwen3) model reads, with their shapes (semantics §1.2, §2).
fn dense_weights(c: &ModelConfig, dtype: Dtype) -> Vec<(String, Dtype, Vec<usize>)> {
    let (h, i, v, d) = (c.hidden_size, c.intermediate_size, c.vocab_size, c.head_dim);
    let (q, kv) = (c.num_attention_heads * d, c.num_kv_heads * d);
    let mut w = vec![
        t("model.embed_tokens.weight", dtype, &[v, h]),
        t("model.norm.weight", dtype, &[h]),
    ];
    if !c.tie_word_embeddings {
        w.push(t("lm_head.weight", dtype, &[v, h]));
    }
    for l in 0..c.num_layers {
        let p = format!("model.layers.{l}");
        w.push(t(&format!("{p}.input_layernorm.weight"), dtype, &[h]));
        w.push(t(
            &format!("{p}.post_attention_layernorm.weight"),
            dtype,
            &[h],
        ));
        w.push(t(&format!("{p}.self_attn.q_proj.weight"), dtype, &[q, h]));
        w.push(t(&format!("{p}.self_attn.k_proj.weight"), dtype, &[kv, h]));
        w.push(t(&format!("{p}.self_attn.v_proj.weight"), dtype, &[kv, h]));
        w.push(t(&format!("{p}.self_attn.o_proj.weight"), dtype, &[h, q]));
        if c.family == Family::Qwen3 {
            w.push(t(&format!("{p}.self_attn.q_norm.weight"), dtype, &[d]));
            w.push(t(&format!("{p}.self_attn.k_norm.weight"), dtype, &[d]));
        }
        w.push(t(&format!("{p}.mlp.gate_proj.weight"), dtype, &[i, h]));
        w.push(t(&format!("{p}.mlp.up_proj.weight"), dtype, &[i, h]));
        w.push(t(&format!("{p}.mlp.down_proj.weight"), dtype, &[h, i]));
    }
    w
}

const LLAMA: &str = r#"{
  "architectures": ["LlamaForCausalLM"],
  "model_type": "llama",
  "vocab_size": 40,
  "hidden_size": 24,
  "intermediate_size": 32,
  "num_hidden_layers": 2,
  "num_attention_heads": 6,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-05,
  "rope_theta": 500000.0,
  "rope_scaling": null,
  "max_position_embeddings": 512,
  "tie_word_embeddings": false,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "torch_dtype": "bfloat16"
}"#;

const QWEN3: &str = r#"{
  "architectures": ["Qwen3ForCausalLM"],
  "vocab_size": 48,
  "hidden_size": 32,
  "intermediate_size": 40,
  "num_hidden_layers": 2,
  "num_attention_heads": 4,
  "num_key_value_heads": 2,
  "head_dim": 16,
  "rms_norm_eps": 1e-06,
  "rope_theta": 5.0,
  "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
  "max_position_embeddings": 256,
  "tie_word_embeddings": true,
  "eos_token_id": [7, 9],
  "dtype": "float16",
  "torch_dtype": "bfloat16"
}"#;

const QWEN3_NEXT: &str = r#"{
  "architectures": ["Qwen3NextForCausalLM"],
  "vocab_size": 50,
  "hidden_size": 32,
  "intermediate_size": 48,
  "num_hidden_layers": 4,
  "num_attention_heads": 4,
  "num_key_value_heads": 2,
  "head_dim": 32,
  "full_attention_interval": 2,
  "partial_rotary_factor": 0.25,
  "linear_num_key_heads": 2,
  "linear_num_value_heads": 4,
  "linear_key_head_dim": 8,
  "linear_value_head_dim": 8,
  "num_experts": 4,
  "num_experts_per_tok": 2,
  "moe_intermediate_size": 16,
  "shared_expert_intermediate_size": 24,
  "mlp_only_layers": [0],
  "eos_token_id": null,
  "torch_dtype": "bfloat16"
}"#;

/// Replaces `"key": <old value>` in a config text (first occurrence).
fn set(json: &str, key: &str, value: &str) -> String {
    let mut v: serde_json::Value = serde_json::from_str(json).expect("test config");
    let new: serde_json::Value = serde_json::from_str(value).expect("test value");
    v.as_object_mut()
        .expect("object")
        .insert(key.to_string(), new);
    serde_json::to_string_pretty(&v).expect("serialise")
}

fn remove(json: &str, key: &str) -> String {
    let mut v: serde_json::Value = serde_json::from_str(json).expect("test config");
    v.as_object_mut().expect("object").remove(key);
    serde_json::to_string_pretty(&v).expect("serialise")
}

fn config(json: &str) -> ModelConfig {
    ModelConfig::from_json(json, Path::new("config.json")).unwrap_or_else(|e| panic!("{e}"))
}

/// A model directory with `config` and a single model.safetensors holding the dense weights.
fn dense_dir(tag: &str, config_json: &str, dtype: Dtype) -> TempDir {
    let dir = TempDir::new(tag);
    dir.write("config.json", config_json);
    dir.write(
        "model.safetensors",
        safetensors_file(&dense_weights(&config(config_json), dtype)),
    );
    dir
}

fn load_err(dir: &Path) -> ImportError {
    match load(dir) {
        Ok(_) => panic!("{} loaded, expected an error", dir.display()),
        Err(e) => e,
    }
}

/// A loaded model whose config.json and weights are both good.
fn good_llama(tag: &str) -> (TempDir, Model) {
    let dir = dense_dir(tag, LLAMA, Dtype::BF16);
    let model = load(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    (dir, model)
}

// ---------------------------------------------------------------------------------------------
// Good model directories
// ---------------------------------------------------------------------------------------------

#[test]
fn tokenizer_json_is_read_verbatim_when_present_and_named_when_broken() {
    let (dir, m) = good_llama("tokenizer");
    assert_eq!(m.tokenizer, None, "no tokenizer.json, no tokenizer");
    let json = "{\"model\": {\"type\": \"BPE\"}}\n";
    dir.write("tokenizer.json", json);
    let m = load(dir.path()).unwrap();
    assert_eq!(m.tokenizer.as_deref(), Some(json));
    assert!(m.warnings().is_empty(), "{:?}", m.warnings());
    // JSON, but nothing the tokenizers library loads: kept, with a warning naming the file.
    for odd in ["{}", "[]", "{\"model\": 3}"] {
        dir.write("tokenizer.json", odd);
        let m = load(dir.path()).unwrap();
        assert_eq!(m.tokenizer.as_deref(), Some(odd));
        let w = m.warnings().join("\n");
        assert!(
            w.contains("tokenizer.json: no `model` object"),
            "{odd}: {w}"
        );
        assert!(w.contains("--ids still works"), "{odd}: {w}");
    }
    // A model type the library does not know: the same, naming the type.
    let odd = "{\"model\": {\"type\": \"Nope\"}}";
    dir.write("tokenizer.json", odd);
    let w = load(dir.path()).unwrap().warnings().join("\n");
    assert!(
        w.contains("tokenizer.json: its model type `Nope` is none") && w.contains("Unigram"),
        "{w}"
    );
    dir.write("tokenizer.json", "{\"model\": ");
    let err = load_err(dir.path()).to_string();
    assert!(err.contains("tokenizer.json:1:"), "{err}");
    assert!(err.contains("invalid JSON"), "{err}");
}

/// generation_config.json's eos ids (transformers' generate stops at them) follow config.json's,
/// each once; a broken file or an id past the vocabulary is named.
#[test]
fn generation_config_eos_ids_are_added_and_a_broken_file_is_named() {
    let (dir, m) = good_llama("generation");
    let base = m.config.eos_token_ids.clone();
    assert_eq!(base, vec![2], "Llama's default");
    dir.write("generation_config.json", "{\"eos_token_id\": [2, 7, 9]}");
    assert_eq!(
        load(dir.path()).unwrap().config.eos_token_ids,
        vec![2, 7, 9]
    );
    dir.write(
        "generation_config.json",
        "{\"eos_token_id\": 5, \"do_sample\": true}",
    );
    assert_eq!(load(dir.path()).unwrap().config.eos_token_ids, vec![2, 5]);
    dir.write("generation_config.json", "{\"bos_token_id\": 1}");
    assert_eq!(load(dir.path()).unwrap().config.eos_token_ids, base);
    for (text, needle) in [
        ("{\"eos_token_id\": ", "generation_config.json:1:"),
        ("[1]", "expected an object"),
        ("{\"eos_token_id\": \"x\"}", "eos_token_id"),
        (
            "{\"eos_token_id\": [2, 99999]}",
            "99999 is outside the vocabulary",
        ),
    ] {
        dir.write("generation_config.json", text);
        let err = load_err(dir.path()).to_string();
        assert!(err.contains("generation_config.json"), "{text}: {err}");
        assert!(err.contains(needle), "{text}: {err}");
    }
}

#[test]
fn llama_loads_with_head_dim_derived_from_hidden_over_heads() {
    let (dir, m) = good_llama("llama");
    let c = &m.config;
    assert_eq!(m.dir, dir.path());
    assert_eq!(
        (c.family, c.architecture.as_str()),
        (Family::Llama, "LlamaForCausalLM")
    );
    assert_eq!(
        (
            c.vocab_size,
            c.hidden_size,
            c.intermediate_size,
            c.num_layers
        ),
        (40, 24, 32, 2)
    );
    assert_eq!(
        (c.num_attention_heads, c.num_kv_heads, c.head_dim),
        (6, 2, 4)
    );
    assert_eq!(c.rms_norm_eps, 1e-5);
    assert_eq!(
        c.rope,
        RopeConfig {
            theta: 500000.0,
            rotary_dim: 4,
            scaling: RopeScaling::None
        }
    );
    assert_eq!(
        (c.bos_token_id, c.eos_token_ids.as_slice()),
        (Some(1), &[2][..])
    );
    assert_eq!(c.dtype, Some(DType::BF16));
    assert_eq!(c.max_position_embeddings, 512);
    assert!(!c.tie_word_embeddings && !c.attention_bias && !c.mlp_bias && c.hybrid.is_none());
}

#[test]
fn every_dense_weight_is_found_with_its_shape_and_reads_back_exactly() {
    let (_dir, m) = good_llama("llama-weights");
    let weights = dense_weights(&m.config, Dtype::BF16);
    assert_eq!(m.tensors.len(), weights.len());
    for (name, _, shape) in &weights {
        let info = m
            .tensors
            .expect(name, shape)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (info.dtype, &info.shape, info.file.as_path()),
            (
                DType::BF16,
                shape,
                m.dir.join("model.safetensors").as_path()
            )
        );
        let numel: usize = shape.iter().product();
        assert_eq!(m.tensors.bytes(name).map(<[u8]>::len).ok(), Some(numel * 2));
        let values = m.tensors.to_f32(name).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(values, (0..numel).map(value).collect::<Vec<_>>(), "{name}");
    }
    let total: usize = weights
        .iter()
        .map(|(_, _, s)| s.iter().product::<usize>())
        .sum();
    assert_eq!(
        (m.tensors.total_params(), m.tensors.total_bytes()),
        (total, total * 2)
    );
    let names: Vec<&str> = m.tensors.names().collect();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    assert_eq!(names, sorted, "names() is sorted");
}

#[test]
fn f32_and_f16_tensors_widen_to_the_same_values() {
    for dtype in [Dtype::F32, Dtype::F16] {
        let dir = dense_dir("widen", LLAMA, dtype);
        let m = load(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        let values = m
            .tensors
            .to_f32("model.embed_tokens.weight")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            values,
            (0..40 * 24).map(value).collect::<Vec<_>>(),
            "{dtype}"
        );
    }
}

#[test]
fn qwen3_reads_rope_parameters_over_top_level_theta_eos_list_and_dtype_over_torch_dtype() {
    let dir = dense_dir("qwen3", QWEN3, Dtype::F16);
    let m = load(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    let c = &m.config;
    assert_eq!(c.family, Family::Qwen3);
    assert_eq!(
        (c.head_dim, c.rope.rotary_dim, c.rope.theta),
        (16, 16, 1_000_000.0)
    );
    assert_eq!(c.eos_token_ids, vec![7, 9]);
    assert_eq!(c.bos_token_id, None);
    assert_eq!(c.dtype, Some(DType::F16));
    assert!(c.tie_word_embeddings);
    assert!(!m.tensors.contains("lm_head.weight"));
    assert!(m
        .tensors
        .expect("model.layers.1.self_attn.k_norm.weight", &[16])
        .is_ok());
}

#[test]
fn qwen3_head_dim_defaults_to_128_not_hidden_over_heads() {
    let c = config(&remove(QWEN3, "head_dim"));
    assert_eq!((c.head_dim, c.rope.rotary_dim), (128, 128));
}

#[test]
fn rope_theta_defaults_to_10000_without_any_rope_field() {
    let c = config(&remove(&remove(QWEN3, "rope_parameters"), "rope_theta"));
    assert_eq!(
        c.rope,
        RopeConfig {
            theta: 10000.0,
            rotary_dim: 16,
            scaling: RopeScaling::None
        }
    );
    let c = config(&remove(QWEN3, "rope_parameters"));
    assert_eq!(
        c.rope.theta, 5.0,
        "top-level rope_theta when rope_parameters is absent"
    );
}

#[test]
fn legacy_llama3_rope_scaling_resolves_like_transformers() {
    let json = set(
        LLAMA,
        "rope_scaling",
        r#"{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}"#,
    );
    let c = config(&json);
    assert_eq!(c.rope.theta, 500000.0);
    assert_eq!(
        c.rope.scaling,
        RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192
        }
    );
    assert_eq!(c.rope.inv_freq().len(), 2);
}

#[test]
fn qwen3_next_derives_layer_types_rotary_dim_and_moe_layers() {
    let c = config(QWEN3_NEXT);
    assert_eq!(c.family, Family::Qwen3Next);
    assert_eq!(
        (c.head_dim, c.rope.rotary_dim, c.rope.theta),
        (32, 8, 10000.0)
    );
    assert_eq!(c.rope.inv_freq().len(), 4);
    assert!(c.eos_token_ids.is_empty() && c.bos_token_id.is_none());
    let h = c.hybrid.as_ref().expect("Qwen3Next has a hybrid config");
    use LayerType::{FullAttention as F, LinearAttention as L};
    assert_eq!(h.layer_types, vec![L, F, L, F], "full iff (i+1) % 2 == 0");
    assert_eq!(h.pattern(), "LFLF");
    assert_eq!((h.linear_num_key_heads, h.linear_num_value_heads), (2, 4));
    assert_eq!(
        (
            h.linear_key_head_dim,
            h.linear_value_head_dim,
            h.linear_conv_kernel_dim
        ),
        (8, 8, 4)
    );
    assert_eq!((h.num_experts, h.num_experts_per_tok), (4, 2));
    assert_eq!(
        (h.moe_intermediate_size, h.shared_expert_intermediate_size),
        (16, 24)
    );
    assert!(h.norm_topk_prob);
    assert_eq!(h.decoder_sparse_step, 1);
    let moe: Vec<bool> = (0..4).map(|l| h.is_moe_layer(l)).collect();
    assert_eq!(
        moe,
        [false, true, true, true],
        "layer 0 is in mlp_only_layers"
    );
    assert_eq!(c.layer_counts(), (2, 2));
}

#[test]
fn qwen3_next_defaults_to_a_full_attention_layer_every_fourth_and_rotary_quarter() {
    let json = remove(
        &remove(
            &set(QWEN3_NEXT, "num_hidden_layers", "8"),
            "full_attention_interval",
        ),
        "partial_rotary_factor",
    );
    let c = config(&json);
    assert_eq!(
        c.rope.rotary_dim, 8,
        "partial_rotary_factor defaults to 0.25 for Qwen3Next"
    );
    assert_eq!(
        c.hybrid.as_ref().map(|h| h.pattern()),
        Some("LLLFLLLF".to_string())
    );
}

#[test]
fn qwen3_next_reads_explicit_layer_types_with_legacy_names() {
    let json = set(
        QWEN3_NEXT,
        "layer_types",
        r#"["linear_attention", "mamba", "attention", "full_attention"]"#,
    );
    let c = config(&json);
    assert_eq!(
        c.hybrid.as_ref().map(|h| h.pattern()),
        Some("LLFF".to_string())
    );
}

#[test]
fn qwen3_next_reads_partial_rotary_factor_from_rope_parameters() {
    let json = set(
        QWEN3_NEXT,
        "rope_parameters",
        r#"{"rope_type": "default", "rope_theta": 3.0, "partial_rotary_factor": 0.5}"#,
    );
    let c = config(&json);
    assert_eq!((c.rope.rotary_dim, c.rope.theta), (16, 3.0));
}

#[test]
fn summary_names_the_layer_pattern_and_moe() {
    let text = config(QWEN3_NEXT).to_string();
    assert!(!text.contains('\n'), "{text}");
    for part in [
        "Qwen3NextForCausalLM: 4 layers (LFLF: 2 Gated DeltaNet, 2 full attention)",
        "RoPE theta 10000 on 8 dims",
        "3 MoE layers of 4 experts, top 2",
        "1 dense SwiGLU layers of 48",
    ] {
        assert!(text.contains(part), "{part:?} not in {text}");
    }
}

#[test]
fn sharded_checkpoint_loads_through_the_index() {
    let dir = TempDir::new("sharded");
    dir.write("config.json", LLAMA);
    let weights = dense_weights(&config(LLAMA), Dtype::BF16);
    let (a, b) = weights.split_at(weights.len() / 2);
    let shard_a = "model-00001-of-00002.safetensors";
    let shard_b = "model-00002-of-00002.safetensors";
    dir.write(shard_a, safetensors_file(a));
    dir.write(shard_b, safetensors_file(b));
    let map: serde_json::Map<String, serde_json::Value> = a
        .iter()
        .map(|w| (w.0.clone(), shard_a.into()))
        .chain(b.iter().map(|w| (w.0.clone(), shard_b.into())))
        .collect();
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map});
    dir.write("model.safetensors.index.json", index.to_string());

    let m = load(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.tensors.len(), weights.len());
    assert_eq!(m.tensors.files().count(), 2);
    let (first, last) = (&a[0], &b[b.len() - 1]);
    assert_eq!(
        m.tensors.get(&first.0).map(|i| i.file.clone()),
        Some(dir.path().join(shard_a))
    );
    assert_eq!(
        m.tensors.get(&last.0).map(|i| i.file.clone()),
        Some(dir.path().join(shard_b))
    );
    for (name, _, shape) in &weights {
        assert!(m.tensors.expect(name, shape).is_ok(), "{name}");
        assert!(m.tensors.to_f32(name).is_ok(), "{name}");
    }
}

#[test]
fn without_model_safetensors_or_index_every_safetensors_file_is_read() {
    let dir = TempDir::new("glob");
    dir.write("config.json", LLAMA);
    let weights = dense_weights(&config(LLAMA), Dtype::BF16);
    let (a, b) = weights.split_at(3);
    dir.write("part-a.safetensors", safetensors_file(a));
    dir.write("part-b.safetensors", safetensors_file(b));
    let m = load(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.tensors.len(), weights.len());
    assert_eq!(m.tensors.source(), dir.path());
}

// ---------------------------------------------------------------------------------------------
// config.json errors
// ---------------------------------------------------------------------------------------------

fn config_err(json: &str) -> (TempDir, ImportError) {
    let dir = TempDir::new("bad-config");
    dir.write("config.json", json);
    dir.write(
        "model.safetensors",
        safetensors_file(&[t("x", Dtype::F32, &[1])]),
    );
    let e = load_err(dir.path());
    (dir, e)
}

#[test]
fn unknown_architecture_names_the_file_the_value_and_the_supported_list() {
    let (dir, e) = config_err(&set(LLAMA, "architectures", r#"["MistralForCausalLM"]"#));
    assert!(
        matches!(&e, ImportError::UnsupportedArchitecture { found, .. } if found == "MistralForCausalLM"),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        format!(
            "{}: architecture \"MistralForCausalLM\" is not supported (supported: LlamaForCausalLM, \
             Qwen3ForCausalLM, Qwen3NextForCausalLM)",
            dir.path().join("config.json").display()
        )
    );
}

#[test]
fn missing_architectures_is_a_bad_field() {
    let (_dir, e) = config_err(&remove(LLAMA, "architectures"));
    assert!(
        matches!(&e, ImportError::BadField { field, .. } if field == "architectures"),
        "{e}"
    );
}

#[test]
fn missing_required_field_names_it() {
    let (dir, e) = config_err(&remove(LLAMA, "hidden_size"));
    assert!(
        matches!(&e, ImportError::BadField { field, file, .. }
        if field == "hidden_size" && file == &dir.path().join("config.json")),
        "{e:?}"
    );
    assert!(
        e.to_string().contains("field \"hidden_size\": missing"),
        "{e}"
    );
}

#[test]
fn wrong_typed_field_names_it_and_quotes_the_value() {
    let (dir, e) = config_err(&set(LLAMA, "hidden_size", r#""abc""#));
    assert_eq!(
        e.to_string(),
        format!(
            "{}: field \"hidden_size\": expected a positive integer, found \"abc\"",
            dir.path().join("config.json").display()
        )
    );
    for (key, value) in [
        ("num_hidden_layers", "0"),
        ("num_attention_heads", "-2"),
        ("vocab_size", "3.5"),
    ] {
        let (_dir, e) = config_err(&set(LLAMA, key, value));
        assert!(
            matches!(&e, ImportError::BadField { field, .. } if field == key),
            "{key}: {e}"
        );
    }
    let (_dir, e) = config_err(&set(LLAMA, "rope_theta", "1e300"));
    assert!(
        matches!(&e, ImportError::BadField { field, .. } if field == "rope_theta"),
        "{e}"
    );
    let (_dir, e) = config_err(&set(LLAMA, "tie_word_embeddings", r#""yes""#));
    assert!(
        e.to_string()
            .contains("\"tie_word_embeddings\": expected true or false, found \"yes\""),
        "{e}"
    );
    let (_dir, e) = config_err(&set(LLAMA, "eos_token_id", r#"[2, "x"]"#));
    assert!(
        matches!(&e, ImportError::BadField { field, .. } if field == "eos_token_id"),
        "{e}"
    );
    let (_dir, e) = config_err(&set(
        LLAMA,
        "rope_scaling",
        r#"{"rope_type": "linear", "factor": "big"}"#,
    ));
    assert!(
        matches!(&e, ImportError::BadField { field, .. } if field == "rope_scaling.factor"),
        "{e}"
    );
}

#[test]
fn bad_json_reports_line_and_column() {
    let broken = LLAMA.replace("\"hidden_size\": 24,", "\"hidden_size\": 24,,");
    let (dir, e) = config_err(&broken);
    let ImportError::BadJson {
        file, line, column, ..
    } = &e
    else {
        panic!("expected BadJson, got {e:?}")
    };
    assert_eq!(file, &dir.path().join("config.json"));
    assert_eq!((*line, *column), (5, 21), "{e}"); // the second comma of `  "hidden_size": 24,,`
    assert!(
        e.to_string()
            .starts_with(&format!("{}:5:21: invalid JSON", file.display())),
        "{e}"
    );
}

#[test]
fn unsupported_rope_type_names_the_field_and_value() {
    let (_dir, e) = config_err(&set(
        LLAMA,
        "rope_scaling",
        r#"{"type": "dynamic", "factor": 2.0}"#,
    ));
    assert!(
        matches!(&e, ImportError::Unsupported { field, .. } if field == "rope_scaling.type"),
        "{e:?}"
    );
    assert!(e.to_string().contains("\"dynamic\""), "{e}");
}

#[test]
fn heads_that_do_not_divide_are_inconsistent() {
    let (dir, e) = config_err(&set(LLAMA, "num_key_value_heads", "4"));
    assert_eq!(
        e.to_string(),
        format!(
            "{}: num_attention_heads (6) is not a multiple of num_key_value_heads (4)",
            dir.path().join("config.json").display()
        )
    );
    let (_dir, e) = config_err(&set(LLAMA, "hidden_size", "25"));
    assert!(
        matches!(&e, ImportError::Inconsistent { message, .. } if message.contains("hidden_size (25)")),
        "{e}"
    );
    // A default the config does not write is named as one: Qwen3's 32 kv heads over 4 heads.
    let (_dir, e) = config_err(&remove(QWEN3, "num_key_value_heads"));
    assert!(
        e.to_string().ends_with(
            "num_attention_heads (4) is not a multiple of num_key_value_heads (32: \
             Qwen3ForCausalLM's default, since config.json does not set it)"
        ),
        "{e}"
    );
}

#[test]
fn qwen3_next_inconsistencies_name_the_fields() {
    let cases = [
        (
            "layer_types",
            r#"["linear_attention", "full_attention"]"#,
            "layer_types has 2 entries but num_hidden_layers is 4",
        ),
        (
            "num_experts_per_tok",
            "5",
            "num_experts_per_tok (5) is greater than num_experts (4)",
        ),
        (
            "linear_num_value_heads",
            "3",
            "linear_num_value_heads (3) is not a multiple of linear_num_key_heads (2)",
        ),
        (
            "partial_rotary_factor",
            "0.1",
            "int(head_dim 32 * partial_rotary_factor 0.1) = 3",
        ),
        ("mlp_only_layers", "[4]", "mlp_only_layers names layer 4"),
    ];
    for (key, value, want) in cases {
        let (_dir, e) = config_err(&set(QWEN3_NEXT, key, value));
        assert!(
            matches!(&e, ImportError::Inconsistent { message, .. } if message.contains(want)),
            "{key}: {e}"
        );
    }
    let (_dir, e) = config_err(&set(
        QWEN3_NEXT,
        "layer_types",
        r#"["linear_attention", "sliding_attention", "x", "y"]"#,
    ));
    assert!(
        matches!(&e, ImportError::Unsupported { field, message, .. }
        if field == "layer_types" && message.contains("layer 1") && message.contains("sliding_attention")),
        "{e}"
    );
    let (_dir, e) = config_err(&remove(QWEN3_NEXT, "linear_key_head_dim"));
    assert!(
        matches!(&e, ImportError::BadField { field, .. } if field == "linear_key_head_dim"),
        "{e}"
    );
}

#[test]
fn missing_directory_and_missing_config_are_io_errors_naming_the_path() {
    let dir = TempDir::new("nothing");
    let absent = dir.path().join("no-such-model");
    let e = load_err(&absent);
    assert!(
        matches!(&e, ImportError::Io { path, .. } if path == &absent),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .starts_with(&format!("cannot read {}", absent.display())),
        "{e}"
    );

    let e = load_err(dir.path());
    assert!(
        matches!(&e, ImportError::Io { path, .. } if path == &dir.path().join("config.json")),
        "{e:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Tensor errors
// ---------------------------------------------------------------------------------------------

#[test]
fn missing_tensor_names_the_tensor_and_the_checkpoint() {
    let (dir, m) = good_llama("missing-tensor");
    let e = m
        .tensors
        .expect("model.layers.2.mlp.up_proj.weight", &[32, 24])
        .expect_err("only 2 layers");
    assert_eq!(
        e.to_string(),
        format!(
            "{}: no tensor named \"model.layers.2.mlp.up_proj.weight\"",
            dir.path().join("model.safetensors").display()
        )
    );
    assert!(
        m.tensors.to_f32("nope").is_err()
            && m.tensors.bytes("nope").is_err()
            && m.tensors.get("nope").is_none()
    );
}

#[test]
fn wrong_shape_names_the_tensor_file_and_both_shapes() {
    let (dir, m) = good_llama("wrong-shape");
    let e = m
        .tensors
        .expect("model.layers.0.mlp.up_proj.weight", &[32, 25])
        .expect_err("shape is [32, 24]");
    assert_eq!(
        e.to_string(),
        format!(
            "{}: tensor \"model.layers.0.mlp.up_proj.weight\" has shape [32, 24], expected [32, 25]",
            dir.path().join("model.safetensors").display()
        )
    );
}

#[test]
fn unsupported_dtypes_load_but_fail_when_requested() {
    let dir = TempDir::new("dtype");
    dir.write("config.json", LLAMA);
    let mut weights = dense_weights(&config(LLAMA), Dtype::BF16);
    weights.push(t(
        "model.layers.0.self_attn.rotary_emb.inv_freq",
        Dtype::I64,
        &[2],
    ));
    weights[0].1 = Dtype::F8_E4M3; // model.embed_tokens.weight
    dir.write("model.safetensors", safetensors_file(&weights));
    let m = load(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    let file = dir.path().join("model.safetensors");
    for (name, dtype) in [
        ("model.embed_tokens.weight", "F8_E4M3"),
        ("model.layers.0.self_attn.rotary_emb.inv_freq", "I64"),
    ] {
        assert!(
            m.tensors.contains(name) && m.tensors.get(name).is_none(),
            "{name}"
        );
        for e in [
            m.tensors
                .expect(name, &[40, 24])
                .map(|_| ())
                .expect_err("expect"),
            m.tensors.bytes(name).map(|_| ()).expect_err("bytes"),
            m.tensors.to_f32(name).map(|_| ()).expect_err("to_f32"),
        ] {
            assert!(
                matches!(&e, ImportError::UnsupportedDtype { tensor, dtype: d, file: f }
                if tensor == name && d == dtype && f == &file),
                "{e:?}"
            );
            assert!(
                e.to_string()
                    .contains(&format!("tensor \"{name}\" has dtype {dtype}")),
                "{e}"
            );
        }
    }
    assert!(
        m.tensors.to_f32("model.norm.weight").is_ok(),
        "other tensors still read"
    );
}

#[test]
fn truncated_safetensors_names_the_file() {
    let dir = TempDir::new("truncated");
    dir.write("config.json", LLAMA);
    let bytes = safetensors_file(&dense_weights(&config(LLAMA), Dtype::BF16));
    let file = dir.path().join("model.safetensors");
    // Shorter than the header's own length field: the crate's refusal, with the file.
    for cut in [0, 5] {
        dir.write("model.safetensors", &bytes[..cut]);
        let e = load_err(dir.path());
        assert!(
            matches!(&e, ImportError::BadSafetensors { file: f, .. } if f == &file),
            "cut {cut}: {e:?}"
        );
        assert!(
            e.to_string().contains("not a valid safetensors file"),
            "{e}"
        );
    }
    // Cut in the header, then in the data: said to be truncated, with both sizes.
    let header_end = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap());
    for (cut, expected, at_least) in [
        (8, header_end, true),
        (40, header_end, true),
        (bytes.len() - 1, bytes.len() as u64, false),
    ] {
        dir.write("model.safetensors", &bytes[..cut]);
        let e = load_err(dir.path());
        assert!(
            matches!(&e, ImportError::TruncatedSafetensors { file: f, expected: x, actual, at_least: a }
                if f == &file && *x == expected && *actual == cut as u64 && *a == at_least),
            "cut {cut}: {e:?}"
        );
        assert!(e.to_string().contains("is truncated"), "{e}");
    }
}

#[test]
fn missing_shard_names_the_index_and_the_shard() {
    let dir = TempDir::new("missing-shard");
    dir.write("config.json", LLAMA);
    dir.write(
        "model-00001-of-00002.safetensors",
        safetensors_file(&[t("a", Dtype::F32, &[2])]),
    );
    let index = r#"{"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}"#;
    dir.write("model.safetensors.index.json", index);
    let e = load_err(dir.path());
    assert!(
        matches!(&e, ImportError::MissingShard { shard, index, .. }
        if shard == "model-00002-of-00002.safetensors" && index == &dir.path().join("model.safetensors.index.json")),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .contains("shard \"model-00002-of-00002.safetensors\""),
        "{e}"
    );
}

#[test]
fn index_that_misplaces_a_tensor_is_inconsistent() {
    let dir = TempDir::new("misplaced");
    dir.write("config.json", LLAMA);
    dir.write(
        "one.safetensors",
        safetensors_file(&[t("a", Dtype::F32, &[2])]),
    );
    dir.write(
        "two.safetensors",
        safetensors_file(&[t("b", Dtype::F32, &[2])]),
    );
    dir.write("model.safetensors.index.json", r#"{"weight_map": {"a": "two.safetensors", "b": "two.safetensors", "c": "one.safetensors"}}"#);
    let e = load_err(dir.path());
    assert!(
        matches!(&e, ImportError::Inconsistent { message, .. } if message.contains("\"a\"")),
        "{e}"
    );
    dir.write("model.safetensors.index.json", r#"{"weight_map": ["a"]}"#);
    let e = load_err(dir.path());
    assert!(
        matches!(&e, ImportError::BadField { field, .. } if field == "weight_map"),
        "{e}"
    );
    dir.write("model.safetensors.index.json", "{");
    assert!(matches!(load_err(dir.path()), ImportError::BadJson { .. }));
}

#[test]
fn duplicate_tensor_across_files_names_both() {
    let dir = TempDir::new("duplicate");
    dir.write("config.json", LLAMA);
    dir.write(
        "a.safetensors",
        safetensors_file(&[t("w", Dtype::F32, &[2])]),
    );
    dir.write(
        "b.safetensors",
        safetensors_file(&[t("w", Dtype::F32, &[2])]),
    );
    let e = load_err(dir.path());
    assert!(
        matches!(&e, ImportError::DuplicateTensor { tensor, first, second }
        if tensor == "w" && first == &dir.path().join("a.safetensors") && second == &dir.path().join("b.safetensors")),
        "{e:?}"
    );
}

#[test]
fn directory_without_weights_says_so() {
    let dir = TempDir::new("no-weights");
    dir.write("config.json", LLAMA);
    let e = load_err(dir.path());
    assert!(
        matches!(&e, ImportError::NoWeights { dir: d, others } if d == dir.path() && others.is_empty()),
        "{e:?}"
    );
}

/// PyTorch's pickled weights alone: named in the error, with what to do instead.
#[test]
fn directory_with_only_pytorch_weights_names_them() {
    let dir = TempDir::new("pytorch-weights");
    dir.write("config.json", LLAMA);
    dir.write("pytorch_model.bin", "not read");
    dir.write("tokenizer.json", "{}");
    let e = load_err(dir.path());
    assert!(
        matches!(&e, ImportError::NoWeights { others, .. } if others == &["pytorch_model.bin"]),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("pytorch_model.bin, which vkfuse does not read"),
        "{msg}"
    );
    assert!(msg.contains("safe_serialization=True"), "{msg}");
}

// ---------------------------------------------------------------------------------------------
// Robustness: no input makes the importer panic
// ---------------------------------------------------------------------------------------------

/// How to damage a file.
#[derive(Clone, Debug)]
enum Damage {
    Truncate(usize),
    /// (position, xor mask); positions are taken modulo the file length.
    Flip(Vec<(usize, u8)>),
    /// Overwrite the bytes at a position with a string (e.g. a number in the JSON header).
    Splice(usize, String),
}

fn damage(bytes: &[u8], how: &Damage) -> Vec<u8> {
    let mut out = bytes.to_vec();
    match how {
        Damage::Truncate(n) => out.truncate(n % (bytes.len() + 1)),
        Damage::Flip(flips) => {
            for &(pos, mask) in flips {
                let i = pos % out.len();
                out[i] ^= mask;
            }
        }
        Damage::Splice(pos, text) => {
            let at = pos % out.len();
            for (i, b) in text.bytes().enumerate() {
                if let Some(slot) = out.get_mut(at + i) {
                    *slot = b;
                }
            }
        }
    }
    out
}

fn damages(len: usize, header_end: usize) -> impl Strategy<Value = Damage> {
    prop_oneof![
        (0..=len).prop_map(Damage::Truncate),
        // Mostly in the header, where the structure is.
        prop::collection::vec((0..header_end, 1u8..=255), 1..4).prop_map(Damage::Flip),
        prop::collection::vec((0..len, 1u8..=255), 1..8).prop_map(Damage::Flip),
        (
            0..header_end,
            prop::sample::select(vec![
                "9999999999999",
                "-1",
                "0",
                "]",
                "}",
                "\"F64\"",
                "\"I64\"",
                "1e309",
                "[]"
            ])
        )
            .prop_map(|(p, s)| Damage::Splice(p, s.to_string())),
    ]
}

fn small_checkpoint() -> Vec<u8> {
    safetensors_file(&[
        t("a", Dtype::F32, &[3, 2]),
        t("b", Dtype::BF16, &[5]),
        t("c", Dtype::F16, &[2, 2, 2]),
        t("d", Dtype::I64, &[2]),
    ])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn damaged_safetensors_never_panics(how in {
        let bytes = small_checkpoint();
        let header = 8 + u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
        damages(bytes.len(), header)
    }) {
        let dir = TempDir::new("prop-st");
        dir.write("config.json", LLAMA);
        dir.write("model.safetensors", damage(&small_checkpoint(), &how));
        if let Ok(m) = load(dir.path()) {
            let names: Vec<String> = m.tensors.names().map(str::to_string).collect();
            for name in &names {
                let _ = m.tensors.to_f32(name);
                let _ = m.tensors.bytes(name);
                let _ = m.tensors.expect(name, &[2]);
            }
            let _ = (m.tensors.total_bytes(), m.tensors.total_params(), m.to_string());
        }
    }

    #[test]
    fn damaged_config_never_panics(how in damages(QWEN3_NEXT.len(), QWEN3_NEXT.len())) {
        let text = String::from_utf8_lossy(&damage(QWEN3_NEXT.as_bytes(), &how)).into_owned();
        if let Ok(c) = ModelConfig::from_json(&text, Path::new("config.json")) {
            let _ = (c.to_string(), c.rope.inv_freq(), c.layer_counts());
        }
    }
}

#[test]
fn opening_a_store_directly_works_too() {
    let (dir, _m) = good_llama("store");
    let store = TensorStore::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(store.source(), dir.path().join("model.safetensors"));
}

// ---------------------------------------------------------------------------------------------
// The real fixtures (fixtures/models/*, written by transformers 5.17 via make_fixtures.py)
// ---------------------------------------------------------------------------------------------

fn fixture(name: &str) -> Model {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/models")
        .join(name);
    assert!(
        dir.is_dir(),
        "fixture {} is missing: generate the fixtures with fixtures/make_fixtures.py",
        dir.display()
    );
    let model = load(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
    // Every tensor reads, and the checkpoint holds exactly the parameters transformers counted.
    for tensor in model.tensors.names() {
        let info = model
            .tensors
            .get(tensor)
            .unwrap_or_else(|| panic!("{name}: {tensor} unreadable"));
        assert_eq!(
            Some(info.dtype),
            model.config.dtype,
            "{name}: {tensor} is stored in the config dtype"
        );
        let values = model
            .tensors
            .to_f32(tensor)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(values.len(), info.numel());
        assert!(
            values.iter().all(|v| v.is_finite()),
            "{name}: {tensor} has a non-finite value"
        );
    }
    let reference = std::fs::read_to_string(dir.join("reference.json")).expect("reference.json");
    let reference: serde_json::Value =
        serde_json::from_str(&reference).expect("reference.json parses");
    assert_eq!(
        Some(model.tensors.total_params() as u64),
        reference["num_parameters"].as_u64(),
        "{name}: parameter count"
    );
    assert_eq!(
        reference["architecture"].as_str(),
        Some(model.config.architecture.as_str())
    );
    model
}

#[test]
fn fixture_qwen3_tied_config() {
    let m = fixture("qwen3-tied");
    let c = &m.config;
    assert_eq!(c.family, Family::Qwen3);
    assert_eq!(
        (
            c.vocab_size,
            c.hidden_size,
            c.num_layers,
            c.intermediate_size
        ),
        (372, 64, 2, 160)
    );
    assert_eq!(
        (c.num_attention_heads, c.num_kv_heads, c.head_dim),
        (4, 2, 32)
    );
    assert_eq!(
        c.rope,
        RopeConfig {
            theta: 10000.0,
            rotary_dim: 32,
            scaling: RopeScaling::None
        }
    );
    assert_eq!(
        (c.rms_norm_eps, c.max_position_embeddings, c.dtype),
        (1e-6, 512, Some(DType::BF16))
    );
    assert_eq!(
        (c.bos_token_id, c.eos_token_ids.as_slice()),
        (Some(369), &[369][..])
    );
    assert!(c.tie_word_embeddings && !m.tensors.contains("lm_head.weight"));
    assert!(m
        .tensors
        .expect("model.embed_tokens.weight", &[372, 64])
        .is_ok());
    assert!(m
        .tensors
        .expect("model.layers.1.self_attn.q_norm.weight", &[32])
        .is_ok());
}

#[test]
fn fixture_qwen3_untied_config_and_shards() {
    let m = fixture("qwen3-untied");
    let c = &m.config;
    assert_eq!(c.family, Family::Qwen3);
    assert_eq!(
        (
            c.vocab_size,
            c.hidden_size,
            c.num_layers,
            c.intermediate_size
        ),
        (768, 96, 3, 256)
    );
    assert_eq!(
        (c.num_attention_heads, c.num_kv_heads, c.head_dim),
        (6, 3, 16)
    );
    assert_eq!((c.rope.theta, c.rope.rotary_dim), (1_000_000.0, 16));
    assert_eq!(
        (c.dtype, c.bos_token_id, c.eos_token_ids.as_slice()),
        (Some(DType::F16), Some(1), &[2][..])
    );
    assert!(!c.tie_word_embeddings);
    assert_eq!(
        m.tensors.files().count(),
        10,
        "ten shards through the index"
    );
    assert!(m.tensors.source().ends_with("model.safetensors.index.json"));
    assert!(m.tensors.expect("lm_head.weight", &[768, 96]).is_ok());
}

#[test]
fn fixture_llama_gqa_config() {
    let m = fixture("llama-gqa");
    let c = &m.config;
    assert_eq!(c.family, Family::Llama);
    assert_eq!(
        (
            c.vocab_size,
            c.hidden_size,
            c.num_layers,
            c.intermediate_size
        ),
        (1000, 96, 2, 200)
    );
    assert_eq!(
        (c.num_attention_heads, c.num_kv_heads, c.head_dim),
        (6, 2, 16),
        "head_dim derived"
    );
    assert_eq!(
        c.rope,
        RopeConfig {
            theta: 500000.0,
            rotary_dim: 16,
            scaling: RopeScaling::None
        }
    );
    assert_eq!((c.rms_norm_eps, c.dtype), (1e-5, Some(DType::BF16)));
    assert!(!c.tie_word_embeddings && !c.attention_bias && !c.mlp_bias);
    assert!(m
        .tensors
        .expect("model.layers.1.mlp.down_proj.weight", &[96, 200])
        .is_ok());
}

#[test]
fn fixture_qwen3_next_config() {
    let m = fixture("qwen3-next");
    let c = &m.config;
    assert_eq!(c.family, Family::Qwen3Next);
    assert_eq!((c.vocab_size, c.hidden_size, c.num_layers), (600, 64, 4));
    assert_eq!(
        (c.num_attention_heads, c.num_kv_heads, c.head_dim),
        (4, 2, 32)
    );
    assert_eq!(
        c.rope,
        RopeConfig {
            theta: 10000.0,
            rotary_dim: 8,
            scaling: RopeScaling::None
        }
    );
    assert_eq!((c.rms_norm_eps, c.dtype), (1e-6, Some(DType::BF16)));
    let h = c.hybrid.as_ref().expect("hybrid");
    assert_eq!(h.pattern(), "LLLF");
    assert_eq!((h.linear_num_key_heads, h.linear_num_value_heads), (2, 4));
    assert_eq!(
        (
            h.linear_key_head_dim,
            h.linear_value_head_dim,
            h.linear_conv_kernel_dim
        ),
        (16, 16, 4)
    );
    assert_eq!(
        (
            h.num_experts,
            h.num_experts_per_tok,
            h.moe_intermediate_size
        ),
        (8, 2, 32)
    );
    assert_eq!(
        (h.shared_expert_intermediate_size, h.norm_topk_prob),
        (48, true)
    );
    assert!((0..4).all(|l| h.is_moe_layer(l)));
    let conv = h.conv_dim();
    assert!(m
        .tensors
        .expect("model.layers.0.linear_attn.conv1d.weight", &[conv, 1, 4])
        .is_ok());
    assert!(m
        .tensors
        .expect("model.layers.3.self_attn.q_proj.weight", &[4 * 32 * 2, 64])
        .is_ok());
    assert!(m
        .tensors
        .expect("model.layers.2.mlp.experts.7.down_proj.weight", &[64, 32])
        .is_ok());
}

/// A folder where the checkpoint file should be is named as one (mapping it failed with the OS's
/// "No such device").
#[test]
fn a_folder_named_like_the_checkpoint_is_named_as_a_folder() {
    let dir = TempDir::new("checkpoint-folder");
    dir.write("config.json", LLAMA);
    std::fs::create_dir(dir.path().join("model.safetensors")).unwrap();
    let e = load_err(dir.path());
    let why = std::error::Error::source(&e).map(|s| s.to_string());
    assert!(e.to_string().contains("model.safetensors"), "{e}");
    assert_eq!(
        why.as_deref(),
        Some("it is a folder, not a safetensors file")
    );
}

/// A tied config over a checkpoint that also stores `lm_head.weight`: the logits come from the
/// embedding table, as transformers ties them after loading, and the model says so; untied, the
/// stored lm_head is read and nothing is said.
#[test]
fn a_tied_config_sets_a_stored_lm_head_aside_and_says_so() {
    let reads_lm_head = |m: &Model| {
        let p = vkfuse_compiler::trace::trace(m, &Default::default()).unwrap();
        p.ops.iter().any(|op| {
            matches!(&op.kind, vkfuse_compiler::ir::OpKind::Weight { name } if name == "lm_head.weight")
        })
    };
    // LLAMA's weights hold an lm_head.weight (it is untied).
    let weights = safetensors_file(&dense_weights(&config(LLAMA), Dtype::BF16));
    let dir = TempDir::new("tied-lm-head");
    dir.write("config.json", set(LLAMA, "tie_word_embeddings", "true"));
    dir.write("model.safetensors", weights.clone());
    let m = load(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    assert!(m.lm_head_set_aside());
    let warnings = m.warnings();
    assert!(
        warnings.iter().any(|w| w.contains("tie_word_embeddings")
            && w.contains("lm_head.weight")
            && w.contains("model.embed_tokens.weight")),
        "{warnings:?}"
    );
    assert!(!reads_lm_head(&m));

    let (_dir, untied) = good_llama("untied-lm-head");
    assert!(!untied.lm_head_set_aside() && untied.warnings().is_empty());
    assert!(reads_lm_head(&untied));
}

/// A checkpoint whose tensors the traced step does not all read is named, as transformers names
/// the weights it did not use: a Qwen3 checkpoint under an `architectures` of Llama drops the
/// q/k norms (and would decode wrongly, silently). What transformers itself skips (`mtp.*`,
/// stored rotary tables) and what `Model::warnings` already reports (layers past the config)
/// are not listed; a checkpoint read whole gives no warning.
#[test]
fn checkpoint_tensors_the_step_does_not_read_are_named() {
    use vkfuse_compiler::trace::{trace, unread_tensors, unread_warning};
    let traced = |m: &Model| trace(m, &Default::default()).unwrap_or_else(|e| panic!("{e}"));

    let dir = dense_dir("unread-qwen3", QWEN3, Dtype::BF16);
    let m = load(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(unread_tensors(&m, &traced(&m)), Vec::<String>::new());
    assert_eq!(unread_warning(&m, &traced(&m)), None);

    // The same checkpoint, described as a Llama.
    dir.write(
        "config.json",
        set(QWEN3, "architectures", r#"["LlamaForCausalLM"]"#),
    );
    let m = load(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    let p = traced(&m);
    let norms: Vec<String> = (0..2)
        .flat_map(|l| {
            ["k_norm", "q_norm"].map(|n| format!("model.layers.{l}.self_attn.{n}.weight"))
        })
        .collect();
    assert_eq!(unread_tensors(&m, &p), norms);
    let w = unread_warning(&m, &p).expect("a warning");
    assert!(
        w.contains("4 checkpoint tensors are not read")
            && w.contains("LlamaForCausalLM")
            && w.contains("model.layers.1.self_attn.q_norm.weight")
            && w.contains("architectures"),
        "{w}"
    );

    // Extras: one unknown tensor is listed; an MTP head, a rotary table and a layer past the
    // config are not.
    let mut weights = dense_weights(&config(LLAMA), Dtype::BF16);
    weights.push(t("mtp.fc.weight", Dtype::BF16, &[4, 4]));
    weights.push(t(
        "model.layers.0.self_attn.rotary_emb.inv_freq",
        Dtype::F32,
        &[2],
    ));
    weights.push(t(
        "model.layers.2.input_layernorm.weight",
        Dtype::BF16,
        &[24],
    ));
    weights.push(t("model.extra_proj.weight", Dtype::BF16, &[4, 24]));
    let dir = TempDir::new("unread-extras");
    dir.write("config.json", LLAMA);
    dir.write("model.safetensors", safetensors_file(&weights));
    let m = load(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    let p = traced(&m);
    assert_eq!(unread_tensors(&m, &p), vec!["model.extra_proj.weight"]);
    let w = unread_warning(&m, &p).expect("a warning");
    assert!(w.contains("1 checkpoint tensor is not read"), "{w}");
}

/// Every bundled fixture's step reads its whole checkpoint, norms folded or not: the warning
/// above has no false alarm on a model vkfuse decodes.
#[test]
fn every_fixture_step_reads_its_whole_checkpoint() {
    use vkfuse_compiler::trace::{trace, unread_tensors, TraceOptions};
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/models");
    for name in ["qwen3-tied", "qwen3-untied", "llama-gqa", "qwen3-next"] {
        let m = load(&root.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        for fold_norms in [false, true] {
            let opts = TraceOptions {
                fold_norms,
                ..Default::default()
            };
            let p = trace(&m, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(unread_tensors(&m, &p), Vec::<String>::new(), "{name}");
        }
    }
}

/// A model_type naming another supported family than architectures[0] is refused, naming
/// both (transformers would build the model_type's class); an unknown model_type is not.
#[test]
fn model_type_contradicting_architectures_is_refused() {
    let dir = dense_dir("model-type", LLAMA, Dtype::BF16);
    dir.write("config.json", set(LLAMA, "model_type", r#""qwen3""#));
    let e = load_err(dir.path()).to_string();
    assert!(
        e.contains("model_type")
            && e.contains("Qwen3ForCausalLM")
            && e.contains("LlamaForCausalLM")
            && e.contains("config.json"),
        "{e}"
    );
    dir.write("config.json", set(LLAMA, "model_type", r#""my_llama""#));
    load(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    dir.write("config.json", set(LLAMA, "model_type", "3"));
    let e = load_err(dir.path()).to_string();
    assert!(e.contains("model_type"), "{e}");
}

/// A pre-quantised checkpoint's config is refused by its quantization_config, naming the
/// method, before any tensor is looked for; null is no quantisation.
#[test]
fn a_quantization_config_is_refused_by_name() {
    let dir = dense_dir("quantization-config", LLAMA, Dtype::BF16);
    dir.write(
        "config.json",
        set(
            LLAMA,
            "quantization_config",
            r#"{"quant_method": "gptq", "bits": 4}"#,
        ),
    );
    let e = load_err(dir.path()).to_string();
    assert!(
        e.contains("quantization_config") && e.contains("gptq") && e.contains("--weights"),
        "{e}"
    );
    dir.write("config.json", set(LLAMA, "quantization_config", "null"));
    load(dir.path()).unwrap_or_else(|e| panic!("{e}"));
}

/// A matrix of the wrong shape under folded norms is named with its shape, as unfolded, not by
/// the compiler's name for the folded matrix nor as a matrix that cannot fold its norm.
#[test]
fn a_misshaped_matrix_reads_the_same_folded_or_not() {
    use vkfuse_compiler::trace::{trace, TraceOptions};
    let mut weights = dense_weights(&config(QWEN3), Dtype::BF16);
    let gate = "model.layers.1.mlp.gate_proj.weight";
    let w = weights.iter_mut().find(|w| w.0 == gate).expect("gate_proj");
    w.2.reverse();
    let dir = TempDir::new("misshaped-folded");
    dir.write("config.json", QWEN3);
    dir.write("model.safetensors", safetensors_file(&weights));
    let m = load(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    let messages: Vec<String> = [false, true]
        .into_iter()
        .map(|fold_norms| {
            let opts = TraceOptions {
                fold_norms,
                ..Default::default()
            };
            match trace(&m, &opts) {
                Ok(_) => panic!("a misshaped {gate} traced"),
                Err(e) => e.to_string(),
            }
        })
        .collect();
    assert!(
        messages[0].contains(&format!("\"{gate}\" has shape [32, 40], expected [40, 32]")),
        "{}",
        messages[0]
    );
    assert_eq!(messages[0], messages[1]);
}

/// What a schedule's writer and uploads read of the store (`TensorBytes`): the checkpoint's
/// tensors borrowed from the memory map, a transposed or folded matrix made for the call and
/// not kept. The made bytes equal what the store's kept paths give (a folded matrix through
/// `bytes`, a transposed one by `layout::transpose` of the matrix), their sizes are told without
/// making them, and a vector's transposed layout is refused naming it.
#[test]
fn derived_matrices_are_made_for_each_read_and_sized_without_making_them() {
    use std::borrow::Cow;
    use vkfuse_compiler::import::layout;
    use vkfuse_runtime::session::TensorBytes;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/models/qwen3-tied");
    let store = &load(&dir).expect("fixture").tensors;
    let (down, norm) = (
        "model.layers.0.mlp.down_proj.weight",
        "model.layers.0.post_attention_layernorm.weight",
    );
    let gate = "model.layers.0.mlp.gate_proj.weight";
    let info = store.get(down).expect("down").clone();
    let own = store.tensor_bytes(down).unwrap();
    assert!(matches!(own, Cow::Borrowed(_)));
    assert_eq!(store.tensor_len(down).unwrap(), own.len() as u64);

    let t = layout::transposed(down);
    let want = layout::transpose(&own, info.dtype, info.shape[0], info.shape[1]).unwrap();
    let made = store.tensor_bytes(&t).unwrap();
    assert!(matches!(made, Cow::Owned(_)), "{t} is made, not kept");
    assert!(made[..] == want[..], "{t}");
    assert_eq!(store.tensor_len(&t).unwrap(), want.len() as u64);

    let f = layout::folded(gate, norm);
    let made = store.tensor_bytes(&f).unwrap();
    assert!(matches!(made, Cow::Owned(_)), "{f} is made, not kept");
    assert!(made[..] == store.bytes(&f).unwrap()[..], "{f}");
    assert_eq!(store.tensor_len(&f).unwrap(), made.len() as u64);

    let vector = layout::transposed(norm);
    for err in [
        store.tensor_bytes(&vector).unwrap_err(),
        store.tensor_len(&vector).unwrap_err(),
    ] {
        assert!(err.contains(norm) && err.contains("not a matrix"), "{err}");
    }
}
