//! Model configuration: the numbers that define a decoder, read from a Hugging Face
//! `config.json` or from GGUF metadata.

use crate::error::{InferenceError, Result};
use crate::gguf::{GgufFile, GgufValue};
use serde_json::Value;

pub use crate::sliding_window::SlidingWindow;
pub use moe::{MoeConfig, RouterKind};
pub use quantization::QuantizationConfig;

mod moe;
mod parameters;
mod quantization;
mod validate;

/// The decoder families this crate runs; each has its file in [`crate::models`], holding its
/// block and its tensor names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    /// Llama 2/3, SmolLM2, Mistral-style decoders.
    Llama,
    /// Qwen2 / Qwen2.5: biases on the Q, K and V projections.
    Qwen2,
    /// Qwen3: RMS norms on each head's queries and keys.
    Qwen3,
    /// Qwen3-MoE (Qwen3-30B-A3B, 235B-A22B, Qwen3-Coder-480B): Qwen3's attention with a
    /// softmax-routed Mixture-of-Experts feed-forward.
    #[serde(rename = "qwen3_moe")]
    Qwen3Moe,
    /// gpt-oss (20b, 120b): attention sinks, alternating sliding-window and full layers, YaRN,
    /// experts in mxfp4 routed top-k then softmax ([`crate::models::gpt_oss`]).
    #[serde(rename = "gpt_oss")]
    GptOss,
    /// Gemma 3 (text): local/global layers, `1 + w` norms around attention and MLP, scaled
    /// embeddings ([`crate::models::gemma3`]).
    #[serde(rename = "gemma3_text")]
    Gemma3Text,
    /// GLM-4.5/4.6/4.7 (`glm4_moe`): partial rotary, Q/K norms and biases, a sigmoid-routed
    /// Mixture of Experts with a shared expert.
    #[serde(rename = "glm4_moe")]
    Glm4Moe,
    /// MiniMax M2 (`minimax_m2`): one Q and one K norm over all heads, partial rotary, a
    /// sigmoid-routed Mixture of Experts on every layer.
    #[serde(rename = "minimax_m2")]
    MiniMax,
    /// DeepSeek V3 / R1 / V3.1 and Kimi K2 (`deepseek_v3`): multi-head latent attention with
    /// YaRN, a sigmoid-routed, group-limited Mixture of Experts with a shared expert.
    #[serde(rename = "deepseek_v3")]
    DeepseekV3,
}

impl Architecture {
    /// Parses a `model_type` or GGUF `general.architecture`.
    pub fn parse(name: &str) -> Result<Architecture> {
        match name {
            "llama" | "mistral" => Ok(Architecture::Llama),
            "qwen2" => Ok(Architecture::Qwen2),
            "qwen3" => Ok(Architecture::Qwen3),
            "qwen3_moe" | "qwen3moe" => Ok(Architecture::Qwen3Moe),
            "gpt_oss" | "gpt-oss" => Ok(Architecture::GptOss),
            "gemma3_text" => Ok(Architecture::Gemma3Text),
            "glm4_moe" => Ok(Architecture::Glm4Moe),
            "minimax_m2" => Ok(Architecture::MiniMax),
            "deepseek_v3" | "kimi_k2" => Ok(Architecture::DeepseekV3),
            other => Err(InferenceError::UnsupportedArchitecture(other.to_owned())),
        }
    }

    /// The `model_type` and the class name (`architectures`) of a Hugging Face config.json.
    pub fn hf_names(self) -> (&'static str, &'static str) {
        match self {
            Architecture::Llama => ("llama", "LlamaForCausalLM"),
            Architecture::Qwen2 => ("qwen2", "Qwen2ForCausalLM"),
            Architecture::Qwen3 => ("qwen3", "Qwen3ForCausalLM"),
            Architecture::Qwen3Moe => ("qwen3_moe", "Qwen3MoeForCausalLM"),
            Architecture::GptOss => ("gpt_oss", "GptOssForCausalLM"),
            Architecture::Gemma3Text => ("gemma3_text", "Gemma3ForCausalLM"),
            Architecture::Glm4Moe => ("glm4_moe", "Glm4MoeForCausalLM"),
            Architecture::MiniMax => ("minimax_m2", "MiniMaxM2ForCausalLM"),
            Architecture::DeepseekV3 => ("deepseek_v3", "DeepseekV3ForCausalLM"),
        }
    }
}

/// How rotary position embeddings are stretched for long contexts.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Positions divided by `factor`.
    Linear {
        /// The divisor.
        factor: f32,
    },
    /// Llama 3.1's frequency-dependent scaling.
    Llama3 {
        /// Scale of the low frequencies.
        factor: f32,
        /// Wavelength threshold for low frequencies (in units of the original context).
        low_freq_factor: f32,
        /// Wavelength threshold for high frequencies.
        high_freq_factor: f32,
        /// The context length the model was trained with.
        original_max_position: f32,
    },
    /// Per-frequency divisors given explicitly (GGUF's `rope_freqs.weight`).
    FreqFactors(Vec<f32>),
    /// YaRN (gpt-oss, DeepSeek V3): high frequencies kept, low ones stretched by `factor`, a
    /// linear ramp between the `beta_fast` and `beta_slow` rotation counts, and queries and
    /// keys scaled by `mscale`'s ratio.
    Yarn {
        /// The context stretch.
        factor: f32,
        /// The context length the model was trained with.
        original_max_position: f32,
        /// Rotations over the original context above which a frequency is kept.
        beta_fast: f32,
        /// Rotations below which a frequency is stretched fully.
        beta_slow: f32,
        /// `mscale` (1 when absent).
        mscale: f32,
        /// `mscale_all_dim` (0 when absent).
        mscale_all_dim: f32,
    },
}

/// Everything needed to build a decoder.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ModelConfig {
    /// Which family.
    pub architecture: Architecture,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Decoder layers.
    pub num_layers: usize,
    /// Width of the SwiGLU feed-forward.
    pub intermediate_size: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (grouped-query attention when fewer than query heads).
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// RoPE base frequency.
    pub rope_theta: f32,
    /// RoPE scaling.
    pub rope_scaling: RopeScaling,
    /// The longest sequence the model supports.
    pub max_position_embeddings: usize,
    /// The output head reuses the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Q/K/V projections have biases (always for Qwen2; Llama checkpoints may say so).
    pub attention_bias: bool,
    /// Quantization of the stored weights (MLX-community checkpoints).
    pub quantization: Option<QuantizationConfig>,
    /// The Mixture-of-Experts feed-forward, for MoE families.
    #[serde(default)]
    pub moe: Option<MoeConfig>,
    /// The layers that attend only to a recent window (gpt-oss, Gemma 3); `None`: every layer
    /// attends to every position.
    #[serde(default)]
    pub sliding_window: Option<SlidingWindow>,
    /// What only one family's config.json holds, read by that family
    /// ([`crate::models::base::Family::configure`]).
    #[serde(default)]
    pub family_params: FamilyParams,
    /// The attention's shape beyond plain heads (partial rotary, Q/K norms), as the family
    /// reads it ([`crate::models::base::Family::configure`]).
    #[serde(default)]
    pub attention: AttentionConfig,
}

/// Numbers only one family's configuration has (its own file defines and reads them).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum FamilyParams {
    /// Nothing beyond the shared numbers.
    #[default]
    None,
    /// gpt-oss's.
    GptOss(crate::models::gpt_oss::GptOssParams),
    /// Gemma 3's.
    Gemma3(crate::models::gemma3::Gemma3Params),
}

/// What a family's attention has beyond grouped-query heads of `head_dim`, filled in by the
/// family's own file from config.json (the shared reader knows none of it).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AttentionConfig {
    /// Width of each head RoPE rotates, when less than `head_dim` (GLM's
    /// `partial_rotary_factor`, MiniMax's `rotary_dim`).
    pub rotary_dim: Option<usize>,
    /// RMS norms on queries and keys (`use_qk_norm`).
    pub qk_norm: bool,
    /// Multi-head latent attention (DeepSeek V3): its ranks and head widths.
    pub latent: Option<LatentConfig>,
}

/// The shape of multi-head latent attention ([`crate::models::mla`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LatentConfig {
    /// Width of the queries' bottleneck (`q_lora_rank`); `None`: one query projection.
    pub q_lora_rank: Option<usize>,
    /// Width of the cached latent (`kv_lora_rank`).
    pub kv_lora_rank: usize,
    /// Per-head query/key width without position (`qk_nope_head_dim`).
    pub qk_nope_head_dim: usize,
    /// Per-head rotated width, one key for all heads (`qk_rope_head_dim`).
    pub qk_rope_head_dim: usize,
    /// Per-head value width (`v_head_dim`).
    pub v_head_dim: usize,
}

impl LatentConfig {
    /// Parameters of one layer's attention with `heads` heads over `hidden`.
    pub fn parameters(&self, hidden: usize, heads: usize) -> usize {
        let q_width = heads * (self.qk_nope_head_dim + self.qk_rope_head_dim);
        let query = match self.q_lora_rank {
            Some(r) => hidden * r + r + r * q_width,
            None => hidden * q_width,
        };
        query
            + hidden * (self.kv_lora_rank + self.qk_rope_head_dim)
            + self.kv_lora_rank
            + heads * self.kv_lora_rank * (self.qk_nope_head_dim + self.v_head_dim)
            + heads * self.v_head_dim * hidden
    }

    /// Numbers one position keeps in one layer's cache: the latent and the rotated key.
    pub fn cached_width(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }
}

fn req_usize(v: &Value, key: &str) -> Result<usize> {
    v.get(key)
        .and_then(Value::as_u64)
        .map(|x| x as usize)
        .ok_or_else(|| InferenceError::BadConfig(format!("config.json has no integer `{key}`")))
}

impl ModelConfig {
    /// Reads a Hugging Face `config.json` (already parsed).
    pub fn from_hf_json(v: &Value) -> Result<ModelConfig> {
        let model_type = v
            .get("model_type")
            .and_then(Value::as_str)
            .ok_or_else(|| InferenceError::BadConfig("config.json has no `model_type`".into()))?;
        let architecture = Architecture::parse(model_type)?;
        let hidden_size = req_usize(v, "hidden_size")?;
        let num_heads = req_usize(v, "num_attention_heads")?;
        let num_kv_heads = v
            .get("num_key_value_heads")
            .and_then(Value::as_u64)
            .map(|x| x as usize)
            .unwrap_or(num_heads);
        let head_dim = v
            .get("head_dim")
            .and_then(Value::as_u64)
            .map(|x| x as usize)
            .unwrap_or(hidden_size.checked_div(num_heads).unwrap_or(0));
        let f =
            |key: &str, default: f64| v.get(key).and_then(Value::as_f64).unwrap_or(default) as f32;
        let rope_scaling = match v.get("rope_scaling") {
            Some(s) if s.is_object() => {
                let kind = s
                    .get("rope_type")
                    .or_else(|| s.get("type"))
                    .and_then(Value::as_str)
                    .unwrap_or("default");
                let g = |key: &str, default: f64| {
                    s.get(key).and_then(Value::as_f64).unwrap_or(default) as f32
                };
                match kind {
                    "default" => RopeScaling::None,
                    "linear" => RopeScaling::Linear {
                        factor: g("factor", 1.0),
                    },
                    "llama3" => RopeScaling::Llama3 {
                        factor: g("factor", 8.0),
                        low_freq_factor: g("low_freq_factor", 1.0),
                        high_freq_factor: g("high_freq_factor", 4.0),
                        original_max_position: g("original_max_position_embeddings", 8192.0),
                    },
                    "yarn" | "deepseek_yarn" => RopeScaling::Yarn {
                        factor: g("factor", 1.0),
                        original_max_position: g("original_max_position_embeddings", 4096.0),
                        beta_fast: g("beta_fast", 32.0),
                        beta_slow: g("beta_slow", 1.0),
                        mscale: g("mscale", 1.0),
                        mscale_all_dim: g("mscale_all_dim", 0.0),
                    },
                    other => {
                        return Err(InferenceError::BadConfig(format!(
                            "rope_scaling type `{other}` is not supported (linear, llama3 and \
                             yarn are)"
                        )))
                    }
                }
            }
            _ => RopeScaling::None,
        };
        let quantization = v
            .get("quantization")
            .filter(|q| q.is_object())
            .map(QuantizationConfig::from_json)
            .transpose()?;
        let moe = match architecture {
            Architecture::Qwen3Moe => Some(MoeConfig {
                num_experts: req_usize(v, "num_experts")?,
                experts_per_token: req_usize(v, "num_experts_per_tok")?,
                expert_width: req_usize(v, "moe_intermediate_size")?,
                router: RouterKind::SoftmaxTopK {
                    normalize: v
                        .get("norm_topk_prob")
                        .and_then(Value::as_bool)
                        .unwrap_or(false),
                },
                dense_layers: v
                    .get("mlp_only_layers")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(Value::as_u64)
                            .map(|x| x as usize)
                            .collect()
                    })
                    .unwrap_or_default(),
                sparse_step: v
                    .get("decoder_sparse_step")
                    .and_then(Value::as_u64)
                    .unwrap_or(1) as usize,
                first_dense: 0,
                shared_width: 0,
            }),
            _ => None,
        };
        let mut config = ModelConfig {
            architecture,
            hidden_size,
            num_layers: req_usize(v, "num_hidden_layers")?,
            intermediate_size: req_usize(v, "intermediate_size")?,
            num_heads,
            num_kv_heads,
            head_dim,
            vocab_size: req_usize(v, "vocab_size")?,
            rms_norm_eps: f("rms_norm_eps", 1e-6),
            rope_theta: f("rope_theta", 10000.0),
            rope_scaling,
            max_position_embeddings: v
                .get("max_position_embeddings")
                .and_then(Value::as_u64)
                .unwrap_or(4096) as usize,
            tie_word_embeddings: v
                .get("tie_word_embeddings")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            attention_bias: match architecture {
                Architecture::Qwen2 => true,
                _ => v
                    .get("attention_bias")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
            },
            quantization,
            moe,
            sliding_window: None,
            family_params: FamilyParams::None,
            attention: AttentionConfig::default(),
        };
        crate::models::family(architecture).configure(v, &mut config)?;
        config.validate()?;
        Ok(config)
    }

    /// Reads GGUF metadata and the tensor directory (for tied embeddings and biases).
    pub fn from_gguf(file: &GgufFile) -> Result<ModelConfig> {
        let arch_name = file
            .get("general.architecture")
            .and_then(GgufValue::as_str)
            .ok_or_else(|| {
                InferenceError::BadConfig("GGUF metadata has no general.architecture".into())
            })?
            .to_owned();
        let architecture = Architecture::parse(&arch_name)?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let req = |k: &str| -> Result<usize> {
            file.get(&key(k))
                .and_then(GgufValue::as_u64)
                .map(|x| x as usize)
                .ok_or_else(|| {
                    InferenceError::BadConfig(format!("GGUF metadata has no `{}`", key(k)))
                })
        };
        let hidden_size = req("embedding_length")?;
        let num_heads = req("attention.head_count")?;
        let num_kv_heads = req("attention.head_count_kv").unwrap_or(num_heads);
        let head_dim =
            req("attention.key_length").unwrap_or(hidden_size.checked_div(num_heads).unwrap_or(0));
        let vocab_size = match req("vocab_size") {
            Ok(v) => v,
            Err(_) => match file.get("tokenizer.ggml.tokens") {
                Some(GgufValue::Array(a)) => a.len(),
                _ => file
                    .tensors
                    .get("token_embd.weight")
                    .map(|t| t.shape[0])
                    .ok_or_else(|| {
                        InferenceError::BadConfig("cannot tell the vocabulary size".into())
                    })?,
            },
        };
        let fl = |k: &str, default: f64| {
            file.get(&key(k))
                .and_then(GgufValue::as_f64)
                .unwrap_or(default) as f32
        };
        let rope_scaling = match file
            .get(&key("rope.scaling.type"))
            .and_then(GgufValue::as_str)
        {
            Some("linear") => RopeScaling::Linear {
                factor: fl("rope.scaling.factor", 1.0),
            },
            Some("none") | None => RopeScaling::None,
            Some(other) => {
                return Err(InferenceError::BadConfig(format!(
                    "rope scaling type `{other}` is not supported (linear and llama3 are)"
                )))
            }
        };
        let config = ModelConfig {
            architecture,
            hidden_size,
            num_layers: req("block_count")?,
            intermediate_size: req("feed_forward_length")?,
            num_heads,
            num_kv_heads,
            head_dim,
            vocab_size,
            rms_norm_eps: fl("attention.layer_norm_rms_epsilon", 1e-5),
            rope_theta: fl("rope.freq_base", 10000.0),
            rope_scaling,
            max_position_embeddings: req("context_length").unwrap_or(4096),
            tie_word_embeddings: !file.tensors.contains_key("output.weight"),
            attention_bias: file.tensors.contains_key("blk.0.attn_q.bias"),
            quantization: None,
            moe: None,
            sliding_window: None,
            family_params: FamilyParams::None,
            attention: AttentionConfig::default(),
        };
        config.validate()?;
        Ok(config)
    }
}
