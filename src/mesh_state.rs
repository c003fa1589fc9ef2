//! The node's adapter over the mesh: [`MeshContext`] (the node's id, state, record writes and
//! connections to other nodes, as [`NodeContext`]), a [`Snapshot`] read out of the mesh
//! replica, and the live nodes' mesh profiles and verified edges as placement takes them.
//! Everything that decides lives in the `control` crate; this file only translates.

use crate::context::NodeContext;
use control::{Author, Snapshot};
use gateway::BoxFuture;
use iroh::endpoint::Connection;
use mesh::probe::{EdgeRecord, EDGE_PREFIX};
use mesh::profile::{HostProfile, PROFILE_KEY};
use mesh::{Event, Mesh};
use placement::Edge;
use std::collections::{BTreeMap, BTreeSet};
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
}

impl models::Cluster for MeshContext {
    fn node_id(&self) -> String {
        self.mesh.id().to_string()
    }

    fn snapshot(&self) -> Snapshot {
        self.mesh.read(snapshot_of)
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

/// The live nodes' profiles and the edges between them, as placement takes them.
pub fn placement_nodes(snapshot: &Snapshot) -> (Vec<placement::NodeProfile>, Vec<Edge>) {
    let live: BTreeSet<&str> = snapshot
        .authors
        .iter()
        .filter(|(id, a)| a.alive || **id == snapshot.me)
        .map(|(id, _)| id.as_str())
        .collect();
    let mut nodes = Vec::new();
    let mut edges = Vec::new();
    for (id, author) in &snapshot.authors {
        if !live.contains(id.as_str()) {
            continue;
        }
        let Some(profile) = author
            .records
            .get(PROFILE_KEY)
            .and_then(|p| serde_json::from_str::<HostProfile>(p).ok())
        else {
            continue;
        };
        nodes.push(profile.placement_profile(id));
        for edge in author
            .records
            .range(EDGE_PREFIX.to_string()..)
            .take_while(|(k, _)| k.starts_with(EDGE_PREFIX))
            .filter_map(|(_, v)| {
                serde_json::from_str::<EdgeRecord>(v)
                    .ok()?
                    .placement_edge(id)
            })
        {
            if live.contains(edge.to.as_str()) {
                edges.push(edge);
            }
        }
    }
    (nodes, edges)
}

#[cfg(test)]
mod tests {
    use super::*;
    use control::fixture::{author, json};
    use mesh::interfaces::Interface;
    use placement::{ComputeBackend, InterfaceKind, Link};

    #[test]
    fn placement_input_comes_from_live_profiles_and_edges() {
        let profile = |ip: &str| HostProfile {
            name: "h".into(),
            os: "linux".into(),
            os_version: "6".into(),
            cpu: "x".into(),
            cpu_cores: 2,
            memory_total: 8 << 30,
            memory_available: 4 << 30,
            backends: vec![ComputeBackend::MlxCpu],
            gpus: vec![],
            interfaces: vec![Interface::new(
                "eth0",
                ip.parse().unwrap(),
                24,
                InterfaceKind::Ethernet,
            )],
            api_port: 52415,
        };
        let edge = |from: &str, to: &str, ip: &str| EdgeRecord {
            edge: Edge {
                from: from.into(),
                to: to.into(),
                link: Link::Ip(ip.parse().unwrap()),
            },
            remote_interface: "eth0".into(),
            remote_kind: InterfaceKind::Ethernet,
            local_interface: Some("eth0".into()),
            local_kind: Some(InterfaceKind::Ethernet),
        };
        let snap = Snapshot {
            settling: false,
            me: "a".into(),
            authors: [
                (
                    "a".to_string(),
                    author(
                        true,
                        &[
                            (PROFILE_KEY.into(), json(&profile("10.0.0.1"))),
                            ("edge/b/10.0.0.2".into(), json(&edge("a", "b", "10.0.0.2"))),
                            ("edge/c/10.0.0.3".into(), json(&edge("a", "c", "10.0.0.3"))),
                        ],
                    ),
                ),
                (
                    "b".to_string(),
                    author(
                        true,
                        &[
                            (PROFILE_KEY.into(), json(&profile("10.0.0.2"))),
                            ("edge/a/10.0.0.1".into(), json(&edge("b", "a", "10.0.0.1"))),
                        ],
                    ),
                ),
                (
                    "c".to_string(),
                    author(false, &[(PROFILE_KEY.into(), json(&profile("10.0.0.3")))]),
                ),
            ]
            .into(),
        };
        let (nodes, edges) = placement_nodes(&snap);
        let ids: Vec<&str> = nodes.iter().map(|n| n.id.as_str()).collect();
        assert_eq!(ids, ["a", "b"], "dead node c is left out");
        assert_eq!(nodes[0].ram_available, 4 << 30);
        assert_eq!(nodes[0].backends, vec![ComputeBackend::MlxCpu]);
        assert_eq!(
            edges,
            vec![
                Edge {
                    from: "a".into(),
                    to: "b".into(),
                    link: Link::Ip("10.0.0.2".parse().unwrap())
                },
                Edge {
                    from: "b".into(),
                    to: "a".into(),
                    link: Link::Ip("10.0.0.1".parse().unwrap())
                },
            ]
        );
    }
}
