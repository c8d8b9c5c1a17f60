//! Hugging Face model import: a model directory (config.json + safetensors, and tokenizer.json
//! when there is one) in, a typed [`ModelConfig`], a memory-mapped [`TensorStore`] and the
//! tokenizer's text out.
//!
//! Import resolves config.json the way transformers 5.x does for the three supported classes
//! (`LlamaForCausalLM`, `Qwen3ForCausalLM`, `Qwen3NextForCausalLM`): every default applied,
//! RoPE resolved, cross-field constraints checked. It does not know which tensors a model
//! needs; the trace asks for each with [`TensorStore::expect`], which checks presence, dtype
//! and shape. Every failure is an [`ImportError`] naming the file and the field or tensor;
//! nothing here panics on any input.

mod config;
mod error;
mod fields;
mod hybrid;
pub mod layout;
mod rope;
mod tensors;

use std::fmt;
use std::path::{Path, PathBuf};

pub use config::{Family, ModelConfig};
pub use error::ImportError;
pub use hybrid::{HybridConfig, LayerType};
pub use rope::{RopeConfig, RopeScaling};
pub use tensors::{TensorInfo, TensorStore};

/// An imported model: its directory, resolved config and tensors.
#[derive(Debug)]
pub struct Model {
    pub dir: PathBuf,
    pub config: ModelConfig,
    pub tensors: TensorStore,
    /// `tokenizer.json` (the Hugging Face `tokenizers` format) verbatim, when the directory
    /// has one. Only checked to be JSON here: the compiler never tokenizes.
    pub tokenizer: Option<String>,
}

/// The generation defaults a model directory may have (only its `eos_token_id` is read).
pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";

/// The tokenizer file a model directory may have.
pub const TOKENIZER_FILE: &str = "tokenizer.json";

impl Model {
    /// The decoder layers the checkpoint holds tensors for (`model.layers.N.*`: the largest N
    /// plus one) where that is more than the config's `num_hidden_layers`: a config cut short
    /// (or a checkpoint of another model), whose other layers no trace reads.
    pub fn layers_beyond_config(&self) -> Option<usize> {
        let held = self
            .tensors
            .names()
            .filter_map(layer_of)
            .map(|l| l + 1)
            .max()?;
        (held > self.config.num_layers).then_some(held)
    }

    /// Whether the checkpoint holds an `lm_head.weight` that config.json's tie_word_embeddings
    /// sets aside: the logits then come from `model.embed_tokens.weight`, as transformers ties
    /// them after loading (and vLLM skips the tensor).
    pub fn lm_head_set_aside(&self) -> bool {
        self.config.tie_word_embeddings && self.tensors.contains("lm_head.weight")
    }

    /// What a user should hear about this model directory before it is compiled or decoded:
    /// checkpoint tensors its config sets aside.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = vec![];
        if let Some(held) = self.layers_beyond_config() {
            out.push(format!(
                "{}: config.json's num_hidden_layers is {}, but the checkpoint holds {held} \
                 layers (model.layers.*): the first {} only are computed",
                self.dir.display(),
                self.config.num_layers,
                self.config.num_layers
            ));
        }
        if let Some(problem) = self.tokenizer.as_deref().and_then(tokenizer_problem) {
            out.push(format!(
                "{}: {problem}: the schedule keeps the file, but `vkfuse generate --prompt` \
                 cannot use it (--ids still works)",
                self.dir.join(TOKENIZER_FILE).display()
            ));
        }
        if self.lm_head_set_aside() {
            out.push(format!(
                "{}: config.json sets tie_word_embeddings, and the checkpoint also holds \
                 lm_head.weight: the logits come from model.embed_tokens.weight, as \
                 transformers ties them; set tie_word_embeddings to false to use lm_head.weight",
                self.dir.display()
            ));
        }
        out
    }
}

/// The decoder layer a checkpoint tensor belongs to: N of `model.layers.N.*`.
pub fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("model.layers.")?
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// Loads the model directory `dir`: `config.json` and its safetensors, memory-mapped, and
/// `tokenizer.json` if present.
pub fn load(dir: &Path) -> Result<Model, ImportError> {
    let meta = std::fs::metadata(dir).map_err(ImportError::io(dir))?;
    if !meta.is_dir() {
        let source =
            std::io::Error::new(std::io::ErrorKind::NotADirectory, "not a model directory");
        return Err(ImportError::Io {
            path: dir.to_path_buf(),
            source,
        });
    }
    let mut config = ModelConfig::from_file(&dir.join("config.json"))?;
    config.add_generation_eos(&dir.join(GENERATION_CONFIG_FILE))?;
    let tensors = TensorStore::open(dir)?;
    let tokenizer = read_tokenizer(dir)?;
    Ok(Model {
        dir: dir.to_path_buf(),
        config,
        tensors,
        tokenizer,
    })
}

/// `dir/tokenizer.json` as text, `None` when the directory has none; an unreadable file or one
/// that is not JSON is an error naming it.
pub fn read_tokenizer(dir: &Path) -> Result<Option<String>, ImportError> {
    let file = dir.join(TOKENIZER_FILE);
    let text = match std::fs::read_to_string(&file) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ImportError::io(&file)(e)),
    };
    serde_json::from_str::<serde::de::IgnoredAny>(&text)
        .map_err(|e| ImportError::json(&file, &e))?;
    Ok(Some(text))
}

/// The model types the tokenizers library loads (its `ModelWrapper`).
const TOKENIZER_MODELS: [&str; 4] = ["BPE", "WordPiece", "WordLevel", "Unigram"];

/// Why `tokenizer` (JSON) is nothing the tokenizers library loads, where that shows without
/// loading it: no `model` object (every `tokenizer.json` it loads has one: its vocabulary and
/// merges are there), or a model `type` it does not know. None where neither shows.
fn tokenizer_problem(tokenizer: &str) -> Option<String> {
    let v = serde_json::from_str::<serde_json::Value>(tokenizer).ok()?;
    let Some(model) = v.get("model").filter(|m| m.is_object()) else {
        return Some(
            "no `model` object, which the tokenizers library reads the vocabulary from".into(),
        );
    };
    match model.get("type").and_then(serde_json::Value::as_str) {
        Some(t) if !TOKENIZER_MODELS.contains(&t) => Some(format!(
            "its model type `{t}` is none the tokenizers library loads ({})",
            TOKENIZER_MODELS.join(", ")
        )),
        _ => None,
    }
}

/// The config paragraph, then one line on the checkpoint.
impl fmt::Display for Model {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.config)?;
        write!(
            f,
            "{} tensors, {} parameters, {:.2} MB in {} file(s) under {}",
            self.tensors.len(),
            self.tensors.total_params(),
            self.tensors.total_bytes() as f64 / 1e6,
            self.tensors.files().count(),
            self.dir.display()
        )
    }
}
