//! The cluster secret and the admission gate in front of every mesh protocol.
//!
//! Every two nodes first exchange their releases ([`super::handshake`]): a node whose protocol
//! differs is not admitted, and both sides log why, naming both releases (once per node).
//! With no secret a cluster is then open to its namespace (zero configuration).
//! With one, two nodes prove to each other that they hold it before any state passes: on the
//! [`auth_alpn`] each side sends a keyed hash (BLAKE3, keyed by the secret) of keying material
//! exported from this very QUIC connection's TLS session and of its role, so the proof is bound
//! to the connection, cannot be replayed on another or reflected back, and the secret itself
//! never travels. A node proven that way is *admitted*: gossip, anti-entropy and the binary's
//! own protocols (chat forwarding, model copies) accept connections only from admitted nodes,
//! and a node dials those protocols only to nodes it has admitted. A connection from a node
//! not yet admitted (gossip dials the peers its neighbours name) is answered by proving the
//! secret back to it first, so the gate needs no extra round trip in the common case and
//! refuses everyone who does not know the secret.
//!
//! **What a stranger can make the gate do.** Each handshake back costs this node a dial and up
//! to [`AUTH_TIMEOUT`], so they are bounded: a node whose proof failed is refused at once,
//! without a new handshake back, for [`REFUSAL_HOLD`] (it can still prove itself by opening
//! the handshake itself, which every member does before it dials a gated protocol), and at
//! most [`MAX_DIAL_BACKS`] handshakes back run at once: past that, new unknown nodes are
//! refused at once (fresh keys cost a stranger nothing, so only a global cap bounds them).
//!
//! The secret also scopes the namespace ([`scoped_namespace`]): the gossip topic, every ALPN
//! and the mDNS service name carry a hash of it, so nodes with different secrets do not even
//! find each other, and what mDNS announces is only that hash.

use super::handshake::Hello;
use super::release::Release;
use iroh::endpoint::Connection;
use iroh::protocol::{AcceptError, ProtocolHandler};
use iroh::{Endpoint, EndpointAddr, PublicKey};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// ALPN prefix of the admission handshake; [`auth_alpn`] appends the namespace (not scoped by
/// the secret, so a node with another secret reaches the handshake and is told why it fails).
pub const AUTH_ALPN: &[u8] = b"shoal/cluster-auth/2/";
/// File in the data directory that holds the secret when no flag or variable gives one.
pub const SECRET_FILE: &str = "cluster.secret";
/// How long one admission handshake may take.
pub const AUTH_TIMEOUT: Duration = Duration::from_secs(5);
/// Fewest characters a secret may have: shorter text is guessable offline from the mDNS tag.
pub const MIN_SECRET_CHARS: usize = 16;
/// Admitted nodes kept; past it the set is cleared and nodes prove themselves again.
const MAX_ADMITTED: usize = 4096;
/// How long a node whose proof failed is refused at the gate without a handshake back.
pub const REFUSAL_HOLD: Duration = Duration::from_secs(30);
/// Handshakes back to unknown nodes that may run at once; past it, they are refused at once.
pub const MAX_DIAL_BACKS: usize = 8;
/// Refused nodes remembered at most (then the memory is cleared and starts again).
const MAX_REFUSED: usize = 4096;
const EXPORT_LABEL: &[u8] = b"shoal cluster admission v1";
const REFUSED: u32 = 0x5301;

/// The reason a connection is closed with when the peer's secret proof is wrong: the other
/// side reads it to tell a secret mismatch from a peer that does not speak the handshake.
const WRONG_SECRET_REASON: &str = "wrong cluster secret";

/// A cluster secret: the key derived from the text users type (`shoal secret` makes one).
#[derive(Clone)]
pub struct ClusterSecret {
    key: [u8; 32],
}

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClusterSecret(tag {})", self.tag())
    }
}

impl ClusterSecret {
    /// The secret of `text` (surrounding white space ignored). Refuses text shorter than
    /// [`MIN_SECRET_CHARS`], since the mDNS tag would let anyone on the LAN guess it offline.
    pub fn from_text(text: &str) -> Result<ClusterSecret, String> {
        let text = text.trim();
        if text.chars().count() < MIN_SECRET_CHARS {
            return Err(format!(
                "a cluster secret needs at least {MIN_SECRET_CHARS} characters (it has {}); \
                 `shoal secret` makes a strong one",
                text.chars().count()
            ));
        }
        Ok(ClusterSecret {
            key: blake3::derive_key("shoal cluster secret v1", text.as_bytes()),
        })
    }

    /// A new random secret's text: 32 random bytes as 64 hex digits.
    pub fn generate_text() -> String {
        let bytes = iroh::SecretKey::generate().to_bytes();
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// A short public hash of the secret (16 hex digits), which scopes the namespace. It says
    /// which secret a node uses without revealing it.
    pub fn tag(&self) -> String {
        let tag = blake3::derive_key("shoal cluster tag v1", &self.key);
        tag[..8].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The proof for `role` on a connection whose exported keying material is `material`.
    fn proof(&self, role: &[u8], material: &[u8; 32]) -> blake3::Hash {
        let mut input = Vec::with_capacity(role.len() + material.len());
        input.extend_from_slice(role);
        input.extend_from_slice(material);
        blake3::keyed_hash(&self.key, &input)
    }
}

/// The namespace as the mesh uses it: the user's namespace, and with a secret its tag, so
/// topic, ALPNs and mDNS name differ between clusters that differ in either.
pub fn scoped_namespace(namespace: &str, secret: Option<&ClusterSecret>) -> String {
    match secret {
        None => namespace.to_string(),
        Some(secret) => format!("{namespace}#{}", secret.tag()),
    }
}

/// The admission ALPN of a namespace.
pub fn auth_alpn(namespace: &str) -> Vec<u8> {
    super::namespace::namespaced_alpn(AUTH_ALPN, namespace)
}

/// Who may use this node's mesh protocols.
#[derive(Debug)]
pub struct Admission {
    secret: Option<ClusterSecret>,
    /// What this node says first: its release, and whether a secret guards it.
    hello: Hello,
    /// Nodes refused for their release or for a secret on one side only, with why (each
    /// logged once).
    mismatched: Mutex<BTreeMap<PublicKey, String>>,
    alpn: Vec<u8>,
    admitted: Mutex<BTreeSet<PublicKey>>,
    /// Nodes whose handshake back failed, and when.
    refused: Mutex<BTreeMap<PublicKey, Instant>>,
    /// Permits for handshakes back ([`MAX_DIAL_BACKS`]).
    dial_backs: tokio::sync::Semaphore,
    /// Handshakes back started so far.
    dial_backs_started: AtomicU64,
}

/// Why the gate turned a connection away.
#[derive(Debug)]
pub(crate) enum GateRefusal {
    /// Its handshake back failed less than [`REFUSAL_HOLD`] ago.
    RecentlyRefused,
    /// [`MAX_DIAL_BACKS`] handshakes back are running.
    Busy,
    /// The handshake back failed now (the reason).
    Failed(anyhow::Error),
}

impl Admission {
    /// The gate of a node of `release` with `secret` (`None`: open) in `namespace`.
    pub fn new(secret: Option<ClusterSecret>, namespace: &str, release: Release) -> Arc<Admission> {
        Arc::new(Admission {
            hello: Hello {
                release,
                closed: secret.is_some(),
            },
            mismatched: Mutex::new(BTreeMap::new()),
            secret,
            alpn: auth_alpn(namespace),
            admitted: Mutex::new(BTreeSet::new()),
            refused: Mutex::new(BTreeMap::new()),
            dial_backs: tokio::sync::Semaphore::new(MAX_DIAL_BACKS),
            dial_backs_started: AtomicU64::new(0),
        })
    }

    /// Handshakes back the gate has started (each a dial out to an unknown node).
    pub fn dial_backs_started(&self) -> u64 {
        self.dial_backs_started.load(Ordering::Relaxed)
    }

    fn refused(&self) -> std::sync::MutexGuard<'_, BTreeMap<PublicKey, Instant>> {
        self.refused.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Lets a connection from `peer` through the gate: at once if it is admitted, else after a
    /// handshake back to it, within the bounds in the module docs.
    pub(crate) async fn admit_incoming(
        &self,
        endpoint: &Endpoint,
        peer: PublicKey,
    ) -> Result<(), GateRefusal> {
        if self.allows(&peer) {
            return Ok(());
        }
        let recently = self
            .refused()
            .get(&peer)
            .is_some_and(|at| at.elapsed() < REFUSAL_HOLD);
        if recently {
            return Err(GateRefusal::RecentlyRefused);
        }
        let Ok(_permit) = self.dial_backs.try_acquire() else {
            return Err(GateRefusal::Busy);
        };
        self.dial_backs_started.fetch_add(1, Ordering::Relaxed);
        match self.ensure(endpoint, peer).await {
            Ok(()) => {
                self.refused().remove(&peer);
                Ok(())
            }
            Err(e) => {
                let mut refused = self.refused();
                if refused.len() >= MAX_REFUSED {
                    refused.clear();
                }
                refused.insert(peer, Instant::now());
                Err(GateRefusal::Failed(e))
            }
        }
    }

    /// Whether a secret guards this node.
    pub fn is_closed(&self) -> bool {
        self.secret.is_some()
    }

    /// The ALPN of the handshake.
    pub fn alpn(&self) -> &[u8] {
        &self.alpn
    }

    /// Whether `peer` may talk to this node now: it has passed the handshake (its release
    /// speaks this node's protocol and, with a secret, it proved it).
    pub fn allows(&self, peer: &PublicKey) -> bool {
        self.lock().contains(peer)
    }

    /// This node's release.
    pub fn release(&self) -> &Release {
        &self.hello.release
    }

    /// Nodes refused for their release (or a secret on one side only), with why.
    pub fn refusals(&self) -> Vec<(PublicKey, String)> {
        let m = self.mismatched.lock().unwrap_or_else(|e| e.into_inner());
        m.iter().map(|(k, v)| (*k, v.clone())).collect()
    }

    /// Records why `peer` was refused, logging it the first time (both sides of a handshake
    /// do, so each operator sees the other node's release).
    fn note_refusal(&self, peer: PublicKey, why: &str) {
        let mut m = self.mismatched.lock().unwrap_or_else(|e| e.into_inner());
        if m.get(&peer).map(String::as_str) != Some(why) {
            tracing::error!(peer = %peer.fmt_short(), "{why}");
            if m.len() >= MAX_REFUSED {
                m.clear();
            }
            m.insert(peer, why.to_string());
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<PublicKey>> {
        self.admitted.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn admit(&self, peer: PublicKey) {
        let mut admitted = self.lock();
        if admitted.len() >= MAX_ADMITTED {
            admitted.clear();
        }
        admitted.insert(peer);
    }

    /// Makes sure `peer` is admitted: over a connection on the admission ALPN, both nodes
    /// say their release (refused when the protocols differ) and, with a secret, prove it to
    /// each other. Errors say why (another protocol, wrong secret, unreachable).
    pub async fn ensure(&self, endpoint: &Endpoint, peer: PublicKey) -> anyhow::Result<()> {
        if self.allows(&peer) {
            return Ok(());
        }
        let attempt = async {
            let connection = endpoint
                .connect(EndpointAddr::new(peer), &self.alpn)
                .await?;
            let material = exported(&connection)?;
            let (mut send, mut recv) = connection.open_bi().await?;
            self.hello.send(&mut send).await?;
            if let Some(secret) = &self.secret {
                send.write_all(secret.proof(b"initiator", &material).as_bytes())
                    .await?;
            }
            let theirs = match Hello::receive(&mut recv).await {
                Ok(hello) => hello,
                Err(e) => {
                    connection.close(REFUSED.into(), b"no handshake");
                    // The peer checked our proof first and closed the connection for it
                    // before its hello arrived: a secret mismatch, said as one.
                    if format!("{e:#}").contains(WRONG_SECRET_REASON) {
                        anyhow::bail!(
                            "node {} does not share this node's cluster secret (or refused \
                             ours); start every node with the same --cluster-secret",
                            peer.fmt_short()
                        );
                    }
                    anyhow::bail!(
                        "node {} did not answer the handshake ({e:#}); is it a shoal node of \
                         this release's protocol?",
                        peer.fmt_short()
                    );
                }
            };
            if let Some(why) = self.hello.refusal(&theirs, &peer.fmt_short().to_string()) {
                self.note_refusal(peer, &why);
                connection.close(REFUSED.into(), b"refused");
                anyhow::bail!(why);
            }
            if let Some(secret) = &self.secret {
                let mut answer = [0u8; 32];
                let read = recv.read_exact(&mut answer).await;
                if read.is_err()
                    || blake3::Hash::from_bytes(answer) != secret.proof(b"responder", &material)
                {
                    connection.close(REFUSED.into(), WRONG_SECRET_REASON.as_bytes());
                    anyhow::bail!(
                        "node {} does not share this node's cluster secret (or refused ours); \
                         start every node with the same --cluster-secret",
                        peer.fmt_short()
                    );
                }
            }
            let _ = send.finish();
            self.admit(peer);
            connection.close(0u32.into(), b"admitted");
            anyhow::Ok(())
        };
        match tokio::time::timeout(AUTH_TIMEOUT, attempt).await {
            Ok(result) => result,
            Err(_) => anyhow::bail!(
                "node {} did not finish the admission handshake within {AUTH_TIMEOUT:?}",
                peer.fmt_short()
            ),
        }
    }
}

fn exported(connection: &Connection) -> anyhow::Result<[u8; 32]> {
    let mut material = [0u8; 32];
    connection
        .export_keying_material(&mut material, EXPORT_LABEL, b"")
        .map_err(|e| anyhow::anyhow!("cannot export the connection's keying material: {e:?}"))?;
    Ok(material)
}

/// Answers admission handshakes: says this node's release, refuses (and logs) a node of
/// another protocol, then with a secret admits a node whose proof is right and proves the
/// secret back, refusing (and logging) one whose proof is wrong; without one admits it.
#[derive(Debug, Clone)]
pub(crate) struct AuthHandler {
    pub(crate) admission: Arc<Admission>,
}

/// How an answered handshake ended.
enum Answered {
    Admitted,
    /// Refused for its release or a secret on one side only (logged already).
    Mismatched,
}

impl ProtocolHandler for AuthHandler {
    async fn accept(&self, connection: Connection) -> Result<(), AcceptError> {
        let admission = &self.admission;
        let peer = connection.remote_id();
        let answer = async {
            let material = exported(&connection)?;
            let (mut send, mut recv) = connection.accept_bi().await?;
            let theirs = Hello::receive(&mut recv).await?;
            admission.hello.send(&mut send).await?;
            if let Some(why) = admission
                .hello
                .refusal(&theirs, &peer.fmt_short().to_string())
            {
                admission.note_refusal(peer, &why);
                // Let our hello reach the node, which closes once it has read it.
                let _ = send.finish();
                connection.closed().await;
                return anyhow::Ok(Answered::Mismatched);
            }
            if let Some(secret) = &admission.secret {
                let mut proof = [0u8; 32];
                recv.read_exact(&mut proof).await?;
                if blake3::Hash::from_bytes(proof) != secret.proof(b"initiator", &material) {
                    anyhow::bail!("wrong proof");
                }
                admission.admit(peer);
                send.write_all(secret.proof(b"responder", &material).as_bytes())
                    .await?;
            } else {
                admission.admit(peer);
            }
            send.finish()?;
            connection.closed().await;
            anyhow::Ok(Answered::Admitted)
        };
        match tokio::time::timeout(AUTH_TIMEOUT, answer).await {
            Ok(Ok(Answered::Admitted)) => {}
            Ok(Ok(Answered::Mismatched)) => {
                connection.close(REFUSED.into(), b"refused: another protocol or secret")
            }
            Ok(Err(e)) if admission.secret.is_some() => {
                tracing::warn!(
                    peer = %peer.fmt_short(),
                    "refused a node that does not know this cluster's secret ({e:#}); if it \
                     is yours, start it with the same --cluster-secret"
                );
                connection.close(REFUSED.into(), WRONG_SECRET_REASON.as_bytes());
            }
            Ok(Err(e)) => {
                tracing::warn!(
                    peer = %peer.fmt_short(),
                    "refused a node whose admission handshake failed ({e:#}); is it a shoal \
                     node of this release's protocol?"
                );
                connection.close(REFUSED.into(), b"admission handshake failed");
            }
            Err(_) => connection.close(REFUSED.into(), b"admission handshake timed out"),
        }
        Ok(())
    }
}

/// A protocol handler behind the admission gate: connections from nodes that are not admitted
/// are first asked to prove the secret (by proving ours to them), and closed if they cannot.
#[derive(Debug)]
pub(crate) struct Gated<H> {
    pub(crate) handler: H,
    pub(crate) admission: Arc<Admission>,
    pub(crate) endpoint: Endpoint,
}

impl<H: ProtocolHandler> ProtocolHandler for Gated<H> {
    async fn accept(&self, connection: Connection) -> Result<(), AcceptError> {
        let peer = connection.remote_id();
        match self.admission.admit_incoming(&self.endpoint, peer).await {
            Ok(()) => self.handler.accept(connection).await,
            Err(refusal) => {
                match refusal {
                    GateRefusal::Failed(e) => {
                        tracing::warn!(peer = %peer.fmt_short(), "refused a connection: {e:#}")
                    }
                    other => {
                        tracing::debug!(peer = %peer.fmt_short(), "refused a connection at once: {other:?}")
                    }
                }
                connection.close(REFUSED.into(), b"not admitted");
                Ok(())
            }
        }
    }

    async fn shutdown(&self) {
        self.handler.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_scope_the_namespace_and_short_ones_are_refused() {
        let a = ClusterSecret::from_text("correct horse battery staple").unwrap();
        let same = ClusterSecret::from_text("  correct horse battery staple\n").unwrap();
        let b = ClusterSecret::from_text("another secret of some length").unwrap();
        assert_eq!(a.tag(), same.tag());
        assert_ne!(a.tag(), b.tag());
        assert_eq!(a.tag().len(), 16);
        assert_eq!(scoped_namespace("lab", None), "lab");
        assert_eq!(
            scoped_namespace("lab", Some(&a)),
            format!("lab#{}", a.tag())
        );
        let err = ClusterSecret::from_text("short").unwrap_err();
        assert!(err.contains("16 characters"), "{err}");
        assert!(!format!("{a:?}").contains("horse"));
        let generated = ClusterSecret::generate_text();
        assert_eq!(generated.len(), 64);
        assert_ne!(generated, ClusterSecret::generate_text());
    }

    const ALPN: &[u8] = b"shoal/test-gated/1";

    /// An endpoint on loopback only (no discovery: nothing is announced), with the admission
    /// handshake and one gated protocol whose accepted connections arrive on the channel.
    async fn node(secret: Option<&str>, lookup: &iroh::address_lookup::MemoryLookup) -> TestNode {
        node_of(secret, Release::of_mesh(), lookup).await
    }

    type TestNode = (
        Endpoint,
        iroh::protocol::Router,
        Arc<Admission>,
        tokio::sync::mpsc::Receiver<Connection>,
    );

    /// As [`node`], of another release.
    async fn node_of(
        secret: Option<&str>,
        release: Release,
        lookup: &iroh::address_lookup::MemoryLookup,
    ) -> TestNode {
        let endpoint = Endpoint::builder(iroh::endpoint::presets::Minimal)
            .relay_mode(iroh::RelayMode::Disabled)
            .clear_address_lookup()
            .address_lookup(lookup.clone())
            .clear_ip_transports()
            .bind_addr(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
            .unwrap()
            .bind()
            .await
            .unwrap();
        lookup.add_endpoint_info(addr_of(&endpoint));
        let secret = secret.map(|t| ClusterSecret::from_text(t).unwrap());
        let admission = Admission::new(secret, "lab", release.clone());
        let (sender, receiver) = tokio::sync::mpsc::channel(4);
        let router = iroh::protocol::Router::builder(endpoint.clone())
            .accept(
                admission.alpn(),
                AuthHandler {
                    admission: admission.clone(),
                },
            )
            .accept(
                ALPN,
                Gated {
                    handler: super::super::endpoint::ChannelHandler {
                        connections: sender,
                    },
                    admission: admission.clone(),
                    endpoint: endpoint.clone(),
                },
            )
            .spawn();
        (endpoint, router, admission, receiver)
    }

    fn addr_of(endpoint: &Endpoint) -> EndpointAddr {
        let mut addr = EndpointAddr::new(endpoint.id());
        for socket in endpoint.bound_sockets() {
            addr = addr.with_ip_addr(socket);
        }
        addr
    }

    /// Connects `from` to `to`'s gated protocol and says whether `to` handed it on.
    async fn gated_connection_served(
        from: &Endpoint,
        to: &Endpoint,
        served: &mut tokio::sync::mpsc::Receiver<Connection>,
    ) -> bool {
        let Ok(connection) = from.connect(to.id(), ALPN).await else {
            return false;
        };
        // Served, or closed by the gate (a refusal), whichever comes first.
        let handed = tokio::time::timeout(Duration::from_secs(8), async {
            tokio::select! {
                handed = served.recv() => handed.is_some(),
                _ = connection.closed() => false,
            }
        })
        .await;
        drop(connection);
        matches!(handed, Ok(true))
    }

    #[tokio::test]
    async fn only_nodes_that_prove_the_secret_get_through_the_gate() {
        let secret = "correct horse battery staple";
        let lookup = iroh::address_lookup::MemoryLookup::new();
        let (a, _router_a, admission_a, mut served_a) = node(Some(secret), &lookup).await;
        let (b, _router_b, admission_b, _served_b) = node(Some(secret), &lookup).await;
        let (wrong, _router_w, admission_w, _served_w) =
            node(Some("another secret of some length"), &lookup).await;
        let (open, _router_o, _, _served_o) = node(None, &lookup).await;

        // A member dialing the gated protocol without a handshake first is proven by a
        // handshake the gate runs back to it, then served.
        assert!(gated_connection_served(&b, &a, &mut served_a).await);
        assert!(admission_a.allows(&b.id()));
        assert!(admission_b.allows(&a.id()), "the proof goes both ways");

        // A node with another secret, or none, is refused, and nothing reaches the protocol.
        assert!(!gated_connection_served(&wrong, &a, &mut served_a).await);
        assert!(!gated_connection_served(&open, &a, &mut served_a).await);
        assert!(!admission_a.allows(&wrong.id()));
        assert!(!admission_a.allows(&open.id()));
        let err = admission_w.ensure(&wrong, a.id()).await.unwrap_err();
        assert!(err.to_string().contains("cluster secret"), "{err:#}");
        assert!(!admission_w.allows(&a.id()));
    }

    #[tokio::test]
    async fn the_gate_dials_a_refused_node_back_once_and_never_more_than_its_limit() {
        let secret = "correct horse battery staple";
        let lookup = iroh::address_lookup::MemoryLookup::new();
        let (a, _router_a, admission_a, mut served_a) = node(Some(secret), &lookup).await;
        let (b, _router_b, _, _served_b) = node(Some(secret), &lookup).await;
        let (wrong, _router_w, _, _served_w) =
            node(Some("another secret of some length"), &lookup).await;
        let (open, _router_o, _, _served_o) = node(None, &lookup).await;

        // A stranger dialling the gated protocol in a loop costs one handshake back.
        for _ in 0..5 {
            assert!(!gated_connection_served(&wrong, &a, &mut served_a).await);
        }
        assert_eq!(admission_a.dial_backs_started(), 1);

        // With every permit taken, an unknown node is refused without a dial at all...
        let held = admission_a
            .dial_backs
            .try_acquire_many(MAX_DIAL_BACKS as u32)
            .unwrap();
        assert!(!gated_connection_served(&open, &a, &mut served_a).await);
        assert!(!gated_connection_served(&b, &a, &mut served_a).await);
        assert_eq!(admission_a.dial_backs_started(), 1);
        drop(held);
        // ...and once one is free, a member is proven and served as before.
        assert!(gated_connection_served(&b, &a, &mut served_a).await);
        assert_eq!(admission_a.dial_backs_started(), 2);
    }

    /// Open nodes of one protocol admit each other whatever their versions (a rolling
    /// upgrade); a node of another protocol is refused by both sides, each naming both
    /// releases, and nothing of it reaches a gated protocol.
    #[tokio::test]
    async fn a_node_of_another_protocol_is_refused_on_both_sides() {
        let lookup = iroh::address_lookup::MemoryLookup::new();
        let release = |version: &str, protocol| Release {
            version: version.into(),
            protocol,
        };
        let (a, _router_a, admission_a, mut served_a) =
            node_of(None, release("0.1.0", 1), &lookup).await;
        let (newer, _router_n, admission_n, _served_n) =
            node_of(None, release("0.2.0", 1), &lookup).await;
        let (other, _router_o, admission_o, _served_o) =
            node_of(None, release("0.3.0", 2), &lookup).await;

        admission_n.ensure(&newer, a.id()).await.unwrap();
        assert!(admission_a.allows(&newer.id()) && admission_n.allows(&a.id()));
        assert!(gated_connection_served(&newer, &a, &mut served_a).await);

        let err = admission_o.ensure(&other, a.id()).await.unwrap_err();
        let both = |text: &str| {
            text.contains("shoal 0.1.0 (protocol 1)") && text.contains("shoal 0.3.0 (protocol 2)")
        };
        assert!(both(&format!("{err:#}")), "{err:#}");
        assert!(!admission_a.allows(&other.id()) && !admission_o.allows(&a.id()));
        let seen = admission_a.refusals();
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert!(seen[0].0 == other.id() && both(&seen[0].1), "{seen:?}");
        assert_eq!(admission_o.refusals().len(), 1);
        assert!(!gated_connection_served(&other, &a, &mut served_a).await);
    }

    #[test]
    fn proofs_depend_on_role_material_and_secret() {
        let a = ClusterSecret::from_text("correct horse battery staple").unwrap();
        let b = ClusterSecret::from_text("another secret of some length").unwrap();
        let m1 = [1u8; 32];
        let m2 = [2u8; 32];
        assert_ne!(a.proof(b"initiator", &m1), a.proof(b"responder", &m1));
        assert_ne!(a.proof(b"initiator", &m1), a.proof(b"initiator", &m2));
        assert_ne!(a.proof(b"initiator", &m1), b.proof(b"initiator", &m1));
    }
}
