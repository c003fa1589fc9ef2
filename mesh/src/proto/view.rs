//! The `GET /state` view of a replica: every author's records in key order (two converged
//! nodes print the same bytes), a digest of them, and this node's local view of liveness,
//! which is not part of the digest.

use crate::proto::replica::Replica;

/// The state of `replica` as JSON at local time `now_ms` (see the module docs).
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
