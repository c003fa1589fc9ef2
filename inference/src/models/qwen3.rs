//! Qwen3: the shared pre-norm block with an RMS norm on each head's queries and keys (before
//! RoPE), and no Q/K/V biases.

use super::base::{
    gguf_part_in, layer_tensor, Attention, DecoderLayer, Family, HeadNorms, LAYER_TENSORS,
};
use crate::config::ModelConfig;
use crate::error::Result;
use crate::weights::FormatOnMlx;
use crate::weights::{GgufNames, TensorSource, WeightFormat};

/// Qwen3's per-head norms, with their GGUF names.
const HEAD_NORMS: &[(&str, &str)] = &[
    ("self_attn.q_norm", "attn_q_norm"),
    ("self_attn.k_norm", "attn_k_norm"),
];

/// The Qwen3 family.
pub struct Qwen3;

impl Family for Qwen3 {
    fn hf_names(&self) -> (&'static str, &'static str) {
        ("qwen3", "Qwen3ForCausalLM")
    }

    fn gguf_architectures(&self) -> &'static [&'static str] {
        &["qwen3"]
    }

    fn block(
        &self,
        config: &ModelConfig,
        source: &mut dyn TensorSource,
        layer: usize,
        format: WeightFormat,
    ) -> Result<DecoderLayer> {
        let dtype = format.compute_dtype();
        let mut norm =
            |part: &str| source.dense(&layer_tensor(layer, &format!("{part}.weight")), dtype);
        let head_norms = HeadNorms::each_head(norm(HEAD_NORMS[0].0)?, norm(HEAD_NORMS[1].0)?);
        let attention = Attention::load(config, source, layer, format, Some(head_norms))?;
        DecoderLayer::load(config, source, layer, format, attention)
    }

    fn layer_tensor_names(&self, _config: &ModelConfig, layer: usize) -> Vec<String> {
        LAYER_TENSORS
            .iter()
            .chain(HEAD_NORMS)
            .map(|(part, _)| layer_tensor(layer, &format!("{part}.weight")))
            .collect()
    }
}

impl GgufNames for Qwen3 {
    fn gguf_part(&self, hf_part: &str) -> Option<&'static str> {
        gguf_part_in(LAYER_TENSORS.iter().chain(HEAD_NORMS), hf_part)
    }
}
