//! Writes a GGUF model out as a Hugging Face folder (f32 or bf16 safetensors, config.json,
//! tokenizer.json, tokenizer_config.json), so tools that read only that layout (mlx-lm, in
//! the benchmark) can run the very same weights; or as an MLX-community quantized folder
//! (affine `bits`-bit weights with per-group scales and biases, as `mlx_lm.convert -q` writes
//! it and Apple GPUs run it), which is how the tests check the quantized path's numbers.

use crate::config::RopeScaling;
use crate::error::{InferenceError, Result};
use crate::loader::open_model;
use mlx_rs::{Array, Dtype};
use std::path::Path;

/// How an export stores the weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportWeights {
    /// Every tensor dense in this dtype.
    Dense(Dtype),
    /// Weight matrices in MLX's affine quantization (`w ≈ scale · q + bias` per group of
    /// `group_size` weights of a row, `q` of `bits` bits), with f32 scales and biases; norms
    /// stay f32.
    Affine {
        /// Bits per weight (4 or 8).
        bits: i32,
        /// Weights per group (64 is mlx-lm's default).
        group_size: i32,
    },
}

/// Converts the model at `model` (GGUF or folder) into a Hugging Face folder at `out`.
pub fn export_hf_folder(model: &Path, out: &Path, dtype: Dtype) -> Result<()> {
    export_hf_folder_as(model, out, ExportWeights::Dense(dtype))
}

/// Converts the model at `model` into a Hugging Face folder at `out`, its weights stored as
/// `weights` says.
pub fn export_hf_folder_as(model: &Path, out: &Path, weights: ExportWeights) -> Result<()> {
    let dtype = match weights {
        ExportWeights::Dense(dtype) => dtype,
        ExportWeights::Affine { .. } => Dtype::Float32,
    };
    let mut opened = open_model(model)?;
    let config = opened.config.clone();
    let io = |source| InferenceError::Io {
        path: out.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(out).map_err(io)?;
    let mut tensors: Vec<(String, Array)> = Vec::new();
    for name in crate::models::tensor_names(&config) {
        let a = opened.source.dense(&name, dtype)?;
        a.eval()?;
        match (weights, name.strip_suffix(".weight")) {
            (ExportWeights::Affine { bits, group_size }, Some(prefix)) if a.ndim() == 2 => {
                let (packed, scales, biases) = mlx_rs::ops::quantize(&a, group_size, bits)?;
                mlx_rs::transforms::eval([&packed, &scales, &biases])?;
                tensors.push((name.clone(), packed));
                tensors.push((format!("{prefix}.scales"), scales));
                tensors.push((format!("{prefix}.biases"), biases));
            }
            _ => tensors.push((name, a)),
        }
    }
    Array::save_safetensors(
        tensors.iter().map(|(n, a)| (n.as_str(), a)),
        None,
        out.join("model.safetensors"),
    )
    .map_err(|e| InferenceError::Mlx(e.to_string()))?;
    let (model_type, class) = config.architecture.hf_names();
    let rope_scaling = match &config.rope_scaling {
        RopeScaling::None | RopeScaling::FreqFactors(_) => serde_json::Value::Null,
        RopeScaling::Linear { factor } => serde_json::json!({"type": "linear", "factor": factor}),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position,
        } => serde_json::json!({
            "rope_type": "llama3", "factor": factor, "low_freq_factor": low_freq_factor,
            "high_freq_factor": high_freq_factor, "original_max_position_embeddings": original_max_position,
        }),
        RopeScaling::Yarn {
            factor,
            original_max_position,
            beta_fast,
            beta_slow,
            mscale,
            mscale_all_dim,
        } => serde_json::json!({
            "type": "yarn", "factor": factor, "original_max_position_embeddings": original_max_position,
            "beta_fast": beta_fast, "beta_slow": beta_slow, "mscale": mscale,
            "mscale_all_dim": mscale_all_dim,
        }),
    };
    let t = &opened.tokenizer;
    let cfg = serde_json::json!({
        "architectures": [class],
        "model_type": model_type,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "vocab_size": config.vocab_size,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": rope_scaling,
        "max_position_embeddings": config.max_position_embeddings,
        "tie_word_embeddings": config.tie_word_embeddings,
        "attention_bias": config.attention_bias,
        "bos_token_id": t.bos_token_id,
        "eos_token_id": t.eos_token_ids,
        "torch_dtype": if dtype == Dtype::Bfloat16 { "bfloat16" } else { "float32" },
    });
    let mut cfg = cfg;
    if let ExportWeights::Affine { bits, group_size } = weights {
        cfg["quantization"] = serde_json::json!({"group_size": group_size, "bits": bits});
    }
    let write = |name: &str, text: String| std::fs::write(out.join(name), text).map_err(io);
    write(
        "config.json",
        serde_json::to_string_pretty(&cfg).unwrap_or_default(),
    )?;
    write("tokenizer.json", t.to_json()?)?;
    let token = |id: Option<u32>| id.and_then(|i| t.id_to_token(i));
    write(
        "tokenizer_config.json",
        serde_json::to_string_pretty(&serde_json::json!({
            "bos_token": token(t.bos_token_id),
            "eos_token": token(t.eos_token_ids.first().copied()),
            "add_bos_token": t.add_bos,
            "chat_template": t.chat_template,
            "tokenizer_class": "PreTrainedTokenizerFast",
        }))
        .unwrap_or_default(),
    )?;
    Ok(())
}
