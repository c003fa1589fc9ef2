//! Choice of the ring: the smallest directed cycle that qualifies, found by a bounded search.
//!
//! # Semantics (exo's, with one change)
//! Candidate rings are directed cycles of the IP topology (a single node is a ring of one). A
//! ring qualifies when it has at least `min_nodes` nodes, contains every required node, its
//! nodes' summed `ram_available` holds the model, and, on more than one node: for tensor
//! sharding the model supports it and the size divides `hidden_size` and
//! `num_key_value_heads`; for JACCL every node has RDMA enabled and every ordered pair an RDMA
//! link. Every node of any ring must offer one of the model's compute backends. Among the
//! qualifying rings of the smallest size, placement prefers, in order: a ring containing a
//! leaf (a node with at most one distinct successor), the largest summed download progress of
//! the model, the largest summed free memory, and last the smallest canonical sequence of node
//! ids (see below), which makes the choice a total order.
//!
//! The change from exo: exo keeps the smallest size that passes the memory and tensor filters
//! and only then filters by backend and RDMA, so it fails when a larger ring would have worked.
//! Here every filter is part of "qualifies", so the smallest ring that can actually run is
//! chosen. When nothing qualifies, the error names the first filter, in the order above, that
//! leaves no ring (see [`choose_ring`]).
//!
//! # Canonical ring order
//! A ring is written starting at its smallest node id and following its edges: rank `r`
//! verified an IP link to rank `r + 1`, and the last rank one to rank 0. When a set of nodes
//! forms several directed cycles (a full mesh of three nodes has two), the lexicographically
//! smallest sequence of ids wins the tie.
//!
//! # Cost
//! exo lists every simple cycle of the graph, which grows exponentially with the number of
//! nodes. This search instead tries ring sizes upward from the smallest one that could hold
//! the model (the fewest largest-memory nodes whose memory adds up to it) and stops at the
//! first size with a qualifying ring. For one size `k` it walks simple paths from each start
//! node `s` through nodes with larger ids only (so each cycle is seen once), depth-first,
//! closing at depth `k`; without pruning that costs `O(n · d^(k−1))` for `n` nodes of out-degree
//! `d`, polynomial in `n` for a fixed `k` (the ring size the model needs, not the cluster size).
//! Branch and bound keeps it far below that: a branch is dropped when it cannot get back to `s`
//! in the steps left (BFS distances), cannot reach the memory needed or include the required
//! nodes, or cannot beat the best ring found so far (an upper bound from the best remaining
//! nodes). Successors are tried best first, so the best ring is found early and the rest is
//! pruned: a 64-node full mesh costs `O(n² · k)` steps, a bidirectional ring `O(n² · k)`
//! (each start has two arcs). Preparing the bounds costs `O(n³)` once per search.
//!
//! Because the general problem (a best `k`-cycle under a memory sum) is NP-hard, the search
//! also counts its steps against [`SEARCH_BUDGET`]. Past the budget it keeps the best ring found
//! so far, or fails with `ring_search_exhausted` if it found none. Steps, not time, are
//! counted, so every node stops at the same point and still agrees.

use crate::error::PlaceError;
use crate::input::Input;
use crate::request::{CollectiveBackend, Sharding};
use crate::topology::Topology;
use std::collections::VecDeque;

/// Most search steps (path extensions tried) of one placement, all sizes and error
/// attribution together. At about 20 ns a step this bounds a placement to tens of milliseconds.
pub const SEARCH_BUDGET: u64 = 2_000_000;

/// The preference of a ring of a given size, compared field by field (larger is better).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Score {
    leaf: bool,
    download: u128,
    memory: u128,
}

/// Per-node values the preference sums.
struct NodeScores {
    memory: Vec<u64>,
    download: Vec<u64>,
    leaf: Vec<bool>,
}

/// The tensor rule: which sizes above one may run tensor-parallel.
#[derive(Clone, Copy)]
struct TensorRule {
    supports: bool,
    hidden_size: u32,
    kv_heads: u32,
}

/// What a ring must satisfy; one stage of the filters.
#[derive(Clone)]
struct Filters {
    min_size: usize,
    required: Vec<usize>,
    memory_needed: Option<u64>,
    tensor: Option<TensorRule>,
    /// Nodes that may be in a ring of any size (the compute-backend filter).
    node_ok: Vec<bool>,
    /// JACCL: on more than one node, RDMA on every node and between every ordered pair.
    rdma: bool,
}

impl Filters {
    fn size_allowed(&self, k: usize) -> bool {
        if k == 1 {
            return true;
        }
        match self.tensor {
            None => true,
            Some(rule) => {
                let k = k as u64;
                rule.supports
                    && u64::from(rule.hidden_size) % k == 0
                    && u64::from(rule.kv_heads) % k == 0
            }
        }
    }
}

/// The outcome of one search.
enum Search {
    Found(Vec<usize>),
    NotFound,
    Exhausted,
}

/// Bounds for walks that start at one node `s`.
struct StartInfo {
    /// Nodes that may follow `s` in its cycles: larger index, eligible.
    is_candidate: Vec<bool>,
    /// Steps from each node back to `s` through candidates (`usize::MAX` if unreachable).
    distance_to_start: Vec<usize>,
    /// `top_memory[r]`: the sum of the `r` largest candidate memories.
    top_memory: Vec<u128>,
    /// `top_download[r]`: the sum of the `r` largest candidate download progresses.
    top_download: Vec<u128>,
    any_leaf: bool,
}

/// Sums of the largest values: `result[r]` adds the `r` largest (sums of `u64` fit `u128`).
fn prefix_sums_descending(mut values: Vec<u64>) -> Vec<u128> {
    values.sort_unstable_by(|a, b| b.cmp(a));
    let mut sums = Vec::with_capacity(values.len() + 1);
    let mut total = 0u128;
    sums.push(0);
    for v in values {
        total += u128::from(v);
        sums.push(total);
    }
    sums
}

struct Searcher<'t, 'a> {
    topo: &'t Topology<'a>,
    scores: &'t NodeScores,
    filters: &'t Filters,
    /// Successors of each node, best first (leaf, download, memory, then id).
    ordered_successors: Vec<Vec<usize>>,
    is_required: Vec<bool>,
    /// Eligible in rings of more than one node.
    multi_ok: Vec<bool>,
    starts: Vec<Option<StartInfo>>,
    first_only: bool,
    budget: &'t mut u64,
}

/// The state of the depth-first walk for one size and one start.
struct Walk {
    k: usize,
    start: usize,
    path: Vec<usize>,
    in_path: Vec<bool>,
    memory: u128,
    download: u128,
    leaf: bool,
    required_left: usize,
    best: Option<(Score, Vec<usize>)>,
    exhausted: bool,
    done: bool,
}

impl<'t, 'a> Searcher<'t, 'a> {
    fn new(
        topo: &'t Topology<'a>,
        scores: &'t NodeScores,
        filters: &'t Filters,
        first_only: bool,
        budget: &'t mut u64,
    ) -> Self {
        let n = topo.len();
        let quality = |v: usize| {
            (
                std::cmp::Reverse(scores.leaf[v]),
                std::cmp::Reverse(scores.download[v]),
                std::cmp::Reverse(scores.memory[v]),
                v,
            )
        };
        let ordered_successors = topo
            .successors
            .iter()
            .map(|succ| {
                let mut succ = succ.clone();
                succ.sort_by_key(|&v| quality(v));
                succ
            })
            .collect();
        let mut is_required = vec![false; n];
        for &r in &filters.required {
            is_required[r] = true;
        }
        let multi_ok = (0..n)
            .map(|v| filters.node_ok[v] && (!filters.rdma || topo.nodes[v].rdma_enabled))
            .collect();
        Searcher {
            topo,
            scores,
            filters,
            ordered_successors,
            is_required,
            multi_ok,
            starts: (0..n).map(|_| None).collect(),
            first_only,
            budget,
        }
    }

    fn run(&mut self) -> Search {
        let n = self.topo.len();
        let k_low = self.filters.min_size.max(self.filters.required.len()).max(1);
        if k_low > n {
            return Search::NotFound;
        }
        if k_low == 1 {
            if let Some(node) = self.best_single() {
                return Search::Found(vec![node]);
            }
            if *self.budget == 0 {
                return Search::Exhausted;
            }
        }
        // The fewest multi-eligible nodes whose memory could hold the model.
        let k_memory = match self.filters.memory_needed {
            None => 2,
            Some(needed) => {
                let memories: Vec<u64> = (0..n)
                    .filter(|&v| self.multi_ok[v])
                    .map(|v| self.scores.memory[v])
                    .collect();
                let sums = prefix_sums_descending(memories);
                match sums.iter().position(|&s| s >= u128::from(needed)) {
                    Some(k) => k.max(2),
                    None => return Search::NotFound,
                }
            }
        };
        let first_start_bound = self.filters.required.first().copied().unwrap_or(n - 1);
        for k in k_low.max(k_memory)..=n {
            if !self.filters.size_allowed(k) {
                continue;
            }
            let mut best: Option<(Score, Vec<usize>)> = None;
            for start in 0..=first_start_bound {
                if !self.multi_ok[start] {
                    continue;
                }
                let mut walk = Walk {
                    k,
                    start,
                    path: vec![start],
                    in_path: vec![false; n],
                    memory: u128::from(self.scores.memory[start]),
                    download: u128::from(self.scores.download[start]),
                    leaf: self.scores.leaf[start],
                    required_left: self.filters.required.len()
                        - usize::from(self.is_required[start]),
                    best: best.take(),
                    exhausted: false,
                    done: false,
                };
                walk.in_path[start] = true;
                self.prepare_start(start);
                self.extend(&mut walk);
                best = walk.best;
                if walk.exhausted {
                    return match best {
                        Some((_, ring)) => Search::Found(ring),
                        None => Search::Exhausted,
                    };
                }
                if walk.done {
                    break;
                }
            }
            if let Some((_, ring)) = best {
                return Search::Found(ring);
            }
        }
        Search::NotFound
    }

    /// The best ring of one node, if any qualifies.
    fn best_single(&mut self) -> Option<usize> {
        let mut best: Option<(Score, usize)> = None;
        for v in 0..self.topo.len() {
            if *self.budget == 0 {
                return None;
            }
            *self.budget -= 1;
            let f = self.filters;
            if !f.node_ok[v] || f.required.iter().any(|&r| r != v) {
                continue;
            }
            if f.memory_needed.is_some_and(|need| self.scores.memory[v] < need) {
                continue;
            }
            let score = Score {
                leaf: self.scores.leaf[v],
                download: u128::from(self.scores.download[v]),
                memory: u128::from(self.scores.memory[v]),
            };
            // Strictly better only: on a tie the smaller id (seen first) stays.
            if best.is_none_or(|(b, _)| score > b) {
                best = Some((score, v));
            }
        }
        best.map(|(_, v)| v)
    }

    fn prepare_start(&mut self, start: usize) {
        if self.starts[start].is_some() {
            return;
        }
        let n = self.topo.len();
        let is_candidate: Vec<bool> = (0..n).map(|v| v > start && self.multi_ok[v]).collect();
        // Backward BFS from `start` over candidates: distance from each node to `start`.
        let mut distance = vec![usize::MAX; n];
        distance[start] = 0;
        let mut queue = VecDeque::from([start]);
        while let Some(x) = queue.pop_front() {
            for u in 0..n {
                if is_candidate[u] && distance[u] == usize::MAX && self.topo.has_ip_edge(u, x) {
                    distance[u] = distance[x] + 1;
                    queue.push_back(u);
                }
            }
        }
        let candidates: Vec<usize> = (0..n).filter(|&v| is_candidate[v]).collect();
        let info = StartInfo {
            top_memory: prefix_sums_descending(
                candidates.iter().map(|&v| self.scores.memory[v]).collect(),
            ),
            top_download: prefix_sums_descending(
                candidates.iter().map(|&v| self.scores.download[v]).collect(),
            ),
            any_leaf: candidates.iter().any(|&v| self.scores.leaf[v]),
            is_candidate,
            distance_to_start: distance,
        };
        self.starts[start] = Some(info);
    }

    fn extend(&mut self, walk: &mut Walk) {
        let depth = walk.path.len();
        let last = walk.path[depth - 1];
        let filters = self.filters;
        if depth == walk.k {
            if !self.topo.has_ip_edge(last, walk.start) || walk.required_left > 0 {
                return;
            }
            if filters
                .memory_needed
                .is_some_and(|need| walk.memory < u128::from(need))
            {
                return;
            }
            let score = Score {
                leaf: walk.leaf,
                download: walk.download,
                memory: walk.memory,
            };
            let better = match &walk.best {
                None => true,
                Some((best, ring)) => score > *best || (score == *best && walk.path < *ring),
            };
            if better {
                walk.best = Some((score, walk.path.clone()));
                walk.done = self.first_only;
            }
            return;
        }
        let successors = std::mem::take(&mut self.ordered_successors[last]);
        for &v in &successors {
            if walk.done || walk.exhausted {
                break;
            }
            let info = self.starts[walk.start].as_ref().expect("prepared start");
            if !info.is_candidate[v] || walk.in_path[v] {
                continue;
            }
            if *self.budget == 0 {
                walk.exhausted = true;
                break;
            }
            *self.budget -= 1;
            // Steps from v back to the start: k - depth.
            if info.distance_to_start[v] > walk.k - depth {
                continue;
            }
            let slots_left = walk.k - depth - 1;
            if slots_left >= info.top_memory.len() {
                continue;
            }
            let required_left = walk.required_left - usize::from(self.is_required[v]);
            if required_left > slots_left {
                continue;
            }
            let memory = u128::from(self.scores.memory[v]);
            let download = u128::from(self.scores.download[v]);
            let memory_bound = walk.memory + memory + info.top_memory[slots_left];
            if filters
                .memory_needed
                .is_some_and(|need| memory_bound < u128::from(need))
            {
                continue;
            }
            if filters.rdma
                && walk
                    .path
                    .iter()
                    .any(|&u| !self.topo.has_rdma_edge(u, v) || !self.topo.has_rdma_edge(v, u))
            {
                continue;
            }
            if let Some((best, ring)) = &walk.best {
                let bound = Score {
                    leaf: walk.leaf || self.scores.leaf[v] || (slots_left > 0 && info.any_leaf),
                    download: walk.download + download + info.top_download[slots_left],
                    memory: memory_bound,
                };
                if bound < *best {
                    continue;
                }
                // At best a tie: only a lexicographically smaller sequence could still win.
                if bound == *best {
                    let prefix_cmp = walk.path.as_slice().cmp(&ring[..depth]);
                    if prefix_cmp == std::cmp::Ordering::Greater
                        || (prefix_cmp == std::cmp::Ordering::Equal && v > ring[depth])
                    {
                        continue;
                    }
                }
            }
            walk.path.push(v);
            walk.in_path[v] = true;
            walk.memory += memory;
            walk.download += download;
            let leaf_before = walk.leaf;
            walk.leaf |= self.scores.leaf[v];
            walk.required_left = required_left;
            self.extend(walk);
            walk.required_left += usize::from(self.is_required[v]);
            walk.leaf = leaf_before;
            walk.download -= download;
            walk.memory -= memory;
            walk.in_path[v] = false;
            walk.path.pop();
        }
        self.ordered_successors[last] = successors;
    }
}

/// Chooses the ring for `input`: node indices of `topo` in rank order.
///
/// When no ring qualifies, the stages of the filters are searched again one by one, in the
/// order topology (size and required nodes), memory, tensor, compute backend, RDMA, and the
/// first stage that leaves no ring names the error.
pub(crate) fn choose_ring(topo: &Topology, input: &Input) -> Result<Vec<usize>, PlaceError> {
    let n = topo.len();
    let model = &input.model;
    let request = &input.request;
    let mut required = Vec::new();
    for id in &request.required_nodes {
        match topo.index_of(id) {
            Some(i) => required.push(i),
            None => {
                return Err(PlaceError::NoRing(format!(
                    "required node {id} is not in the cluster; wait until it has joined, or \
                     remove it from required_nodes"
                )))
            }
        }
    }
    required.sort_unstable();
    required.dedup();
    let scores = NodeScores {
        memory: topo.nodes.iter().map(|node| node.ram_available).collect(),
        download: topo
            .nodes
            .iter()
            .map(|node| node.download_millionths(&model.id))
            .collect(),
        leaf: (0..n).map(|v| topo.is_leaf(v)).collect(),
    };
    let min_nodes = request.min_nodes.max(1);

    let mut stages: Vec<(Filters, PlaceError)> = Vec::new();
    let mut filters = Filters {
        min_size: min_nodes as usize,
        required: required.clone(),
        memory_needed: None,
        tensor: None,
        node_ok: vec![true; n],
        rdma: false,
    };
    let required_text = if request.required_nodes.is_empty() {
        String::new()
    } else {
        let mut ids = request.required_nodes.clone();
        ids.sort();
        ids.dedup();
        format!(" containing {}", ids.join(", "))
    };
    let no_ring = if (min_nodes as usize) > n {
        format!(
            "the cluster has {n} node(s) but min_nodes is {min_nodes}; lower min_nodes or add nodes"
        )
    } else {
        format!(
            "no directed cycle of at least {min_nodes} node(s){required_text} exists in the \
             topology; check that these nodes verified links to each other, or lower min_nodes"
        )
    };
    stages.push((filters.clone(), PlaceError::NoRing(no_ring)));

    filters.memory_needed = Some(model.storage_bytes);
    stages.push((
        filters.clone(),
        PlaceError::NoRingWithEnoughMemory {
            needed: model.storage_bytes,
            available: scores.memory.iter().fold(0u64, |a, &m| a.saturating_add(m)),
            min_nodes,
        },
    ));

    if request.sharding == Sharding::Tensor {
        filters.tensor = Some(TensorRule {
            supports: model.supports_tensor,
            hidden_size: model.hidden_size,
            kv_heads: model.num_key_value_heads,
        });
        let error = if model.supports_tensor {
            PlaceError::TensorIndivisible {
                hidden_size: model.hidden_size,
                kv_heads: model.num_key_value_heads,
            }
        } else {
            PlaceError::TensorNotSupported {
                model: model.id.clone(),
            }
        };
        stages.push((filters.clone(), error));
    }

    filters.node_ok = topo
        .nodes
        .iter()
        .map(|node| node.backends.iter().any(|b| model.backends.contains(b)))
        .collect();
    let mut backends: Vec<String> = model
        .backends
        .iter()
        .map(|b| {
            serde_json::to_value(b)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default()
        })
        .collect();
    backends.sort();
    backends.dedup();
    stages.push((
        filters.clone(),
        PlaceError::BackendUnsupported {
            model: model.id.clone(),
            backends: if backends.is_empty() {
                "(none)".into()
            } else {
                backends.join(", ")
            },
        },
    ));

    if request.backend == CollectiveBackend::Jaccl {
        filters.rdma = true;
        stages.push((filters.clone(), PlaceError::NoRdmaRing));
    }

    let mut budget = SEARCH_BUDGET;
    let full = &stages.last().expect("at least one stage").0;
    match Searcher::new(topo, &scores, full, false, &mut budget).run() {
        Search::Found(ring) => return Ok(ring),
        Search::Exhausted => return Err(PlaceError::RingSearchExhausted { budget: SEARCH_BUDGET }),
        Search::NotFound => {}
    }
    for (stage, error) in &stages {
        match Searcher::new(topo, &scores, stage, true, &mut budget).run() {
            Search::Found(_) => {}
            Search::NotFound => return Err(error.clone()),
            Search::Exhausted => {
                return Err(PlaceError::RingSearchExhausted { budget: SEARCH_BUDGET })
            }
        }
    }
    // The last stage is the full filter set, which found nothing, so the loop returned.
    Err(stages.pop().expect("at least one stage").1)
}
