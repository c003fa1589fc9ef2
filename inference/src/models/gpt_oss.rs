//! gpt-oss (gpt-oss-20b, gpt-oss-120b), as mlx-lm's `gpt_oss.py`: every layer is attention
//! with biases on Q, K, V and O, a learned sink logit per head (attention may give weight to
//! nothing), YaRN RoPE, and a sliding window on the layers `layer_types` marks
//! `sliding_attention` (the others attend to everything); then a Mixture of Experts whose
//! router (a linear layer with a bias) keeps the top k logits and takes their softmax, and whose
//! experts (with biases) run a clamped SwiGLU: `(clip(up, ±limit) + 1) · g · σ(1.702 g)` with
//! `g = min(gate, limit)`.
//!
//! Experts come in two layouts. The released OpenAI checkpoint stores them in mxfp4 as
//! `gate_up_proj_blocks` (bytes `[experts, 2·width, in/32, 16]`), `gate_up_proj_scales` and
//! `gate_up_proj_bias`, gate and up rows interleaved (even rows gate, odd rows up), and
//! `down_proj_*`; the bytes are MLX's mxfp4 packing already, so they are read as its words and
//! de-interleaved here. `mlx_lm.convert` stores them stacked as `experts.{gate,up,down}_proj`
//! (mxfp4, with `.bias`).

use super::base::{gguf_part_in, layer_tensor, Attention, DecoderLayer, Family, FeedForward};
use super::gguf_moe::{gguf_count, gguf_experts};
use super::moe::{ExpertActivation, ExpertBiases, Experts, MoeBlock};
#[cfg(test)]
use crate::config::RopeScaling;
use crate::config::{FamilyParams, ModelConfig, MoeConfig, RouterKind, SlidingWindow};
use crate::error::{InferenceError, Result};
use crate::gguf::GgufValue;
use crate::quantized::{QuantMode, QuantSpec, QuantizedMatrix};
use crate::tensor_divisors::TensorDivisor;
use crate::weights::FormatOnMlx;
use crate::weights::{GgufNames, Stacked, TensorSource, WeightFormat};
use mlx_rs::{Array, Dtype};
use serde_json::Value;

/// The clamped SwiGLU's `alpha`: a constant of the architecture, not in config.json.
const SWIGLU_ALPHA: f32 = 1.702;

/// The quantization of the released checkpoint's experts.
const MXFP4: QuantSpec = QuantSpec {
    group_size: 32,
    bits: 4,
    mode: QuantMode::Mxfp4,
};

/// The tensors of a layer besides its experts, with their GGUF names.
const TENSORS: &[(&str, &str)] = &[
    ("self_attn.q_proj", "attn_q"),
    ("self_attn.k_proj", "attn_k"),
    ("self_attn.v_proj", "attn_v"),
    ("self_attn.o_proj", "attn_output"),
    ("self_attn.sinks", "attn_sinks"),
    ("mlp.router", "ffn_gate_inp"),
    ("input_layernorm", "attn_norm"),
    ("post_attention_layernorm", "post_attention_norm"),
    // llama.cpp's converter splits the released `gate_up_proj` (even rows gate, odd rows up)
    // into two stacks and keeps the experts' biases beside them (`ffn_*_exps.bias`).
    ("mlp.experts.gate_proj", "ffn_gate_exps"),
    ("mlp.experts.up_proj", "ffn_up_exps"),
    ("mlp.experts.down_proj", "ffn_down_exps"),
];

/// The gpt-oss family.
pub struct GptOss;

fn bad(message: String) -> InferenceError {
    InferenceError::BadConfig(message)
}

/// What gpt-oss's configuration holds beyond the shared numbers.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct GptOssParams {
    /// `swiglu_limit`: where the experts' gate (from above) and up (both sides) are clamped.
    swiglu_limit: f32,
}

impl Family for GptOss {
    fn hf_names(&self) -> (&'static str, &'static str) {
        ("gpt_oss", "GptOssForCausalLM")
    }

    fn gguf_architectures(&self) -> &'static [&'static str] {
        &["gpt-oss"]
    }

    /// llama.cpp's `gpt-oss`: the experts' keys ([`gguf_experts`]; its graph takes the softmax
    /// of the top k router logits, as here), `attention.sliding_window` on the layers
    /// `attention.sliding_window_pattern` marks (absent: every other layer, the first sliding,
    /// as llama.cpp's `load_swa_pattern(2)`), and the SwiGLU limit llama.cpp fixes at 7.
    fn configure_gguf(
        &self,
        file: &crate::gguf::GgufFile,
        arch: &str,
        config: &mut ModelConfig,
    ) -> Result<()> {
        let experts = gguf_experts(file, arch)?;
        config.moe = Some(experts.on_every_layer(RouterKind::TopKSoftmax));
        let size = gguf_count(file, arch, "attention.sliding_window").ok_or_else(|| {
            bad(format!(
                "GGUF metadata has no `{arch}.attention.sliding_window`"
            ))
        })?;
        let layers = match file.get(&format!("{arch}.attention.sliding_window_pattern")) {
            Some(GgufValue::Array(flags)) => flags
                .iter()
                .map(|f| f.as_bool().or_else(|| f.as_u64().map(|n| n != 0)))
                .collect::<Option<Vec<bool>>>()
                .filter(|l| l.len() == config.num_layers)
                .ok_or_else(|| {
                    bad(format!(
                        "`{arch}.attention.sliding_window_pattern` is not one flag per layer"
                    ))
                })?,
            other => {
                let n = other.and_then(GgufValue::as_u64).unwrap_or(2) as usize;
                (0..config.num_layers)
                    .map(|l| n == 0 || l % n < n - 1)
                    .collect()
            }
        };
        config.sliding_window = Some(SlidingWindow { size, layers });
        config.family_params = FamilyParams::of(&GptOssParams { swiglu_limit: 7.0 })?;
        config.attention_bias = true;
        Ok(())
    }

    fn configure(&self, json: &Value, config: &mut ModelConfig) -> Result<()> {
        let count = |key: &str| json.get(key).and_then(Value::as_u64).map(|n| n as usize);
        let num_experts = count("num_local_experts")
            .ok_or_else(|| bad("a gpt_oss config.json without `num_local_experts`".into()))?;
        let experts_per_token = count("num_experts_per_tok")
            .or_else(|| count("experts_per_token"))
            .ok_or_else(|| bad("a gpt_oss config.json without `num_experts_per_tok`".into()))?;
        config.moe = Some(MoeConfig {
            num_experts,
            experts_per_token,
            expert_width: config.intermediate_size,
            router: RouterKind::TopKSoftmax,
            dense_layers: Vec::new(),
            sparse_step: 1,
            first_dense: 0,
            shared_width: 0,
            latent_width: 0,
        });
        // Without `layer_types`, mlx-lm alternates sliding and full layers, sliding first.
        config.sliding_window =
            SlidingWindow::from_hf_json(json, config.num_layers, |l| l % 2 == 0)?;
        if config.sliding_window.is_none() {
            return Err(bad(
                "a gpt_oss config.json without `sliding_window` (128 in the released models)"
                    .into(),
            ));
        }
        let swiglu_limit = json
            .get("swiglu_limit")
            .and_then(Value::as_f64)
            .unwrap_or(7.0) as f32;
        config.family_params = FamilyParams::of(&GptOssParams { swiglu_limit })?;
        config.attention_bias = true;
        Ok(())
    }

    fn block(
        &self,
        config: &ModelConfig,
        source: &mut dyn TensorSource,
        layer: usize,
        format: WeightFormat,
    ) -> Result<DecoderLayer> {
        let Some(moe) = &config.moe else {
            return Err(bad("a gpt_oss configuration without its experts".into()));
        };
        let params: GptOssParams = config.family_params.get("gpt_oss")?;
        let sinks = source.dense(
            &layer_tensor(layer, "self_attn.sinks"),
            format.compute_dtype(),
        )?;
        let attention = Attention::load(config, source, layer, format, None)?.with_sinks(sinks)?;
        let router_name = layer_tensor(layer, "mlp.router");
        let router = source.linear(&router_name, format)?;
        let activation = ExpertActivation::ClampedSwiGlu {
            alpha: SWIGLU_ALPHA,
            limit: params.swiglu_limit,
        };
        let prefix = layer_tensor(layer, "mlp.experts");
        let (projections, biases) = if source.contains(&format!("{prefix}.gate_up_proj_blocks")) {
            openai_experts(source, &prefix, format)?
        } else {
            stacked_experts(source, &prefix, format)?
        };
        let experts = Experts::new(config, moe, &prefix, projections, Some(biases), activation)?;
        let ffn = FeedForward::Experts(MoeBlock::from_parts(
            moe,
            router,
            None,
            experts,
            None,
            &router_name,
        )?);
        DecoderLayer::assemble(config, source, layer, format, attention, ffn)
    }

    /// Heads and key/value heads; each expert's width and its mxfp4 groups of 32 (the experts
    /// are mxfp4 in both layouts); the output projection's inputs in the groups the
    /// attention is quantized in (64 at mlx-community's 4 and 8 bits, not the default 32).
    fn tensor_divisors(&self, config: &ModelConfig) -> Vec<TensorDivisor> {
        let divisor = |what: String, count: usize| TensorDivisor {
            what,
            count: crate::tensor_divisors::count_of(count),
        };
        let mut out = vec![
            divisor("attention heads".into(), config.num_heads),
            divisor("key/value heads".into(), config.num_kv_heads),
        ];
        if let Some(moe) = &config.moe {
            let width = moe.expert_width;
            out.push(divisor("expert width".into(), width));
            out.push(divisor(
                format!(
                    "expert width ({width}) in mxfp4 groups of {}",
                    MXFP4.group_size
                ),
                width / MXFP4.group_size as usize,
            ));
        }
        if let Some(q) = &config.quantization {
            let inputs = config.num_heads * config.head_dim;
            let g = q.spec_for(&layer_tensor(0, "self_attn.o_proj")).group_size as usize;
            out.push(divisor(
                format!("output projection inputs ({inputs}) in quantization groups of {g}"),
                inputs / g.max(1),
            ));
        }
        out
    }

    fn layer_tensor_names(&self, _config: &ModelConfig, layer: usize) -> Vec<String> {
        let mut names = Vec::new();
        // The experts' split stacks are GGUF's (and mlx_lm.convert's) layout; the released
        // checkpoint's own names follow.
        for (part, _) in TENSORS
            .iter()
            .filter(|(part, _)| !part.starts_with("mlp.experts."))
        {
            let suffixes: &[&str] = match *part {
                "self_attn.sinks" => &[""],
                "input_layernorm" | "post_attention_layernorm" => &[".weight"],
                _ => &[".weight", ".bias"],
            };
            names.extend(
                suffixes
                    .iter()
                    .map(|s| layer_tensor(layer, &format!("{part}{s}"))),
            );
        }
        for proj in ["gate_up_proj", "down_proj"] {
            for what in ["blocks", "scales", "bias"] {
                names.push(layer_tensor(layer, &format!("mlp.experts.{proj}_{what}")));
            }
        }
        names
    }
}

impl GgufNames for GptOss {
    fn gguf_part(&self, hf_part: &str) -> Option<&'static str> {
        gguf_part_in(TENSORS, hf_part)
    }
}

/// Experts as `mlx_lm.convert` stores them: `<prefix>.{gate,up,down}_proj` stacked, with
/// `.bias` `[experts, out]`.
fn stacked_experts(
    source: &mut dyn TensorSource,
    prefix: &str,
    format: WeightFormat,
) -> Result<([Stacked; 3], ExpertBiases)> {
    let mut load = |proj: &str| -> Result<(Stacked, Array)> {
        let name = format!("{prefix}.{proj}");
        let w = source
            .stacked(&name, format)?
            .ok_or_else(|| InferenceError::MissingTensor(format!("{name}.weight")))?;
        Ok((
            w,
            source.dense(&format!("{name}.bias"), format.compute_dtype())?,
        ))
    };
    let ((gate, gate_bias), (up, up_bias), (down, down_bias)) =
        (load("gate_proj")?, load("up_proj")?, load("down_proj")?);
    let biases = ExpertBiases {
        gate: gate_bias,
        up: up_bias,
        down: down_bias,
    };
    Ok(([gate, up, down], biases))
}

/// Experts as the released checkpoint stores them (see the module docs): mxfp4 kept as it is
/// for [`WeightFormat::Quantized`], else dequantized to the compute dtype.
fn openai_experts(
    source: &mut dyn TensorSource,
    prefix: &str,
    format: WeightFormat,
) -> Result<([Stacked; 3], ExpertBiases)> {
    let dtype = format.compute_dtype();
    let mut read = |proj: &str| -> Result<(QuantizedMatrix, Array)> {
        let name = |what: &str| format!("{prefix}.{proj}_{what}");
        let blocks = source.dense(&name("blocks"), Dtype::Uint8)?;
        let scales = source.dense(&name("scales"), Dtype::Uint8)?;
        let s = blocks.shape().to_vec();
        if s.len() != 4 || s[3] != 16 || scales.shape() != &s[..3] {
            return Err(InferenceError::BadTensor {
                name: name("blocks"),
                reason: format!(
                    "expected mxfp4 blocks [experts, rows, groups, 16] with scales [experts, \
                     rows, groups]; found {s:?} and {:?}",
                    scales.shape()
                ),
            });
        }
        // 16 bytes of a group are 4 of MLX's 32-bit words (little-endian, as MLX packs them).
        let packed = blocks.view::<u32>()?.reshape(&[s[0], s[1], s[2] * 4])?;
        let matrix = QuantizedMatrix {
            packed,
            scales,
            biases: None,
            spec: MXFP4,
        };
        Ok((matrix, source.dense(&name("bias"), dtype)?))
    };
    let (gate_up, gate_up_bias) = read("gate_up_proj")?;
    let (down, down_bias) = read("down_proj")?;
    let rows = gate_up.out_rows() as i32;
    let every_other = |first: i32| Array::from_iter((first..rows).step_by(2), &[rows / 2]);
    let (even, odd) = (every_other(0), every_other(1));
    let pick = |q: &QuantizedMatrix, rows: &Array| -> Result<QuantizedMatrix> {
        Ok(QuantizedMatrix {
            packed: q.packed.take_axis(rows, 1)?,
            scales: q.scales.take_axis(rows, 1)?,
            biases: None,
            spec: q.spec,
        })
    };
    let stacked = |q: QuantizedMatrix| -> Result<Stacked> {
        Ok(match format {
            WeightFormat::Quantized => Stacked::Quantized(q),
            _ => Stacked::Dense(q.dequantize(dtype)?),
        })
    };
    let biases = ExpertBiases {
        gate: gate_up_bias.take_axis(&even, 1)?,
        up: gate_up_bias.take_axis(&odd, 1)?,
        down: down_bias,
    };
    Ok((
        [
            stacked(pick(&gate_up, &even)?)?,
            stacked(pick(&gate_up, &odd)?)?,
            stacked(down)?,
        ],
        biases,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor_split::tensor_refusal;

    /// gpt-oss-120b's shape, as mlx-community's 4-bit conversion describes it (experts stay
    /// mxfp4; attention affine at groups of 64).
    fn gpt_oss_120b(layer_types: bool) -> ModelConfig {
        let mut v = serde_json::json!({
            "model_type": "gpt_oss", "hidden_size": 2880, "num_hidden_layers": 36,
            "intermediate_size": 2880, "num_attention_heads": 64, "num_key_value_heads": 8,
            "head_dim": 64, "vocab_size": 201088, "num_local_experts": 128,
            "num_experts_per_tok": 4, "sliding_window": 128, "swiglu_limit": 7.0,
            "rope_theta": 150000,
            "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                "beta_slow": 1.0, "original_max_position_embeddings": 4096},
            "quantization": {"group_size": 32, "bits": 4, "mode": "mxfp4",
                "model.layers.0.self_attn.o_proj": {"group_size": 64, "bits": 4,
                    "mode": "affine"}},
        });
        if layer_types {
            let types: Vec<&str> = (0..36)
                .map(|l| {
                    if l % 2 == 0 {
                        "sliding_attention"
                    } else {
                        "full_attention"
                    }
                })
                .collect();
            v["layer_types"] = serde_json::json!(types);
        }
        ModelConfig::from_hf_json(&v).unwrap()
    }

    #[test]
    fn configuration_reads_experts_windows_and_yarn() {
        let c = gpt_oss_120b(false);
        let moe = c.moe.as_ref().unwrap();
        assert_eq!(
            (moe.num_experts, moe.experts_per_token, moe.expert_width),
            (128, 4, 2880)
        );
        assert_eq!(moe.router, RouterKind::TopKSoftmax);
        // Without layer_types, sliding and full layers alternate, sliding first.
        let w = c.sliding_window.as_ref().unwrap();
        assert_eq!(
            (w.of_layer(0), w.of_layer(1), w.of_layer(34)),
            (Some(128), None, Some(128))
        );
        assert_eq!(c.sliding_window, gpt_oss_120b(true).sliding_window);
        assert!(matches!(c.rope_scaling, RopeScaling::Yarn { factor, .. } if factor == 32.0));
        assert_eq!(
            c.family_params.get::<GptOssParams>("gpt_oss").unwrap(),
            GptOssParams { swiglu_limit: 7.0 }
        );
        // A layer_types entry this build does not know is refused with its name.
        let mut bad = serde_json::to_value(vec!["sliding_attention"; 35]).unwrap();
        bad.as_array_mut().unwrap().push("chunked_attention".into());
        let mut v = serde_json::json!({
            "model_type": "gpt_oss", "hidden_size": 64, "num_hidden_layers": 36,
            "intermediate_size": 64, "num_attention_heads": 4, "vocab_size": 100,
            "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 8,
        });
        v["layer_types"] = bad;
        let err = ModelConfig::from_hf_json(&v).unwrap_err().to_string();
        assert!(err.contains("chunked_attention"), "{err}");
    }

    /// Experts 2880 wide are 90 mxfp4 groups and there are 8 key/value heads: only 2 ranks
    /// split gpt-oss-120b; 4 would cut the experts' groups (90 / 4), 3 the heads.
    #[test]
    fn ring_sizes_follow_the_experts_and_attention_groups() {
        let c = gpt_oss_120b(true);
        assert_eq!(tensor_refusal(&c, 2), None);
        assert!(tensor_refusal(&c, 3).unwrap().contains("8 key/value heads"));
        let four = tensor_refusal(&c, 4).unwrap();
        assert!(
            four.contains("90 expert width (2880) in mxfp4 groups of 32"),
            "{four}"
        );
    }
}
