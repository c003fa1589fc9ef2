//! Table tests of the previews (`GET /instance/previews`): every sharding × backend × node
//! count, in a fixed order, each placed as `place` would place it alone.

use placement::fixture::*;
use placement::{place, previews, CollectiveBackend, Sharding};

#[test]
fn previews_cover_every_combination_in_order_each_as_place_gives_it() {
    // (node RAM in MB, model MB, expected ok/err per (sharding, backend, count) in order)
    let cases: &[(&[u64], u64, &[bool])] = &[
        // One node that holds it: pipeline/ring places, JACCL needs Metal and RDMA (none here),
        // tensor on one node places like pipeline.
        (&[1000], 500, &[true, false, true, false]),
        // Two nodes, a model only both together hold: a count is the least number of nodes,
        // so one and two both find the two-node ring (JACCL still has no RDMA here).
        (
            &[600, 600],
            1000,
            &[true, true, false, false, true, true, false, false],
        ),
        // Two nodes that together cannot hold it: nothing places.
        (
            &[300, 300],
            1000,
            &[false, false, false, false, false, false, false, false],
        ),
    ];
    for (rams, model_mb, expected) in cases {
        let nodes = nodes_mb(rams);
        let edges = full_mesh(&nodes);
        let base = input(nodes, edges, model(16, model_mb * MB), pipeline());
        let got = previews(&base);
        let n = rams.len();
        assert_eq!(got.len(), 4 * n, "{rams:?}");
        let mut i = 0;
        for sharding in [Sharding::Pipeline, Sharding::Tensor] {
            for backend in [CollectiveBackend::Ring, CollectiveBackend::Jaccl] {
                for count in 1..=n {
                    let p = &got[i];
                    assert_eq!(
                        (p.sharding, p.backend, p.node_count),
                        (sharding, backend, count)
                    );
                    let mut alone = base.clone();
                    alone.request.sharding = sharding;
                    alone.request.backend = backend;
                    alone.request.min_nodes = count as u32;
                    alone.request.instance_id = placement::DEFAULT_INSTANCE_ID.into();
                    assert_eq!(p.placed, place(&alone), "{rams:?} case {i}");
                    assert_eq!(
                        p.placed.is_ok(),
                        expected[i],
                        "{rams:?} case {i}: {:?}",
                        p.placed
                    );
                    i += 1;
                }
            }
        }
    }
}

#[test]
fn previews_of_no_nodes_still_try_one() {
    let base = input(vec![], vec![], model(4, MB), pipeline());
    let got = previews(&base);
    assert_eq!(got.len(), 4);
    assert!(got.iter().all(|p| p.node_count == 1 && p.placed.is_err()));
}
