//! A placement is computed once per (instance, epoch) and kept: later views take it from
//! the node's cache.

use control::fixture::record;
use control::{Author, PlacementCache, Snapshot, INSTANCE_PREFIX};

#[test]
fn a_second_view_of_the_same_instance_does_not_place_again() {
    let cache = PlacementCache::new();
    let r = record(3, 400_000_000, 3);
    let snap = Snapshot {
        settling: false,
        me: "a".into(),
        authors: [(
            "a".to_string(),
            Author {
                alive: true,
                dead: false,
                records: [(
                    format!("{INSTANCE_PREFIX}{}", r.id()),
                    serde_json::to_string(&r).unwrap(),
                )]
                .into(),
            },
        )]
        .into(),
    };
    let first = snap.instances(&cache);
    assert_eq!(cache.computed(), 1);
    // A second view (another request, another pass) answers the kept placement.
    let second = snap.instances(&cache);
    assert_eq!(cache.computed(), 1, "the second view must not place again");
    assert_eq!(first[r.id()].placement, second[r.id()].placement);
    assert_eq!(second[r.id()].placement, r.place());
    // The next epoch is a new record: placed once, then kept.
    let next = r.replaced(&["c".to_string()].into());
    assert_eq!(cache.place(&next), next.place());
    assert_eq!(cache.place(&next), next.place());
    assert_eq!(cache.computed(), 2);
    // Another copy of the same epoch with other exclusions is not answered from the entry.
    let other = r.replaced(&["b".to_string()].into());
    assert_eq!(cache.place(&other), other.place());
    assert_eq!(cache.computed(), 3);
    // Forgetting what is gone.
    cache.retain([(r.id(), 1)]);
    assert_eq!(cache.len(), 1);
    cache.retain([]);
    assert!(cache.is_empty());
}
