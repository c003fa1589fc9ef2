//! What an instance of a model holds in memory while it runs, as placement must count it: the
//! weights in the representation the runner computes with (not the file: the Q4_1 SmolLM2
//! fixture is 98 MB on disk and 538 MB as f32 weights, and a GGUF file run quantized is
//! repacked, K-quants with f32 scales, e.g. Q4_K_M's 100 MB as 122 MB: `running_bytes`), the KV-cache
//! budget of its batch, and what a runner process holds besides (MLX, activations, the
//! tokenizer, the process itself).
//!
//! The runner keeps its KV cache within the same budget ([`KvBudget`]), so the memory that
//! placement counts is the memory the runner holds.

use crate::config::ModelConfig;
use crate::weights::{available_memory_bytes, FormatOnMlx, WeightFormat};

/// What a runner process holds besides weights and KV cache: MLX and its allocator's pools,
/// one step's activations, the tokenizer, the process (measured: an idle SmolLM2 runner's RSS
/// is about 50 MB above its f32 weights; activations of a 256-token prefill chunk add some
/// tens of MB).
pub const RUNNER_OVERHEAD_BYTES: u64 = 160 << 20;

/// Positions of KV cache an instance holds at most by default (for example 32 streams of 256
/// tokens, or 4 of 2048): what placement counts, and the runner's cap unless
/// `SHOAL_KV_BUDGET_MB` says otherwise.
pub const DEFAULT_KV_TOKENS: u64 = 8192;

/// The share of the memory free when a runner loads that its KV cache may take by default.
pub const KV_FREE_MEMORY_SHARE: u64 = 4;

/// Bytes of one element of `format`'s compute dtype.
fn element_bytes(format: WeightFormat) -> u64 {
    match format.compute_dtype() {
        mlx_rs::Dtype::Float16 | mlx_rs::Dtype::Bfloat16 => 2,
        _ => 4,
    }
}

/// Parameters of the whole model (tied embeddings counted once, as the loader holds them).
pub fn parameters(config: &ModelConfig) -> u64 {
    let embed = (config.vocab_size * config.hidden_size) as u64;
    let heads = if config.tie_word_embeddings { 1 } else { 2 };
    (config.all_layer_parameters() + config.model_parameters_beyond_layers()) as u64
        + heads * embed
        + config.hidden_size as u64
}

/// The bytes a checkpoint of `config` (whose `config.json` is `json`) takes on disk, from its
/// parameters and how they are stored: `quantization`'s bits plus two 16-bit numbers per group
/// (affine) or one 8-bit scale (micro-scaled), else `torch_dtype` (f32: 4 bytes, anything else 2). For a folder whose weights are not
/// here yet and which has no index to give their size.
pub fn stored_bytes_estimate(config: &ModelConfig, json: &serde_json::Value) -> u64 {
    let params = parameters(config);
    if let Some(q) = &config.quantization {
        let groups = params / u64::try_from(q.group_size.max(1)).unwrap_or(64);
        let group_bytes = match q.mode {
            crate::quantized::QuantMode::Affine => 4,
            _ => 1,
        };
        return params * u64::try_from(q.bits.max(1)).unwrap_or(4) / 8 + groups * group_bytes;
    }
    let dtype = json
        .get("torch_dtype")
        .or_else(|| json.get("dtype"))
        .and_then(serde_json::Value::as_str);
    match dtype {
        Some("float32") => params * 4,
        _ => params * 2,
    }
}

/// Bytes the weights take as `format` (a quantized runner keeps the file's size, or for a
/// GGUF file its repacked size, `running_bytes`).
pub fn weight_bytes(config: &ModelConfig, format: WeightFormat, bytes_on_disk: u64) -> u64 {
    match format {
        WeightFormat::Quantized => config
            .quantization
            .as_ref()
            .and_then(|q| q.running_bytes)
            .unwrap_or(bytes_on_disk),
        other => parameters(config) * element_bytes(other),
    }
}

/// Layers that keep keys and values of their own: [`ModelConfig::kv_layers`] less those that
/// attend over an earlier layer's (Gemma 4's KV-shared layers,
/// [`crate::models::Family::kv_source`]), which cache nothing.
pub fn own_kv_layers(config: &ModelConfig) -> usize {
    let family = crate::models::family(config.architecture);
    let shared = (0..config.num_layers)
        .filter(|&layer| family.kv_source(config, layer).is_some())
        .count();
    config.kv_layers().saturating_sub(shared)
}

/// Bytes of KV cache one position takes over every layer (keys and values) in `format`.
/// Latent attention caches one latent and one rotated key per layer, for all heads. A
/// block-sparse attention layer (MiniMax M3) adds its index key, cached as one more value head. A
/// linear-attention layer caches nothing per position (its state is per sequence:
/// [`state_bytes_per_sequence`]), nor does a KV-shared one ([`own_kv_layers`]).
pub fn kv_bytes_per_token(config: &ModelConfig, format: WeightFormat) -> u64 {
    let layers = own_kv_layers(config);
    if let Some(latent) = &config.attention.latent {
        return (layers * latent.cached_width()) as u64 * element_bytes(format);
    }
    // A block-sparse layer caches its index key as one more value head.
    let index_heads = config
        .attention
        .block_index
        .as_ref()
        .map_or(0, |b| b.layers.iter().filter(|&&s| s).count());
    (2 * layers * config.num_kv_heads + index_heads) as u64
        * config.head_dim as u64
        * element_bytes(format)
}

/// Bytes of recurrent state one sequence holds over every linear-attention layer, whatever
/// its length (the convolution's inputs in `format`, the delta rule's matrices in float32);
/// 0 for a model without such layers.
pub fn state_bytes_per_sequence(config: &ModelConfig, format: WeightFormat) -> u64 {
    let Some(linear) = &config.attention.linear else {
        return 0;
    };
    let s = &linear.shape;
    let conv = ((s.kernel - 1) * s.conv_channels()) as u64 * element_bytes(format);
    let matrix = (s.v_heads * s.v_dim * s.k_dim) as u64 * 4;
    linear.count() as u64 * (conv + matrix)
}

/// Sequences whose recurrent state placement counts for a hybrid model (the state is fixed
/// bytes per sequence, beside the per-position KV budget).
pub const STATE_SEQUENCES: u64 = 16;

/// How a sequence's KV cache grows with its length, in positions of every layer (the unit of
/// [`KvBudget`]): a full-attention layer holds every position, a sliding-window layer at most
/// [`crate::kv_cache::held_bound`] of them (gpt-oss: half the layers keep at most 255 of a
/// long conversation; Gemma 3: five in six keep at most 1023).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvGrowth {
    layers: usize,
    sliding: usize,
    window: usize,
}

impl KvGrowth {
    /// The growth of `config`'s cache.
    pub fn of(config: &ModelConfig) -> KvGrowth {
        match &config.sliding_window {
            Some(w) => KvGrowth {
                layers: config.num_layers,
                sliding: w.layers.iter().filter(|&&s| s).count(),
                window: w.size,
            },
            None => KvGrowth {
                layers: config.num_layers,
                sliding: 0,
                window: 0,
            },
        }
    }

    /// Positions of every layer that a sequence of `len` positions costs: `len` when no layer
    /// slides, less once the sliding layers stop growing.
    pub fn positions(&self, len: usize) -> usize {
        if self.sliding == 0 || self.layers == 0 {
            return len;
        }
        let held = len.min(crate::kv_cache::held_bound(self.window));
        let weighted = (self.layers - self.sliding) * len + self.sliding * held;
        weighted.div_ceil(self.layers)
    }
}

pub use placement::InstanceMemory;

/// Counting an instance's memory from its model: a trait because [`InstanceMemory`] is plain
/// data in `placement` (what it counts, and what the node's model facts carry), while counting it
/// needs the model's configuration and the runner's weight format.
pub trait MemoryOf: Sized {
    /// The memory of an instance of `config` (stored in `bytes_on_disk`) on this build's
    /// backend, in the representation it runs by default
    /// ([`crate::weights::FormatOnMlx::preferred`]).
    fn of(config: &ModelConfig, bytes_on_disk: u64) -> Self;
}

impl MemoryOf for InstanceMemory {
    fn of(config: &ModelConfig, bytes_on_disk: u64) -> InstanceMemory {
        let format = WeightFormat::preferred(config);
        let tokens = DEFAULT_KV_TOKENS.min(config.max_position_embeddings as u64);
        InstanceMemory {
            weights: weight_bytes(config, format, bytes_on_disk),
            kv_budget: tokens * kv_bytes_per_token(config, format)
                + STATE_SEQUENCES * state_bytes_per_sequence(config, format),
            overhead: RUNNER_OVERHEAD_BYTES,
            vision: 0,
        }
    }
}

/// The KV-cache budget of one runner, in positions of every layer (summed over its
/// sequences; a sequence's count is [`KvGrowth::positions`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvBudget {
    /// Positions the runner's sequences may hold together.
    pub tokens: usize,
}

impl KvBudget {
    /// The budget for `config` run as `format`: `megabytes` when given (the node's
    /// `--kv-budget-mb`), else [`DEFAULT_KV_TOKENS`] positions but at most a quarter of the
    /// memory free now. Never less than one full context, so that every request the model
    /// takes can run (alone).
    pub fn new(config: &ModelConfig, format: WeightFormat, megabytes: Option<u64>) -> KvBudget {
        let per_token = kv_bytes_per_token(config, format).max(1);
        let tokens = match megabytes {
            Some(mb) => (mb << 20) / per_token,
            None => {
                let free = available_memory_bytes().unwrap_or(u64::MAX) / KV_FREE_MEMORY_SHARE;
                DEFAULT_KV_TOKENS.min(free / per_token)
            }
        };
        let context = config.max_position_embeddings as u64;
        KvBudget {
            tokens: usize::try_from(tokens.max(context)).unwrap_or(usize::MAX),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn smollm2() -> ModelConfig {
        // SmolLM2-135M's shape.
        let json = serde_json::json!({
            "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536,
            "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
            "vocab_size": 49152, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
            "rope_theta": 100000.0, "tie_word_embeddings": true
        });
        ModelConfig::from_hf_json(&json).unwrap()
    }

    #[test]
    fn sliding_layers_stop_counting_past_their_bound() {
        let mut c = smollm2();
        assert_eq!(KvGrowth::of(&c).positions(5000), 5000);
        // gpt-oss's pattern over 30 layers: 15 slide with a window of 128.
        c.sliding_window = Some(crate::config::SlidingWindow {
            size: 128,
            layers: (0..30).map(|l| l % 2 == 0).collect(),
        });
        let g = KvGrowth::of(&c);
        assert_eq!(g.positions(0), 0);
        assert_eq!(
            g.positions(100),
            100,
            "within the window every layer holds all"
        );
        assert_eq!(g.positions(255), 255);
        // 15 layers hold 5000, 15 hold 255: (75000 + 3825) / 30, rounded up.
        assert_eq!(g.positions(5000), 2628);
        assert!(
            g.positions(5002) > g.positions(5000),
            "the full layers still grow"
        );
    }

    #[test]
    fn the_fixture_counts_its_f32_weights_kv_budget_and_overhead() {
        let c = smollm2();
        assert_eq!(parameters(&c), 134_515_008);
        assert_eq!(weight_bytes(&c, WeightFormat::F32, 98_000_000), 538_060_032);
        assert_eq!(
            weight_bytes(&c, WeightFormat::Quantized, 98_000_000),
            98_000_000
        );
        assert_eq!(kv_bytes_per_token(&c, WeightFormat::F32), 46_080);
        assert_eq!(kv_bytes_per_token(&c, WeightFormat::Bf16), 23_040);
        let budget = KvBudget::new(&c, WeightFormat::F32, Some(1));
        assert_eq!(budget.tokens, 8192, "at least one context");
        let budget = KvBudget::new(&c, WeightFormat::F32, Some(720));
        assert_eq!(budget.tokens, (720 << 20) / 46_080);
    }
}
