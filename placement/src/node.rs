//! A node as placement sees it: memory, compute backends, interfaces, downloads.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::IpAddr;

/// A node's id: its iroh public key as text. Placement treats it as an opaque string and
/// orders ids by their bytes (`str`'s `Ord`), which is the total order every tie-break uses.
pub type NodeId = String;

/// What a node can compute with. A model runs on a node only if they share one backend.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
pub enum ComputeBackend {
    /// MLX on the CPU (any Linux or macOS machine).
    MlxCpu,
    /// MLX on Apple silicon GPUs.
    MlxMetal,
    /// MLX on NVIDIA GPUs.
    MlxCuda,
}

/// The physical kind of a network interface. It ranks the IPs a neighbour is reachable at:
/// the derived order (thunderbolt first, unknown last) is the ring's preference.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
pub enum InterfaceKind {
    /// Thunderbolt bridge: the fastest link between Macs.
    Thunderbolt,
    /// Wired Ethernet.
    Ethernet,
    /// Wi-Fi.
    Wifi,
    /// Anything the node could not classify.
    Unknown,
}

/// One network interface of a node and the address it holds.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(deny_unknown_fields)]
pub struct Interface {
    /// The OS name of the interface (`en0`, `eth0`, `bridge0`).
    pub name: String,
    /// The address on this interface that other nodes may reach.
    pub ip: IpAddr,
    /// What kind of link the interface is.
    pub kind: InterfaceKind,
}

/// Everything placement needs to know about one node. The node itself authors this record in
/// the replicated state (mesh); placement only reads it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NodeProfile {
    /// The node's id (see [`NodeId`]).
    pub id: NodeId,
    /// Memory free for model weights, in bytes. Layers are split in proportion to it.
    pub ram_available: u64,
    /// Total memory of the machine, in bytes (informative; placement decides on `ram_available`).
    pub ram_total: u64,
    /// The compute backends the node offers.
    pub backends: Vec<ComputeBackend>,
    /// Whether the node has RDMA (Thunderbolt 5 JACCL) switched on.
    #[serde(default)]
    pub rdma_enabled: bool,
    /// The node's interfaces; they give each reachable IP its kind.
    #[serde(default)]
    pub interfaces: Vec<Interface>,
    /// Download progress per model id, 0.0 (nothing) to 1.0 (complete). Missing means 0.0.
    #[serde(default)]
    pub download: BTreeMap<String, f64>,
}

/// Download progress is compared as an integer number of millionths, so that sums are exact
/// and every node computes the same preference whatever the order it adds them in.
pub(crate) const DOWNLOAD_SCALE: f64 = 1_000_000.0;

impl NodeProfile {
    /// Download progress of `model_id` in millionths (0..=1_000_000), clamped.
    pub(crate) fn download_millionths(&self, model_id: &str) -> u64 {
        let fraction = self.download.get(model_id).copied().unwrap_or(0.0);
        if fraction.is_nan() {
            return 0;
        }
        (fraction.clamp(0.0, 1.0) * DOWNLOAD_SCALE).round() as u64
    }
}
