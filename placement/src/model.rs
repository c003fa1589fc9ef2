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
