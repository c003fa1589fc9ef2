//! The sigmoid-routed, group-limited Mixture of Experts with a shared expert that DeepSeek V3,
//! GLM-4.5 and their descendants configure and name alike: its configuration keys, its
//! tensors and their names. A library piece the families call ([`super::deepseek_v3`],
//! [`super::glm4_moe`], and under Moonshot's names [`super::kimi_linear`] and
//! [`super::kimi_k3`]), so no family imports another.

use super::config_keys::{required, usize_or};
use super::mlp::Mlp;
use super::moe::{ExpertNames, Experts, MoeBlock, PROJ_NAMES};
use super::parts::layer_tensor;
use crate::config::{ModelConfig, MoeConfig, RouterKind};
use crate::error::{InferenceError, Result};
use crate::weights::{TensorSource, WeightFormat};
use serde_json::Value;

/// The sigmoid-routed experts DeepSeek V3 and GLM-4.5 configure alike: `n_routed_experts`,
/// `num_experts_per_tok`, `moe_intermediate_size`, `n_group` / `topk_group`,
/// `norm_topk_prob`, `routed_scaling_factor`, `n_shared_experts`, `first_k_dense_replace`.
/// Only the reference's `noaux_tc` selection over sigmoid scores is known.
pub(crate) fn sigmoid_moe_config(v: &Value) -> Result<MoeConfig> {
    for (key, want) in [("scoring_func", "sigmoid"), ("topk_method", "noaux_tc")] {
        match v.get(key).and_then(Value::as_str) {
            None => {}
            Some(got) if got == want => {}
            Some(got) => {
                return Err(InferenceError::BadConfig(format!(
                    "`{key}` is `{got}`; only `{want}` routing is supported for this family"
                )))
            }
        }
    }
    let experts_per_token = required(v, "num_experts_per_tok")?;
    let expert_width = required(v, "moe_intermediate_size")?;
    Ok(MoeConfig {
        num_experts: required(v, "n_routed_experts")?,
        experts_per_token,
        expert_width,
        router: RouterKind::SigmoidGroupedTopK {
            groups: usize_or(v, "n_group", 1),
            top_groups: usize_or(v, "topk_group", 1),
            // The reference divides by the sum only when more than one expert is chosen.
            normalize: experts_per_token > 1
                && v.get("norm_topk_prob")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
            scale: v
                .get("routed_scaling_factor")
                .and_then(Value::as_f64)
                .unwrap_or(1.0) as f32,
        },
        dense_layers: Vec::new(),
        sparse_step: 1,
        first_dense: usize_or(v, "first_k_dense_replace", 0),
        shared_width: usize_or(v, "n_shared_experts", 0) * expert_width,
        latent_width: 0,
    })
}

/// Reads layer `layer`'s Mixture of Experts under `prefix` (`model.layers.N.mlp`): the router
/// `gate` with its `gate.e_score_correction_bias`, the experts and, when configured, the
/// shared expert `shared_experts` (DeepSeek V3 and GLM-4.5 name them alike).
pub(crate) fn load_sigmoid_moe(
    config: &ModelConfig,
    moe: &MoeConfig,
    source: &mut dyn TensorSource,
    prefix: &str,
    format: WeightFormat,
) -> Result<MoeBlock> {
    let correction = format!("{prefix}.gate.e_score_correction_bias");
    let correction = has_correction(moe).then_some(correction.as_str());
    load_sigmoid_moe_named(config, moe, source, prefix, correction, PROJ_NAMES, format)
}

/// The same block under another checkpoint's names: the correction at `correction` (when the
/// router has one) and the experts' projections named `names` (Kimi's `w1`, `w3`, `w2`).
pub(crate) fn load_sigmoid_moe_named(
    config: &ModelConfig,
    moe: &MoeConfig,
    source: &mut dyn TensorSource,
    prefix: &str,
    correction: Option<&str>,
    names: ExpertNames,
    format: WeightFormat,
) -> Result<MoeBlock> {
    let router = source.linear(&format!("{prefix}.gate"), format)?;
    // The correction stays f32 in every checkpoint layout: it only decides ties of choice.
    // A softmax router (Mistral 4) has none.
    let correction = correction
        .map(|name| source.dense(name, mlx_rs::Dtype::Float32))
        .transpose()?;
    let experts = Experts::load(config, moe, source, prefix, names, format)?;
    let shared = if moe.shared_width > 0 {
        let at = format!("{prefix}.shared_experts");
        Some(Mlp::load_at(config, source, &at, moe.shared_width, format)?)
    } else {
        None
    };
    MoeBlock::from_parts(
        moe,
        router,
        correction,
        experts,
        shared,
        &format!("{prefix}.gate.weight"),
    )
}

/// Hugging Face names of a sigmoid-routed MoE layer's tensors under `mlp`.
pub(crate) fn sigmoid_moe_tensor_names(moe: &MoeConfig, layer: usize) -> Vec<String> {
    let mut names = vec![layer_tensor(layer, "mlp.gate.weight")];
    if has_correction(moe) {
        names.push(layer_tensor(layer, "mlp.gate.e_score_correction_bias"));
    }
    for e in 0..moe.num_experts {
        for proj in PROJ_NAMES {
            names.push(layer_tensor(
                layer,
                &format!("mlp.experts.{e}.{proj}.weight"),
            ));
        }
    }
    if moe.shared_width > 0 {
        for proj in PROJ_NAMES {
            names.push(layer_tensor(
                layer,
                &format!("mlp.shared_experts.{proj}.weight"),
            ));
        }
    }
    names
}

/// Whether the router has a score correction (`e_score_correction_bias`): sigmoid routers do.
fn has_correction(moe: &MoeConfig) -> bool {
    matches!(moe.router, RouterKind::SigmoidGroupedTopK { .. })
}

/// Moonshot's names of the experts' projections (gate, up, down).
pub(crate) const MOONSHOT_EXPERT_NAMES: ExpertNames = ["w1", "w3", "w2"];

/// Layer `layer`'s experts as Moonshot's checkpoints (Kimi Linear, Kimi K3) hold them:
/// `block_sparse_moe` with its router, correction (`gate.e_score_correction_bias`),
/// per-expert `w1`/`w3`/`w2` and shared expert; or as mlx-lm writes them, under `mlp`
/// (`switch_mlp`, the correction beside the router). Returns the block and the prefix it was
/// read under (where a family finds what else it keeps beside the experts).
pub(crate) fn load_moonshot_moe(
    config: &ModelConfig,
    moe: &MoeConfig,
    source: &mut dyn TensorSource,
    layer: usize,
    format: WeightFormat,
) -> Result<(MoeBlock, String)> {
    let moonshot = layer_tensor(layer, "block_sparse_moe");
    let (prefix, correction) = if source.contains(&format!("{moonshot}.gate.weight")) {
        let c = format!("{moonshot}.gate.e_score_correction_bias");
        (moonshot, c)
    } else {
        let mlp = layer_tensor(layer, "mlp");
        let c = format!("{mlp}.e_score_correction_bias");
        (mlp, c)
    };
    let block = load_sigmoid_moe_named(
        config,
        moe,
        source,
        &prefix,
        Some(&correction),
        MOONSHOT_EXPERT_NAMES,
        format,
    )?;
    Ok((block, prefix))
}

/// Moonshot's names of layer `layer`'s experts (see [`load_moonshot_moe`]).
pub(crate) fn moonshot_moe_tensor_names(moe: &MoeConfig, layer: usize) -> Vec<String> {
    let p = |part: &str| layer_tensor(layer, &format!("block_sparse_moe.{part}"));
    let mut names = vec![p("gate.weight"), p("gate.e_score_correction_bias")];
    for e in 0..moe.num_experts {
        for w in MOONSHOT_EXPERT_NAMES {
            names.push(p(&format!("experts.{e}.{w}.weight")));
        }
    }
    if moe.shared_width > 0 {
        for proj in PROJ_NAMES {
            names.push(p(&format!("shared_experts.{proj}.weight")));
        }
    }
    names
}
