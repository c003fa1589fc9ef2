//! Which ring sizes a model can be split over tensor-parallel, and why the others cannot: a
//! rank keeps `1/N` of the heads and of each feed-forward's width, so `N` must divide each of
//! them; quantized weights are cut at their groups (a group shares one scale), so `N` must
//! also divide the number of groups each cut axis holds. Placement refuses, with the reason,
//! a ring size the runner would refuse after loading.

use crate::config::ModelConfig;
pub use crate::tensor_divisors::{standard_divisors, TensorDivisor};

/// The counts a tensor-parallel ring size must divide for a model of `config` (its family's
/// own rule, [`crate::models::base::Family::tensor_divisors`]).
pub fn tensor_divisors(config: &ModelConfig) -> Vec<TensorDivisor> {
    crate::models::family(config.architecture).tensor_divisors(config)
}

/// Why `size` ranks cannot split a model of `config`, or `None` when they can.
pub fn tensor_refusal(config: &ModelConfig, size: usize) -> Option<String> {
    if size <= 1 {
        return None;
    }
    let refused: Vec<String> = tensor_divisors(config)
        .into_iter()
        .filter(|d| d.count == 0 || !(d.count as usize).is_multiple_of(size))
        .map(|d| format!("{} {}", d.count, d.what))
        .collect();
    if refused.is_empty() {
        None
    } else {
        Some(format!(
            "{size} ranks cannot evenly split the model's {}",
            refused.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ModelConfig;

    fn qwen3_30b_a3b(quantized: bool) -> ModelConfig {
        let mut v = serde_json::json!({
            "model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48,
            "intermediate_size": 6144, "num_attention_heads": 32, "num_key_value_heads": 4,
            "head_dim": 128, "vocab_size": 151936, "num_experts": 128,
            "num_experts_per_tok": 8, "moe_intermediate_size": 768, "norm_topk_prob": true,
            "decoder_sparse_step": 1, "mlp_only_layers": [],
        });
        if quantized {
            v["quantization"] = serde_json::json!({"group_size": 64, "bits": 4});
        }
        ModelConfig::from_hf_json(&v).unwrap()
    }

    /// Qwen3-30B-A3B at 4 bits (groups of 64): experts 768 wide are 12 groups, so 2 and 4
    /// ranks split it and 8 would cut a group (and 3 does not divide the 4 key/value heads).
    #[test]
    fn quantization_groups_limit_the_ring_size() {
        let q = qwen3_30b_a3b(true);
        assert_eq!(tensor_refusal(&q, 1), None);
        assert_eq!(tensor_refusal(&q, 2), None);
        assert_eq!(tensor_refusal(&q, 4), None);
        let eight = tensor_refusal(&q, 8).unwrap();
        assert!(
            eight.contains("12 expert width (768) in quantization groups of 64"),
            "{eight}"
        );
        // (Its 4 key/value heads refuse 8 ranks too: both reasons are given.)
        assert!(eight.contains("4 key/value heads"), "{eight}");
        let three = tensor_refusal(&q, 3).unwrap();
        assert!(three.contains("4 key/value heads"), "{three}");
        // In f32 every width splits 8 ways; the 4 key/value heads still limit it.
        let f = qwen3_30b_a3b(false);
        assert!(tensor_refusal(&f, 8).unwrap().contains("4 key/value heads"));
        assert!(!tensor_refusal(&f, 8).unwrap().contains("expert"));
        // All layers are MoE: the unused dense width is not a divisor.
        assert!(!standard_divisors(&f).iter().any(|d| d.what == "MLP units"));
    }
}
