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

/// The shared expert's tensors under DeepSeek's and GLM's name (`mlp.shared_experts`), as
/// llama.cpp names them (`ffn_*_shexp`).
pub(crate) const SHARED_EXPERT_TENSORS: &[(&str, &str)] = &[
    ("mlp.shared_experts.gate_proj", "ffn_gate_shexp"),
    ("mlp.shared_experts.up_proj", "ffn_up_shexp"),
    ("mlp.shared_experts.down_proj", "ffn_down_shexp"),
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

impl GgufExperts {
    /// Experts on every layer, routed by `router`, with no shared expert (llama.cpp's
    /// `qwen3moe` and `gpt-oss`).
    pub(crate) fn on_every_layer(
        &self,
        router: crate::config::RouterKind,
    ) -> crate::config::MoeConfig {
        crate::config::MoeConfig {
            num_experts: self.count,
            experts_per_token: self.used,
            expert_width: self.width,
            router,
            dense_layers: Vec::new(),
            sparse_step: 1,
            first_dense: 0,
            shared_width: 0,
            latent_width: 0,
        }
    }
}

/// `<arch>.<key>` as a count; `None` when absent.
pub(crate) fn gguf_count(file: &GgufFile, arch: &str, key: &str) -> Option<usize> {
    file.get(&format!("{arch}.{key}"))
        .and_then(GgufValue::as_u64)
        .map(|x| x as usize)
}

/// Reads [`GgufExperts`]; a missing key is a clear error naming it.
pub(crate) fn gguf_experts(file: &GgufFile, arch: &str) -> Result<GgufExperts> {
    let req = |k: &str| -> Result<usize> {
        gguf_count(file, arch, k)
            .ok_or_else(|| InferenceError::BadConfig(format!("GGUF metadata has no `{arch}.{k}`")))
    };
    Ok(GgufExperts {
        count: req("expert_count")?,
        used: req("expert_used_count")?,
        width: req("expert_feed_forward_length")?,
    })
}

/// The sigmoid-routed experts of a GGUF (llama.cpp's `expert_gating_func` 2: GLM-4.5, DeepSeek
/// V3): groups, the weights' normalization and scale, the shared expert and the leading dense
/// layers from their keys, as llama.cpp's `build_moe_ffn` reads them (it normalizes whenever
/// `expert_weights_norm` is set, whatever k).
pub(crate) fn gguf_sigmoid_moe(file: &GgufFile, arch: &str) -> Result<crate::config::MoeConfig> {
    let experts = gguf_experts(file, arch)?;
    match gguf_count(file, arch, "expert_gating_func") {
        None | Some(2) => {}
        Some(other) => {
            return Err(InferenceError::BadConfig(format!(
                "`{arch}.expert_gating_func` is {other}; only sigmoid (2) routing is supported \
                 for this family"
            )))
        }
    }
    let f = |k: &str, default: f64| {
        file.get(&format!("{arch}.{k}"))
            .and_then(GgufValue::as_f64)
            .unwrap_or(default) as f32
    };
    Ok(crate::config::MoeConfig {
        num_experts: experts.count,
        experts_per_token: experts.used,
        expert_width: experts.width,
        router: crate::config::RouterKind::SigmoidGroupedTopK {
            groups: gguf_count(file, arch, "expert_group_count").unwrap_or(1),
            top_groups: gguf_count(file, arch, "expert_group_used_count").unwrap_or(1),
            normalize: file
                .get(&format!("{arch}.expert_weights_norm"))
                .and_then(GgufValue::as_bool)
                .unwrap_or(false),
            scale: f("expert_weights_scale", 1.0),
        },
        dense_layers: Vec::new(),
        sparse_step: 1,
        first_dense: gguf_count(file, arch, "leading_dense_block_count").unwrap_or(0),
        shared_width: gguf_count(file, arch, "expert_shared_count").unwrap_or(0) * experts.width,
        latent_width: 0,
    })
}
