//! [`NodeContext`]: what the node needs from the rest of the process (the mesh): its id, the
//! replicated state, writes of its own records (the part the models need too,
//! [`models::Cluster`]), the state's changes, and connections to other nodes for chat
//! forwarding. The mesh supplies it (`MeshContext`, `mesh_state.rs`); unit tests use
//! [`LocalOnly`], an in-memory lone node.

#[cfg(test)]
use control::Snapshot;
use gateway::BoxFuture;
#[cfg(test)]
use serde_json::json;
use serde_json::Value;
#[cfg(test)]
use std::collections::BTreeMap;
#[cfg(test)]
use std::sync::Mutex;

/// What the node knows beyond its own runners: supplied by the mesh (or a lone test node).
pub trait NodeContext: models::Cluster {
    /// The state as `GET /state` shows it (before the instances are added).
    fn state_json(&self) -> Value;
    /// Grows with every start of this node, so ids made now never repeat older ones.
    fn generation(&self) -> u64;
    /// Changes of the state, to react at once (the executor also ticks).
    fn subscribe(&self) -> Option<tokio::sync::broadcast::Receiver<mesh::Event>>;
    /// A connection to `node` on the chat-forwarding ALPN (`chat/forward.rs`), kept
    /// open across requests; a node outside a mesh has none.
    fn open_chat(&self, node: String) -> BoxFuture<'_, Result<iroh::endpoint::Connection, String>> {
        Box::pin(async move { Err(format!("no mesh to reach node {node} through")) })
    }
    /// Whether this node takes `node` for dead (a forwarded chat then ends at once).
    fn is_dead(&self, node: &str) -> bool {
        let _ = node;
        false
    }
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
impl models::Cluster for LocalOnly {
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
}

#[cfg(test)]
impl NodeContext for LocalOnly {
    fn state_json(&self) -> Value {
        json!({ "node_id": self.node_id })
    }

    fn generation(&self) -> u64 {
        1
    }

    fn subscribe(&self) -> Option<tokio::sync::broadcast::Receiver<mesh::Event>> {
        None
    }
}
