//! Why a placement failed: a stable machine code plus a sentence that says what to do.

use crate::node::NodeId;
use serde::ser::SerializeStruct;
use serde::{Serialize, Serializer};

/// A placement failure. [`PlaceError::code`] is stable (clients match on it); the `Display`
/// text is for people and names what to do about it.
///
/// When several apply, the first in the order placement runs is reported: input checks, ring
/// choice (topology, memory, tensor, compute backend, RDMA), layer split and per-node memory,
/// then neighbour links.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum PlaceError {
    /// The input contradicts itself (duplicate node ids, download progress outside 0..1).
    #[error("invalid input at `{field}`: {reason}")]
    InvalidInput {
        /// Where in the input (a JSON path such as `nodes[2].ram_total`, or `nodes.id`).
        field: String,
        /// What is wrong with it and how to fix it.
        reason: String,
    },
    /// No directed cycle of the topology has enough nodes and contains the required ones.
    #[error("{0}")]
    NoRing(String),
    /// Rings exist, but none has enough memory in total.
    #[error(
        "no ring of at least {min_nodes} node(s) has {needed} bytes free for the model \
         (all eligible nodes together have {available}); free memory on the nodes, add nodes \
         or links between them, or choose a smaller model"
    )]
    NoRingWithEnoughMemory {
        /// Bytes the model needs.
        needed: u64,
        /// Free bytes of every node that could be in a ring, together.
        available: u64,
        /// The request's minimum ring size.
        min_nodes: u32,
    },
    /// Tensor sharding on more than one node, for a model that cannot shard its layers.
    #[error(
        "model {model} does not support tensor sharding on more than one node; request \
         pipeline sharding instead"
    )]
    TensorNotSupported {
        /// The model id.
        model: String,
    },
    /// No ring with enough memory has a size dividing the hidden size and the KV-head count.
    #[error(
        "no ring with enough memory has a size that divides each of hidden_size {hidden_size}, \
         num_key_value_heads {kv_heads}{also}; request pipeline sharding, or change min_nodes \
         or the set of nodes"
    )]
    TensorIndivisible {
        /// The model's hidden size.
        hidden_size: u32,
        /// The model's KV-head count.
        kv_heads: u32,
        /// The model card's further divisors, each as `", COUNT WHAT"` (empty when none).
        also: String,
    },
    /// No ring whose every node offers one of the model's compute backends.
    #[error(
        "no ring with enough memory is made only of nodes offering one of the backends {backends} \
         that model {model} runs on; add such nodes or choose a model for the backends you have"
    )]
    BackendUnsupported {
        /// The model id.
        model: String,
        /// The model's backends, comma-separated.
        backends: String,
    },
    /// JACCL was asked for, but no qualifying ring is made of Metal nodes with RDMA enabled
    /// (a ring of one too: JACCL exists only on macOS) and RDMA links between every pair.
    #[error(
        "no ring with enough memory has RDMA enabled and the Metal backend on every node (JACCL \
         runs only on macOS) and an RDMA link between every ordered pair of its nodes; enable \
         RDMA and cable the nodes, or request the ring backend"
    )]
    NoRdmaRing,
    /// The bounded ring search spent its budget before finding a ring.
    #[error(
        "the ring search stopped after {budget} units of work without finding a ring; name the nodes \
         to use in required_nodes, or raise min_nodes"
    )]
    RingSearchExhausted {
        /// The step budget that ran out.
        budget: u64,
    },
    /// The chosen ring has more nodes than the model has layers.
    #[error(
        "the model has {n_layers} layer(s) but the ring needs at least one per node on {nodes} \
         node(s); lower min_nodes or use tensor sharding"
    )]
    TooFewLayers {
        /// The model's layer count.
        n_layers: u32,
        /// The ring size.
        nodes: usize,
    },
    /// The ring's pipeline would have to begin a stage at a layer that must stay with the
    /// one before it ([`crate::ModelCard::no_cut_before`]), whichever way the cuts move.
    #[error(
        "the model's {n_layers} layers cannot be cut into {nodes} pipeline stages: no stage may \
         begin at layer(s) {joined:?} (those layers read the keys and values of an earlier \
         layer, which must be on the same rank); lower min_nodes or use tensor sharding"
    )]
    UncuttableLayers {
        /// The model's layer count.
        n_layers: u32,
        /// The ring size.
        nodes: usize,
        /// The layers no stage may begin at.
        joined: Vec<u32>,
    },
    /// A node of the chosen ring cannot hold its share of the weights.
    #[error(
        "node {node} would hold {needed} bytes of weights but has only {available} free; free \
         memory on it, or exclude it by naming other nodes in required_nodes"
    )]
    NodeShortOfMemory {
        /// The node.
        node: NodeId,
        /// Bytes its share needs.
        needed: u64,
        /// Bytes it has free.
        available: u64,
    },
    /// A rank has no verified IP link to a node it must reach.
    #[error(
        "node {node} has no verified IP link to {neighbour}, which it must reach in the ring; \
         check the network between them (same subnet, firewall) and wait for the reachability probe"
    )]
    NeighbourUnreachable {
        /// The node that must connect.
        node: NodeId,
        /// The node it cannot reach.
        neighbour: NodeId,
    },
}

impl PlaceError {
    /// The stable machine code of this error.
    pub fn code(&self) -> &'static str {
        match self {
            PlaceError::InvalidInput { .. } => "invalid_input",
            PlaceError::NoRing(_) => "no_ring",
            PlaceError::NoRingWithEnoughMemory { .. } => "no_ring_with_enough_memory",
            PlaceError::TensorNotSupported { .. } => "tensor_not_supported",
            PlaceError::TensorIndivisible { .. } => "tensor_indivisible",
            PlaceError::BackendUnsupported { .. } => "backend_unsupported",
            PlaceError::NoRdmaRing => "no_rdma_ring",
            PlaceError::RingSearchExhausted { .. } => "ring_search_exhausted",
            PlaceError::TooFewLayers { .. } => "too_few_layers",
            PlaceError::UncuttableLayers { .. } => "uncuttable_layers",
            PlaceError::NodeShortOfMemory { .. } => "node_short_of_memory",
            PlaceError::NeighbourUnreachable { .. } => "neighbour_unreachable",
        }
    }

    /// The human sentence (same as `Display`).
    pub fn message(&self) -> String {
        self.to_string()
    }
}

/// Serialized as `{"code": ..., "message": ...}`, the shape of the CLI and the API.
impl Serialize for PlaceError {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut s = serializer.serialize_struct("PlaceError", 2)?;
        s.serialize_field("code", self.code())?;
        s.serialize_field("message", &self.message())?;
        s.end()
    }
}
