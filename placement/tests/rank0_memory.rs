//! What rank 0 alone holds (`ModelCard::rank0_bytes`, a vision tower, issue 47) is counted on
//! rank 0, whole, and never spread over a pipeline's layers or a tensor ring's ranks.

use placement::fixture::*;
use placement::{place, PlaceError, Placement, Sharding};

/// Each rank's node and layer count.
fn split(p: &Placement) -> Vec<(&str, u32)> {
    p.ranks
        .iter()
        .map(|r| (r.node.as_str(), r.end_layer - r.start_layer))
        .collect()
}

/// A 12-layer model of 1200 MB (100 MB a layer) whose rank 0 holds `tower` MB besides.
fn card(tower: u64) -> placement::ModelCard {
    let mut m = model(12, 1200 * MB);
    m.rank0_bytes = tower * MB;
    m
}

fn two_nodes(sharding: Sharding, rams: &[u64], tower: u64) -> Result<Placement, PlaceError> {
    let nodes = nodes_mb(rams);
    let mut request = pipeline();
    request.sharding = sharding;
    request.min_nodes = 2;
    place(&input(
        nodes.clone(),
        full_mesh(&nodes),
        card(tower),
        request,
    ))
}

#[test]
fn a_pipeline_splits_its_layers_over_what_rank_0_has_left_after_the_tower() {
    // Without a tower two nodes of 900 MB take 6 layers each.
    let p = two_nodes(Sharding::Pipeline, &[900, 900], 0).unwrap();
    assert_eq!(split(&p), [("a", 6), ("b", 6)]);
    // A 300 MB tower on rank 0 leaves it 600 MB for layers: 12 × 600/1500 = 4.8 and
    // 12 × 900/1500 = 7.2 layers, the one left over to the larger remainder (rank 0): 5 and
    // 7, so rank 0 holds 500 + 300 MB and rank 1 700 MB. Spread over the split (as before),
    // the tower would have given 6 and 6 (rank 0 then holding 900 MB).
    let p = two_nodes(Sharding::Pipeline, &[900, 900], 300).unwrap();
    assert_eq!(split(&p), [("a", 5), ("b", 7)]);
}

#[test]
fn a_pipeline_whose_rank_0_cannot_hold_its_layers_and_the_tower_is_refused() {
    // 1500 MB in all (1200 of layers, 300 of tower) on 1400 MB: no ring holds it, and the
    // refusal says so with the tower counted.
    match two_nodes(Sharding::Pipeline, &[700, 700], 300) {
        Err(PlaceError::NoRingWithEnoughMemory { needed, .. }) => {
            assert_eq!(needed, 1500 * MB)
        }
        other => panic!("expected no_ring_with_enough_memory, got {other:?}"),
    }
    // Enough in all (1500 of 1510 MB), but rank 0 (`a`, on 310 MB) would hold one layer
    // besides the tower, 400 MB: the ring is refused naming rank 0's need. Spread over the
    // split (1500 MB over 12 layers), the tower would have given `a` 2 layers of 125 MB and
    // no room for itself.
    match two_nodes(Sharding::Pipeline, &[310, 1200], 300) {
        Err(PlaceError::NodeShortOfMemory {
            node,
            needed,
            available,
        }) => assert_eq!(
            (node.as_str(), needed, available),
            ("a", 400 * MB, 310 * MB)
        ),
        other => panic!("expected node_short_of_memory, got {other:?}"),
    }
}

#[test]
fn a_tensor_rings_rank_0_holds_its_slice_and_the_whole_tower() {
    // Each rank holds 600 MB of the layers; rank 0 900 MB with the tower: 900 MB nodes do.
    let p = two_nodes(Sharding::Tensor, &[900, 900], 300).unwrap();
    assert_eq!(split(&p), [("a", 12), ("b", 12)]);
    // 899 MB nodes do not: rank 0 is 1 MB short, whichever node it is, though the ring holds
    // 1500 of its 1798 MB.
    match two_nodes(Sharding::Tensor, &[899, 899], 300) {
        Err(PlaceError::NodeShortOfMemory {
            needed, available, ..
        }) => assert_eq!((needed, available), (900 * MB, 899 * MB)),
        other => panic!("expected node_short_of_memory, got {other:?}"),
    }
    // Without the tower they do.
    assert!(two_nodes(Sharding::Tensor, &[899, 899], 0).is_ok());
}
