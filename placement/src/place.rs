//! `place`: the whole pipeline from input to placement.

use crate::error::PlaceError;
use crate::input::Input;
use crate::node::{NodeId, NodeProfile};
use crate::pipeline_split::pipeline_split;
use crate::request::{CollectiveBackend, Sharding};
use crate::ring::{choose_ring, larger_ring, SEARCH_BUDGET};
use crate::split::check_share;
use crate::topology::Topology;
use crate::views::{jaccl_coordinators, jaccl_devices, ring_hosts, ring_port};
use serde::{Deserialize, Serialize};

/// Where an instance runs. Every node computes the same value (and the same JSON bytes) from
/// the same [`Input`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The sharding that runs: the request's, except that a ring of one runs pipeline.
    pub sharding: Sharding,
    /// The collective that runs: the request's, except that a ring of one runs ring.
    pub backend: CollectiveBackend,
    /// The TCP port ranks listen on, derived from the instance id.
    pub port: u16,
    /// One entry per rank, in rank order.
    pub ranks: Vec<RankPlacement>,
    /// JACCL's addressing, when the backend is JACCL.
    pub jaccl: Option<JacclPlan>,
}

/// One rank of a placement.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct RankPlacement {
    /// The node that runs this rank.
    pub node: NodeId,
    /// First layer it holds.
    pub start_layer: u32,
    /// One past the last layer it holds (`end_layer - start_layer` layers). Tensor ranks hold
    /// `0..n_layers`, each a slice of every layer.
    pub end_layer: u32,
    /// The ring backend's host list for this rank (see [`crate::views`]); empty for JACCL.
    pub hosts: Vec<String>,
}

/// JACCL's addressing, indexed by rank.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct JacclPlan {
    /// `devices[i][j]`: rank `i`'s RDMA interface to rank `j`; `null` on the diagonal.
    pub devices: Vec<Vec<Option<String>>>,
    /// Per rank, where rank 0's coordinator is: `0.0.0.0:PORT` for rank 0, `IP:PORT` for others.
    pub coordinators: Vec<String>,
}

/// Places `input.model` on the cluster, deterministically: the same input, in any order of
/// nodes, edges and interfaces, gives the same placement on every machine.
///
/// Steps, each of which may fail with the error named: check the input (`invalid_input`),
/// choose the ring ([`crate::ring`]), split the layers (`too_few_layers`) and check each node
/// holds its share (`node_short_of_memory`; then the best rings of the next sizes are tried
/// in turn, and the first ring's error is reported only when none holds its split), then
/// build the ring views or JACCL addressing (`neighbour_unreachable`).
///
/// Where the cluster mixes GPU and CPU-only nodes, the GPU nodes alone are tried first
/// ([`crate::accel`]), then the whole cluster with every GPU node in the ring, and the
/// cluster as it is only when neither places.
pub fn place(input: &Input) -> Result<Placement, PlaceError> {
    input.validate()?;
    for attempt in crate::accel::gpu_first_attempts(input) {
        if let Ok(placement) = place_validated(&attempt) {
            return Ok(placement);
        }
    }
    place_validated(input)
}

/// [`place`] on an input already validated, without the accelerated-first step.
fn place_validated(input: &Input) -> Result<Placement, PlaceError> {
    let topo = Topology::new(&input.nodes, &input.edges);
    let mut budget = SEARCH_BUDGET;
    let mut ring = choose_ring(&topo, input, &mut budget)?;
    let mut first_error: Option<PlaceError> = None;
    let layer_ranges = loop {
        match layer_ranges(&topo, input, &ring) {
            Ok(ranges) => break ranges,
            Err(e @ PlaceError::NodeShortOfMemory { .. }) => {
                let first = first_error.get_or_insert(e).clone();
                match larger_ring(&topo, input, ring.len() + 1, &mut budget) {
                    Some(next) => ring = next,
                    None => return Err(first),
                }
            }
            Err(e) => return Err(first_error.unwrap_or(e)),
        }
    };
    let single = ring.len() == 1;
    let backend = if single {
        CollectiveBackend::Ring
    } else {
        input.request.backend
    };
    let port = ring_port(&input.request.instance_id);
    let (hosts, jaccl) = match backend {
        CollectiveBackend::Ring => (ring_hosts(&topo, &ring, port)?, None),
        CollectiveBackend::Jaccl => (
            vec![Vec::new(); ring.len()],
            Some(JacclPlan {
                devices: jaccl_devices(&topo, &ring),
                coordinators: jaccl_coordinators(&topo, &ring, port)?,
            }),
        ),
    };
    let ranks = ring
        .iter()
        .zip(layer_ranges)
        .zip(hosts)
        .map(|((&v, (start_layer, end_layer)), hosts)| RankPlacement {
            node: topo.nodes[v].id.clone(),
            start_layer,
            end_layer,
            hosts,
        })
        .collect();
    Ok(Placement {
        sharding: sharding_of(input, &ring),
        backend,
        port,
        ranks,
        jaccl,
    })
}

/// The sharding that runs on `ring`: the request's, except that a ring of one runs pipeline.
fn sharding_of(input: &Input, ring: &[usize]) -> Sharding {
    if ring.len() == 1 {
        Sharding::Pipeline
    } else {
        input.request.sharding
    }
}

/// Each rank's half-open layer range on `ring`, once every node is checked to hold its share.
fn layer_ranges(
    topo: &Topology,
    input: &Input,
    ring: &[usize],
) -> Result<Vec<(u32, u32)>, PlaceError> {
    let model = &input.model;
    match sharding_of(input, ring) {
        Sharding::Pipeline => {
            let nodes: Vec<&NodeProfile> = ring.iter().map(|&v| topo.nodes[v]).collect();
            let counts = pipeline_split(&nodes, model)?;
            let mut start = 0;
            let mut ranges = Vec::with_capacity(counts.len());
            for (rank, (&v, &count)) in ring.iter().zip(&counts).enumerate() {
                let (part, whole) = model.layer_weight(start, start + count);
                let extra = model.extra_on_rank(rank);
                check_share(topo.nodes[v], model.storage_bytes, part, whole, extra)?;
                ranges.push((start, start + count));
                start += count;
            }
            Ok(ranges)
        }
        Sharding::Tensor => {
            if model.n_layers == 0 {
                return Err(PlaceError::TooFewLayers {
                    n_layers: 0,
                    nodes: ring.len(),
                });
            }
            // Each rank holds a 1/k slice of every layer; rank 0 the tower besides.
            for (rank, &v) in ring.iter().enumerate() {
                let (of, extra) = (ring.len() as u128, model.extra_on_rank(rank));
                check_share(topo.nodes[v], model.storage_bytes, 1, of, extra)?;
            }
            Ok(vec![(0, model.n_layers); ring.len()])
        }
    }
}
