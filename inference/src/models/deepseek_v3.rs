//! DeepSeek V3 / R1 / V3.1 and Kimi K2 (`deepseek_v3`), as mlx-lm's `deepseek_v3.py`:
//! multi-head latent attention ([`super::mla`]) with interleaved ("traditional") RoPE, YaRN
//! with its magnitude correction; a dense SwiGLU on the first `first_k_dense_replace` layers
//! and then the sigmoid-routed, group-limited Mixture of Experts with a shared expert that
//! GLM-4.5 also uses ([`super::sigmoid_moe::sigmoid_moe_config`]).
//!
//! Hugging Face checkpoints store the latent's up-projection as one `kv_b_proj`
//! (`[heads·(nope + v), kv_lora]`); it is split here into `embed_q` (`W_uk`, per head
//! `[kv_lora, nope]`) and `unembed_out` (`W_uv`, `[v, kv_lora]`), the form mlx-lm's converted
//! folders store.

use super::base::{gguf_part_in, DecoderLayer, Family, LAYER_TENSORS};
use super::gguf_moe::{gguf_count, gguf_sigmoid_moe, EXPERT_TENSORS, SHARED_EXPERT_TENSORS};
use super::latent_moe::{configure_latent, latent_moe_block, latent_moe_tensor_names};
use super::sigmoid_moe::sigmoid_moe_config;
use crate::config::ModelConfig;
use crate::error::{InferenceError, Result};
use crate::weights::{GgufNames, TensorSource, WeightFormat};
use serde_json::Value;

/// The DeepSeek V3 family.
pub struct DeepseekV3;

/// The reference normalizes both bottlenecks with this epsilon, whatever `rms_norm_eps` says.
const LATENT_NORM_EPS: f32 = 1e-6;

impl Family for DeepseekV3 {
    fn hf_names(&self) -> (&'static str, &'static str) {
        ("deepseek_v3", "DeepseekV3ForCausalLM")
    }

    fn gguf_architectures(&self) -> &'static [&'static str] {
        &["deepseek2"]
    }

    fn configure_gguf(
        &self,
        file: &crate::gguf::GgufFile,
        arch: &str,
        config: &mut ModelConfig,
    ) -> Result<()> {
        configure_deepseek2(file, arch, config)
    }

    fn configure(&self, v: &Value, config: &mut ModelConfig) -> Result<()> {
        let moe = sigmoid_moe_config(v)?;
        if v.get("moe_layer_freq").and_then(Value::as_u64).unwrap_or(1) != 1 {
            return Err(InferenceError::BadConfig(
                "deepseek_v3 with moe_layer_freq other than 1 is not supported".into(),
            ));
        }
        config.moe = Some(moe);
        configure_latent(v, config, LATENT_NORM_EPS)?;
        Ok(())
    }

    fn block(
        &self,
        config: &ModelConfig,
        source: &mut dyn TensorSource,
        layer: usize,
        format: WeightFormat,
    ) -> Result<DecoderLayer> {
        latent_moe_block("deepseek_v3", config, source, layer, format)
    }

    fn layer_tensor_names(&self, config: &ModelConfig, layer: usize) -> Vec<String> {
        latent_moe_tensor_names(config, layer)
    }
}

/// The latent attention's tensors as llama.cpp's `deepseek2` names them. Its converter splits
/// `kv_b_proj` per head into `attn_k_b` (`W_uk` transposed: `[heads, kv_lora, nope]`) and
/// `attn_v_b` (`W_uv`: `[heads, v, kv_lora]`), which is mlx-lm's `embed_q` / `unembed_out`
/// layout; older files keep the whole `attn_kv_b`.
const LATENT_TENSORS: &[(&str, &str)] = &[
    ("self_attn.q_proj", "attn_q"),
    ("self_attn.q_a_proj", "attn_q_a"),
    ("self_attn.q_a_layernorm", "attn_q_a_norm"),
    ("self_attn.q_b_proj", "attn_q_b"),
    ("self_attn.kv_a_proj_with_mqa", "attn_kv_a_mqa"),
    ("self_attn.kv_a_layernorm", "attn_kv_a_norm"),
    ("self_attn.kv_b_proj", "attn_kv_b"),
    ("self_attn.embed_q", "attn_k_b"),
    ("self_attn.unembed_out", "attn_v_b"),
];

impl GgufNames for DeepseekV3 {
    fn gguf_part(&self, hf_part: &str) -> Option<&'static str> {
        let tables = LATENT_TENSORS.iter().chain(LAYER_TENSORS);
        gguf_part_in(
            tables.chain(EXPERT_TENSORS).chain(SHARED_EXPERT_TENSORS),
            hf_part,
        )
    }
}

/// llama.cpp's `deepseek2` as DeepSeek V3 / R1 / Kimi K2 files have it: sigmoid routing
/// (`expert_gating_func` 2) with `exp_probs_b`, the shared expert and the leading dense layers
/// ([`gguf_sigmoid_moe`]); the latent widths from `attention.q_lora_rank`,
/// `attention.kv_lora_rank`, `rope.dimension_count` and the `*_length_mla` keys. llama.cpp
/// normalizes the bottlenecks with the file's `layer_norm_rms_epsilon`, so shoal does too. A
/// V2-style softmax router (no `expert_gating_func`) is refused by [`gguf_sigmoid_moe`].
fn configure_deepseek2(
    file: &crate::gguf::GgufFile,
    arch: &str,
    config: &mut ModelConfig,
) -> Result<()> {
    if gguf_count(file, arch, "expert_gating_func").is_none() {
        return Err(InferenceError::BadConfig(format!(
            "this `{arch}` GGUF has no `{arch}.expert_gating_func`: DeepSeek V2's softmax \
             router is not supported (V3's sigmoid routing, gating function 2, is)"
        )));
    }
    let moe = gguf_sigmoid_moe(file, arch)?;
    let count = |k: &str| gguf_count(file, arch, k);
    let need = |k: &str| {
        count(k)
            .ok_or_else(|| InferenceError::BadConfig(format!("GGUF metadata has no `{arch}.{k}`")))
    };
    let rope = need("rope.dimension_count")?;
    let key = need("attention.key_length_mla")?;
    let json = serde_json::json!({
        "q_lora_rank": count("attention.q_lora_rank"),
        "kv_lora_rank": need("attention.kv_lora_rank")?,
        "qk_nope_head_dim": key.checked_sub(rope).ok_or_else(|| InferenceError::BadConfig(
            format!("`{arch}.attention.key_length_mla` {key} is below the rotary width {rope}")
        ))?,
        "qk_rope_head_dim": rope,
        "v_head_dim": need("attention.value_length_mla")?,
    });
    config.moe = Some(moe);
    configure_latent(&json, config, config.rms_norm_eps)
}

#[cfg(test)]
mod tests {
    use crate::config::ModelConfig;
    use crate::gguf::GgufFile;

    /// A GGUF v3 file of metadata only: `u32` values and strings.
    fn metadata_only(keys: &[(&str, Result<u32, &str>)]) -> Vec<u8> {
        let string = |b: &mut Vec<u8>, s: &str| {
            b.extend((s.len() as u64).to_le_bytes());
            b.extend(s.as_bytes());
        };
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b.extend((keys.len() as u64).to_le_bytes());
        for (key, value) in keys {
            string(&mut b, key);
            match value {
                Ok(n) => {
                    b.extend(4u32.to_le_bytes());
                    b.extend(n.to_le_bytes());
                }
                Err(s) => {
                    b.extend(8u32.to_le_bytes());
                    string(&mut b, s);
                }
            }
        }
        b
    }

    /// DeepSeek V2's files carry no `expert_gating_func` (llama.cpp then routes by softmax):
    /// refused saying so; with V3's sigmoid routing the same keys read as latent attention.
    #[test]
    fn a_deepseek2_file_without_sigmoid_routing_is_refused_by_name() {
        let mut keys = vec![
            ("general.architecture", Err("deepseek2")),
            ("deepseek2.embedding_length", Ok(256)),
            ("deepseek2.block_count", Ok(2)),
            ("deepseek2.feed_forward_length", Ok(512)),
            ("deepseek2.attention.head_count", Ok(4)),
            ("deepseek2.vocab_size", Ok(100)),
            ("deepseek2.expert_count", Ok(8)),
            ("deepseek2.expert_used_count", Ok(2)),
            ("deepseek2.expert_feed_forward_length", Ok(256)),
            ("deepseek2.leading_dense_block_count", Ok(1)),
            ("deepseek2.attention.kv_lora_rank", Ok(256)),
            ("deepseek2.attention.key_length_mla", Ok(96)),
            ("deepseek2.attention.value_length_mla", Ok(64)),
            ("deepseek2.rope.dimension_count", Ok(32)),
        ];
        let path = std::env::temp_dir().join(format!("shoal-ds2-{}.gguf", std::process::id()));
        let read = |keys: &[(&str, Result<u32, &str>)]| {
            std::fs::write(&path, metadata_only(keys)).unwrap();
            ModelConfig::from_gguf(&GgufFile::open(&path).unwrap())
        };
        let err = read(&keys).unwrap_err().to_string();
        assert!(
            err.contains("expert_gating_func") && err.contains("softmax router"),
            "{err}"
        );
        keys.push(("deepseek2.expert_gating_func", Ok(2)));
        let config = read(&keys);
        std::fs::remove_file(&path).ok();
        let config = config.unwrap();
        let latent = config.attention.latent.as_ref().unwrap();
        assert_eq!(
            (
                latent.qk_nope_head_dim,
                latent.qk_rope_head_dim,
                latent.v_head_dim
            ),
            (64, 32, 64)
        );
        assert_eq!(config.moe.as_ref().unwrap().first_dense, 1);
    }
}
