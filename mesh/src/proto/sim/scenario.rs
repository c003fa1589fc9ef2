//! What a simulation is given (the scenario: network, protocol and overlay settings, the
//! records every node writes) and what it measures (traffic per node, how broadcasts travelled).

use super::overlay::OverlayConfig;
use crate::proto::replica::Config;

/// The records a node writes when it starts (and restarts): `(node, nodes, generation)` to
/// `(key, JSON value)` pairs. A plain function so a scenario stays `Clone` and reproducible.
pub type RecordsFn = fn(node: usize, nodes: usize, generation: u64) -> Vec<(String, String)>;

/// The default start-up records: one `profile` of about 300 bytes.
pub fn small_profile(node: usize, _nodes: usize, generation: u64) -> Vec<(String, String)> {
    let profile = format!(
        "{{\"name\":\"node-{node}\",\"generation\":{generation},\"memory\":{},\"pad\":\"{}\"}}",
        64u64 << 30,
        "x".repeat(220)
    );
    vec![("profile".to_string(), profile)]
}

/// A scenario's network and protocol settings.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Number of nodes.
    pub nodes: usize,
    /// Seed of every random choice (network, overlay and replicas).
    pub seed: u64,
    /// Probability that any one message is lost.
    pub loss: f64,
    /// Smallest one-way latency.
    pub min_latency_ms: u64,
    /// Largest one-way latency.
    pub max_latency_ms: u64,
    /// Peers each replica knows at start for anti-entropy (as discovery would give it).
    pub seed_peers: usize,
    /// Protocol settings of every replica.
    pub replica: Config,
    /// The gossip overlay's settings.
    pub overlay: OverlayConfig,
    /// What every node writes when it (re)starts.
    pub records: RecordsFn,
}

impl SimConfig {
    /// `nodes` nodes on a LAN-like network (1–5 ms, no loss) with default protocol and
    /// overlay settings, each writing a small profile.
    pub fn lan(nodes: usize, seed: u64) -> SimConfig {
        SimConfig {
            nodes,
            seed,
            loss: 0.0,
            min_latency_ms: 1,
            max_latency_ms: 5,
            seed_peers: 3,
            replica: Config::default(),
            overlay: OverlayConfig::default(),
            records: small_profile,
        }
    }
}

/// Bytes and messages received by one node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Messages delivered to the node.
    pub messages: u64,
    /// Bytes delivered to the node.
    pub bytes: u64,
}

/// How gossip broadcasts travelled the overlay.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GossipStats {
    /// Broadcasts the replicas sent.
    pub sent: u64,
    /// First receipts of a broadcast (one per node that got it).
    pub delivered: u64,
    /// Copies received a second time (each prunes a link to lazy).
    pub duplicates: u64,
    /// Messages fetched by a graft after an `IHave`.
    pub grafted: u64,
    /// Sum of hop counts over first receipts.
    pub hop_sum: u64,
    /// Most hops any first receipt took.
    pub max_hops: u32,
}

impl GossipStats {
    /// Mean hops of a first receipt.
    pub fn mean_hops(&self) -> f64 {
        self.hop_sum as f64 / self.delivered.max(1) as f64
    }
}
