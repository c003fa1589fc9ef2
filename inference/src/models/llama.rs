//! Llama 2/3, SmolLM2 and Mistral-style decoders: the shared pre-norm block with plain
//! attention (biases on Q/K/V only when `attention_bias` says so).
//!
//! In GGUF files, Llama's Q and K rows are interleaved for GGML's RoPE; reading them undoes
//! that, so every family runs the same (Hugging Face, half-split) RoPE.

use super::base::{gguf_part_in, layer_tensor, Family, LAYER_TENSORS, QKV_BIASES};
use crate::config::ModelConfig;
use crate::weights::GgufNames;

/// The Llama family.
pub struct Llama;

impl Family for Llama {
    fn hf_names(&self) -> (&'static str, &'static str) {
        ("llama", "LlamaForCausalLM")
    }

    fn gguf_architectures(&self) -> &'static [&'static str] {
        &["llama"]
    }

    fn layer_tensor_names(&self, config: &ModelConfig, layer: usize) -> Vec<String> {
        let mut names: Vec<String> = LAYER_TENSORS
            .iter()
            .map(|(part, _)| layer_tensor(layer, &format!("{part}.weight")))
            .collect();
        if config.attention_bias {
            names.extend(QKV_BIASES.iter().map(|b| layer_tensor(layer, b)));
        }
        names
    }
}

impl GgufNames for Llama {
    fn gguf_part(&self, hf_part: &str) -> Option<&'static str> {
        gguf_part_in(LAYER_TENSORS, hf_part)
    }

    fn gguf_rows_interleaved(&self, hf_name: &str) -> bool {
        hf_name.contains("self_attn.q_proj.") || hf_name.contains("self_attn.k_proj.")
    }
}
