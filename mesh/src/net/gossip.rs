//! The two gossip tasks: protocol rounds (a tick of the replica every gossip interval, its
//! broadcasts onto the iroh-gossip topic and its syncs to their peers) and the topic's
//! receiver (broadcasts merged into the replica; a neighbour coming up is synced at once).

use super::driver::Inner;
use super::sync;
use crate::proto::id::NodeId;
use crate::proto::transport::Outbox;
use iroh_gossip::api::{Event as GossipEvent, GossipReceiver};
use n0_future::StreamExt;
use std::sync::Arc;
use std::time::Duration;

/// iroh-gossip's message size limit; every node must use the same.
pub const GOSSIP_MAX_MESSAGE: usize = 4096;

/// Ticks the replica every gossip interval and sends what the tick produced.
pub(crate) async fn rounds(inner: Arc<Inner>) {
    let period = Duration::from_millis(inner.with_replica(|r| r.config().gossip_interval_ms));
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

/// Feeds the topic's events to the replica until the topic closes.
pub(crate) async fn receive(inner: Arc<Inner>, mut receiver: GossipReceiver) {
    while let Some(event) = receiver.next().await {
        match event {
            Ok(GossipEvent::Received(message)) => {
                let now = inner.now_ms();
                if let Err(e) = inner.with_replica(|r| r.on_broadcast(&message.content, now)) {
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
