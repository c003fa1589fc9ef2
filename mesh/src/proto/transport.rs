//! The seam between the protocol and the network: the replica asks for messages to be sent,
//! the driver (iroh, or the simulator) sends them and feeds the answers back.

use crate::proto::id::NodeId;

/// Where a [`crate::Replica`] sends what it produces in [`crate::Replica::tick`].
pub trait Transport {
    /// Sends `message` (an encoded [`crate::proto::codec::Message::Broadcast`], within the gossip size
    /// limit) to every node on the gossip topic.
    fn broadcast(&mut self, message: Vec<u8>);

    /// Starts an anti-entropy exchange with `peer`: deliver `syn` to it, pass its reply to
    /// [`crate::Replica::on_synack`] and deliver that answer back to it.
    fn sync(&mut self, peer: NodeId, syn: Vec<u8>);
}

/// A [`Transport`] that collects what one tick produced, for a driver to send afterwards
/// (the iroh driver and the simulator both work this way).
#[derive(Debug, Default)]
pub struct Outbox {
    /// Messages for the gossip topic.
    pub broadcasts: Vec<Vec<u8>>,
    /// Anti-entropy exchanges to start: the peer and the opening message.
    pub syncs: Vec<(NodeId, Vec<u8>)>,
}

impl Transport for Outbox {
    fn broadcast(&mut self, message: Vec<u8>) {
        self.broadcasts.push(message);
    }

    fn sync(&mut self, peer: NodeId, syn: Vec<u8>) {
        self.syncs.push((peer, syn));
    }
}
