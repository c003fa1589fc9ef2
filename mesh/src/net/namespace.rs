//! How a cluster namespace scopes the mesh: its gossip topic and the ALPNs of its protocols,
//! so nodes of two namespaces on one LAN never merge their states.

use iroh_gossip::TopicId;

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
