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

/// Which family a model is: the key it is registered under in
/// [`crate::models::registry`] (mlx-lm's module name, e.g. `llama`, `minimax`). Made only by
/// [`Architecture::parse`], so it always names a registered family; serialized as its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Architecture(&'static str);

impl Architecture {
    /// Parses a `model_type` (mlx-lm's remapping applied, e.g. `kimi_k2` is `deepseek_v3`) or a
    /// GGUF `general.architecture`; an unknown name's error lists every supported one.
    pub fn parse(name: &str) -> Result<Architecture> {
        crate::models::registry::resolve(name).map(Architecture)
    }

    /// The family of a GGUF file's `general.architecture` (llama.cpp's names), refused with
    /// what to download instead where shoal runs the family from safetensors only.
    pub fn parse_gguf(name: &str) -> Result<Architecture> {
        crate::models::registry::resolve_gguf(name).map(Architecture)
    }

    /// The registry key (mlx-lm's module name).
    pub fn key(self) -> &'static str {
        self.0
    }

    /// The `model_type` and the class name (`architectures`) of a Hugging Face config.json, as
    /// an export writes them.
    pub fn hf_names(self) -> (&'static str, &'static str) {
        crate::models::family(self).hf_names()
    }
}

impl std::fmt::Display for Architecture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl serde::Serialize for Architecture {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Architecture {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        Architecture::parse(&name).map_err(serde::de::Error::custom)
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

impl ModelConfig {
    /// Whether layer `layer` is a linear-attention layer (no keys and values).
    pub fn is_linear_layer(&self, layer: usize) -> bool {
        self.attention
            .linear
            .as_ref()
            .is_some_and(|l| l.is_linear(layer))
    }

    /// Layers that cache keys and values (every layer but the linear ones).
    pub fn kv_layers(&self) -> usize {
        self.num_layers
            - self
                .attention
                .linear
                .as_ref()
                .map_or(0, LinearLayers::count)
    }
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

/// What only one family's configuration holds, kept as that family's own serde struct
/// serialized to JSON: the family's file defines the struct, writes it in
/// [`crate::models::base::Family::configure`] ([`FamilyParams::of`]) and reads it back where it
/// builds its blocks ([`FamilyParams::get`]); nothing outside the family knows its fields.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FamilyParams(serde_json::Value);

impl FamilyParams {
    /// The family's parameters `params`.
    pub fn of(params: &impl serde::Serialize) -> Result<FamilyParams> {
        serde_json::to_value(params)
            .map(FamilyParams)
            .map_err(|e| InferenceError::BadConfig(format!("family parameters: {e}")))
    }

    /// The family's parameters as its struct `T`; an error names the family when they are
    /// missing (a configuration not read by the family's `configure`).
    pub fn get<T: serde::de::DeserializeOwned>(&self, family: &str) -> Result<T> {
        serde_json::from_value(self.0.clone()).map_err(|e| {
            InferenceError::BadConfig(format!(
                "a {family} configuration without its own parameters ({e})"
            ))
        })
    }
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
    /// `q_proj` also gives a gate per query (Qwen3-Next's gated attention): twice the rows.
    #[serde(default)]
    pub output_gate: bool,
    /// The layers that are linear attention with a recurrent state instead of attention
    /// (Qwen3.5, Qwen3-Next), and their shape.
    #[serde(default)]
    pub linear: Option<LinearLayers>,
    /// Block-sparse attention (MiniMax M3): the indexer's shape and the layers that have it;
    /// each such layer caches one index key per position beside its values.
    #[serde(default)]
    pub block_index: Option<crate::models::block_index::BlockIndexShape>,
    /// M-RoPE's sections (Qwen3.5's `rope_parameters.mrope_section`): how the positions of
    /// image tokens turn the rotated frequencies ([`crate::mrope`]); text alone never needs it.
    #[serde(default)]
    pub mrope_section: Option<[usize; 3]>,
}

/// Which layers of a hybrid model are Gated DeltaNet layers ([`crate::models::gated_delta`]):
/// they hold a fixed-size state per sequence, no keys and values.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LinearLayers {
    /// Per layer, whether it is linear.
    pub layers: Vec<bool>,
    /// Their shape.
    pub shape: crate::models::gated_delta::DeltaNetShape,
}

impl LinearLayers {
    /// Whether layer `layer` is linear.
    pub fn is_linear(&self, layer: usize) -> bool {
        self.layers.get(layer).copied().unwrap_or(false)
    }

    /// Linear layers in all.
    pub fn count(&self) -> usize {
        self.layers.iter().filter(|&&l| l).count()
    }
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
    /// Epsilon of the bottlenecks' RMS norms (`q_a_layernorm`, `kv_a_layernorm`): DeepSeek V3's
    /// reference fixes it at 1e-6, GLM-4.7-Flash's takes `rms_norm_eps`.
    pub norm_eps: f32,
    /// DeepSeek Sparse Attention's indexer (DeepSeek V3.2, GLM-5): its keys are cached too.
    #[serde(default)]
    pub indexer: Option<crate::models::dsa_indexer::IndexerShape>,
    /// Llama 4's attention scale on the queries by position (Mistral 4).
    #[serde(default)]
    pub position_scale: Option<crate::models::mla::PositionScale>,
    /// No position encoding: the "rotated" part is used as it comes (Kimi Linear).
    #[serde(default)]
    pub no_rope: bool,
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
            + self.indexer.as_ref().map_or(0, |i| {
                crate::models::dsa_indexer::Indexer::parameters(
                    i,
                    hidden,
                    self.q_lora_rank.unwrap_or(0),
                )
            })
    }

    /// Numbers one position keeps in one layer's cache: the latent and the rotated key (and
    /// the indexer's key).
    pub fn cached_width(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim + self.indexer.as_ref().map_or(0, |i| i.head_dim)
    }
}
