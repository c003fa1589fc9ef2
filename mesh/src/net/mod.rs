//! The iroh driver: one [`Mesh`] per node process. It binds an iroh endpoint with relays, n0
//! DNS/pkarr and the port mapper off, announces itself by mDNS on every interface, joins the
//! namespace's gossip topic (fresh changes) and runs anti-entropy on [`sync_alpn`], feeding a
//! [`Replica`] that holds the state. All protocol decisions are the replica's (`proto`); this
//! folder only moves bytes and keeps time.

pub mod admission;
mod authority;
pub mod discovery;
mod driver;
mod endpoint;
mod gossip;
mod handshake;
pub mod identity;
mod namespace;
mod options;
mod peers;
pub mod release;
pub mod sync;

pub use gossip::GOSSIP_MAX_MESSAGE;
pub use namespace::{namespaced_alpn, topic_of};
pub use options::{MeshOptions, StaticPeer, DEFAULT_MESH_PORT};
pub use sync::{sync_alpn, SYNC_ALPN};

use crate::proto::id::NodeId;
use crate::proto::replica::{Event, Replica};
use crate::proto::view::state_view;
use admission::{Admission, AuthHandler, Gated};
use anyhow::Context;
use authority::IrohAuthority;
use driver::Inner;
use endpoint::{ChannelHandler, Handler};
use iroh::address_lookup::MemoryLookup;
use iroh::endpoint::Connection;
use iroh::protocol::Router;
use iroh::{EndpointAddr, PublicKey};
use iroh_gossip::Gossip;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::broadcast;

/// A running mesh node.
pub struct Mesh {
    inner: Arc<Inner>,
    id: NodeId,
    router: Router,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    _discovery: Option<discovery::Discovery>,
}

impl std::fmt::Debug for Mesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mesh").field("id", &self.id).finish()
    }
}

impl Mesh {
    /// Loads the identity, binds the endpoint and starts discovery, gossip and anti-entropy.
    pub async fn start(options: MeshOptions) -> anyhow::Result<Mesh> {
        let key = identity::load_or_create_key(&options.data_dir)?;
        let scoped = options.scoped_namespace();
        let admission = Admission::new(
            options.cluster_secret.clone(),
            &options.namespace,
            options.release.clone(),
        );
        let generation = identity::next_generation(&options.data_dir)?;
        let id = NodeId::from_bytes(*key.public().as_bytes());
        let lookup = MemoryLookup::new();
        let endpoint = endpoint::bind(key.clone(), lookup.clone(), options.port).await?;
        let port = endpoint::bound_port(&endpoint, options.port);
        let gossip = Gossip::builder()
            .max_message_size(GOSSIP_MAX_MESSAGE)
            .spawn(endpoint.clone());
        let topic = gossip
            .subscribe(topic_of(&scoped), Vec::new())
            .await
            .context("cannot join the gossip topic")?;
        let (sender, receiver) = topic.split();
        let seed = u64::from_le_bytes(key.public().as_bytes()[..8].try_into().unwrap_or([0; 8]))
            ^ generation;
        let replica = Replica::new(
            id,
            generation,
            options.config,
            Arc::new(IrohAuthority { key }),
            seed,
        );
        let (events, _) = broadcast::channel(256);
        let inner = Arc::new(Inner {
            replica: Mutex::new(replica),
            started: Instant::now(),
            endpoint: endpoint.clone(),
            lookup,
            gossip: sender,
            connections: tokio::sync::Mutex::new(BTreeMap::new()),
            events,
            alpn: sync_alpn(&scoped),
            admission: admission.clone(),
        });
        let gate = |handler| Gated {
            handler,
            admission: admission.clone(),
            endpoint: endpoint.clone(),
        };
        let mut router = Router::builder(endpoint.clone())
            .accept(
                admission.alpn(),
                AuthHandler {
                    admission: admission.clone(),
                },
            )
            .accept(iroh_gossip::ALPN, gate(Handler::Gossip(gossip.clone())))
            .accept(
                sync_alpn(&scoped),
                gate(Handler::Sync(sync::SyncHandler {
                    inner: inner.clone(),
                })),
            );
        for (alpn, connections) in &options.extra_protocols {
            router = router.accept(
                alpn,
                gate(Handler::Channel(ChannelHandler {
                    connections: connections.clone(),
                })),
            );
        }
        let router = router.spawn();
        tracing::info!(node_id = %id, generation, port, namespace = %options.namespace, "mesh endpoint bound (relays off, LAN only)");
        match &options.cluster_secret {
            Some(secret) => tracing::info!(
                tag = %secret.tag(),
                "cluster secret set: only nodes started with the same secret are seen or served"
            ),
            None => tracing::warn!(
                "no cluster secret: any node on this LAN that uses namespace {:?} can join \
                 this cluster (`shoal secret` makes one; see the README)",
                options.namespace
            ),
        }

        let (discovery, found) = match discovery::start(&scoped, id, port) {
            Ok(started) => (Some(started.0), started.1),
            Err(e) => {
                tracing::warn!(
                    "mDNS discovery is off ({e:#}); only --peer addresses will be dialed"
                );
                (None, tokio::sync::mpsc::unbounded_channel().1)
            }
        };
        let tasks = vec![
            tokio::spawn(gossip::rounds(inner.clone())),
            tokio::spawn(gossip::receive(inner.clone(), receiver)),
            tokio::spawn(peers::join(inner.clone(), id, options.peers.clone(), found)),
        ];
        Ok(Mesh {
            inner,
            id,
            router,
            tasks,
            _discovery: discovery,
        })
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The mesh endpoint's bound addresses.
    pub fn bound_sockets(&self) -> Vec<SocketAddr> {
        self.inner.endpoint.bound_sockets()
    }

    /// Opens a connection to `peer` on `alpn` (one of the peer's extra protocols), at the
    /// addresses discovery or `--peer` gave for it.
    pub async fn connect(&self, peer: NodeId, alpn: &[u8]) -> anyhow::Result<Connection> {
        let key = PublicKey::from_bytes(peer.as_bytes()).context("peer id is not a key")?;
        self.inner
            .admission
            .ensure(&self.inner.endpoint, key)
            .await?;
        self.inner
            .endpoint
            .connect(EndpointAddr::new(key), alpn)
            .await
            .with_context(|| format!("cannot connect to {}", peer.short()))
    }

    /// Writes this node's record `key` as JSON.
    pub fn set<T: serde::Serialize>(&self, key: &str, value: &T) -> anyhow::Result<()> {
        let json = serde_json::to_string(value)?;
        let now = self.inner.now_ms();
        self.inner.with_replica(|r| r.set(key, &json, now))?;
        Ok(())
    }

    /// Deletes this node's record `key`. True if it existed.
    pub fn delete(&self, key: &str) -> bool {
        let now = self.inner.now_ms();
        self.inner.with_replica(|r| r.delete(key, now))
    }

    /// Keys of this node's own live records that start with `prefix`.
    pub fn own_keys(&self, prefix: &str) -> BTreeSet<String> {
        self.inner.with_replica(|r| {
            r.state().nodes[&r.id()]
                .values()
                .filter(|(k, _)| k.starts_with(prefix))
                .map(|(k, _)| k.to_string())
                .collect()
        })
    }

    /// Runs `f` over the replica (read-only), for views such as `/state`.
    pub fn read<T>(&self, f: impl FnOnce(&Replica, u64) -> T) -> T {
        let now = self.inner.now_ms();
        self.inner.with_replica(|r| f(r, now))
    }

    /// The whole state as JSON for `GET /state`: every author's records (key order, so two
    /// converged nodes print the same bytes), a digest of them, and this node's view of
    /// liveness (which is local and not part of the digest).
    pub fn state_json(&self) -> serde_json::Value {
        self.read(state_view)
    }

    /// Liveness and duplicate-id events as they happen.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.inner.events.subscribe()
    }

    /// Stops every task and closes the endpoint (telling connected peers, so they see this
    /// node leave at once and iroh does not report an endpoint dropped unclosed).
    pub async fn shutdown(&self) {
        for task in &self.tasks {
            task.abort();
        }
        let _ = self.router.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_get_their_own_sync_alpn() {
        assert_ne!(sync_alpn("shoal"), sync_alpn("lab"));
        assert!(sync_alpn("shoal").starts_with(SYNC_ALPN));
        assert_eq!(sync_alpn("shoal"), sync_alpn("shoal"));
    }
}
