//! Previews: every way a model could be placed on the nodes there are (`GET
//! /instance/previews`), each sharding × collective backend × node count, with its placement or
//! why there is none. Pure, like [`place`]: the same input gives the same previews on every node.

use crate::{place, CollectiveBackend, Input, PlaceError, Placement, Request, Sharding};

/// One combination and what placing it gives.
#[derive(Debug, Clone, PartialEq)]
pub struct PreviewPlacement {
    /// How the model is split.
    pub sharding: Sharding,
    /// How its nodes talk.
    pub backend: CollectiveBackend,
    /// The least number of nodes asked for.
    pub node_count: usize,
    /// The placement, or why there is none.
    pub placed: Result<Placement, PlaceError>,
}

/// Every combination's placement on `base`'s nodes, in a fixed order: pipeline before tensor,
/// ring before JACCL, then 1 to `base.nodes.len()` nodes (at least one). `base.request` is
/// replaced in each; nothing is required of particular nodes.
pub fn previews(base: &Input) -> Vec<PreviewPlacement> {
    let nodes = base.nodes.len().max(1);
    let mut out = Vec::new();
    for sharding in [Sharding::Pipeline, Sharding::Tensor] {
        for backend in [CollectiveBackend::Ring, CollectiveBackend::Jaccl] {
            for node_count in 1..=nodes {
                let mut input = base.clone();
                input.request = Request {
                    sharding,
                    backend,
                    min_nodes: node_count as u32,
                    required_nodes: vec![],
                    instance_id: crate::DEFAULT_INSTANCE_ID.into(),
                };
                out.push(PreviewPlacement {
                    sharding,
                    backend,
                    node_count,
                    placed: place(&input),
                });
            }
        }
    }
    out
}
