//! The canonical, indexed form of the input that the search runs on.
//!
//! Nodes are sorted by id and numbered in that order, so "smaller index" means "smaller id"
//! everywhere, and edges and interfaces are sorted and deduplicated: whatever order the input
//! lists them in, the topology, and so the placement, is the same.

use crate::edge::{Edge, Link};
use crate::node::{InterfaceKind, NodeProfile};
use std::collections::BTreeMap;
use std::net::IpAddr;

/// The cluster as the ring search sees it.
pub(crate) struct Topology<'a> {
    /// Nodes sorted by id; a node's index is its position here.
    pub nodes: Vec<&'a NodeProfile>,
    /// Distinct IP successors of each node, ascending.
    pub successors: Vec<Vec<usize>>,
    /// `has_ip_edge[from * n + to]`.
    has_ip_edge: Vec<bool>,
    /// The IPs `from` verified `to` at, per ordered pair, ascending and distinct.
    ip_links: BTreeMap<(usize, usize), Vec<IpAddr>>,
    /// The smallest-named RDMA interface of `from` linked to `to`, per ordered pair.
    rdma_links: BTreeMap<(usize, usize), String>,
    /// The best kind of interface each node holds each of its IPs on.
    ip_kinds: Vec<BTreeMap<IpAddr, InterfaceKind>>,
}

impl<'a> Topology<'a> {
    /// Builds the canonical form. Ids must be unique (see [`crate::Input::validate`]).
    pub fn new(nodes: &'a [NodeProfile], edges: &[Edge]) -> Self {
        let mut sorted: Vec<&NodeProfile> = nodes.iter().collect();
        sorted.sort_by(|a, b| a.id.cmp(&b.id));
        let index: BTreeMap<&str, usize> = sorted
            .iter()
            .enumerate()
            .map(|(i, node)| (node.id.as_str(), i))
            .collect();
        let n = sorted.len();
        let mut has_ip_edge = vec![false; n * n];
        let mut ip_links: BTreeMap<(usize, usize), Vec<IpAddr>> = BTreeMap::new();
        let mut rdma_links: BTreeMap<(usize, usize), String> = BTreeMap::new();
        for edge in edges {
            let (Some(&from), Some(&to)) =
                (index.get(edge.from.as_str()), index.get(edge.to.as_str()))
            else {
                continue;
            };
            if from == to {
                continue;
            }
            match &edge.link {
                Link::Ip(ip) => {
                    has_ip_edge[from * n + to] = true;
                    ip_links.entry((from, to)).or_default().push(*ip);
                }
                Link::Rdma(rdma) => {
                    let slot = rdma_links
                        .entry((from, to))
                        .or_insert_with(|| rdma.from_iface.clone());
                    if rdma.from_iface < *slot {
                        *slot = rdma.from_iface.clone();
                    }
                }
            }
        }
        for ips in ip_links.values_mut() {
            ips.sort();
            ips.dedup();
        }
        let successors = (0..n)
            .map(|from| (0..n).filter(|&to| has_ip_edge[from * n + to]).collect())
            .collect();
        let ip_kinds = sorted
            .iter()
            .map(|node| {
                let mut kinds: BTreeMap<IpAddr, InterfaceKind> = BTreeMap::new();
                for iface in &node.interfaces {
                    let slot = kinds.entry(iface.ip).or_insert(iface.kind);
                    *slot = (*slot).min(iface.kind);
                }
                kinds
            })
            .collect();
        Topology {
            nodes: sorted,
            successors,
            has_ip_edge,
            ip_links,
            rdma_links,
            ip_kinds,
        }
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Index of a node id, if present.
    pub fn index_of(&self, id: &str) -> Option<usize> {
        self.nodes
            .binary_search_by(|node| node.id.as_str().cmp(id))
            .ok()
    }

    /// Whether `from` verified an IP link to `to`.
    pub fn has_ip_edge(&self, from: usize, to: usize) -> bool {
        self.has_ip_edge[from * self.len() + to]
    }

    /// Whether `from` has an RDMA link to `to`.
    pub fn has_rdma_edge(&self, from: usize, to: usize) -> bool {
        self.rdma_links.contains_key(&(from, to))
    }

    /// `from`'s RDMA interface towards `to`.
    pub fn rdma_iface(&self, from: usize, to: usize) -> Option<&str> {
        self.rdma_links.get(&(from, to)).map(String::as_str)
    }

    /// A leaf has at most one distinct successor: a node that is otherwise a dead end.
    pub fn is_leaf(&self, node: usize) -> bool {
        self.successors[node].len() <= 1
    }

    /// The best IP `from` verified `to` at: the first by `preference` of the kind of `to`'s
    /// interface holding it (unknown when `to` lists no interface with that IP), then by IP.
    pub fn best_ip(
        &self,
        from: usize,
        to: usize,
        preference: &[InterfaceKind; 4],
    ) -> Option<IpAddr> {
        let ips = self.ip_links.get(&(from, to))?;
        let rank = |ip: &IpAddr| {
            let kind = self.ip_kinds[to]
                .get(ip)
                .copied()
                .unwrap_or(InterfaceKind::Unknown);
            preference
                .iter()
                .position(|k| *k == kind)
                .unwrap_or(preference.len())
        };
        ips.iter().min_by_key(|ip| (rank(ip), **ip)).copied()
    }
}
