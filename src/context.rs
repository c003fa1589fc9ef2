//! [`NodeContext`]: what the node's backend needs from the rest of the node (the mesh): its
//! id, the replicated state, writes of its own records, and chats forwarded to other nodes.
//! The mesh supplies it (src/node.rs); unit tests use [`LocalOnly`], an in-memory lone node.

use control::Snapshot;
use gateway::{ApiError, BoxFuture, CancellationToken, ChatRequest, ChatStream};
#[cfg(test)]
use serde_json::json;
use serde_json::Value;
#[cfg(test)]
use std::collections::BTreeMap;
#[cfg(test)]
use std::sync::Mutex;

/// What the node knows beyond its own runners: supplied by the mesh (or a lone test node).
pub trait NodeContext: Send + Sync + 'static {
    /// This node's id (`GET /node_id`).
    fn node_id(&self) -> String;
    /// The replicated state now, with this node's liveness view.
    fn snapshot(&self) -> Snapshot;
    /// The state as `GET /state` shows it (before the instances are added).
    fn state_json(&self) -> Value;
    /// Writes this node's record `key`.
    fn write(&self, key: &str, value: &Value) -> Result<(), String>;
    /// A connection to member `node` on the file-copy ALPN ([`crate::models::peer`]); a node
    /// outside a mesh has none.
    fn open_files(
        &self,
        node: String,
    ) -> BoxFuture<'_, Result<iroh::endpoint::Connection, String>> {
        Box::pin(async move { Err(format!("no mesh to reach node {node} through")) })
    }
    /// Deletes this node's record `key`; true if it existed.
    fn remove(&self, key: &str) -> bool;
    /// Grows with every start of this node, so ids made now never repeat older ones.
    fn generation(&self) -> u64;
    /// Changes of the state, to react at once (the reconciler also ticks).
    fn subscribe(&self) -> Option<tokio::sync::broadcast::Receiver<mesh::Event>>;
    /// Sends `request` for instance `instance_id` to `node` (its rank 0) and streams the
    /// events back.
    fn forward_chat(
        &self,
        node: String,
        instance_id: String,
        request: ChatRequest,
        cancel: CancellationToken,
    ) -> BoxFuture<'_, Result<ChatStream, ApiError>>;
}

/// A node on its own (unit tests): its records in memory, always alive, and other authors'
/// parts of the state as the test sets them (no network).
#[cfg(test)]
pub struct LocalOnly {
    node_id: String,
    records: Mutex<BTreeMap<String, String>>,
    /// Other nodes' parts of the state.
    pub others: Mutex<BTreeMap<String, control::Author>>,
}

#[cfg(test)]
impl LocalOnly {
    /// A lone node with this id.
    pub fn new(node_id: impl Into<String>) -> LocalOnly {
        LocalOnly {
            node_id: node_id.into(),
            records: Mutex::default(),
            others: Mutex::default(),
        }
    }
}

#[cfg(test)]
impl NodeContext for LocalOnly {
    fn node_id(&self) -> String {
        self.node_id.clone()
    }

    fn snapshot(&self) -> Snapshot {
        let records = self.records.lock().unwrap().clone();
        let mut authors = self.others.lock().unwrap().clone();
        authors.insert(
            self.node_id.clone(),
            control::Author {
                alive: true,
                dead: false,
                records,
            },
        );
        Snapshot {
            settling: false,
            me: self.node_id.clone(),
            authors,
        }
    }

    fn state_json(&self) -> Value {
        json!({ "node_id": self.node_id })
    }

    fn write(&self, key: &str, value: &Value) -> Result<(), String> {
        self.records
            .lock()
            .unwrap()
            .insert(key.to_string(), value.to_string());
        Ok(())
    }

    fn remove(&self, key: &str) -> bool {
        self.records.lock().unwrap().remove(key).is_some()
    }

    fn generation(&self) -> u64 {
        1
    }

    fn subscribe(&self) -> Option<tokio::sync::broadcast::Receiver<mesh::Event>> {
        None
    }

    fn forward_chat(
        &self,
        node: String,
        _instance_id: String,
        _request: ChatRequest,
        _cancel: CancellationToken,
    ) -> BoxFuture<'_, Result<ChatStream, ApiError>> {
        Box::pin(async move { Err(ApiError::internal(format!("no peer {node} here"))) })
    }
}
