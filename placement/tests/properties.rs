//! Property tests: order independence, real cycles, layer coverage, memory fit, and agreement
//! with a brute-force reference (every directed cycle enumerated) on small clusters.

use placement::fixture::MB;
use placement::{
    cli, place, CollectiveBackend, ComputeBackend, Edge, Input, Interface, InterfaceKind, Link,
    ModelCard, NodeProfile, PlaceError, RdmaLink, Request, Sharding,
};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

const UNIT: u64 = 250 * MB;

fn kind() -> impl Strategy<Value = InterfaceKind> {
    prop_oneof![
        Just(InterfaceKind::Thunderbolt),
        Just(InterfaceKind::Ethernet),
        Just(InterfaceKind::Wifi),
        Just(InterfaceKind::Unknown),
    ]
}

fn backends() -> impl Strategy<Value = Vec<ComputeBackend>> {
    prop::sample::subsequence(
        vec![
            ComputeBackend::MlxCpu,
            ComputeBackend::MlxMetal,
            ComputeBackend::MlxCuda,
        ],
        0..=3,
    )
}

/// Node `i` owns addresses 10.0.i.1 and 10.0.i.2; ids are random and unique.
fn node(i: usize) -> impl Strategy<Value = NodeProfile> {
    (
        "[a-z0-9]{1,6}",
        prop_oneof![1 => Just(0u64), 4 => 1u64..=4],
        prop_oneof![4 => Just(vec![ComputeBackend::MlxCpu]), 1 => backends()],
        any::<bool>(),
        prop::collection::vec((kind(), 1u8..=2), 1..=2),
        prop::option::of(prop_oneof![Just(0.0), Just(0.5), Just(1.0), 0.0f64..=1.0]),
    )
        .prop_map(
            move |(id, ram, backends, rdma, ifaces, download)| NodeProfile {
                id: format!("{id}-{i}"),
                ram_available: ram * UNIT,
                ram_total: 8 * UNIT,
                backends,
                rdma_enabled: rdma,
                interfaces: ifaces
                    .into_iter()
                    .enumerate()
                    .map(|(j, (kind, host))| Interface {
                        name: format!("if{j}"),
                        ip: format!("10.0.{i}.{host}").parse().unwrap(),
                        kind,
                    })
                    .collect(),
                download: download
                    .map(|d| BTreeMap::from([("m".to_string(), d)]))
                    .unwrap_or_default(),
            },
        )
}

fn cluster() -> impl Strategy<Value = Input> {
    (1usize..=6)
        .prop_flat_map(|n| {
            (
                (0..n).map(node).collect::<Vec<_>>(),
                // Per ordered pair: IP link to host 1, host 2 or both (or none), RDMA link.
                prop::collection::vec((0u8..5, prop::bool::weighted(0.5)), n * n),
                (1u32..=12, 0u64..=10, prop::sample::select(vec![4u32, 6, 8, 12]), 1u32..=4, any::<bool>()),
                prop_oneof![4 => Just(vec![ComputeBackend::MlxCpu, ComputeBackend::MlxMetal]), 1 => backends()],
                (any::<bool>(), any::<bool>(), prop_oneof![3 => Just(1u32), 1 => 0u32..=4], prop_oneof![3 => Just(vec![]), 1 => prop::collection::vec(0usize..7, 1..=2)]),
                "[a-z]{1,8}",
                prop::bool::weighted(0.7),
            )
        })
        .prop_map(|(nodes, links, (n_layers, storage, hidden, kv, tensor), model_backends, (tp, jaccl, min_nodes, required), instance, symmetric)| {
            let n = nodes.len();
            let mut edges = Vec::new();
            for from in 0..n {
                for to in 0..n {
                    // Symmetric clusters mirror the links of the lower-numbered node.
                    let (ip, rdma) = if symmetric && from > to {
                        let (ip, rdma) = links[to * n + from];
                        (if ip == 3 { 2 } else { ip }, rdma)
                    } else {
                        links[from * n + to]
                    };
                    if from == to {
                        continue;
                    }
                    let hosts: &[u8] = match ip {
                        0 => &[],
                        1 | 2 => &[1],
                        3 => &[2],
                        _ => &[1, 2],
                    };
                    for host in hosts {
                        edges.push(Edge {
                            from: nodes[from].id.clone(),
                            to: nodes[to].id.clone(),
                            link: Link::Ip(format!("10.0.{to}.{host}").parse().unwrap()),
                        });
                    }
                    if rdma {
                        edges.push(Edge {
                            from: nodes[from].id.clone(),
                            to: nodes[to].id.clone(),
                            link: Link::Rdma(RdmaLink {
                                from_iface: format!("rdma_en{to}"),
                                to_iface: format!("rdma_en{from}"),
                            }),
                        });
                    }
                }
            }
            let required_nodes = required
                .into_iter()
                .map(|i| nodes.get(i).map(|node| node.id.clone()).unwrap_or_else(|| "ghost".into()))
                .collect();
            // A tenth to all of the cluster's memory (or a little, on an empty one).
            let storage_bytes = match nodes.iter().map(|n| n.ram_available).sum::<u64>() {
                0 => storage * UNIT,
                total => storage * total / 10,
            };
            Input {
                nodes,
                edges,
                model: ModelCard {
                    id: "m".into(),
                    n_layers,
                    // A tenth to all of the cluster's memory (or a little, on an empty one).
                    storage_bytes,
                    hidden_size: hidden,
                    num_key_value_heads: kv,
                    supports_tensor: tensor,
                    tensor_divisors: vec![],
                    layer_weights: vec![],
                    rank0_bytes: 0,
                    no_cut_before: vec![],
                    backends: model_backends,
                },
                request: Request {
                    sharding: if tp { Sharding::Tensor } else { Sharding::Pipeline },
                    backend: if jaccl { CollectiveBackend::Jaccl } else { CollectiveBackend::Ring },
                    min_nodes,
                    required_nodes,
                    instance_id: instance,
                },
            }
        })
}

fn permute<T: Clone>(items: &[T], keys: &[u32]) -> Vec<T> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| (keys[i % keys.len()], i));
    order.into_iter().map(|i| items[i].clone()).collect()
}

fn output_bytes(input: &Input) -> String {
    match place(input) {
        Ok(p) => serde_json::to_string(&p).unwrap(),
        Err(e) => serde_json::to_string(&e).unwrap(),
    }
}

// ---- the reference: enumerate every directed simple cycle ----------------------------------

struct Reference<'a> {
    input: &'a Input,
    nodes: Vec<&'a NodeProfile>,
    ip: BTreeSet<(usize, usize)>,
    rdma: BTreeSet<(usize, usize)>,
}

#[derive(Clone, Copy, PartialEq)]
enum Stage {
    Structure,
    Memory,
    Tensor,
    Backend,
    Rdma,
}

impl<'a> Reference<'a> {
    fn new(input: &'a Input) -> Self {
        let mut nodes: Vec<&NodeProfile> = input.nodes.iter().collect();
        nodes.sort_by(|a, b| a.id.cmp(&b.id));
        let index = |id: &str| nodes.iter().position(|n| n.id == id);
        let mut ip = BTreeSet::new();
        let mut rdma = BTreeSet::new();
        for e in &input.edges {
            if let (Some(f), Some(t)) = (index(&e.from), index(&e.to)) {
                if f != t {
                    match e.link {
                        Link::Ip(_) => ip.insert((f, t)),
                        Link::Rdma(_) => rdma.insert((f, t)),
                    };
                }
            }
        }
        Reference {
            input,
            nodes,
            ip,
            rdma,
        }
    }

    fn cycles(&self) -> Vec<Vec<usize>> {
        let n = self.nodes.len();
        let mut all: Vec<Vec<usize>> = (0..n).map(|v| vec![v]).collect();
        fn walk(r: &Reference, path: &mut Vec<usize>, all: &mut Vec<Vec<usize>>) {
            let last = *path.last().unwrap();
            if path.len() >= 2 && r.ip.contains(&(last, path[0])) {
                all.push(path.clone());
            }
            for v in path[0] + 1..r.nodes.len() {
                if !path.contains(&v) && r.ip.contains(&(last, v)) {
                    path.push(v);
                    walk(r, path, all);
                    path.pop();
                }
            }
        }
        for s in 0..n {
            walk(self, &mut vec![s], &mut all);
        }
        all
    }

    fn passes(&self, ring: &[usize], upto: Stage) -> bool {
        let req = &self.input.request;
        let model = &self.input.model;
        let k = ring.len();
        let ids: BTreeSet<&str> = ring.iter().map(|&v| self.nodes[v].id.as_str()).collect();
        if k < req.min_nodes.max(1) as usize
            || !req.required_nodes.iter().all(|r| ids.contains(r.as_str()))
        {
            return false;
        }
        if upto == Stage::Structure {
            return true;
        }
        let memory: u64 = ring.iter().map(|&v| self.nodes[v].ram_available).sum();
        if memory < model.storage_bytes {
            return false;
        }
        if upto == Stage::Memory {
            return true;
        }
        if req.sharding == Sharding::Tensor && k > 1 {
            let k = k as u32;
            if !model.supports_tensor
                || !model.hidden_size.is_multiple_of(k)
                || !model.num_key_value_heads.is_multiple_of(k)
            {
                return false;
            }
        }
        if upto == Stage::Tensor {
            return true;
        }
        if !ring.iter().all(|&v| {
            self.nodes[v]
                .backends
                .iter()
                .any(|b| model.backends.contains(b))
        }) {
            return false;
        }
        if upto == Stage::Backend {
            return true;
        }
        // JACCL: Metal and RDMA on every node, a ring of one too; RDMA links between pairs.
        if req.backend == CollectiveBackend::Jaccl {
            for &a in ring {
                let node = self.nodes[a];
                if !node.rdma_enabled || !node.backends.contains(&ComputeBackend::MlxMetal) {
                    return false;
                }
                for &b in ring {
                    if a != b && !self.rdma.contains(&(a, b)) {
                        return false;
                    }
                }
            }
        }
        true
    }

    /// The expected ring (ids, from the smallest) or the expected error code.
    fn expected(&self) -> Result<Vec<String>, &'static str> {
        let n = self.nodes.len();
        let cycles = self.cycles();
        let leaf: Vec<bool> = (0..n)
            .map(|v| self.ip.iter().filter(|(f, _)| *f == v).count() <= 1)
            .collect();
        let download: Vec<u64> = self
            .nodes
            .iter()
            .map(|node| {
                let d = node.download.get("m").copied().unwrap_or(0.0);
                (d.clamp(0.0, 1.0) * 1_000_000.0).round() as u64
            })
            .collect();
        let qualifying: Vec<&Vec<usize>> = cycles
            .iter()
            .filter(|c| self.passes(c, Stage::Rdma))
            .collect();
        if qualifying.is_empty() {
            for (stage, code) in [
                (Stage::Structure, "no_ring"),
                (Stage::Memory, "no_ring_with_enough_memory"),
                (
                    Stage::Tensor,
                    if self.input.model.supports_tensor {
                        "tensor_indivisible"
                    } else {
                        "tensor_not_supported"
                    },
                ),
                (Stage::Backend, "backend_unsupported"),
            ] {
                if !cycles.iter().any(|c| self.passes(c, stage)) {
                    return Err(code);
                }
            }
            return Err("no_rdma_ring");
        }
        // Preference positions: leaf, download, memory (descending), then id.
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&v| {
            (
                !leaf[v],
                std::cmp::Reverse(download[v]),
                std::cmp::Reverse(self.nodes[v].ram_available),
                v,
            )
        });
        let mut position = vec![0; n];
        for (p, &v) in order.iter().enumerate() {
            position[v] = p;
        }
        let key = |c: &Vec<usize>| {
            let score = (
                c.iter().any(|&v| leaf[v]),
                c.iter().map(|&v| u128::from(download[v])).sum::<u128>(),
                c.iter()
                    .map(|&v| u128::from(self.nodes[v].ram_available))
                    .sum::<u128>(),
            );
            let mut seq: Vec<usize> = c.iter().map(|&v| position[v]).collect();
            let first = seq.iter().enumerate().min_by_key(|(_, p)| **p).unwrap().0;
            seq.rotate_left(first);
            (std::cmp::Reverse(score), seq)
        };
        // The best ring of the smallest size; when it cannot hold its layer split because a
        // node is short of memory, the best of the next size, and so on (the first error
        // stands when none holds it).
        let sizes: BTreeSet<usize> = qualifying.iter().map(|c| c.len()).collect();
        let mut first_error = None;
        for size in sizes {
            let best = qualifying
                .iter()
                .filter(|c| c.len() == size)
                .min_by_key(|c| key(c))
                .unwrap();
            match self.split_error(best) {
                None => return Ok(best.iter().map(|&v| self.nodes[v].id.clone()).collect()),
                Some("node_short_of_memory") => {
                    first_error.get_or_insert("node_short_of_memory");
                }
                Some(code) => return Err(first_error.unwrap_or(code)),
            }
        }
        Err(first_error.expect("a split error"))
    }

    /// Why `ring` (from its smallest id) cannot hold its layer split, if it cannot.
    fn split_error(&self, ring: &[usize]) -> Option<&'static str> {
        let model = &self.input.model;
        let k = ring.len();
        let tensor = k > 1 && self.input.request.sharding == Sharding::Tensor;
        if model.n_layers == 0 || (!tensor && (model.n_layers as usize) < k) {
            return Some("too_few_layers");
        }
        let shares: Vec<(u128, u128)> = if tensor {
            vec![(1, k as u128); k]
        } else {
            let nodes: Vec<&NodeProfile> = ring.iter().map(|&v| self.nodes[v]).collect();
            placement::pipeline_split::pipeline_split(&nodes, model)
                .unwrap()
                .into_iter()
                .map(|c| (u128::from(c), u128::from(model.n_layers)))
                .collect()
        };
        let short = ring.iter().zip(shares).any(|(&v, (parts, of))| {
            u128::from(model.storage_bytes) * parts > u128::from(self.nodes[v].ram_available) * of
        });
        short.then_some("node_short_of_memory")
    }
}

/// Soundness of one placement, and agreement with the reference.
fn check_placement(input: &Input) -> Result<(), TestCaseError> {
    let input = input.clone();
    let result = place(&input);
    // Accelerated nodes first: the reference answers for the first of placement's GPU-first
    // attempts that places (the ring chosen there is still checked against the reference),
    // else for the input as it is.
    let gpu_first = placement::accel::gpu_first_attempts(&input)
        .into_iter()
        .find(|attempt| place(attempt).is_ok());
    let expected = match &gpu_first {
        Some(subset) => Reference::new(subset).expected(),
        None => Reference::new(&input).expected(),
    };
    match (&result, &expected) {
        (Ok(p), Ok(ring)) => {
            let ids: Vec<String> = p.ranks.iter().map(|r| r.node.clone()).collect();
            prop_assert_eq!(&ids, ring);
        }
        // The reference checks the layer split too (and tries larger rings as placement
        // does), so only the neighbour-link check is left to fail after it.
        (Err(e), Ok(_)) => prop_assert!(
            matches!(e, PlaceError::NeighbourUnreachable { .. }),
            "ring choice and layer split should have succeeded, got {e}"
        ),
        (Err(e), Err(code)) => prop_assert_eq!(e.code(), *code),
        (Ok(p), Err(code)) => prop_assert!(false, "expected {code}, got {p:?}"),
    }
    let Ok(p) = result else { return Ok(()) };
    let model = &input.model;
    let by_id: BTreeMap<&str, &NodeProfile> =
        input.nodes.iter().map(|n| (n.id.as_str(), n)).collect();
    let k = p.ranks.len();
    // A real directed cycle, starting at its smallest id, with distinct nodes.
    let ids: Vec<&str> = p.ranks.iter().map(|r| r.node.as_str()).collect();
    prop_assert_eq!(ids.iter().collect::<BTreeSet<_>>().len(), k);
    prop_assert_eq!(Some(&ids[0]), ids.iter().min());
    if k > 1 {
        for r in 0..k {
            let (from, to) = (ids[r], ids[(r + 1) % k]);
            prop_assert!(input
                .edges
                .iter()
                .any(|e| e.from == from && e.to == to && matches!(e.link, Link::Ip(_))));
        }
    }
    // Layers: contiguous and covering for pipeline, all for tensor.
    match p.sharding {
        Sharding::Pipeline => {
            let mut next = 0;
            for r in &p.ranks {
                prop_assert_eq!(r.start_layer, next);
                prop_assert!(r.end_layer > r.start_layer);
                next = r.end_layer;
            }
            prop_assert_eq!(next, model.n_layers);
        }
        Sharding::Tensor => {
            prop_assert!(k > 1);
            prop_assert!(p
                .ranks
                .iter()
                .all(|r| (r.start_layer, r.end_layer) == (0, model.n_layers)));
        }
    }
    // Nobody holds more than it can.
    for r in &p.ranks {
        let node = by_id[r.node.as_str()];
        let (parts, of) = match p.sharding {
            Sharding::Pipeline => (
                u128::from(r.end_layer - r.start_layer),
                u128::from(model.n_layers),
            ),
            Sharding::Tensor => (1, k as u128),
        };
        prop_assert!(
            u128::from(model.storage_bytes) * parts <= u128::from(node.ram_available) * of
        );
    }
    // Hosts: one per rank, self at 0.0.0.0, neighbours at an address of theirs.
    if p.backend == CollectiveBackend::Ring {
        for (r, rank) in p.ranks.iter().enumerate() {
            prop_assert_eq!(rank.hosts.len(), k);
            prop_assert_eq!(&rank.hosts[r], &format!("0.0.0.0:{}", p.port));
            for (j, host) in rank.hosts.iter().enumerate() {
                let neighbour = k > 1 && (j == (r + 1) % k || j == (r + k - 1) % k);
                if j != r && !neighbour {
                    prop_assert_eq!(host.as_str(), "198.51.100.1:0");
                }
                if j != r && neighbour {
                    let ip = host.rsplit_once(':').unwrap().0;
                    prop_assert!(input.edges.iter().any(|e| e.from == ids[r]
                        && e.to == ids[j]
                        && e.link == Link::Ip(ip.parse().unwrap())));
                }
            }
        }
    }
    Ok(())
}

/// Clusters where multi-node rings are the rule: symmetric links, CPU everywhere, pipeline
/// over the ring backend, at least two nodes.
fn multi_node_cluster() -> impl Strategy<Value = Input> {
    cluster().prop_map(|mut input| {
        for node in &mut input.nodes {
            if !node.backends.contains(&ComputeBackend::MlxCpu) {
                node.backends.push(ComputeBackend::MlxCpu);
            }
        }
        input.model.backends = vec![ComputeBackend::MlxCpu];
        let mut reverse: Vec<Edge> = input
            .edges
            .iter()
            .filter_map(|e| match e.link {
                Link::Ip(_) => {
                    let to = input.nodes.iter().find(|n| n.id == e.from)?;
                    Some(Edge {
                        from: e.to.clone(),
                        to: e.from.clone(),
                        link: Link::Ip(to.interfaces[0].ip),
                    })
                }
                Link::Rdma(_) => None,
            })
            .collect();
        input.edges.append(&mut reverse);
        input.request.min_nodes = input.request.min_nodes.max(2);
        input.request.sharding = Sharding::Pipeline;
        input.request.backend = CollectiveBackend::Ring;
        input.request.required_nodes.clear();
        input
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn shuffling_never_changes_the_output(
        input in cluster(),
        node_keys in prop::collection::vec(any::<u32>(), 1..8),
        edge_keys in prop::collection::vec(any::<u32>(), 1..80),
        iface_keys in prop::collection::vec(any::<u32>(), 1..4),
    ) {
        let mut shuffled = input.clone();
        shuffled.nodes = permute(&input.nodes, &node_keys);
        for node in &mut shuffled.nodes {
            node.interfaces = permute(&node.interfaces, &iface_keys);
        }
        shuffled.edges = permute(&input.edges, &edge_keys);
        prop_assert_eq!(output_bytes(&input), output_bytes(&shuffled));
    }

    #[test]
    fn placements_are_sound_and_match_the_reference(input in cluster()) {
        check_placement(&input)?;
    }

    #[test]
    fn multi_node_placements_are_sound_and_match_the_reference(input in multi_node_cluster()) {
        check_placement(&input)?;
    }

    #[test]
    fn the_cli_never_panics_on_arbitrary_text(text in ".{0,200}") {
        let (out, code) = cli::run(&text);
        prop_assert!(code == 0 || code == 2);
        let json: serde_json::Value = serde_json::from_str(&out).unwrap();
        prop_assert!(json["ok"].is_boolean());
    }

    #[test]
    fn the_cli_never_panics_on_damaged_input(input in cluster(), cut in any::<prop::sample::Index>(), junk in "[\\[\\]{}\",:0-9a-z-]{0,3}") {
        let text = serde_json::to_string(&input).unwrap();
        let at = cut.index(text.len() + 1);
        let at = (0..=at).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
        let damaged = format!("{}{}{}", &text[..at], junk, &text[(at + 1).min(text.len())..]);
        let (out, code) = cli::run(&damaged);
        prop_assert!(code == 0 || code == 2);
        let json: serde_json::Value = serde_json::from_str(&out).unwrap();
        if code == 2 {
            prop_assert_eq!(&json["error"]["code"], "invalid_input");
        }
        // The undamaged document always parses.
        let (_, code) = cli::run(&text);
        prop_assert_eq!(code, 0);
    }
}
