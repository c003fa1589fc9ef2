//! What llama.cpp's Mixture-of-Experts GGUF files share across families: the experts'
//! tensor names (one tensor per projection holding every expert, `blk.N.ffn_gate_exps`, read as
//! mlx-lm's stacked `switch_mlp` by [`crate::weights::GgufSource`]) and the metadata keys that
//! give their numbers. A family's [`super::base::Family::configure_gguf`] reads these and adds
//! what its own graph fixes (the router's kind).

use crate::error::{InferenceError, Result};
use crate::gguf::{GgufFile, GgufValue};

/// The experts' and router's tensors: mlx-lm's name (under `model.layers.N.`) and llama.cpp's
/// (under `blk.N.`), as llama.cpp's `tensor_mapping.py` maps Qwen's, DeepSeek's and GLM's.
pub(crate) const EXPERT_TENSORS: &[(&str, &str)] = &[
    ("mlp.gate", "ffn_gate_inp"),
    ("mlp.switch_mlp.gate_proj", "ffn_gate_exps"),
    ("mlp.switch_mlp.up_proj", "ffn_up_exps"),
    ("mlp.switch_mlp.down_proj", "ffn_down_exps"),
];

/// The numbers of a GGUF's experts, from `<arch>.expert_count`, `<arch>.expert_used_count` and
/// `<arch>.expert_feed_forward_length`.
pub(crate) struct GgufExperts {
    /// Routed experts per layer.
    pub count: usize,
    /// Experts a token runs through.
    pub used: usize,
    /// One expert's hidden width.
    pub width: usize,
}

/// Reads [`GgufExperts`]; a missing key is a clear error naming it.
pub(crate) fn gguf_experts(file: &GgufFile, arch: &str) -> Result<GgufExperts> {
    let req = |k: &str| -> Result<usize> {
        file.get(&format!("{arch}.{k}"))
            .and_then(GgufValue::as_u64)
            .map(|x| x as usize)
            .ok_or_else(|| InferenceError::BadConfig(format!("GGUF metadata has no `{arch}.{k}`")))
    };
    Ok(GgufExperts {
        count: req("expert_count")?,
        used: req("expert_used_count")?,
        width: req("expert_feed_forward_length")?,
    })
}
