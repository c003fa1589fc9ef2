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
    /// The compute backends the model runs on; every node of a ring must offer one of them.
    /// An empty list matches no node.
    pub backends: Vec<ComputeBackend>,
}
