//! The iroh endpoint of a node: bound on the mesh port with relays, n0 DNS/pkarr and the port
//! mapper off (nothing leaves the LAN), addresses only from [`MemoryLookup`] (fed by mDNS and
//! `--peer`), and the handler that passes the binary's own protocols on to it.

use anyhow::Context;
use iroh::address_lookup::MemoryLookup;
use iroh::endpoint::{presets, Connection};
use iroh::{Endpoint, RelayMode, SecretKey};
use std::net::SocketAddr;

/// Binds the endpoint of `key` on UDP `port` of every IPv4 address (0: any port).
pub(crate) async fn bind(
    key: SecretKey,
    lookup: MemoryLookup,
    port: u16,
) -> anyhow::Result<Endpoint> {
    Endpoint::builder(presets::Minimal)
        .secret_key(key)
        .relay_mode(RelayMode::Disabled)
        .clear_address_lookup()
        .address_lookup(lookup)
        .clear_ip_transports()
        .bind_addr(SocketAddr::from(([0, 0, 0, 0], port)))
        .context("invalid mesh bind address")?
        .bind()
        .await
        .with_context(|| {
            format!("cannot bind the mesh endpoint on UDP port {port}; is another shoal running?")
        })
}

/// The endpoint's bound IPv4 port (`requested` if none is IPv4).
pub(crate) fn bound_port(endpoint: &Endpoint, requested: u16) -> u16 {
    endpoint
        .bound_sockets()
        .iter()
        .find(|a| a.is_ipv4())
        .map_or(requested, SocketAddr::port)
}

/// Hands connections on an extra ALPN to the binary (see
/// [`super::MeshOptions::extra_protocols`]).
#[derive(Debug, Clone)]
pub(crate) struct ChannelHandler {
    pub(crate) connections: tokio::sync::mpsc::Sender<Connection>,
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

/// The mesh's protocol handlers as one type, so the admission gate wraps each the same way.
#[derive(Debug, Clone)]
pub(crate) enum Handler {
    /// iroh-gossip's.
    Gossip(iroh_gossip::Gossip),
    /// Anti-entropy.
    Sync(super::sync::SyncHandler),
    /// One of the binary's protocols.
    Channel(ChannelHandler),
}

impl iroh::protocol::ProtocolHandler for Handler {
    async fn accept(&self, connection: Connection) -> Result<(), iroh::protocol::AcceptError> {
        match self {
            Handler::Gossip(gossip) => gossip.accept(connection).await,
            Handler::Sync(sync) => sync.accept(connection).await,
            Handler::Channel(channel) => channel.accept(connection).await,
        }
    }

    async fn shutdown(&self) {
        if let Handler::Gossip(gossip) = self {
            iroh::protocol::ProtocolHandler::shutdown(gossip).await;
        }
    }
}
