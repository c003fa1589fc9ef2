//! Qwen3-Next's sparse Mixture-of-Experts block, which Qwen3.5-MoE reuses (mlx-lm's
//! `Qwen3NextSparseMoeBlock`): a softmax over every expert's router score (`mlp.gate`), the top
//! k kept and, with `norm_topk_prob`, renormalized; each picked expert's SwiGLU; plus a shared
//! expert (`mlp.shared_expert`, `shared_expert_intermediate_size` wide) every token runs,
//! scaled per token by `sigmoid(shared_expert_gate(x))`. A library both families call.
//!
//! Experts are read in any of the three layouts checkpoints use: stacked as mlx-lm saves them
//! (`switch_mlp.*`), one matrix per expert (`experts.<e>.gate_proj`, Qwen3-Next's Hugging Face
//! files), or fused as Qwen3.5-MoE's Hugging Face files store them (`experts.gate_up_proj`
//! `[experts, 2 x width, hidden]`, the gate's rows first, and `experts.down_proj`
//! `[experts, hidden, width]`, neither with a `.weight` suffix), split here as mlx-lm's
//! `qwen3_5_moe.py` sanitize splits them.

use super::base::{layer_tensor, Mlp};
use super::config_keys::family_keys;
use super::moe::{ExpertActivation, Experts, MoeBlock, PROJ_NAMES};
use crate::config::{ModelConfig, MoeConfig, RouterKind};
use crate::error::{InferenceError, Result};
use crate::quantized::slice_axis;
use crate::weights::FormatOnMlx;
use crate::weights::{Stacked, TensorSource, WeightFormat};
use serde_json::Value;

/// The sparse block's keys of a config.json (or a multimodal release's `text_config`).
#[derive(serde::Deserialize)]
struct SparseKeys {
    num_experts: usize,
    num_experts_per_tok: usize,
    moe_intermediate_size: usize,
    shared_expert_intermediate_size: usize,
    norm_topk_prob: Option<bool>,
    #[serde(default = "one")]
    decoder_sparse_step: usize,
    #[serde(default)]
    mlp_only_layers: Vec<usize>,
}

fn one() -> usize {
    1
}

/// Which layers have the sparse block, as each family's mlx-lm file decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SparseLayers {
    /// Every layer (Qwen3.5-MoE: mlx-lm ignores `decoder_sparse_step` and `mlp_only_layers`).
    All,
    /// Every `decoder_sparse_step`-th layer not in `mlp_only_layers` (Qwen3-Next); the others
    /// keep a dense MLP of `intermediate_size`.
    BySparseStep,
}

/// The experts' configuration; `norm_default` is the family's `norm_topk_prob` when the
/// config.json has none (mlx-lm: true for Qwen3.5, false for Qwen3-Next).
pub(crate) fn sparse_moe_config(
    json: &Value,
    family: &str,
    layers: SparseLayers,
    norm_default: bool,
) -> Result<MoeConfig> {
    let keys: SparseKeys = family_keys(json, family)?;
    if keys.num_experts == 0
        || keys.num_experts_per_tok == 0
        || keys.num_experts_per_tok > keys.num_experts
    {
        return Err(InferenceError::BadConfig(format!(
            "a {family} config.json's experts: {} of {} per token",
            keys.num_experts_per_tok, keys.num_experts
        )));
    }
    let (dense_layers, sparse_step) = match layers {
        SparseLayers::All => (Vec::new(), 1),
        SparseLayers::BySparseStep => (keys.mlp_only_layers, keys.decoder_sparse_step),
    };
    Ok(MoeConfig {
        num_experts: keys.num_experts,
        experts_per_token: keys.num_experts_per_tok,
        expert_width: keys.moe_intermediate_size,
        router: RouterKind::SoftmaxTopK {
            normalize: keys.norm_topk_prob.unwrap_or(norm_default),
        },
        dense_layers,
        sparse_step,
        first_dense: 0,
        shared_width: keys.shared_expert_intermediate_size,
        latent_width: 0,
    })
}

/// The routed experts under `prefix` (`model.layers.3.mlp`), in whichever layout is stored.
fn load_experts(
    config: &ModelConfig,
    moe: &MoeConfig,
    source: &mut dyn TensorSource,
    prefix: &str,
    format: WeightFormat,
) -> Result<Experts> {
    if !source.contains(&format!("{prefix}.experts.gate_up_proj")) {
        return Experts::load(config, moe, source, prefix, PROJ_NAMES, format);
    }
    let experts = format!("{prefix}.experts");
    fused_experts(
        config,
        moe,
        source,
        &experts,
        format,
        ExpertActivation::SwiGlu,
    )
}

/// Experts stored fused as Qwen3.5-MoE's and Gemma 4's Hugging Face files store them:
/// `<experts>.gate_up_proj` `[experts, 2 x width, hidden]` (the gate's rows first) and
/// `<experts>.down_proj` `[experts, hidden, width]`, neither with a `.weight` suffix.
pub(crate) fn fused_experts(
    config: &ModelConfig,
    moe: &MoeConfig,
    source: &mut dyn TensorSource,
    experts_prefix: &str,
    format: WeightFormat,
    activation: ExpertActivation,
) -> Result<Experts> {
    let fused = format!("{experts_prefix}.gate_up_proj");
    let dtype = format.compute_dtype();
    let gate_up = source.dense(&fused, dtype)?;
    let (experts, width) = (moe.num_experts, moe.expert_width);
    let want = [experts as i32, 2 * width as i32, config.hidden_size as i32];
    if gate_up.shape() != want {
        return Err(InferenceError::BadTensor {
            name: fused,
            reason: format!("expected shape {want:?}, found {:?}", gate_up.shape()),
        });
    }
    let gate = slice_axis(&gate_up, 1, 0, width)?;
    let up = slice_axis(&gate_up, 1, width, 2 * width)?;
    let down = source.dense(&format!("{experts_prefix}.down_proj"), dtype)?;
    let projections = [gate, up, down].map(Stacked::Dense);
    Experts::new(config, moe, experts_prefix, projections, None, activation)
}

/// Layer `layer`'s sparse block: router, experts, shared expert and its gate.
pub(crate) fn load_sparse_block(
    config: &ModelConfig,
    moe: &MoeConfig,
    source: &mut dyn TensorSource,
    layer: usize,
    format: WeightFormat,
) -> Result<MoeBlock> {
    let prefix = layer_tensor(layer, "mlp");
    let router = source.linear(&format!("{prefix}.gate"), format)?;
    let experts = load_experts(config, moe, source, &prefix, format)?;
    let at = format!("{prefix}.shared_expert");
    let shared = Mlp::load_at(config, source, &at, moe.shared_width, format)?;
    let gate = source.linear(&format!("{prefix}.shared_expert_gate"), format)?;
    let what = format!("{prefix}.gate.weight");
    MoeBlock::from_parts(moe, router, None, experts, Some(shared), &what)?
        .with_shared_gate(gate, &format!("{prefix}.shared_expert_gate.weight"))
}

/// Names of layer `layer`'s sparse-block tensors as Hugging Face stores them: the experts
/// `fused` (Qwen3.5-MoE) or one matrix per expert (Qwen3-Next).
pub(crate) fn sparse_block_tensor_names(moe: &MoeConfig, layer: usize, fused: bool) -> Vec<String> {
    let mut parts = vec!["mlp.gate.weight".to_owned()];
    if fused {
        parts.push("mlp.experts.gate_up_proj".into());
        parts.push("mlp.experts.down_proj".into());
    } else {
        for e in 0..moe.num_experts {
            for proj in PROJ_NAMES {
                parts.push(format!("mlp.experts.{e}.{proj}.weight"));
            }
        }
    }
    for proj in PROJ_NAMES {
        parts.push(format!("mlp.shared_expert.{proj}.weight"));
    }
    parts.push("mlp.shared_expert_gate.weight".into());
    parts.iter().map(|p| layer_tensor(layer, p)).collect()
}
