//! The node's adapter over the mesh: [`MeshContext`] (the node's id, state, record writes and
//! connections to other nodes, as [`NodeContext`]) and a [`Snapshot`] read out of the mesh
//! replica. Everything that decides lives in the `control` crate; this file only translates.

use crate::context::NodeContext;
use control::{Author, Snapshot};
use gateway::BoxFuture;
use iroh::endpoint::Connection;
use mesh::{Event, Mesh};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The node's id and state as the mesh holds them, and connections to other nodes.
pub struct MeshContext {
    /// The mesh.
    pub mesh: Arc<Mesh>,
    /// The chat-forwarding ALPN ([`crate::chat::forward::chat_alpn`]).
    pub chat_alpn: Vec<u8>,
    /// The file-copy ALPN ([`models::peer::files_alpn`]).
    pub files_alpn: Vec<u8>,
    /// Open chat connections by peer, reused across requests.
    pub connections: tokio::sync::Mutex<BTreeMap<mesh::NodeId, Connection>>,
    /// A test fault, off unless its environment variable is set
    /// ([`crate::late_removals`]).
    pub late_removals: Option<crate::late_removals::LateRemovals>,
}

impl models::Cluster for MeshContext {
    fn node_id(&self) -> String {
        self.mesh.id().to_string()
    }

    fn snapshot(&self) -> Snapshot {
        let Some(late) = &self.late_removals else {
            return self.mesh.read(snapshot_of);
        };
        let (mut snapshot, now_ms) = self
            .mesh
            .read(|replica, now_ms| (snapshot_of(replica, now_ms), now_ms));
        late.apply(&mut snapshot, now_ms);
        snapshot
    }

    fn write(&self, key: &str, value: &serde_json::Value) -> Result<(), String> {
        self.mesh.set(key, value).map_err(|e| format!("{e:#}"))
    }

    fn remove(&self, key: &str) -> bool {
        self.mesh.delete(key)
    }

    fn open_files(&self, node: String) -> BoxFuture<'_, Result<Connection, String>> {
        Box::pin(async move {
            let peer: mesh::NodeId = node
                .parse()
                .map_err(|e| format!("bad node id {node}: {e}"))?;
            self.mesh
                .connect(peer, &self.files_alpn)
                .await
                .map_err(|e| format!("{e:#}"))
        })
    }
}

impl NodeContext for MeshContext {
    /// The replicated state (identical on every node, see its `digest`) and this node's view
    /// of liveness.
    fn state_json(&self) -> serde_json::Value {
        self.mesh.state_json()
    }

    fn generation(&self) -> u64 {
        self.mesh.read(|replica, _| replica.generation())
    }

    fn subscribe(&self) -> Option<tokio::sync::broadcast::Receiver<Event>> {
        Some(self.mesh.subscribe())
    }

    /// The open connection to `node` on the chat ALPN, else a new one.
    fn open_chat(&self, node: String) -> BoxFuture<'_, Result<Connection, String>> {
        Box::pin(async move {
            let peer: mesh::NodeId = node
                .parse()
                .map_err(|e| format!("bad node id {node}: {e}"))?;
            let mut cache = self.connections.lock().await;
            if let Some(c) = cache.get(&peer) {
                if c.close_reason().is_none() {
                    return Ok(c.clone());
                }
            }
            let connection = self
                .mesh
                .connect(peer, &self.chat_alpn)
                .await
                .map_err(|e| format!("{e:#}"))?;
            cache.insert(peer, connection.clone());
            Ok(connection)
        })
    }

    fn is_dead(&self, node: &str) -> bool {
        match node.parse::<mesh::NodeId>() {
            Ok(peer) => self.mesh.read(|replica, _| replica.is_dead(&peer)),
            Err(_) => false,
        }
    }
}

/// Reads a snapshot out of a mesh replica at `now_ms` (its clock).
pub fn snapshot_of(replica: &mesh::Replica, now_ms: u64) -> Snapshot {
    let authors = replica
        .state()
        .nodes
        .iter()
        .map(|(id, state)| {
            let records = state
                .values()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            (
                id.to_string(),
                Author {
                    alive: replica.is_alive(id),
                    dead: replica.is_dead(id),
                    records,
                },
            )
        })
        .collect();
    Snapshot {
        me: replica.id().to_string(),
        authors,
        settling: control::settling(replica.last_return_ms(), now_ms),
    }
}
