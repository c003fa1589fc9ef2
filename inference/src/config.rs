//! Model configuration: the numbers that define a decoder, read from a Hugging Face
//! `config.json` or from GGUF metadata.

use crate::error::{InferenceError, Result};
use crate::gguf::{GgufFile, GgufValue};
use serde_json::Value;

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
}

impl Architecture {
    /// Parses a `model_type` or GGUF `general.architecture`.
    pub fn parse(name: &str) -> Result<Architecture> {
        match name {
            "llama" | "mistral" => Ok(Architecture::Llama),
            "qwen2" => Ok(Architecture::Qwen2),
            "qwen3" => Ok(Architecture::Qwen3),
            other => Err(InferenceError::UnsupportedArchitecture(other.to_owned())),
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
}

/// Quantization of an MLX-community checkpoint (`quantization` in config.json).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QuantizationConfig {
    /// Weights per scale/bias group.
    pub group_size: i32,
    /// Bits per weight.
    pub bits: i32,
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
                    other => {
                        return Err(InferenceError::BadConfig(format!(
                            "rope_scaling type `{other}` is not supported (linear and llama3 are)"
                        )))
                    }
                }
            }
            _ => RopeScaling::None,
        };
        let quantization =
            v.get("quantization")
                .filter(|q| q.is_object())
                .map(|q| QuantizationConfig {
                    group_size: q.get("group_size").and_then(Value::as_i64).unwrap_or(64) as i32,
                    bits: q.get("bits").and_then(Value::as_i64).unwrap_or(4) as i32,
                });
        let config = ModelConfig {
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
        };
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
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks that the numbers make a buildable model.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(InferenceError::BadConfig(m));
        if self.hidden_size == 0
            || self.num_layers == 0
            || self.num_heads == 0
            || self.num_kv_heads == 0
            || self.vocab_size == 0
        {
            return bad(format!("zero-sized model: {self:?}"));
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return bad(format!(
                "{} query heads are not a multiple of {} key/value heads",
                self.num_heads, self.num_kv_heads
            ));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return bad(format!(
                "head_dim {} must be even and positive",
                self.head_dim
            ));
        }
        if self.hidden_size > 1 << 16
            || self.num_layers > 1 << 12
            || self.vocab_size > 1 << 22
            || self.head_dim > 1024
        {
            return bad("implausibly large dimensions".into());
        }
        Ok(())
    }

    /// Bytes of weights per layer in f32, for memory and watchdog estimates.
    pub fn layer_parameters(&self) -> usize {
        let attn = self.hidden_size * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads);
        let mlp = 3 * self.hidden_size * self.intermediate_size;
        attn + mlp + 2 * self.hidden_size
    }
}
