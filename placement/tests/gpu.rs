//! GPU-aware placement (issue 18): GPU nodes first, mixed rings split by speed, and a CPU node
//! is never given layers that GPU nodes can hold. Clusters of one kind place as before.

use placement::fixture::*;
use placement::{place, ComputeBackend, Placement};

const GB: u64 = 1_000_000_000;

fn ids(p: &Placement) -> Vec<&str> {
    p.ranks.iter().map(|r| r.node.as_str()).collect()
}

fn counts(p: &Placement) -> Vec<u32> {
    p.ranks
        .iter()
        .map(|r| r.end_layer - r.start_layer)
        .collect()
}

/// Nodes `a`, `b`, ... (GB of free memory), the ones named in `cuda` offering CUDA too.
fn cluster(gb: &[u64], cuda: &[usize]) -> Vec<placement::NodeProfile> {
    let mut nodes = nodes_mb(&gb.iter().map(|g| g * 1000).collect::<Vec<_>>());
    for &i in cuda {
        nodes[i].backends = vec![ComputeBackend::MlxCuda, ComputeBackend::MlxCpu];
    }
    nodes
}

#[test]
fn gpu_nodes_that_hold_the_model_take_it_all() {
    // The CPU node `a` has the most memory and would hold the model alone; the two GPU nodes
    // hold it together, so they run it.
    let nodes = cluster(&[128, 24, 24], &[1, 2]);
    let edges = full_mesh(&nodes);
    let p = place(&input(nodes, edges, model(32, 40 * GB), pipeline())).unwrap();
    assert_eq!(ids(&p), ["b", "c"]);
    assert_eq!(counts(&p), [16, 16]);
}

#[test]
fn a_mixed_ring_gives_the_gpu_node_what_it_holds() {
    // Too big for the GPU node alone. The CPU node `a` would hold it alone, but then runs every
    // layer on the CPU: instead the GPU node takes the 24 layers it can hold and `a` the rest
    // (by memory alone `a` would get 23 of 32).
    let nodes = cluster(&[64, 24], &[1]);
    let edges = full_mesh(&nodes);
    let p = place(&input(nodes, edges, model(32, 32 * GB), pipeline())).unwrap();
    assert_eq!(ids(&p), ["a", "b"]);
    assert_eq!(counts(&p), [8, 24]);
}

#[test]
fn a_required_cpu_node_gets_only_what_the_gpus_leave() {
    let nodes = cluster(&[64, 24, 24], &[1, 2]);
    let edges = full_mesh(&nodes);
    let mut request = pipeline();
    request.required_nodes = vec!["a".into()];
    let p = place(&input(nodes, edges, model(30, 30 * GB), request)).unwrap();
    assert_eq!(ids(&p), ["a", "b", "c"]);
    assert_eq!(counts(&p), [1, 15, 14]);
}

#[test]
fn a_cluster_of_one_kind_places_as_before() {
    // All CPU, and all CUDA: the split is by memory (2/2/4 GB, 12 layers: 3/3/6).
    for cuda in [vec![], vec![0, 1, 2]] {
        let nodes = cluster(&[2, 2, 4], &cuda);
        let edges = full_mesh(&nodes);
        let p = place(&input(nodes, edges, model(12, 7 * GB), pipeline())).unwrap();
        assert_eq!(counts(&p), [3, 3, 6], "cuda nodes {cuda:?}");
    }
}

#[test]
fn gpu_nodes_in_another_part_of_the_network_are_not_forced_in() {
    // The GPU node `c` cannot hold the model and has no link to the others: the CPU nodes
    // place without it.
    let nodes = cluster(&[16, 16, 24], &[2]);
    let edges = vec![ip_edge(&nodes, 0, 1), ip_edge(&nodes, 1, 0)];
    let p = place(&input(nodes, edges, model(10, 30 * GB), pipeline())).unwrap();
    assert_eq!(ids(&p), ["a", "b"]);
}

#[test]
fn a_model_without_a_gpu_backend_ignores_the_gpus() {
    let nodes = cluster(&[128, 24, 24], &[1, 2]);
    let edges = full_mesh(&nodes);
    let mut m = model(32, 40 * GB);
    m.backends = vec![ComputeBackend::MlxCpu];
    let p = place(&input(nodes, edges, m, pipeline())).unwrap();
    assert_eq!(ids(&p), ["a"]);
}
