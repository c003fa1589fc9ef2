//! What the user asked for: how to shard, over which collective, on how many nodes.

use crate::node::NodeId;
use serde::{Deserialize, Serialize};

/// How the model is split across the ring.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
pub enum Sharding {
    /// Each rank holds a contiguous range of layers; activations flow rank to rank.
    Pipeline,
    /// Each rank holds a slice of every layer; ranks all-reduce after each layer.
    Tensor,
}

/// The collective the ranks talk over.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
pub enum CollectiveBackend {
    /// MLX's ring backend over TCP: each rank knows its two neighbours.
    Ring,
    /// MLX's JACCL backend over RDMA (Thunderbolt 5): every pair needs an RDMA link.
    Jaccl,
}

/// The instance id used when a request names none (the `shoal place` CLI). Nodes that place a
/// real instance always pass its id, from which the ring port is derived.
pub const DEFAULT_INSTANCE_ID: &str = "shoal-place";

fn default_instance_id() -> String {
    DEFAULT_INSTANCE_ID.to_string()
}

fn default_min_nodes() -> u32 {
    1
}

/// A request to run a model.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// How to shard. A ring of one node always runs pipeline over the ring backend.
    pub sharding: Sharding,
    /// Which collective to use.
    pub backend: CollectiveBackend,
    /// The fewest nodes the ring may have (0 counts as 1). Defaults to 1.
    #[serde(default = "default_min_nodes")]
    pub min_nodes: u32,
    /// Nodes the ring must contain. Defaults to none.
    #[serde(default)]
    pub required_nodes: Vec<NodeId>,
    /// The instance being placed; the ring port is derived from it, so every node computes the
    /// same port. Defaults to [`DEFAULT_INSTANCE_ID`].
    #[serde(default = "default_instance_id")]
    pub instance_id: String,
}
