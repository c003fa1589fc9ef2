//! Reading a [`ModelConfig`] from a Hugging Face `config.json` or from GGUF metadata: the
//! shared numbers here, then the family's own (its file in [`crate::models`] reads them, so
//! this reader is the one place the configuration meets the families).

use super::*;
use crate::gguf::{GgufFile, GgufValue};
use crate::models::config_keys::required;
use serde_json::Value;

/// A multimodal configuration's language model: `text_config` with the outer `model_type`
/// (the family mlx-lm loads) and the outer quantization entries; `None` without one.
fn text_model_config(v: &Value) -> Option<Value> {
    let mut text = v.get("text_config")?.as_object()?.clone();
    for key in ["model_type", "quantization", "quantization_config"] {
        match (v.get(key), key) {
            // mlx-lm's `mistral3` runs the text model `text_config` names (Mistral 4's
            // `mistral4`; `llama` for any other but `ministral3`).
            (Some(outer), "model_type") if outer == "mistral3" => {
                let inner = text.get(key).and_then(Value::as_str).unwrap_or_default();
                let family = match inner {
                    "mistral4" | "ministral3" => inner,
                    _ => "llama",
                };
                text.insert(key.to_owned(), Value::from(family));
            }
            (Some(outer), "model_type") => {
                text.insert(key.to_owned(), outer.clone());
            }
            (Some(outer), _) if !text.contains_key(key) => {
                text.insert(key.to_owned(), outer.clone());
            }
            _ => {}
        }
    }
    Some(Value::Object(text))
}

impl ModelConfig {
    /// Reads a Hugging Face `config.json` (already parsed). A multimodal release's
    /// (`*ForConditionalGeneration` with a `text_config`, e.g. Qwen3.5) is read as its
    /// language model, as mlx-lm does: the numbers are `text_config`'s, the family is the
    /// outer `model_type`'s, and the quantization (saved beside it) applies.
    pub fn from_hf_json(v: &Value) -> Result<ModelConfig> {
        let text;
        let v = match text_model_config(v) {
            Some(t) => {
                text = t;
                &text
            }
            None => v,
        };
        let model_type = v
            .get("model_type")
            .and_then(Value::as_str)
            .ok_or_else(|| InferenceError::BadConfig("config.json has no `model_type`".into()))?;
        let architecture = Architecture::parse(model_type)?;
        let hidden_size = required(v, "hidden_size")?;
        let num_heads = required(v, "num_attention_heads")?;
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
        let mut config = ModelConfig {
            architecture,
            hidden_size,
            num_layers: required(v, "num_hidden_layers")?,
            // An MoE model whose every layer has experts may leave it out, as Qwen3.5-MoE's
            // releases do: no dense MLP reads it.
            intermediate_size: match (v.get("intermediate_size"), v.get("moe_intermediate_size")) {
                (None, Some(_)) => 0,
                _ => required(v, "intermediate_size")?,
            },
            num_heads,
            num_kv_heads,
            head_dim,
            vocab_size: required(v, "vocab_size")?,
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
            attention_bias: v
                .get("attention_bias")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            quantization,
            moe: None,
            sliding_window: None,
            family_params: FamilyParams::default(),
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
        let architecture = Architecture::parse_gguf(&arch_name)?;
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
            Some("yarn") => gguf_yarn(file, &arch_name)?,
            Some(other) => {
                return Err(InferenceError::BadConfig(format!(
                    "rope scaling type `{other}` is not supported (linear, llama3 and yarn are)"
                )))
            }
        };
        let mut config = ModelConfig {
            architecture,
            hidden_size,
            num_layers: req("block_count")?,
            // A Mixture of Experts whose every layer has experts may leave it out.
            intermediate_size: match req("feed_forward_length") {
                Err(_) if file.get(&key("expert_count")).is_some() => 0,
                other => other?,
            },
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
            quantization: super::QuantizationConfig::of_gguf(file),
            moe: None,
            sliding_window: None,
            family_params: FamilyParams::default(),
            attention: AttentionConfig::default(),
        };
        crate::models::family(architecture).configure_gguf(file, &arch_name, &mut config)?;
        config.validate()?;
        Ok(config)
    }
}

/// A GGUF's YaRN as llama.cpp's context reads it: the stretch `rope.scaling.factor` over
/// `rope.scaling.original_context_length`, `yarn_beta_fast`/`yarn_beta_slow` (32 and 1 when
/// absent), and the magnitude `mscale(factor, m) / mscale(factor, yarn_log_multiplier)` with
/// `m` 1 (DeepSeek 2's files store `0.1 · mscale_all_dim` as the multiplier, and `m` is that
/// `mscale_all_dim` unless it is 1, as llama.cpp special-cases them). An extrapolation or attention factor other than 1 is refused: shoal's YaRN has none.
fn gguf_yarn(file: &GgufFile, arch: &str) -> Result<RopeScaling> {
    let f = |k: &str| {
        file.get(&format!("{arch}.rope.scaling.{k}"))
            .and_then(GgufValue::as_f64)
            .map(|v| v as f32)
    };
    for k in ["yarn_ext_factor", "yarn_attn_factor", "attn_factor"] {
        if let Some(v) = f(k).filter(|&v| v != 1.0) {
            return Err(InferenceError::BadConfig(format!(
                "`{arch}.rope.scaling.{k}` is {v}; YaRN with a factor other than 1 there is \
                 not supported"
            )));
        }
    }
    let mut log_mul = f("yarn_log_multiplier").unwrap_or(0.0);
    let mut mscale = 1.0;
    if arch == "deepseek2" && log_mul != 0.0 {
        // Its converter writes 0.1 · mscale_all_dim; llama.cpp divides the 0.1 back out.
        log_mul /= 0.1;
        if log_mul != 1.0 {
            mscale = log_mul;
        }
    }
    Ok(RopeScaling::Yarn {
        factor: f("factor").unwrap_or(1.0),
        original_max_position: f("original_context_length").ok_or_else(|| {
            InferenceError::BadConfig(format!(
                "GGUF metadata has YaRN but no `{arch}.rope.scaling.original_context_length`"
            ))
        })?,
        beta_fast: f("yarn_beta_fast").unwrap_or(32.0),
        beta_slow: f("yarn_beta_slow").unwrap_or(1.0),
        mscale,
        mscale_all_dim: log_mul,
    })
}
