//! Choice of the ring: the smallest directed cycle that qualifies, found by a bounded search.
//!
//! # Semantics (exo's, with one change)
//! Candidate rings are directed cycles of the IP topology (a single node is a ring of one). A
//! ring qualifies when it has at least `min_nodes` nodes, contains every required node, its
//! nodes' summed `ram_available` holds the model, and, on more than one node, for tensor
//! sharding the model supports it and the size divides `hidden_size` and
//! `num_key_value_heads`. Every node of any ring must offer one of the model's compute
//! backends. For JACCL every node of the ring, a ring of one included, must offer the Metal
//! backend (JACCL exists only on macOS) and have RDMA enabled, and on more than one node every
//! ordered pair needs an RDMA link (exo refuses JACCL on such nodes too). Among the
//! qualifying rings of the smallest size, placement prefers, in order: a ring containing a
//! leaf (a node with at most one distinct successor), the largest summed download progress of
//! the model, the largest summed free memory. Remaining ties are broken by a total order:
//! number the nodes in *preference order* (leaves first, then most downloaded, then most free
//! memory, then smallest id; distinct ids make it total), write each ring as its sequence of
//! numbers from its smallest number along its edges, and take the lexicographically smallest.
//! (So between otherwise equal rings, the one with the better nodes wins, and between equal
//! nodes, the smaller ids.) This is also the order the search walks rings in, which is what
//! makes the tie-break free.
//!
//! The change from exo: exo keeps the smallest size that passes the memory and tensor filters
//! and only then filters by backend and RDMA, so it fails when a larger ring would have worked.
//! Here every filter is part of "qualifies", so the smallest ring that can actually run is
//! chosen. When nothing qualifies, the error names the first filter, in the order above, that
//! leaves no ring.
//!
//! A second change from exo: the layer split is checked after the ring is chosen (each node
//! must hold its share, see [`crate::split`]), and when the chosen ring fails it with
//! `node_short_of_memory` (rounding gives one node a layer too many), exo fails; here
//! placement tries the best ring of the next qualifying sizes, in order, before failing with
//! the first ring's error (`larger_ring`, called by [`crate::place()`]). A 24-node full mesh
//! of 16 GiB nodes and an 80-layer model of 11.5 × 16 GiB places on 14 nodes (12 and 13 hold
//! it in total, but give some node 7 layers, 16.1 GiB). Every retry searches under what is
//! left of the same work budget, so placement stays bounded and deterministic.
//!
//! # Canonical rank order
//! The chosen ring is then written starting at its smallest node id and following its edges:
//! rank `r` verified an IP link to rank `r + 1`, and the last rank one to rank 0.
//!
//! # Cost
//! exo lists every simple cycle of the graph, which grows exponentially with the number of
//! nodes. This search instead tries ring sizes upward from the smallest one that could hold
//! the model (the fewest largest-memory nodes whose memory adds up to it) and stops at the
//! first size with a qualifying ring. For one size `k` it walks simple paths from each start
//! node `s` through nodes later in preference order only (so each cycle is seen once),
//! depth-first, closing at depth `k`; without pruning that costs `O(n · d^(k−1))` for `n` nodes
//! of out-degree `d`: polynomial in `n` for a fixed `k` (the ring size the model needs, not the
//! cluster size), but not small. Branch and bound keeps it far below that: a branch is dropped
//! when it cannot get back to `s` in the steps left (BFS distances), cannot reach the memory
//! needed or include the required nodes, or cannot beat the best ring found so far. The
//! memory and download bounds add up the best nodes that are not on the path yet and that the
//! walk could still reach and come back from in the steps left (all-pairs BFS distances), so
//! they are tight where the topology is sparse. Successors are tried best first, so on a full
//! mesh the very first walk is the optimum and the rest is pruned at once, and starts that
//! cannot win are skipped with an `O(n)` check.
//!
//! Set-up costs `O(e log n)` to sort the input, `O(n · e)` for the all-pairs distances (skipped
//! on a complete graph) and `O(n²)` per start actually walked. Measured (see the crate docs),
//! a full mesh grows about as `n²·⁵` (64 nodes: about 2 ms) and a ring of `n` nodes about as `n²`.
//!
//! Because the general problem (a best `k`-cycle under a memory sum) is NP-hard, the search
//! also counts its work (one unit per path extension tried and per node a bound looks at):
//! at most [`SIZE_BUDGET`] per ring size and [`SEARCH_BUDGET`] in all. When a size's budget
//! runs out, the best ring found so far at that size is kept; if none was found, that size is
//! skipped and the next one tried. When the whole budget runs out without a ring, placement
//! fails with `ring_search_exhausted`. So the worst case is bounded (about a tenth of a second
//! on the 2-core build machine), the result is exact whenever the budget suffices (full
//! meshes and rings up to 256 nodes, two switches joined by two uplinks up to 32), and since
//! work, not time, is counted, every node stops at the same point and still agrees.

use crate::error::PlaceError;
use crate::input::Input;
use crate::request::{CollectiveBackend, Sharding};
use crate::topology::Topology;
use search::{Filters, NodeScores, Search, Searcher, TensorRule};

mod search;

pub use search::{SEARCH_BUDGET, SIZE_BUDGET};

/// Chooses the ring for `input`: node indices of `topo` in rank order.
///
/// When no ring qualifies, the stages of the filters are searched again one by one, in the
/// order topology (size and required nodes), memory, tensor, compute backend, RDMA, and the
/// first stage that leaves no ring names the error.
///
/// `budget` is the work the search may spend (see [`SEARCH_BUDGET`]); what it spends is taken
/// off, so that [`larger_ring`] searches on under the same bound.
pub(crate) fn choose_ring(
    topo: &Topology,
    input: &Input,
    budget: &mut u64,
) -> Result<Vec<usize>, PlaceError> {
    let (scores, stages) = stages(topo, input)?;
    let full = &stages.last().expect("at least one stage").0;
    let mut searcher = Searcher::new(topo, &scores, full, false, *budget);
    let outcome = searcher.run();
    *budget = searcher.budget;
    match outcome {
        Search::Found(ring) => return Ok(canonical_rotation(ring)),
        Search::Exhausted => {
            return Err(PlaceError::RingSearchExhausted {
                budget: SEARCH_BUDGET,
            })
        }
        Search::NotFound => {}
    }
    for (stage, error) in &stages {
        let mut searcher = Searcher::new(topo, &scores, stage, true, *budget);
        let outcome = searcher.run();
        *budget = searcher.budget;
        match outcome {
            Search::Found(_) => {}
            Search::NotFound => return Err(error.clone()),
            Search::Exhausted => {
                return Err(PlaceError::RingSearchExhausted {
                    budget: SEARCH_BUDGET,
                })
            }
        }
    }
    // The last stage is the full filter set, which found nothing, so the loop returned.
    let (_, error) = stages.into_iter().last().expect("at least one stage");
    Err(error)
}

/// The best qualifying ring of at least `min_size` nodes (in rank order), searched under
/// what is left of `budget`: the next try when the ring chosen before could not hold its
/// layer split. `None` when there is none or the budget runs out.
pub(crate) fn larger_ring(
    topo: &Topology,
    input: &Input,
    min_size: usize,
    budget: &mut u64,
) -> Option<Vec<usize>> {
    let (scores, stages) = stages(topo, input).ok()?;
    let (mut full, _) = stages.into_iter().last()?;
    full.min_size = full.min_size.max(min_size);
    let mut searcher = Searcher::new(topo, &scores, &full, false, *budget);
    let outcome = searcher.run();
    *budget = searcher.budget;
    match outcome {
        Search::Found(ring) => Some(canonical_rotation(ring)),
        Search::NotFound | Search::Exhausted => None,
    }
}

/// The preference scores of every node, and the stages of the filters with the error each
/// names when it leaves no ring (the last stage is the full set); fails when a required node
/// is not in the cluster.
fn stages(
    topo: &Topology,
    input: &Input,
) -> Result<(NodeScores, Vec<(Filters, PlaceError)>), PlaceError> {
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

    filters.memory_needed = Some(model.instance_bytes());
    stages.push((
        filters.clone(),
        PlaceError::NoRingWithEnoughMemory {
            needed: model.instance_bytes(),
            available: scores.memory.iter().fold(0u64, |a, &m| a.saturating_add(m)),
            min_nodes,
        },
    ));

    if request.sharding == Sharding::Tensor {
        filters.tensor = Some(TensorRule {
            supports: model.supports_tensor,
            hidden_size: model.hidden_size,
            kv_heads: model.num_key_value_heads,
            divisors: model.tensor_divisors.iter().map(|d| d.count).collect(),
        });
        let error = if model.supports_tensor {
            PlaceError::TensorIndivisible {
                hidden_size: model.hidden_size,
                kv_heads: model.num_key_value_heads,
                also: model
                    .tensor_divisors
                    .iter()
                    .map(|d| format!(", {} {}", d.count, d.what))
                    .collect(),
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

    Ok((scores, stages))
}

/// Rotates a ring (topology indices, which follow id order) to start at its smallest id,
/// keeping its direction.
fn canonical_rotation(mut ring: Vec<usize>) -> Vec<usize> {
    if let Some(first) = ring
        .iter()
        .enumerate()
        .min_by_key(|(_, &v)| v)
        .map(|(i, _)| i)
    {
        ring.rotate_left(first);
    }
    ring
}
