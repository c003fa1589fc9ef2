//! Model configuration: the numbers that define a decoder, read from a Hugging Face
//! `config.json` or from GGUF metadata.

use crate::error::{InferenceError, Result};

pub use crate::sliding_window::SlidingWindow;
pub use moe::{MoeConfig, RouterKind};
pub use quantization::QuantizationConfig;

mod moe;
mod parameters;
mod quantization;
mod read;
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

/// Numbers only one family's configuration has (its own file in [`crate::models`] reads them
/// from config.json).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum FamilyParams {
    /// Nothing beyond the shared numbers.
    #[default]
    None,
    /// gpt-oss's.
    GptOss(GptOssParams),
    /// Gemma 3's.
    Gemma3(Gemma3Params),
}

/// What gpt-oss's configuration holds beyond the shared numbers.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GptOssParams {
    /// `swiglu_limit`: where the experts' gate (from above) and up (both sides) are clamped.
    pub swiglu_limit: f32,
}

/// What Gemma 3's configuration holds beyond the shared numbers.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Gemma3Params {
    /// Queries are scaled by `query_pre_attn_scalar^-1/2` (not `head_dim^-1/2`).
    pub query_pre_attn_scalar: f32,
    /// RoPE base of the local (sliding) layers.
    pub rope_local_base_freq: f32,
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
