//! Qwen2 / Qwen2.5: the shared pre-norm block with biases on the Q, K and V projections.

use super::base::{gguf_part_in, layer_tensor, Family, LAYER_TENSORS, QKV_BIASES};
use crate::config::ModelConfig;
use crate::error::Result;
use crate::weights::GgufNames;

/// The Qwen2 family.
pub struct Qwen2;

impl Family for Qwen2 {
    fn hf_names(&self) -> (&'static str, &'static str) {
        ("qwen2", "Qwen2ForCausalLM")
    }

    fn gguf_architectures(&self) -> &'static [&'static str] {
        &["qwen2"]
    }

    /// Qwen2's Q, K and V projections always have biases, whatever `attention_bias` says.
    fn configure(&self, _json: &serde_json::Value, config: &mut ModelConfig) -> Result<()> {
        config.attention_bias = true;
        Ok(())
    }

    fn layer_tensor_names(&self, _config: &ModelConfig, layer: usize) -> Vec<String> {
        LAYER_TENSORS
            .iter()
            .map(|(part, _)| format!("{part}.weight"))
            .chain(QKV_BIASES.iter().map(|b| b.to_string()))
            .map(|part| layer_tensor(layer, &part))
            .collect()
    }
}

impl GgufNames for Qwen2 {
    fn gguf_part(&self, hf_part: &str) -> Option<&'static str> {
        gguf_part_in(LAYER_TENSORS, hf_part)
    }
}
