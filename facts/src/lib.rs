//! A model's facts as the node reads them (its card for placement, its tokenizer and image
//! prompt for prompts), from the model families of `inference`.
//!
//! **Why a crate of its own.** `models` holds a model's facts as plain data and never links
//! MLX; reading them needs the family registry (`inference::loader::describe_model`), the
//! memory count and the vision tower's configuration, which do. The node gives this reader to
//! its model registry ([`models::registry::ModelRegistry::new`]); tests that need a real model's
//! facts call it too.

use inference::memory::{InstanceMemory, MemoryOf};
use inference::vision::{ImagePrompt, ReadImagePrompt};
use models::ModelFacts;
use std::path::Path;

/// `config`'s size and experts, for `GET /v1/models`.
fn shape_of(config: &inference::ModelConfig) -> gateway::ModelShape {
    let embed = (config.vocab_size * config.hidden_size) as u64;
    let embeddings = if config.tie_word_embeddings {
        embed
    } else {
        2 * embed
    };
    gateway::ModelShape {
        family: config.architecture.hf_names().0.to_string(),
        parameters: inference::memory::parameters(config),
        active_parameters: config.active_layer_parameters() as u64 + embeddings,
        experts: config.moe.as_ref().map(|m| m.num_experts as u32),
        experts_per_token: config.moe.as_ref().map(|m| m.experts_per_token as u32),
        capabilities: Vec::new(),
    }
}

/// `config`'s parameters per layer, or nothing when every layer has as many.
fn layer_weights(config: &inference::ModelConfig) -> Vec<u64> {
    let weights: Vec<u64> = (0..config.num_layers)
        .map(|l| config.parameters_of_layer(l) as u64)
        .collect();
    if weights.windows(2).all(|w| w[0] == w[1]) {
        Vec::new()
    } else {
        weights
    }
}

/// Reads the facts of the model at `path`: its configuration and tokenizer, not its weights
/// (the node's [`models::registry::ReadFacts`]).
pub fn read(path: &Path) -> Result<ModelFacts, String> {
    let opened = inference::loader::describe_model(path).map_err(|e| e.to_string())?;
    let image_prompt = ImagePrompt::read(path, &opened.tokenizer).unwrap_or_else(|e| {
        tracing::warn!(path = %path.display(), %e, "its vision tower cannot be read: it takes text only");
        None
    });
    Ok(ModelFacts {
        tokenizer: opened.tokenizer,
        context_length: opened.config.max_position_embeddings,
        vocab_size: opened.config.vocab_size,
        num_layers: opened.config.num_layers,
        hidden_size: opened.config.hidden_size,
        num_kv_heads: opened.config.num_kv_heads,
        bytes_on_disk: opened.bytes_on_disk,
        shape: gateway::ModelShape {
            capabilities: image_prompt.iter().map(|_| "vision".to_string()).collect(),
            ..shape_of(&opened.config)
        },
        tensor_divisors: inference::tensor_split::tensor_divisors(&opened.config)
            .into_iter()
            .filter(|d| d.what != "key/value heads")
            .collect(),
        layer_weights: layer_weights(&opened.config),
        no_cut_before: inference::models::no_cut_before(&opened.config),
        memory: InstanceMemory {
            vision: image_prompt.as_ref().map_or(0, |v| v.tower_bytes),
            ..InstanceMemory::of(&opened.config, opened.bytes_on_disk)
        },
        image_prompt,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model whose layers differ tells placement their weights (DeepSeek's fixture: a dense
    /// first layer, then Mixture-of-Experts layers); a model of equal layers tells nothing.
    #[test]
    fn the_card_carries_layer_weights_when_the_layers_differ() {
        let deepseek = kit::dirs::family_fixture_dir("deepseek_v3", "q4");
        let gemma = kit::dirs::family_fixture_dir("gemma3_text", "q4");
        if !deepseek.join("config.json").is_file() || !gemma.join("config.json").is_file() {
            let _ = kit::skip::can_run(
                Err::<(), String>("the family fixtures are missing".into()),
                "run `cargo xtask setup`",
            );
            return;
        }
        let card = read(&deepseek).unwrap().card("d");
        assert_eq!(card.layer_weights.len(), 3);
        assert!(card.layer_weights[0] < card.layer_weights[1]);
        assert_eq!(card.layer_weights[1], card.layer_weights[2]);
        let card = read(&gemma).unwrap().card("g");
        assert!(card.layer_weights.is_empty());
    }

    /// A vision model's tower is rank 0's alone on the card (placement counts it there, whole),
    /// and the rest is what the split shares out.
    #[test]
    fn the_card_counts_the_vision_tower_on_rank_0_alone() {
        let dir = kit::dirs::vision_fixtures_dir().join("gemma3/f32");
        if !dir.join("config.json").is_file() {
            let _ = kit::skip::can_run(
                Err::<(), String>("the vision fixtures are missing".into()),
                "run `cargo xtask setup`",
            );
            return;
        }
        let facts = read(&dir).unwrap();
        let tower = facts.image_prompt.as_ref().unwrap().tower_bytes;
        assert!(tower > 0);
        assert_eq!(facts.memory.vision, tower);
        let card = facts.card("v");
        assert_eq!(card.rank0_bytes, tower);
        assert_eq!(card.storage_bytes, facts.memory.total() - tower);
        assert_eq!(card.instance_bytes(), facts.memory.total());
    }
}
