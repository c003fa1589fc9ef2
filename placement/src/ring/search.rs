//! The bounded branch-and-bound search for the best ring of each size (see [`super`] for the
//! semantics and the cost).

use crate::node::ComputeBackend;
use crate::topology::Topology;
use std::collections::VecDeque;

/// Most work units (path extensions tried plus nodes looked at by the bounds) of one
/// placement, all sizes and error attribution together. At about 4 ns a unit on the 2-core
/// build machine, this bounds a placement to about a tenth of a second.
pub const SEARCH_BUDGET: u64 = 25_000_000;

/// Most work units spent on one ring size. A size whose search hits it without finding a
/// ring is skipped (a ring of that size may exist but would cost too much to find), and the
/// next size is tried.
pub const SIZE_BUDGET: u64 = 5_000_000;

/// The preference of a ring of a given size, compared field by field (larger is better).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Score {
    leaf: bool,
    download: u128,
    memory: u128,
}

/// Per-node values the preference sums, by topology index.
pub(super) struct NodeScores {
    pub(super) memory: Vec<u64>,
    pub(super) download: Vec<u64>,
    pub(super) leaf: Vec<bool>,
}

/// The tensor rule: which sizes above one may run tensor-parallel.
#[derive(Clone)]
pub(super) struct TensorRule {
    pub(super) supports: bool,
    pub(super) hidden_size: u32,
    pub(super) kv_heads: u32,
    /// The model card's further divisors.
    pub(super) divisors: Vec<u32>,
}

/// What a ring must satisfy; one stage of the filters.
#[derive(Clone)]
pub(super) struct Filters {
    pub(super) min_size: usize,
    /// Required nodes, by topology index.
    pub(super) required: Vec<usize>,
    pub(super) memory_needed: Option<u64>,
    pub(super) tensor: Option<TensorRule>,
    /// Nodes that may be in a ring of any size (the compute-backend filter), by topology index.
    pub(super) node_ok: Vec<bool>,
    /// JACCL: Metal and RDMA on every node and, on more than one node, RDMA between every
    /// ordered pair.
    pub(super) rdma: bool,
}

impl Filters {
    pub(super) fn size_allowed(&self, k: usize) -> bool {
        if k == 1 {
            return true;
        }
        match &self.tensor {
            None => true,
            Some(rule) => {
                let k = k as u64;
                rule.supports
                    && u64::from(rule.hidden_size) % k == 0
                    && u64::from(rule.kv_heads) % k == 0
                    && rule.divisors.iter().all(|&d| u64::from(d) % k == 0)
            }
        }
    }
}

/// The outcome of one search: a ring as topology indices in search order (from its most
/// preferred node), or why there is none.
pub(super) enum Search {
    Found(Vec<usize>),
    NotFound,
    Exhausted,
}

/// The sum of the `count` largest `values` over `candidates` (positions, largest value
/// first) that `usable` accepts; `None` when fewer than `count` are. The walk passes the nodes
/// that are not in the path and lie within reach of the steps left, so the bound does not count
/// a node twice or one the ring cannot get to and back from in time.
///
/// Adds the number of candidates it looked at to `work`, which the search budget counts.
fn top_usable(
    candidates: &[usize],
    values: &[u64],
    count: usize,
    usable: impl Fn(usize) -> bool,
    work: &mut u64,
) -> Option<u128> {
    let mut sum = 0u128;
    let mut taken = 0;
    for &v in candidates {
        if taken == count {
            break;
        }
        *work += 1;
        if !usable(v) {
            continue;
        }
        sum += u128::from(values[v]);
        taken += 1;
    }
    (taken == count).then_some(sum)
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

/// Breadth-first distances between every pair of eligible positions: `O(n · (n + e))`.
/// A complete graph (every LAN behind one switch) skips the searches: every distance is 1.
fn all_pair_distances(successors: &[Vec<usize>], eligible: &[bool]) -> Vec<u16> {
    let n = successors.len();
    let members = eligible.iter().filter(|&&e| e).count();
    let complete = (0..n)
        .filter(|&v| eligible[v])
        .all(|v| successors[v].iter().filter(|&&w| eligible[w]).count() + 1 == members);
    if complete {
        return (0..n * n)
            .map(|i| if i / n == i % n { 0 } else { 1 })
            .collect();
    }
    let mut distance = vec![u16::MAX; n * n];
    let mut queue = VecDeque::new();
    for from in (0..n).filter(|&v| eligible[v]) {
        let row = &mut distance[from * n..(from + 1) * n];
        row[from] = 0;
        queue.clear();
        queue.push_back(from);
        while let Some(x) = queue.pop_front() {
            for &y in &successors[x] {
                if eligible[y] && row[y] == u16::MAX {
                    row[y] = row[x].saturating_add(1);
                    queue.push_back(y);
                }
            }
        }
    }
    distance
}

/// Bounds for walks that start at one position `s`.
struct StartInfo {
    /// Steps from each position back to `s` through positions after it (`usize::MAX` if none).
    distance_to_start: Vec<usize>,
    /// Positions after `s` that may be in a ring, most memory first.
    by_memory: Vec<usize>,
    /// The same, most downloaded first.
    by_download: Vec<usize>,
    /// Whether any of them is a leaf.
    any_leaf: bool,
}

/// The search works on *positions*: nodes numbered in preference order (leaf first, then
/// most downloaded, most memory, smallest id). A cycle is walked from its first position
/// through later positions only, so each directed cycle is seen once, and the walk visits
/// cycles in lexicographic order of their position sequences, which is the final tie-break:
/// the first ring found among equal scores wins, and a branch whose bound only ties the best
/// is dropped. Best-first order also finds the best ring early: on a full mesh the first walk
/// is the optimum.
pub(super) struct Searcher<'f> {
    n: usize,
    filters: &'f Filters,
    /// `node_at[position]`: the topology index.
    node_at: Vec<usize>,
    /// `edge[a * n + b]`: an IP edge from position `a` to position `b`.
    edge: Vec<bool>,
    /// `rdma[a * n + b]`: an RDMA edge from position `a` to position `b`.
    rdma: Vec<bool>,
    /// Successor positions of each position, ascending (best first).
    successors: Vec<Vec<usize>>,
    /// `distance[a * n + b]`: fewest IP hops from `a` to `b` through nodes that may be in a
    /// ring (saturating at `u16::MAX`): a lower bound for any walk, which the bounds use.
    distance: Vec<u16>,
    memory: Vec<u64>,
    download: Vec<u64>,
    leaf: Vec<bool>,
    required: Vec<bool>,
    required_count: usize,
    /// Lowest required position: every cycle containing it starts at or before it.
    first_required: Option<usize>,
    /// May be in a ring of one (compute backend, and Metal and RDMA for JACCL).
    single_ok: Vec<bool>,
    /// May be in a ring of more than one (the same; pairs need RDMA links on top).
    multi_ok: Vec<bool>,
    starts: Vec<Option<StartInfo>>,
    first_only: bool,
    /// Steps left for the whole placement.
    pub(super) budget: u64,
    /// Steps left for the current ring size (at most [`SIZE_BUDGET`]).
    size_budget: u64,
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

impl<'f> Searcher<'f> {
    pub(super) fn new(
        topo: &Topology,
        scores: &NodeScores,
        filters: &'f Filters,
        first_only: bool,
        budget: u64,
    ) -> Self {
        let n = topo.len();
        let mut node_at: Vec<usize> = (0..n).collect();
        node_at.sort_by_key(|&v| {
            (
                std::cmp::Reverse(scores.leaf[v]),
                std::cmp::Reverse(scores.download[v]),
                std::cmp::Reverse(scores.memory[v]),
                v,
            )
        });
        let mut position_of = vec![0; n];
        for (position, &v) in node_at.iter().enumerate() {
            position_of[v] = position;
        }
        let mut edge = vec![false; n * n];
        let mut rdma = vec![false; n * n];
        for a in 0..n {
            for b in 0..n {
                edge[a * n + b] = topo.has_ip_edge(node_at[a], node_at[b]);
                rdma[a * n + b] = topo.has_rdma_edge(node_at[a], node_at[b]);
            }
        }
        let successors: Vec<Vec<usize>> = (0..n)
            .map(|a| (0..n).filter(|&b| edge[a * n + b]).collect())
            .collect();
        // JACCL needs Metal and RDMA on every node, a ring of one included.
        let jaccl_ok = |v: usize| {
            let node = topo.nodes[v];
            node.rdma_enabled && node.backends.contains(&ComputeBackend::MlxMetal)
        };
        let multi_ok: Vec<bool> = node_at
            .iter()
            .map(|&v| filters.node_ok[v] && (!filters.rdma || jaccl_ok(v)))
            .collect();
        let distance = all_pair_distances(&successors, &multi_ok);
        let mut required = vec![false; n];
        for &r in &filters.required {
            required[position_of[r]] = true;
        }
        let single_ok = multi_ok.clone();
        Searcher {
            distance,
            n,
            filters,
            edge,
            rdma,
            successors,
            memory: node_at.iter().map(|&v| scores.memory[v]).collect(),
            download: node_at.iter().map(|&v| scores.download[v]).collect(),
            leaf: node_at.iter().map(|&v| scores.leaf[v]).collect(),
            first_required: required.iter().position(|&r| r),
            required_count: filters.required.len(),
            required,
            single_ok,
            multi_ok,
            node_at,
            starts: (0..n).map(|_| None).collect(),
            first_only,
            budget,
            size_budget: SIZE_BUDGET,
        }
    }

    pub(super) fn run(&mut self) -> Search {
        let n = self.n;
        let k_low = self.filters.min_size.max(self.required_count).max(1);
        if k_low > n {
            return Search::NotFound;
        }
        if k_low == 1 {
            if let Some(position) = self.best_single() {
                return Search::Found(vec![self.node_at[position]]);
            }
        }
        // The fewest multi-eligible nodes whose memory could hold the model.
        let k_memory = match self.filters.memory_needed {
            None => 2,
            Some(needed) => {
                let memories: Vec<u64> = (0..n)
                    .filter(|&v| self.multi_ok[v])
                    .map(|v| self.memory[v])
                    .collect();
                let sums = prefix_sums_descending(memories);
                match sums.iter().position(|&s| s >= u128::from(needed)) {
                    Some(k) => k.max(2),
                    None => return Search::NotFound,
                }
            }
        };
        let last_start = self.first_required.unwrap_or(n - 1);
        let mut skipped_a_size = false;
        for k in k_low.max(k_memory)..=n {
            if !self.filters.size_allowed(k) {
                continue;
            }
            self.size_budget = SIZE_BUDGET;
            let mut best: Option<(Score, Vec<usize>)> = None;
            let mut size_exhausted = false;
            for start in 0..=last_start {
                if !self.multi_ok[start] || !self.start_can_win(start, k, best.as_ref()) {
                    continue;
                }
                let mut walk = Walk {
                    k,
                    start,
                    path: vec![start],
                    in_path: vec![false; n],
                    memory: u128::from(self.memory[start]),
                    download: u128::from(self.download[start]),
                    leaf: self.leaf[start],
                    required_left: self.required_count - usize::from(self.required[start]),
                    best: best.take(),
                    exhausted: false,
                    done: false,
                };
                walk.in_path[start] = true;
                self.prepare_start(start);
                self.extend(&mut walk);
                best = walk.best;
                if walk.exhausted {
                    size_exhausted = true;
                    break;
                }
                if walk.done {
                    break;
                }
            }
            if let Some((_, ring)) = best {
                return Search::Found(ring.iter().map(|&p| self.node_at[p]).collect());
            }
            if self.budget == 0 {
                return Search::Exhausted;
            }
            skipped_a_size |= size_exhausted;
        }
        if skipped_a_size {
            Search::Exhausted
        } else {
            Search::NotFound
        }
    }

    /// Whether a ring of `k` nodes starting at `start` could still hold the model and beat
    /// `best`, counting the best later candidates whether or not a cycle joins them: an `O(n)`
    /// check that spares the `O(n²)` preparation of starts that cannot win (on a full mesh,
    /// every start after the first).
    fn start_can_win(&self, start: usize, k: usize, best: Option<&(Score, Vec<usize>)>) -> bool {
        let later = |values: &[u64]| {
            let mut top: Vec<u64> = (start + 1..self.n)
                .filter(|&v| self.multi_ok[v])
                .map(|v| values[v])
                .collect();
            if top.len() < k - 1 {
                return None;
            }
            top.sort_unstable_by(|a, b| b.cmp(a));
            Some(top[..k - 1].iter().map(|&m| u128::from(m)).sum::<u128>())
        };
        let Some(memory) = later(&self.memory) else {
            return false;
        };
        let memory = memory + u128::from(self.memory[start]);
        if self
            .filters
            .memory_needed
            .is_some_and(|need| memory < u128::from(need))
        {
            return false;
        }
        let Some((best, _)) = best else {
            return true;
        };
        let bound = Score {
            leaf: self.leaf[start] || (start + 1..self.n).any(|v| self.multi_ok[v] && self.leaf[v]),
            download: u128::from(self.download[start]) + later(&self.download).unwrap_or(0),
            memory,
        };
        bound > *best
    }

    /// The best ring of one node: the first position that qualifies.
    fn best_single(&self) -> Option<usize> {
        (0..self.n).find(|&p| {
            self.single_ok[p]
                && self.required_count <= usize::from(self.required[p])
                && self
                    .filters
                    .memory_needed
                    .is_none_or(|need| self.memory[p] >= need)
        })
    }

    fn prepare_start(&mut self, start: usize) {
        if self.starts[start].is_some() {
            return;
        }
        let n = self.n;
        let is_candidate = |v: usize| v > start && self.multi_ok[v];
        // Backward BFS from `start` over candidates: distance from each position to `start`.
        let mut distance = vec![usize::MAX; n];
        distance[start] = 0;
        let mut queue = VecDeque::from([start]);
        while let Some(x) = queue.pop_front() {
            for u in start + 1..n {
                if is_candidate(u) && distance[u] == usize::MAX && self.edge[u * n + x] {
                    distance[u] = distance[x] + 1;
                    queue.push_back(u);
                }
            }
        }
        // Only candidates that can get back to the start can be on a cycle through it.
        let candidates: Vec<usize> = (start + 1..n)
            .filter(|&v| is_candidate(v) && distance[v] != usize::MAX)
            .collect();
        let mut by_memory = candidates.clone();
        by_memory.sort_by_key(|&v| (std::cmp::Reverse(self.memory[v]), v));
        let mut by_download = candidates.clone();
        by_download.sort_by_key(|&v| (std::cmp::Reverse(self.download[v]), v));
        self.starts[start] = Some(StartInfo {
            any_leaf: candidates.iter().any(|&v| self.leaf[v]),
            distance_to_start: distance,
            by_memory,
            by_download,
        });
    }

    fn extend(&mut self, walk: &mut Walk) {
        let n = self.n;
        let depth = walk.path.len();
        let last = walk.path[depth - 1];
        let filters = self.filters;
        if depth == walk.k {
            if !self.edge[last * n + walk.start] || walk.required_left > 0 {
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
            // Walks come in lexicographic order, so only a strictly better score wins.
            if walk.best.as_ref().is_none_or(|(best, _)| score > *best) {
                walk.best = Some((score, walk.path.clone()));
                walk.done = self.first_only;
            }
            return;
        }
        let successors = std::mem::take(&mut self.successors[last]);
        for &v in &successors {
            if walk.done || walk.exhausted {
                break;
            }
            if v <= walk.start || !self.multi_ok[v] || walk.in_path[v] {
                continue;
            }
            if self.budget == 0 || self.size_budget == 0 {
                walk.exhausted = true;
                break;
            }
            self.budget -= 1;
            self.size_budget -= 1;
            let info = self.starts[walk.start].as_ref().expect("prepared start");
            // Steps from v back to the start: k - depth.
            if info.distance_to_start[v] > walk.k - depth {
                continue;
            }
            let slots_left = walk.k - depth - 1;
            let required_left = walk.required_left - usize::from(self.required[v]);
            if required_left > slots_left {
                continue;
            }
            let memory = u128::from(self.memory[v]);
            let download = u128::from(self.download[v]);
            // A later node u costs dist(v, u) steps to reach and dist(u, start) to get back.
            let steps_left = walk.k - depth;
            let in_path = &walk.in_path;
            let distance = &self.distance;
            let usable = |u: usize| {
                !in_path[u]
                    && u != v
                    && usize::from(distance[v * n + u]).saturating_add(info.distance_to_start[u])
                        <= steps_left
            };
            let mut work = 0;
            let top_memory =
                top_usable(&info.by_memory, &self.memory, slots_left, usable, &mut work);
            let memory_bound = top_memory.map(|top| walk.memory + memory + top);
            let too_little = match memory_bound {
                None => true,
                Some(bound) => filters
                    .memory_needed
                    .is_some_and(|need| bound < u128::from(need)),
            };
            let mut beaten = false;
            if let (false, Some(memory_bound), Some((best, _))) =
                (too_little, memory_bound, &walk.best)
            {
                let top_download = top_usable(
                    &info.by_download,
                    &self.download,
                    slots_left,
                    usable,
                    &mut work,
                )
                .unwrap_or(0);
                let bound = Score {
                    leaf: walk.leaf || self.leaf[v] || (slots_left > 0 && info.any_leaf),
                    download: walk.download + download + top_download,
                    memory: memory_bound,
                };
                // A later walk that only ties the best loses the tie-break.
                beaten = bound <= *best;
            }
            self.budget = self.budget.saturating_sub(work);
            self.size_budget = self.size_budget.saturating_sub(work);
            if too_little || beaten {
                continue;
            }
            if filters.rdma
                && walk
                    .path
                    .iter()
                    .any(|&u| !self.rdma[u * n + v] || !self.rdma[v * n + u])
            {
                continue;
            }
            walk.path.push(v);
            walk.in_path[v] = true;
            walk.memory += memory;
            walk.download += download;
            let leaf_before = walk.leaf;
            walk.leaf |= self.leaf[v];
            walk.required_left = required_left;
            self.extend(walk);
            walk.required_left += usize::from(self.required[v]);
            walk.leaf = leaf_before;
            walk.download -= download;
            walk.memory -= memory;
            walk.in_path[v] = false;
            walk.path.pop();
        }
        self.successors[last] = successors;
    }
}
