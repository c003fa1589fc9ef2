//! The whole input of [`crate::place()`]: a snapshot of the cluster plus a model and a request.

use crate::edge::Edge;
use crate::error::PlaceError;
use crate::model::ModelCard;
use crate::node::NodeProfile;
use crate::request::Request;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// The most nodes one placement considers. Placement costs grow about as `n³` in the worst
/// case (see [`crate::ring`]); at this size a placement still takes well under a second.
pub const MAX_NODES: usize = 512;

/// Everything a placement depends on. Every node builds it from the replicated state and gets
/// the same placement; the order of `nodes`, `edges` and each node's `interfaces` does not
/// matter (placement sorts them first).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// The live nodes.
    pub nodes: Vec<NodeProfile>,
    /// Verified links. Edges naming a node not in `nodes`, and self-loops, are ignored (a dead
    /// node's edges may outlive it in the state).
    #[serde(default)]
    pub edges: Vec<Edge>,
    /// The model to place.
    pub model: ModelCard,
    /// How to place it.
    pub request: Request,
}

impl Input {
    /// Checks what the JSON types cannot: node ids are unique and download progress is a
    /// fraction. Placement calls it first; callers may call it to reject input early.
    pub fn validate(&self) -> Result<(), PlaceError> {
        if self.nodes.len() > MAX_NODES {
            return Err(PlaceError::InvalidInput {
                field: "nodes".into(),
                reason: format!(
                    "{} nodes is more than placement handles ({MAX_NODES}); split the cluster \
                     with separate namespaces",
                    self.nodes.len()
                ),
            });
        }
        let mut seen = BTreeSet::new();
        for node in &self.nodes {
            if !seen.insert(node.id.as_str()) {
                return Err(PlaceError::InvalidInput {
                    field: "nodes.id".into(),
                    reason: format!(
                        "node id {} appears twice; each node must appear once (a copied data \
                         directory duplicates a node's identity: delete its identity file)",
                        node.id
                    ),
                });
            }
            for (model, fraction) in &node.download {
                if !(0.0..=1.0).contains(fraction) {
                    return Err(PlaceError::InvalidInput {
                        field: format!("nodes[id={}].download.{model}", node.id),
                        reason: format!("progress {fraction} is not between 0.0 and 1.0"),
                    });
                }
            }
        }
        Ok(())
    }
}
