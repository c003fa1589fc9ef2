//! Anti-entropy over its own ALPN: on one QUIC stream, the initiator sends its digest (Syn),
//! the responder answers with what the initiator lacks plus its own digest (SynAck), and the
//! initiator sends what the responder lacks (Ack). Frames are length-prefixed and bounded.

use super::driver::Inner;
use crate::proto::codec::MAX_MESSAGE_BYTES;
use crate::proto::id::NodeId;
use anyhow::{bail, Context};
use iroh::endpoint::{Connection, RecvStream, SendStream};
use iroh::protocol::{AcceptError, ProtocolHandler};
use std::sync::Arc;
use std::time::Duration;

/// ALPN prefix of the anti-entropy protocol; [`sync_alpn`] appends the namespace's topic.
pub const SYNC_ALPN: &[u8] = b"shoal/mesh-sync/1/";

/// The anti-entropy ALPN of a cluster namespace: a node given a `--peer` of another cluster
/// fails the handshake instead of merging two clusters' states.
pub fn sync_alpn(namespace: &str) -> Vec<u8> {
    super::namespace::namespaced_alpn(SYNC_ALPN, namespace)
}

/// How long one exchange may take before it is abandoned.
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(3);

async fn write_frame(send: &mut SendStream, bytes: &[u8]) -> anyhow::Result<()> {
    let len = u32::try_from(bytes.len()).context("frame too large")?;
    send.write_all(&len.to_be_bytes()).await?;
    send.write_all(bytes).await?;
    Ok(())
}

async fn read_frame(recv: &mut RecvStream) -> anyhow::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    recv.read_exact(&mut len).await?;
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_MESSAGE_BYTES {
        bail!("peer sent a {len}-byte frame, over the {MAX_MESSAGE_BYTES}-byte limit");
    }
    let mut buf = vec![0u8; len];
    recv.read_exact(&mut buf).await?;
    Ok(buf)
}

/// Accepts anti-entropy streams from peers.
#[derive(Clone)]
pub(crate) struct SyncHandler {
    pub(super) inner: Arc<Inner>,
}

impl std::fmt::Debug for SyncHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SyncHandler")
    }
}

impl ProtocolHandler for SyncHandler {
    async fn accept(&self, connection: Connection) -> Result<(), AcceptError> {
        let peer = NodeId::from_bytes(*connection.remote_id().as_bytes());
        while let Ok((send, recv)) = connection.accept_bi().await {
            let inner = self.inner.clone();
            tokio::spawn(async move {
                let exchange = respond(&inner, peer, send, recv);
                match tokio::time::timeout(SYNC_TIMEOUT, exchange).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        tracing::debug!(peer = %peer.short(), "sync (responder) failed: {e:#}")
                    }
                    Err(_) => tracing::debug!(peer = %peer.short(), "sync (responder) timed out"),
                }
            });
        }
        Ok(())
    }
}

async fn respond(
    inner: &Inner,
    peer: NodeId,
    mut send: SendStream,
    mut recv: RecvStream,
) -> anyhow::Result<()> {
    let syn = read_frame(&mut recv).await?;
    let now = inner.now_ms();
    let synack = inner.with_replica(|r| r.on_syn(peer, &syn, now))?;
    write_frame(&mut send, &synack).await?;
    let ack = read_frame(&mut recv).await?;
    let now = inner.now_ms();
    inner.with_replica(|r| r.on_ack(peer, &ack, now))?;
    send.finish()?;
    Ok(())
}

/// Runs one exchange with `peer` as the initiator, reusing a cached connection.
pub(crate) async fn initiate(inner: Arc<Inner>, peer: NodeId, syn: Vec<u8>) {
    let result = tokio::time::timeout(SYNC_TIMEOUT, initiate_inner(&inner, peer, syn)).await;
    let failed = match result {
        Ok(Ok(())) => false,
        Ok(Err(e)) => {
            tracing::debug!(peer = %peer.short(), "sync failed: {e:#}");
            true
        }
        Err(_) => {
            tracing::debug!(peer = %peer.short(), "sync timed out");
            true
        }
    };
    if failed {
        inner.connections.lock().await.remove(&peer);
    }
}

async fn initiate_inner(inner: &Inner, peer: NodeId, syn: Vec<u8>) -> anyhow::Result<()> {
    let connection = inner.connection(peer).await?;
    let (mut send, mut recv) = connection.open_bi().await?;
    write_frame(&mut send, &syn).await?;
    let synack = read_frame(&mut recv).await?;
    let now = inner.now_ms();
    let ack = inner.with_replica(|r| r.on_synack(peer, &synack, now))?;
    write_frame(&mut send, &ack).await?;
    send.finish()?;
    // Wait until the peer has read everything before the stream is dropped.
    let _ = send.stopped().await;
    Ok(())
}
