//! The model to place, as its model card describes it.

use crate::node::ComputeBackend;
use serde::{Deserialize, Serialize};

/// The facts about a model that decide where it fits.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ModelCard {
    /// The model id (a Hugging Face repository id, or a local name); keys `download`.
    pub id: String,
    /// Number of transformer layers: the unit of a pipeline split.
    pub n_layers: u32,
    /// Size of the weights in bytes. A node holding `l` layers needs
    /// `storage_bytes × l / n_layers` bytes.
    pub storage_bytes: u64,
    /// Hidden size: a tensor-parallel ring's size must divide it.
    pub hidden_size: u32,
    /// Number of key/value heads: a tensor-parallel ring's size must divide it.
    pub num_key_value_heads: u32,
    /// Whether the model's code can shard every layer across ranks.
    pub supports_tensor: bool,
    /// Further counts a tensor-parallel ring's size must divide, besides the hidden size and
    /// the key/value heads: query heads, feed-forward and expert widths, and the number of
    /// quantization groups each cut axis holds (a group shares one scale, so it cannot be
    /// split between ranks). Always written (postcard, which carries placement inputs
    /// between nodes, has no optional fields); JSON documents may leave it out.
    #[serde(default)]
    pub tensor_divisors: Vec<TensorDivisor>,
    /// The relative size of each layer (its parameters) when the layers differ: DeepSeek V3's
    /// and GLM-4.5's dense leading layers weigh about a twentieth of a Mixture-of-Experts
    /// layer. Empty when every layer weighs the same (or when the list does not have one entry
    /// per layer). A pipeline rank then needs the bytes of its layers' weight, and the split
    /// gives ranks weight in proportion to their memory. Always written like
    /// `tensor_divisors`; JSON documents may leave it out.
    #[serde(default)]
    pub layer_weights: Vec<u64>,
    /// Bytes rank 0 alone holds on top of its share of [`ModelCard::storage_bytes`]: a vision
    /// tower (issue 47), which runs whole on the rank that holds the requests and embeds the
    /// prompt. Counted on rank 0 only, never spread over a pipeline's layers or a tensor
    /// ring's ranks, so a split cannot leave rank 0 short by the tower. Always written like
    /// `tensor_divisors`; JSON documents may leave it out (0).
    #[serde(default)]
    pub rank0_bytes: u64,
    /// Layers a pipeline stage may not begin at: a cut there would separate layers that must
    /// run on one rank (Gemma 4's KV-shared layers read the keys and values an earlier layer
    /// computed, so every layer from the source to its readers stays together). Sorted, each
    /// in `1..n_layers`; empty for most models. Always written like `tensor_divisors`; JSON
    /// documents may leave it out.
    #[serde(default)]
    pub no_cut_before: Vec<u32>,
    /// The compute backends the model runs on; every node of a ring must offer one of them.
    /// An empty list matches no node.
    pub backends: Vec<ComputeBackend>,
}

/// A count a tensor-parallel ring's size must divide, and what it counts (named in the
/// refusal).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TensorDivisor {
    /// What is counted (`"expert width (768) in quantization groups of 64"`).
    pub what: String,
    /// The count.
    pub count: u32,
}

impl ModelCard {
    /// Whether the layers weigh differently ([`ModelCard::layer_weights`] holds one weight per
    /// layer, not all equal).
    pub fn layers_differ(&self) -> bool {
        self.layer_weights.len() == self.n_layers as usize
            && self.layer_weights.windows(2).any(|w| w[0] != w[1])
    }

    /// The weight of layers `start..end` and of the whole model, in the same unit (layers
    /// when they weigh the same).
    pub fn layer_weight(&self, start: u32, end: u32) -> (u128, u128) {
        if !self.layers_differ() {
            let held = end.min(self.n_layers).saturating_sub(start);
            return (u128::from(held), u128::from(self.n_layers));
        }
        let sum = |r: std::ops::Range<usize>| -> u128 {
            self.layer_weights
                .get(r)
                .unwrap_or_default()
                .iter()
                .map(|&w| u128::from(w))
                .sum()
        };
        let n = self.layer_weights.len();
        let (start, end) = ((start as usize).min(n), (end as usize).min(n));
        (sum(start..end.max(start)), sum(0..n))
    }

    /// Bytes a pipeline rank holding layers `start..end` needs: [`ModelCard::storage_bytes`]
    /// times their share of the weight, rounded up.
    pub fn bytes_of_layers(&self, start: u32, end: u32) -> u64 {
        let (part, whole) = self.layer_weight(start, end);
        let need = (u128::from(self.storage_bytes) * part).div_ceil(whole.max(1));
        u64::try_from(need).unwrap_or(u64::MAX)
    }

    /// What rank `rank` of an instance holds besides its share: [`ModelCard::rank0_bytes`] on
    /// rank 0, nothing elsewhere.
    pub fn extra_on_rank(&self, rank: usize) -> u64 {
        if rank == 0 {
            self.rank0_bytes
        } else {
            0
        }
    }

    /// Everything an instance holds over all its ranks: the weights' shares and rank 0's
    /// extra.
    pub fn instance_bytes(&self) -> u64 {
        self.storage_bytes.saturating_add(self.rank0_bytes)
    }
}

/// What one instance of a model holds while it runs, as `inference::memory` counts it: the
/// node's model facts carry it and the model card's size is its total.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstanceMemory {
    /// The weights as they run.
    pub weights: u64,
    /// The KV-cache budget (of `inference::memory::DEFAULT_KV_TOKENS` positions, at most the
    /// context).
    pub kv_budget: u64,
    /// `inference::memory::RUNNER_OVERHEAD_BYTES`.
    pub overhead: u64,
    /// The vision tower and projector as they run (float32), held by the rank that embeds
    /// (see `inference::vision`); 0 for a model without one.
    pub vision: u64,
}

impl InstanceMemory {
    /// Everything: what placement counts.
    pub fn total(&self) -> u64 {
        self.weights + self.kv_budget + self.overhead + self.vision
    }
}
