//! Qwen3-Next's hybrid layout: which layers are Gated DeltaNet (linear attention) and which are
//! full attention, the DeltaNet sizes, and the sparse-MoE settings
//! (`configuration_qwen3_next.py`, semantics §5.1).

use std::fmt;

use super::error::ImportError;
use super::fields::Fields;

/// The token mixer of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerType {
    /// Gated DeltaNet (`linear_attn.*` weights).
    LinearAttention,
    /// Gated full attention (`self_attn.*` weights).
    FullAttention,
}

impl LayerType {
    /// The name used in config.json's `layer_types`.
    pub fn name(self) -> &'static str {
        match self {
            LayerType::LinearAttention => "linear_attention",
            LayerType::FullAttention => "full_attention",
        }
    }

    /// Reads a `layer_types` entry, with transformers' legacy names (`mamba`, `conv`, `attention`).
    fn parse(s: &str) -> Option<LayerType> {
        match s {
            "linear_attention" | "mamba" | "conv" => Some(LayerType::LinearAttention),
            "full_attention" | "attention" => Some(LayerType::FullAttention),
            _ => None,
        }
    }
}

impl fmt::Display for LayerType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The Qwen3-Next-specific part of the config.
#[derive(Clone, Debug, PartialEq)]
pub struct HybridConfig {
    /// One per layer: from `layer_types`, or derived from `full_attention_interval` (default 4):
    /// layer `i` is full attention iff `(i + 1) % interval == 0`.
    pub layer_types: Vec<LayerType>,
    pub linear_num_key_heads: usize,
    pub linear_num_value_heads: usize,
    pub linear_key_head_dim: usize,
    pub linear_value_head_dim: usize,
    pub linear_conv_kernel_dim: usize,
    /// 0 means every layer has a dense MLP.
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: usize,
    pub shared_expert_intermediate_size: usize,
    pub norm_topk_prob: bool,
    pub decoder_sparse_step: usize,
    pub mlp_only_layers: Vec<usize>,
}

impl HybridConfig {
    /// Whether `layer` has the sparse-MoE block (else a dense SwiGLU MLP of `intermediate_size`):
    /// `layer ∉ mlp_only_layers && num_experts > 0 && (layer + 1) % decoder_sparse_step == 0`.
    pub fn is_moe_layer(&self, layer: usize) -> bool {
        !self.mlp_only_layers.contains(&layer)
            && self.num_experts > 0
            && (layer + 1).checked_rem(self.decoder_sparse_step) == Some(0)
    }

    /// `linear_num_key_heads * linear_key_head_dim`.
    pub fn key_dim(&self) -> usize {
        self.linear_num_key_heads * self.linear_key_head_dim
    }

    /// `linear_num_value_heads * linear_value_head_dim`.
    pub fn value_dim(&self) -> usize {
        self.linear_num_value_heads * self.linear_value_head_dim
    }

    /// Channels of the causal depthwise conv: `2 * key_dim + value_dim`.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// The layer pattern, one letter per layer: `L` (linear attention) or `F` (full attention).
    pub fn pattern(&self) -> String {
        self.layer_types
            .iter()
            .map(|t| match t {
                LayerType::LinearAttention => 'L',
                LayerType::FullAttention => 'F',
            })
            .collect()
    }

    /// Reads the hybrid fields from config.json's top level.
    pub(crate) fn parse(f: Fields<'_>, num_layers: usize) -> Result<HybridConfig, ImportError> {
        let inconsistent = |message: String| ImportError::Inconsistent {
            file: f.file().to_path_buf(),
            message,
        };

        let layer_types = match f.array_opt("layer_types")? {
            Some(items) => {
                let mut types = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    let Some(name) = item.as_str() else {
                        let found = super::fields::show(item);
                        return Err(f.bad(
                            "layer_types",
                            format!("expected a list of strings, found {found}"),
                        ));
                    };
                    let Some(t) = LayerType::parse(name) else {
                        return Err(ImportError::Unsupported {
                            file: f.file().to_path_buf(),
                            field: "layer_types".into(),
                            message: format!(
                                "layer {i} has type \"{name}\"; Qwen3-Next layers are \"linear_attention\" or \"full_attention\""
                            ),
                        });
                    };
                    types.push(t);
                }
                if types.len() != num_layers {
                    return Err(inconsistent(format!(
                        "layer_types has {} entries but num_hidden_layers is {num_layers}",
                        types.len()
                    )));
                }
                types
            }
            None => {
                let interval = f.positive_or("full_attention_interval", 4)?;
                (0..num_layers)
                    .map(|i| {
                        if (i + 1) % interval == 0 {
                            LayerType::FullAttention
                        } else {
                            LayerType::LinearAttention
                        }
                    })
                    .collect()
            }
        };

        let linear_num_key_heads = f.positive("linear_num_key_heads")?;
        let linear_num_value_heads = f.positive("linear_num_value_heads")?;
        if linear_num_value_heads % linear_num_key_heads != 0 {
            return Err(inconsistent(format!(
                "linear_num_value_heads ({linear_num_value_heads}) is not a multiple of linear_num_key_heads \
                 ({linear_num_key_heads})"
            )));
        }
        let linear_key_head_dim = f.positive("linear_key_head_dim")?;
        let linear_value_head_dim = f.positive("linear_value_head_dim")?;
        let linear_conv_kernel_dim = f.positive_or("linear_conv_kernel_dim", 4)?;

        // With no experts the MoE sizes are unused; transformers' defaults stand in for them.
        let num_experts = f.count("num_experts")?;
        let moe = num_experts > 0;
        let sized = |key: &str, default: usize| {
            if moe {
                f.positive(key)
            } else {
                f.positive_or(key, default)
            }
        };
        let num_experts_per_tok = sized("num_experts_per_tok", 10)?;
        let moe_intermediate_size = sized("moe_intermediate_size", 512)?;
        let shared_expert_intermediate_size = sized("shared_expert_intermediate_size", 512)?;
        if moe && num_experts_per_tok > num_experts {
            return Err(inconsistent(format!(
                "num_experts_per_tok ({num_experts_per_tok}) is greater than num_experts ({num_experts})"
            )));
        }
        let norm_topk_prob = f.bool_or("norm_topk_prob", true)?;
        let decoder_sparse_step = f.positive_or("decoder_sparse_step", 1)?;
        let mlp_only_layers = f.index_list_opt("mlp_only_layers")?.unwrap_or_default();
        if let Some(bad) = mlp_only_layers.iter().find(|&&l| l >= num_layers) {
            return Err(inconsistent(format!(
                "mlp_only_layers names layer {bad} but num_hidden_layers is {num_layers}"
            )));
        }

        Ok(HybridConfig {
            layer_types,
            linear_num_key_heads,
            linear_num_value_heads,
            linear_key_head_dim,
            linear_value_head_dim,
            linear_conv_kernel_dim,
            num_experts,
            num_experts_per_tok,
            moe_intermediate_size,
            shared_expert_intermediate_size,
            norm_topk_prob,
            decoder_sparse_step,
            mlp_only_layers,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hybrid(layers: usize, step: usize, mlp_only: Vec<usize>, experts: usize) -> HybridConfig {
        HybridConfig {
            layer_types: vec![LayerType::LinearAttention; layers],
            linear_num_key_heads: 2,
            linear_num_value_heads: 4,
            linear_key_head_dim: 16,
            linear_value_head_dim: 8,
            linear_conv_kernel_dim: 4,
            num_experts: experts,
            num_experts_per_tok: 2,
            moe_intermediate_size: 32,
            shared_expert_intermediate_size: 48,
            norm_topk_prob: true,
            decoder_sparse_step: step,
            mlp_only_layers: mlp_only,
        }
    }

    #[test]
    fn moe_layers_follow_sparse_step_and_mlp_only_layers() {
        let h = hybrid(6, 2, vec![3], 8);
        let moe: Vec<bool> = (0..6).map(|l| h.is_moe_layer(l)).collect();
        assert_eq!(moe, [false, true, false, false, false, true]);
        let none = hybrid(4, 1, vec![], 0);
        assert!((0..4).all(|l| !none.is_moe_layer(l)));
    }

    #[test]
    fn derived_sizes() {
        let h = hybrid(1, 1, vec![], 8);
        assert_eq!((h.key_dim(), h.value_dim(), h.conv_dim()), (32, 32, 96));
    }
}
