//! The iroh driver: one [`Mesh`] per node process. It binds an iroh endpoint with relays, n0
//! DNS/pkarr and the port mapper off, announces itself by mDNS on every interface, joins the
//! namespace's gossip topic (fresh changes) and runs anti-entropy on [`sync_alpn`], feeding a
//! [`Replica`] that holds the state.

pub mod discovery;
pub mod identity;
pub mod sync;

pub use sync::{sync_alpn, SYNC_ALPN};

use crate::id::NodeId;
use crate::record::{Authority, Signature};
use crate::replica::{Config, Event, Replica};
use crate::transport::Outbox;
use anyhow::Context;
use iroh::address_lookup::MemoryLookup;
use iroh::endpoint::{presets, Connection};
use iroh::protocol::Router;
use iroh::{Endpoint, EndpointAddr, PublicKey, RelayMode, SecretKey};
use iroh_gossip::api::{Event as GossipEvent, GossipSender};
use iroh_gossip::{Gossip, TopicId};
use n0_future::StreamExt;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::broadcast;

/// Default UDP port of the mesh endpoint (the HTTP API is 52415).
pub const DEFAULT_MESH_PORT: u16 = 52416;

/// iroh-gossip's message size limit; every node must use the same.
pub const GOSSIP_MAX_MESSAGE: usize = 4096;

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
    /// ALPNs (see [`namespaced_alpn`]) is handed to its channel, which holds it open.
    pub extra_protocols: Vec<(Vec<u8>, tokio::sync::mpsc::Sender<Connection>)>,
}

/// An ALPN of `prefix` scoped by the cluster namespace, as the sync ALPN is: a node of
/// another namespace fails the handshake instead of talking to this cluster.
pub fn namespaced_alpn(prefix: &[u8], namespace: &str) -> Vec<u8> {
    let topic = topic_of(namespace);
    let mut alpn = prefix.to_vec();
    for byte in &topic.as_bytes()[..8] {
        alpn.extend(format!("{byte:02x}").as_bytes());
    }
    alpn
}

/// Hands connections on an extra ALPN to the binary (see [`MeshOptions::extra_protocols`]).
#[derive(Debug, Clone)]
struct ChannelHandler {
    connections: tokio::sync::mpsc::Sender<Connection>,
}

impl iroh::protocol::ProtocolHandler for ChannelHandler {
    async fn accept(&self, connection: Connection) -> Result<(), iroh::protocol::AcceptError> {
        if self.connections.send(connection.clone()).await.is_ok() {
            // The receiver serves it; the router keeps its task until the peer is done.
            connection.closed().await;
        }
        Ok(())
    }
}

/// Signs with the node's iroh secret key (ed25519) and checks other nodes' signatures with
/// their node id, which is their public key.
struct IrohAuthority {
    key: SecretKey,
}

impl Authority for IrohAuthority {
    fn sign(&self, message: &[u8]) -> Signature {
        self.key.sign(message).to_bytes().to_vec()
    }

    fn verify(&self, author: &NodeId, message: &[u8], signature: &[u8]) -> bool {
        let Ok(key) = PublicKey::from_bytes(author.as_bytes()) else {
            return false;
        };
        let Ok(bytes) = <[u8; 64]>::try_from(signature) else {
            return false;
        };
        key.verify(message, &iroh::Signature::from_bytes(&bytes))
            .is_ok()
    }
}

/// Shared by the driver's tasks.
pub(crate) struct Inner {
    replica: Mutex<Replica>,
    started: Instant,
    endpoint: Endpoint,
    lookup: MemoryLookup,
    gossip: GossipSender,
    connections: tokio::sync::Mutex<BTreeMap<NodeId, Connection>>,
    events: broadcast::Sender<Event>,
    alpn: Vec<u8>,
}

impl Inner {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Runs `f` on the replica, then publishes the events it produced.
    fn with_replica<T>(&self, f: impl FnOnce(&mut Replica) -> T) -> T {
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

    async fn connection(&self, peer: NodeId) -> anyhow::Result<Connection> {
        let mut cache = self.connections.lock().await;
        if let Some(c) = cache.get(&peer) {
            if c.close_reason().is_none() {
                return Ok(c.clone());
            }
        }
        let key = PublicKey::from_bytes(peer.as_bytes()).context("peer id is not a key")?;
        let connection = self
            .endpoint
            .connect(EndpointAddr::new(key), &self.alpn)
            .await
            .with_context(|| format!("cannot connect to {}", peer.short()))?;
        cache.insert(peer, connection.clone());
        Ok(connection)
    }

    fn learn_addrs(&self, id: NodeId, addrs: &[SocketAddr]) {
        if let Ok(key) = PublicKey::from_bytes(id.as_bytes()) {
            let mut addr = EndpointAddr::new(key);
            for a in addrs {
                addr = addr.with_ip_addr(*a);
            }
            self.lookup.add_endpoint_info(addr);
        }
    }
}

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

/// See [`Mesh::state_json`].
pub fn state_view(replica: &Replica, now_ms: u64) -> serde_json::Value {
    let nodes = replica.state().to_json();
    let text = nodes.to_string();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.as_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    let liveness: serde_json::Map<String, serde_json::Value> = replica
        .state()
        .nodes
        .keys()
        .map(|id| {
            let alive = replica.is_alive(id);
            let phi = replica.phi(id, now_ms).map(|p| (p * 100.0).round() / 100.0);
            (
                id.to_string(),
                serde_json::json!({ "alive": alive, "phi": phi }),
            )
        })
        .collect();
    serde_json::json!({
        "node_id": replica.id().to_string(),
        "digest": format!("{hash:016x}"),
        "nodes": nodes,
        "liveness": liveness,
        "stats": replica.stats(),
    })
}

/// The gossip topic of a namespace.
pub fn topic_of(namespace: &str) -> TopicId {
    let mut bytes = [0u8; 32];
    for (i, chunk) in bytes.chunks_mut(8).enumerate() {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325 ^ (i as u64);
        for byte in b"shoal-topic/".iter().chain(namespace.as_bytes()) {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        chunk.copy_from_slice(&hash.to_le_bytes());
    }
    TopicId::from_bytes(bytes)
}

impl Mesh {
    /// Loads the identity, binds the endpoint and starts discovery, gossip and anti-entropy.
    pub async fn start(options: MeshOptions) -> anyhow::Result<Mesh> {
        let key = identity::load_or_create_key(&options.data_dir)?;
        let generation = identity::next_generation(&options.data_dir)?;
        let id = NodeId::from_bytes(*key.public().as_bytes());
        let lookup = MemoryLookup::new();
        let endpoint = Endpoint::builder(presets::Minimal)
            .secret_key(key.clone())
            .relay_mode(RelayMode::Disabled)
            .clear_address_lookup()
            .address_lookup(lookup.clone())
            .clear_ip_transports()
            .bind_addr(SocketAddr::from(([0, 0, 0, 0], options.port)))
            .context("invalid mesh bind address")?
            .bind()
            .await
            .with_context(|| {
                format!(
                    "cannot bind the mesh endpoint on UDP port {}; is another shoal running?",
                    options.port
                )
            })?;
        let port = endpoint
            .bound_sockets()
            .iter()
            .find(|a| a.is_ipv4())
            .map_or(options.port, SocketAddr::port);
        let gossip = Gossip::builder()
            .max_message_size(GOSSIP_MAX_MESSAGE)
            .spawn(endpoint.clone());
        let topic = gossip
            .subscribe(topic_of(&options.namespace), Vec::new())
            .await
            .context("cannot join the gossip topic")?;
        let (sender, mut receiver) = topic.split();
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
            alpn: sync_alpn(&options.namespace),
        });
        let mut router = Router::builder(endpoint.clone())
            .accept(iroh_gossip::ALPN, gossip.clone())
            .accept(
                sync_alpn(&options.namespace),
                sync::SyncHandler {
                    inner: inner.clone(),
                },
            );
        for (alpn, connections) in &options.extra_protocols {
            router = router.accept(
                alpn,
                ChannelHandler {
                    connections: connections.clone(),
                },
            );
        }
        let router = router.spawn();
        tracing::info!(node_id = %id, generation, port, namespace = %options.namespace, "mesh endpoint bound (relays off, LAN only)");

        let mut tasks = Vec::new();
        // Protocol rounds.
        tasks.push(tokio::spawn({
            let inner = inner.clone();
            async move {
                let period =
                    Duration::from_millis(inner.with_replica(|r| r.config().gossip_interval_ms));
                let mut ticker = tokio::time::interval(period);
                ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    ticker.tick().await;
                    let now = inner.now_ms();
                    let mut out = Outbox::default();
                    inner.with_replica(|r| r.tick(now, &mut out));
                    for message in out.broadcasts {
                        if message.len() <= GOSSIP_MAX_MESSAGE {
                            let _ = inner.gossip.broadcast(message.into()).await;
                        }
                    }
                    for (peer, syn) in out.syncs {
                        tokio::spawn(sync::initiate(inner.clone(), peer, syn));
                    }
                }
            }
        }));
        // Gossip events.
        tasks.push(tokio::spawn({
            let inner = inner.clone();
            async move {
                while let Some(event) = receiver.next().await {
                    match event {
                        Ok(GossipEvent::Received(message)) => {
                            let now = inner.now_ms();
                            if let Err(e) =
                                inner.with_replica(|r| r.on_broadcast(&message.content, now))
                            {
                                tracing::debug!("dropped a gossip message: {e}");
                            }
                        }
                        Ok(GossipEvent::NeighborUp(peer)) => {
                            let peer = NodeId::from_bytes(*peer.as_bytes());
                            tracing::debug!(peer = %peer.short(), "gossip neighbour up: syncing");
                            let syn = inner.with_replica(|r| {
                                r.add_peer(peer);
                                r.syn()
                            });
                            tokio::spawn(sync::initiate(inner.clone(), peer, syn));
                        }
                        Ok(GossipEvent::NeighborDown(_)) | Ok(GossipEvent::Lagged) => {}
                        Err(e) => {
                            tracing::warn!("gossip topic closed: {e}");
                            break;
                        }
                    }
                }
            }
        }));
        // Discovery and static peers.
        let (discovery, mut found) = match discovery::start(&options.namespace, id, port) {
            Ok(started) => (Some(started.0), started.1),
            Err(e) => {
                tracing::warn!(
                    "mDNS discovery is off ({e:#}); only --peer addresses will be dialed"
                );
                (None, tokio::sync::mpsc::unbounded_channel().1)
            }
        };
        tasks.push(tokio::spawn({
            let inner = inner.clone();
            let statics = options.peers.clone();
            async move {
                let mut joined: BTreeMap<NodeId, Instant> = BTreeMap::new();
                let mut retry = tokio::time::interval(Duration::from_secs(5));
                loop {
                    let batch: Vec<(NodeId, Vec<SocketAddr>)> = tokio::select! {
                        Some(f) = found.recv() => vec![(f.id, f.addrs)],
                        _ = retry.tick() => statics.iter().map(|p| (p.id, vec![p.addr])).collect(),
                    };
                    for (peer, addrs) in batch {
                        if peer == id {
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
                                let _ = inner.gossip.join_peers(vec![key]).await;
                            }
                        }
                    }
                }
            }
        }));
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

    /// Stops every task and closes the endpoint.
    pub async fn shutdown(self) {
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

    #[test]
    fn iroh_signatures_bind_records_to_their_author() {
        let a = SecretKey::generate();
        let b = SecretKey::generate();
        let auth = IrohAuthority { key: a.clone() };
        let id_a = NodeId::from_bytes(*a.public().as_bytes());
        let id_b = NodeId::from_bytes(*b.public().as_bytes());
        let sig = auth.sign(b"record");
        assert_eq!(sig.len(), 64);
        assert!(auth.verify(&id_a, b"record", &sig));
        assert!(!auth.verify(&id_b, b"record", &sig));
        assert!(!auth.verify(&id_a, b"other", &sig));
        assert!(!auth.verify(&id_a, b"record", &sig[..10]));
    }
}
