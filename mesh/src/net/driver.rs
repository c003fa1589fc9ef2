//! What the driver's tasks share: the replica behind a lock, the endpoint, the gossip sender
//! and the cached sync connections. Every call into the replica goes through
//! [`Inner::with_replica`], which publishes the events it produced.

use crate::proto::id::NodeId;
use crate::proto::replica::{Event, Replica};
use anyhow::Context;
use iroh::address_lookup::MemoryLookup;
use iroh::endpoint::Connection;
use iroh::{Endpoint, EndpointAddr, PublicKey};
use iroh_gossip::api::GossipSender;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Instant;
use tokio::sync::broadcast;

/// Shared by the driver's tasks.
pub(crate) struct Inner {
    pub(crate) replica: Mutex<Replica>,
    pub(crate) started: Instant,
    pub(crate) endpoint: Endpoint,
    pub(crate) lookup: MemoryLookup,
    pub(crate) gossip: GossipSender,
    pub(crate) connections: tokio::sync::Mutex<BTreeMap<NodeId, Connection>>,
    pub(crate) events: broadcast::Sender<Event>,
    pub(crate) alpn: Vec<u8>,
    pub(crate) admission: std::sync::Arc<super::admission::Admission>,
}

impl Inner {
    /// Milliseconds since the driver started: the replica's clock.
    pub(crate) fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Runs `f` on the replica, then publishes the events it produced.
    pub(crate) fn with_replica<T>(&self, f: impl FnOnce(&mut Replica) -> T) -> T {
        let (result, events) = {
            let mut replica = self.replica.lock().unwrap_or_else(|e| e.into_inner());
            let result = f(&mut replica);
            (result, replica.drain_events())
        };
        for event in events {
            match &event {
                Event::Changed(_) => {}
                Event::DuplicateId { .. } => tracing::error!(?event, "duplicate node id"),
                other => tracing::info!(event = ?other, "mesh"),
            }
            let _ = self.events.send(event);
        }
        result
    }

    /// A sync connection to `peer`, cached while it stays open.
    pub(crate) async fn connection(&self, peer: NodeId) -> anyhow::Result<Connection> {
        let mut cache = self.connections.lock().await;
        if let Some(c) = cache.get(&peer) {
            if c.close_reason().is_none() {
                return Ok(c.clone());
            }
        }
        let key = PublicKey::from_bytes(peer.as_bytes()).context("peer id is not a key")?;
        self.admission.ensure(&self.endpoint, key).await?;
        let connection = self
            .endpoint
            .connect(EndpointAddr::new(key), &self.alpn)
            .await
            .with_context(|| format!("cannot connect to {}", peer.short()))?;
        cache.insert(peer, connection.clone());
        Ok(connection)
    }

    /// Tells the endpoint where `id` can be reached (from mDNS or `--peer`).
    pub(crate) fn learn_addrs(&self, id: NodeId, addrs: &[SocketAddr]) {
        if let Ok(key) = PublicKey::from_bytes(id.as_bytes()) {
            let mut addr = EndpointAddr::new(key);
            for a in addrs {
                addr = addr.with_ip_addr(*a);
            }
            self.lookup.add_endpoint_info(addr);
        }
    }
}
