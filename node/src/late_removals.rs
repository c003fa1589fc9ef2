//! A fault for tests: this node hears other nodes' removals of instance copies late.
//!
//! `SHOAL_FAULT_LATE_COPY_REMOVALS_MS=N` makes the node's view of the cluster (the snapshot
//! its control plane decides on) keep another node's `instance/<id>` record for `N` ms after
//! the record is gone from the mesh. That is the order gossip can deliver on its own (each
//! author's records travel separately, so one node may hear of a deletion's removal before
//! a third node's removal of its copy), made certain: `tests/moe_cluster.rs` starts nodes with
//! it to show that a deleted instance stays gone, and that it would come back if deletions were
//! forgotten once their author saw no copy (see `control::KEEP_DELETIONS`). Unset (the
//! default), nothing changes. Only the view is late: the records in the mesh and `/state`'s
//! replicated records are the mesh's.

use control::Snapshot;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// The environment variable that turns the fault on, in milliseconds.
const ENV: &str = "SHOAL_FAULT_LATE_COPY_REMOVALS_MS";

/// An (author, key) pair: whose record, under which key.
type RecordAt = (String, String);

/// A record's value as last seen, and when it was first seen gone (mesh clock).
type LastSeen = (String, Option<u64>);

/// Other nodes' instance copies as last seen, kept in the view after their removal.
pub struct LateRemovals {
    delay_ms: u64,
    seen: Mutex<BTreeMap<RecordAt, LastSeen>>,
}

impl LateRemovals {
    /// The fault when [`ENV`] holds a number of milliseconds above 0; `None` otherwise (a
    /// value that is not a number is reported and ignored).
    pub fn from_env() -> Option<LateRemovals> {
        let text = std::env::var(ENV).ok()?;
        match text.trim().parse::<u64>() {
            Ok(0) => None,
            Ok(delay_ms) => {
                tracing::warn!(
                    "{ENV}={delay_ms}: other nodes' instance copy removals are seen {delay_ms} ms late (a test fault)"
                );
                Some(LateRemovals {
                    delay_ms,
                    seen: Mutex::default(),
                })
            }
            Err(_) => {
                tracing::warn!("{ENV}={text:?} is not a number of milliseconds; ignored");
                None
            }
        }
    }

    /// Puts back into `snapshot` every other author's instance copy removed less than the
    /// delay ago (`now_ms` on the mesh's clock), and remembers the copies it holds now.
    pub fn apply(&self, snapshot: &mut Snapshot, now_ms: u64) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        for (author, state) in &snapshot.authors {
            if *author == snapshot.me {
                continue;
            }
            for (key, value) in &state.records {
                if key.starts_with(control::INSTANCE_PREFIX) {
                    seen.insert((author.clone(), key.clone()), (value.clone(), None));
                }
            }
        }
        let delay = self.delay_ms;
        seen.retain(|(author, key), (value, gone_since)| {
            let Some(state) = snapshot.authors.get_mut(author) else {
                return false;
            };
            if state.records.contains_key(key) {
                return true;
            }
            let since = *gone_since.get_or_insert(now_ms);
            if now_ms.saturating_sub(since) >= delay {
                return false;
            }
            state.records.insert(key.clone(), value.clone());
            true
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use control::Author;

    fn snapshot(copies: &[(&str, &str)]) -> Snapshot {
        let mut authors: BTreeMap<String, Author> = ["a", "b", "me"]
            .into_iter()
            .map(|n| {
                (
                    n.to_string(),
                    Author {
                        alive: true,
                        dead: false,
                        records: BTreeMap::new(),
                    },
                )
            })
            .collect();
        for (author, key) in copies {
            let records = &mut authors.get_mut(*author).unwrap().records;
            records.insert((*key).to_string(), "{}".into());
        }
        Snapshot {
            settling: false,
            me: "me".into(),
            authors,
        }
    }

    fn held(s: &Snapshot, author: &str) -> Vec<String> {
        s.authors[author].records.keys().cloned().collect()
    }

    #[test]
    fn another_nodes_removed_copy_stays_in_the_view_for_the_delay_only() {
        let late = LateRemovals {
            delay_ms: 1_000,
            seen: Mutex::default(),
        };
        let mut s = snapshot(&[("a", "instance/x"), ("a", "runner/x"), ("me", "instance/x")]);
        late.apply(&mut s, 0);
        assert_eq!(held(&s, "a"), ["instance/x", "runner/x"]);
        // Everything removed at 100 ms: a's copy is still seen until 1,100 ms; a's runner
        // record and this node's own copy are not kept.
        for at in [100, 600, 1_099] {
            let mut s = snapshot(&[]);
            late.apply(&mut s, at);
            assert_eq!(held(&s, "a"), ["instance/x"], "at {at} ms");
            assert!(held(&s, "me").is_empty());
        }
        let mut s = snapshot(&[]);
        late.apply(&mut s, 1_100);
        assert!(held(&s, "a").is_empty());
        // Once gone, a later snapshot does not bring it back.
        let mut s = snapshot(&[]);
        late.apply(&mut s, 1_200);
        assert!(held(&s, "a").is_empty());
    }
}
