//! What a node is told at start: its data directory, namespace, static peers, port, protocol
//! tuning and the binary's own protocols on the mesh endpoint.

use crate::proto::id::NodeId;
use crate::proto::replica::Config;
use iroh::endpoint::Connection;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

/// Default UDP port of the mesh endpoint (the HTTP API is 52415).
pub const DEFAULT_MESH_PORT: u16 = 52416;

/// A peer given by the user as `NODE_ID@IP:PORT`, for networks that block multicast.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticPeer {
    /// The peer's node id (64 hex digits, as `GET /node_id` prints it).
    pub id: NodeId,
    /// Its mesh endpoint address.
    pub addr: SocketAddr,
}

impl FromStr for StaticPeer {
    type Err = String;

    fn from_str(s: &str) -> Result<StaticPeer, String> {
        let (id, addr) = s
            .trim()
            .split_once('@')
            .ok_or_else(|| format!("peer {s:?} must look like NODE_ID@IP:PORT"))?;
        let id = id
            .parse::<NodeId>()
            .map_err(|e| format!("peer {s:?}: {e}"))?;
        let addr = addr
            .parse::<SocketAddr>()
            .map_err(|e| format!("peer {s:?}: address {addr:?}: {e} (expected IP:PORT)"))?;
        Ok(StaticPeer { id, addr })
    }
}

/// What a node needs to join its cluster.
#[derive(Debug, Clone)]
pub struct MeshOptions {
    /// Where the identity key and generation are kept.
    pub data_dir: PathBuf,
    /// Cluster namespace: only nodes with the same one see each other.
    pub namespace: String,
    /// Peers to dial in addition to mDNS.
    pub peers: Vec<StaticPeer>,
    /// UDP port of the endpoint (0: any).
    pub port: u16,
    /// Protocol tuning.
    pub config: Config,
    /// The binary's own protocols on this endpoint: each incoming connection on one of these
    /// ALPNs (see [`super::namespaced_alpn`]) is handed to its channel, which holds it open.
    pub extra_protocols: Vec<(Vec<u8>, tokio::sync::mpsc::Sender<Connection>)>,
    /// The cluster secret every other node must prove before any state passes (`None`: the
    /// cluster is open to its namespace). See [`super::admission`].
    pub cluster_secret: Option<super::admission::ClusterSecret>,
    /// This node's release, said to every node before anything else: one of another protocol
    /// is refused ([`super::release`]).
    pub release: super::release::Release,
}

impl MeshOptions {
    /// The namespace as topic, ALPNs and mDNS use it (with the secret's tag, if any); the
    /// binary scopes its own protocols' ALPNs by it too.
    pub fn scoped_namespace(&self) -> String {
        super::admission::scoped_namespace(&self.namespace, self.cluster_secret.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_peers_parse() {
        let id = NodeId::from_index(5);
        let p: StaticPeer = format!("{id}@10.0.0.2:4455").parse().unwrap();
        assert_eq!(p.id, id);
        assert_eq!(p.addr, "10.0.0.2:4455".parse().unwrap());
        assert!("nope".parse::<StaticPeer>().is_err());
        assert!(format!("{id}@10.0.0.2").parse::<StaticPeer>().is_err());
        assert!("abc@10.0.0.2:1".parse::<StaticPeer>().is_err());
    }
}
