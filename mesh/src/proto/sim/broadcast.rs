//! How the simulator carries a gossip broadcast over the overlay (Plumtree-style: push along
//! eager links, announce along lazy ones, prune duplicates, graft what was only announced),
//! and how each node keeps its active view filled when neighbours become unreachable.

use super::overlay::{GOSSIP_FRAMING_BYTES, GRAFT_BYTES, IHAVE_BYTES, PRUNE_BYTES};
use super::{Delivery, Sim};
use std::sync::Arc;

impl Sim {
    /// Node `node`'s replica broadcast `bytes`: a new message on the topic.
    pub(super) fn originate(&mut self, node: usize, bytes: Vec<u8>) {
        let id = self.payloads.len() as u64;
        self.payloads.insert(id, Arc::new(bytes));
        self.gossip.sent += 1;
        self.overlay.peers[node].seen.insert(id, 0);
        self.push(node, None, id, 0);
    }

    /// Sends message `id` on from `node`: whole to eager neighbours, announced to lazy ones;
    /// never back to `came_from`.
    fn push(&mut self, node: usize, came_from: Option<usize>, id: u64, hops: u32) {
        let peer = &self.overlay.peers[node];
        let eager: Vec<usize> = peer.eager.iter().copied().collect();
        let lazy: Vec<usize> = peer.lazy.iter().copied().collect();
        for to in eager.into_iter().filter(|p| Some(*p) != came_from) {
            let gossip = Delivery::Gossip {
                from: node,
                to,
                id,
                hops: hops + 1,
            };
            self.send(node, to, gossip);
        }
        for to in lazy.into_iter().filter(|p| Some(*p) != came_from) {
            self.send(node, to, Delivery::IHave { from: node, to, id });
        }
    }

    pub(super) fn on_gossip(&mut self, from: usize, to: usize, id: u64, hops: u32) {
        if !self.nodes[to].alive {
            return;
        }
        let payload = self.payloads[&id].clone();
        self.count(to, payload.len() + GOSSIP_FRAMING_BYTES);
        let peer = &mut self.overlay.peers[to];
        if peer.seen.contains_key(&id) {
            // A second copy: this link is not needed for the tree.
            self.gossip.duplicates += 1;
            peer.make_lazy(from);
            self.send(to, from, Delivery::Prune { from: to, to: from });
            return;
        }
        peer.seen.insert(id, hops);
        peer.missing.remove(&id);
        peer.make_eager(from);
        self.gossip.delivered += 1;
        self.gossip.hop_sum += u64::from(hops);
        self.gossip.max_hops = self.gossip.max_hops.max(hops);
        let now = self.now_ms;
        let _ = self.nodes[to].replica.on_broadcast(&payload, now);
        self.collect_events(to);
        self.push(to, Some(from), id, hops);
    }

    pub(super) fn on_ihave(&mut self, from: usize, to: usize, id: u64) {
        if !self.nodes[to].alive {
            return;
        }
        self.count(to, IHAVE_BYTES);
        let peer = &mut self.overlay.peers[to];
        if peer.seen.contains_key(&id) {
            return;
        }
        let announcers = peer.missing.entry(id).or_default();
        announcers.push(from);
        if announcers.len() == 1 {
            let wait = self.overlay.config.graft_timeout_ms;
            self.schedule(wait, Delivery::GraftTimer { node: to, id });
        }
    }

    pub(super) fn on_graft_timer(&mut self, node: usize, id: u64) {
        if !self.nodes[node].alive {
            return;
        }
        let peer = &mut self.overlay.peers[node];
        if peer.seen.contains_key(&id) {
            return;
        }
        let Some(announcers) = peer.missing.get_mut(&id) else {
            return;
        };
        if announcers.is_empty() {
            return;
        }
        let ask = announcers.remove(0);
        peer.make_eager(ask);
        self.send(
            node,
            ask,
            Delivery::Graft {
                from: node,
                to: ask,
                id,
            },
        );
        let retry = self.overlay.config.graft_retry_ms;
        self.schedule(retry, Delivery::GraftTimer { node, id });
    }

    pub(super) fn on_graft(&mut self, from: usize, to: usize, id: u64) {
        if !self.nodes[to].alive {
            return;
        }
        self.count(to, GRAFT_BYTES);
        let peer = &mut self.overlay.peers[to];
        peer.make_eager(from);
        if let Some(&hops) = peer.seen.get(&id) {
            self.gossip.grafted += 1;
            let hops = hops + 1;
            let gossip = Delivery::Gossip {
                from: to,
                to: from,
                id,
                hops,
            };
            self.send(to, from, gossip);
        }
    }

    pub(super) fn on_prune(&mut self, from: usize, to: usize) {
        if !self.nodes[to].alive {
            return;
        }
        self.count(to, PRUNE_BYTES);
        self.overlay.peers[to].make_lazy(from);
    }

    /// At each tick: drops links to neighbours unreachable for longer than the link timeout
    /// and, below the target view size, links to random reachable nodes.
    pub(super) fn maintain_overlay(&mut self, node: usize) {
        let now = self.now_ms;
        let timeout = self.overlay.config.link_timeout_ms;
        for peer in self.overlay.peers[node].neighbours() {
            if self.reachable(node, peer) {
                self.overlay.peers[node].down_since.remove(&peer);
                continue;
            }
            let since = *self.overlay.peers[node]
                .down_since
                .entry(peer)
                .or_insert(now);
            if now.saturating_sub(since) >= timeout {
                self.overlay.disconnect(node, peer);
            }
        }
        if self.overlay.peers[node].degree() < self.overlay.config.active_view {
            let candidates: Vec<usize> = (0..self.nodes.len())
                .filter(|&c| self.reachable(node, c))
                .collect();
            let cap = self.overlay.soft_cap();
            self.overlay.fill(node, &candidates, cap, &mut self.rng);
        }
    }
}
