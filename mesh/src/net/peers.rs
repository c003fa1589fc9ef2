//! Joining peers: every node mDNS finds and every `--peer` (retried every 5 s) is taught to
//! the endpoint, added to the replica's sync peers and joined on the gossip topic, again when
//! it was considered gone.

use super::discovery::Found;
use super::driver::Inner;
use super::options::StaticPeer;
use crate::proto::id::NodeId;
use iroh::PublicKey;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedReceiver;

/// Joins found and static peers until the driver stops.
pub(crate) async fn join(
    inner: Arc<Inner>,
    me: NodeId,
    statics: Vec<StaticPeer>,
    mut found: UnboundedReceiver<Found>,
) {
    let mut joined: BTreeMap<NodeId, Instant> = BTreeMap::new();
    // Peers whose refusal was already logged as a warning (later retries log at debug), so a
    // `--peer` with the wrong secret says why once instead of every 5 s.
    let warned: Arc<std::sync::Mutex<BTreeSet<NodeId>>> = Arc::default();
    let mut retry = tokio::time::interval(Duration::from_secs(5));
    loop {
        let batch: Vec<(NodeId, Vec<SocketAddr>)> = tokio::select! {
            Some(f) = found.recv() => vec![(f.id, f.addrs)],
            _ = retry.tick() => statics.iter().map(|p| (p.id, vec![p.addr])).collect(),
        };
        for (peer, addrs) in batch {
            if peer == me {
                continue;
            }
            inner.learn_addrs(peer, &addrs);
            let alive = inner.with_replica(|r| {
                r.add_peer(peer);
                r.state().nodes.contains_key(&peer) && r.is_alive(&peer)
            });
            // Join (again) a peer that is new, or that we consider gone.
            let stale = joined
                .get(&peer)
                .is_none_or(|t| !alive && t.elapsed() > Duration::from_secs(5));
            if stale {
                joined.insert(peer, Instant::now());
                if let Ok(key) = PublicKey::from_bytes(peer.as_bytes()) {
                    tracing::debug!(peer = %peer.short(), ?addrs, "joining peer");
                    // The handshake may take a while (or fail): never hold up the others.
                    let inner = inner.clone();
                    let warned = warned.clone();
                    tokio::spawn(async move {
                        match inner.admission.ensure(&inner.endpoint, key).await {
                            Ok(()) => {
                                warned
                                    .lock()
                                    .unwrap_or_else(|e| e.into_inner())
                                    .remove(&peer);
                                let _ = inner.gossip.join_peers(vec![key]).await;
                            }
                            Err(e) => {
                                let first = warned
                                    .lock()
                                    .unwrap_or_else(|e| e.into_inner())
                                    .insert(peer);
                                if first {
                                    tracing::warn!(peer = %peer.short(), "not joined: {e:#}");
                                } else {
                                    tracing::debug!(peer = %peer.short(), "not joined: {e:#}");
                                }
                            }
                        }
                    });
                }
            }
        }
    }
}
