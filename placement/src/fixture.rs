//! Builders of clusters (nodes, topologies, model cards, requests) for tests and benchmarks:
//! placement's own tests and benchmark, and the control plane's fixtures, build their inputs
//! from these rather than from copies of them. Public because integration tests, benchmarks
//! and other crates cannot reach a `#[cfg(test)]` module; behind the `test-support` feature, so
//! production builds leave them out.

use crate::{
    CollectiveBackend, ComputeBackend, Edge, Input, Interface, InterfaceKind, Link, ModelCard,
    NodeProfile, RdmaLink, Request, Sharding,
};
use std::collections::BTreeMap;
use std::net::IpAddr;

/// A megabyte, as the tests count memory.
pub const MB: u64 = 1_000_000;

/// A CPU node with one Ethernet interface at `ip`.
pub fn node(id: &str, ram_available: u64, ip: &str) -> NodeProfile {
    NodeProfile {
        id: id.to_string(),
        ram_available,
        ram_total: ram_available * 2,
        backends: vec![ComputeBackend::MlxCpu],
        rdma_enabled: false,
        interfaces: vec![Interface {
            name: "eth0".into(),
            ip: ip.parse().expect("test ip"),
            kind: InterfaceKind::Ethernet,
        }],
        download: BTreeMap::new(),
    }
}

/// Nodes `a`, `b`, `c`, ... at 10.0.0.1, 10.0.0.2, ... with the given free memory in MB.
pub fn nodes_mb(rams: &[u64]) -> Vec<NodeProfile> {
    rams.iter()
        .enumerate()
        .map(|(i, &ram)| node(&letter_id(i), ram * MB, &format!("10.0.0.{}", i + 1)))
        .collect()
}

/// `a`..`z`, then `n026`, ... (ids that sort in index order for up to 26 nodes).
pub fn letter_id(i: usize) -> String {
    if i < 26 {
        ((b'a' + i as u8) as char).to_string()
    } else {
        format!("n{i:03}")
    }
}

/// Numbered ids `n000`, `n001`, ... that sort in index order.
pub fn numbered_nodes(rams: &[u64]) -> Vec<NodeProfile> {
    rams.iter()
        .enumerate()
        .map(|(i, &ram)| {
            node(
                &format!("n{i:03}"),
                ram,
                &format!("10.0.{}.{}", i / 250, i % 250 + 1),
            )
        })
        .collect()
}

/// The IP edge `from → to` at `to`'s first interface.
pub fn ip_edge(nodes: &[NodeProfile], from: usize, to: usize) -> Edge {
    Edge {
        from: nodes[from].id.clone(),
        to: nodes[to].id.clone(),
        link: Link::Ip(nodes[to].interfaces[0].ip),
    }
}

/// An IP edge to a given address.
pub fn ip_edge_at(from: &str, to: &str, ip: &str) -> Edge {
    Edge {
        from: from.into(),
        to: to.into(),
        link: Link::Ip(ip.parse::<IpAddr>().expect("test ip")),
    }
}

/// An RDMA edge.
pub fn rdma_edge(from: &str, to: &str, from_iface: &str, to_iface: &str) -> Edge {
    Edge {
        from: from.into(),
        to: to.into(),
        link: Link::Rdma(RdmaLink {
            from_iface: from_iface.into(),
            to_iface: to_iface.into(),
        }),
    }
}

/// Every node reaches every other.
pub fn full_mesh(nodes: &[NodeProfile]) -> Vec<Edge> {
    let n = nodes.len();
    let mut edges = Vec::new();
    for from in 0..n {
        for to in 0..n {
            if from != to {
                edges.push(ip_edge(nodes, from, to));
            }
        }
    }
    edges
}

/// A physical ring: each node reaches its two neighbours.
pub fn ring(nodes: &[NodeProfile]) -> Vec<Edge> {
    let n = nodes.len();
    let mut edges = Vec::new();
    for i in 0..n {
        edges.push(ip_edge(nodes, i, (i + 1) % n));
        edges.push(ip_edge(nodes, (i + 1) % n, i));
    }
    edges.sort();
    edges.dedup();
    edges
}

/// Two switches: the first and second half of the nodes are each a full mesh, and two
/// uplinks join them (node 0 with node n/2, node 1 with node n/2 + 1, both ways).
pub fn two_switch(nodes: &[NodeProfile]) -> Vec<Edge> {
    let n = nodes.len();
    let half = n / 2;
    let mut edges = Vec::new();
    for group in [0..half, half..n] {
        for from in group.clone() {
            for to in group.clone() {
                if from != to {
                    edges.push(ip_edge(nodes, from, to));
                }
            }
        }
    }
    for (a, b) in [(0, half), (1, half + 1)] {
        if b < n && a < half {
            edges.push(ip_edge(nodes, a, b));
            edges.push(ip_edge(nodes, b, a));
        }
    }
    edges
}

/// A CPU model.
pub fn model(n_layers: u32, storage_bytes: u64) -> ModelCard {
    ModelCard {
        id: "m".into(),
        n_layers,
        storage_bytes,
        hidden_size: 4096,
        num_key_value_heads: 8,
        supports_tensor: true,
        tensor_divisors: vec![],
        layer_weights: vec![],
        rank0_bytes: 0,
        no_cut_before: vec![],
        backends: vec![
            ComputeBackend::MlxCpu,
            ComputeBackend::MlxMetal,
            ComputeBackend::MlxCuda,
        ],
    }
}

/// Pipeline over the ring backend, at least one node.
pub fn pipeline() -> Request {
    Request {
        sharding: Sharding::Pipeline,
        backend: CollectiveBackend::Ring,
        min_nodes: 1,
        required_nodes: vec![],
        instance_id: "test-instance".into(),
    }
}

/// An [`Input`] from its four parts.
pub fn input(
    nodes: Vec<NodeProfile>,
    edges: Vec<Edge>,
    model: ModelCard,
    request: Request,
) -> Input {
    Input {
        nodes,
        edges,
        model,
        request,
    }
}
