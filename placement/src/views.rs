//! What each rank is told: the ring port, its host list, and JACCL's devices and coordinators.

use crate::error::PlaceError;
use crate::node::InterfaceKind;
use crate::topology::Topology;
use std::net::{IpAddr, SocketAddr};

/// The HTTP API port every node listens on; a ring port never takes it.
pub const API_PORT: u16 = 52415;
/// Lowest ring port. Ring ports lie below the ports a system hands out to outgoing
/// connections (Linux 32768–60999, macOS and the IANA dynamic range 49152–65535): a node's
/// own connections to the hub or its peers held the ring's port once and the rank could not
/// listen on it (a 2-node tensor ring in `tests/moe_cluster.rs`, port 52446).
pub const RING_PORT_MIN: u16 = 20480;
/// Highest ring port (one below Linux's first ephemeral port).
pub const RING_PORT_MAX: u16 = 32767;
/// Where a rank listens: every address, at the ring port.
pub const LISTEN_HOST: &str = "0.0.0.0";
/// Stand-in for ranks a node never talks to directly (RFC 5737 TEST-NET-2, port 0).
pub const PLACEHOLDER_HOST: &str = "198.51.100.1:0";

/// Ring neighbours are reached over the fastest kind of link first.
pub const RING_PREFERENCE: [InterfaceKind; 4] = [
    InterfaceKind::Thunderbolt,
    InterfaceKind::Ethernet,
    InterfaceKind::Wifi,
    InterfaceKind::Unknown,
];
/// JACCL coordinators are reached over Ethernet first: Thunderbolt carries RDMA there.
pub const COORDINATOR_PREFERENCE: [InterfaceKind; 4] = [
    InterfaceKind::Ethernet,
    InterfaceKind::Thunderbolt,
    InterfaceKind::Wifi,
    InterfaceKind::Unknown,
];

/// The ring port of an instance: FNV-1a (64-bit) of the instance id, mapped into
/// [`RING_PORT_MIN`]..=[`RING_PORT_MAX`] (the API port, were it inside, is bumped). Every node
/// derives the same port from the same id, with no coordination and no randomness.
pub fn ring_port(instance_id: &str) -> u16 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in instance_id.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let span = u64::from(RING_PORT_MAX - RING_PORT_MIN) + 1;
    let port = RING_PORT_MIN + (hash % span) as u16;
    if port == API_PORT {
        port + 1
    } else {
        port
    }
}

fn host(ip: IpAddr, port: u16) -> String {
    SocketAddr::new(ip, port).to_string()
}

/// The MLX ring host list of every rank: `hosts[r][j]` is how rank `r` reaches rank `j`:
/// itself `0.0.0.0:PORT`, its left and right neighbours at the best IP it verified for them
/// ([`RING_PREFERENCE`]), everyone else [`PLACEHOLDER_HOST`]. A ring of one lists only itself.
pub(crate) fn ring_hosts(
    topo: &Topology,
    ring: &[usize],
    port: u16,
) -> Result<Vec<Vec<String>>, PlaceError> {
    let k = ring.len();
    let mut all = Vec::with_capacity(k);
    for r in 0..k {
        let mut hosts = Vec::with_capacity(k);
        for j in 0..k {
            if j == r {
                hosts.push(format!("{LISTEN_HOST}:{port}"));
            } else if j == (r + 1) % k || j == (r + k - 1) % k {
                let ip = topo
                    .best_ip(ring[r], ring[j], &RING_PREFERENCE)
                    .ok_or_else(|| PlaceError::NeighbourUnreachable {
                        node: topo.nodes[ring[r]].id.clone(),
                        neighbour: topo.nodes[ring[j]].id.clone(),
                    })?;
                hosts.push(host(ip, port));
            } else {
                hosts.push(PLACEHOLDER_HOST.to_string());
            }
        }
        all.push(hosts);
    }
    Ok(all)
}

/// JACCL's RDMA device matrix: `devices[i][j]` is rank `i`'s RDMA interface to rank `j`
/// (`None` on the diagonal).
pub(crate) fn jaccl_devices(topo: &Topology, ring: &[usize]) -> Vec<Vec<Option<String>>> {
    ring.iter()
        .map(|&from| {
            ring.iter()
                .map(|&to| {
                    if from == to {
                        None
                    } else {
                        topo.rdma_iface(from, to).map(str::to_string)
                    }
                })
                .collect()
        })
        .collect()
}

/// JACCL's coordinator address per rank: rank 0 listens on `0.0.0.0:PORT`, the others reach
/// it at the best IP they verified for it ([`COORDINATOR_PREFERENCE`]).
pub(crate) fn jaccl_coordinators(
    topo: &Topology,
    ring: &[usize],
    port: u16,
) -> Result<Vec<String>, PlaceError> {
    let mut coordinators = vec![format!("{LISTEN_HOST}:{port}")];
    for &node in &ring[1..] {
        let ip = topo
            .best_ip(node, ring[0], &COORDINATOR_PREFERENCE)
            .ok_or_else(|| PlaceError::NeighbourUnreachable {
                node: topo.nodes[node].id.clone(),
                neighbour: topo.nodes[ring[0]].id.clone(),
            })?;
        coordinators.push(host(ip, port));
    }
    Ok(coordinators)
}
