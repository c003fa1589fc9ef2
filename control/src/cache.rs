//! Placements computed once per instance record and kept.
//!
//! A placement is a pure function of an [`InstanceRecord`] (its intent's input and its epoch's
//! exclusions), so it never needs computing twice for the same record. Without the cache every
//! chat request, `/v1/models`, `/state` and reconcile pass placed every instance again (up to
//! a tenth of a second each on large clusters, see the placement crate).
//!
//! Entries are keyed by (instance id, epoch) and hold the record they were computed from: a
//! lookup whose record differs from the stored one (two copies of one epoch with different
//! exclusions) computes afresh and replaces the entry, so a stale placement is never
//! answered. Comparing the whole record is exact where a digest could collide, and costs
//! far less than placing.

use crate::intent::InstanceRecord;
use placement::{PlaceError, Placement};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// What one entry keeps: the record and its placement.
type Entry = (InstanceRecord, Result<Placement, PlaceError>);

/// The node's placements by (instance id, epoch). Shared by the API handlers and the
/// reconciler (`&self` methods, one lock held only to look up or store, never while placing).
#[derive(Debug, Default)]
pub struct PlacementCache {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    entries: BTreeMap<(String, u32), Entry>,
    computed: u64,
}

impl PlacementCache {
    /// An empty cache.
    pub fn new() -> PlacementCache {
        PlacementCache::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The placement of `record`: the kept one, or computed now and kept.
    pub fn place(&self, record: &InstanceRecord) -> Result<Placement, PlaceError> {
        let key = (record.id().to_string(), record.epoch);
        if let Some((kept, placement)) = self.lock().entries.get(&key) {
            if kept == record {
                return placement.clone();
            }
        }
        let placement = record.place();
        let mut inner = self.lock();
        inner.computed += 1;
        inner
            .entries
            .insert(key, (record.clone(), placement.clone()));
        placement
    }

    /// How many placements this cache has computed (each lookup that was not a hit).
    pub fn computed(&self) -> u64 {
        self.lock().computed
    }

    /// How many placements it keeps.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether it keeps none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets every entry but those of the given (instance id, epoch) pairs: instances that
    /// are gone or moved to another epoch.
    pub fn retain<'a>(&self, live: impl IntoIterator<Item = (&'a str, u32)>) {
        let live: std::collections::BTreeSet<(&str, u32)> = live.into_iter().collect();
        self.lock()
            .entries
            .retain(|(id, epoch), _| live.contains(&(id.as_str(), *epoch)));
    }
}
