//! Signed liveness: a beat is an author's signed statement "in generation `g`, at heartbeat `h`,
//! I held every record up to version `v`, and my live records hash to `records_hash`". Every
//! part of a delta carries the newest beat its sender knows of the author, so the fields that
//! change what others believe — generation, heartbeat, the version range, a reset — are all
//! bounded by something only the author could have signed:
//!
//! - a part whose beat does not verify is dropped whole, so no node can keep another alive,
//!   bring a departed one back, invent a generation (which would wipe the author's records
//!   everywhere) or pass itself off as a second process with another's id;
//! - a part may claim versions only up to its beat's `max_version`;
//! - a `reset` (drop what you hold of this author first) is honoured only when the records it
//!   carries are exactly the live set the beat signed;
//! - a receiver that holds all versions up to the beat's `max_version` checks its live set
//!   against `records_hash`; a mismatch (a relay left records out of a range it claimed) makes
//!   it ask for a full copy again, so omitted records are repaired rather than lost.
//!
//! The author signs a new beat at every heartbeat and after every write of its own, so its
//! current beat always covers everything it sends.

use crate::proto::id::NodeId;
use crate::proto::record::{Authority, Record, Signature};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Length of [`Beat::records_hash`].
pub const RECORDS_HASH_LEN: usize = 32;

/// Encoded-size allowance of a beat (three varints, the hash, a 64-byte signature).
pub const BEAT_WIRE_SIZE: usize = 3 * 10 + RECORDS_HASH_LEN + 2 + 64;

/// An author's signed liveness and version claim (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Beat {
    /// The author's generation.
    pub generation: u64,
    /// Its heartbeat counter when it signed.
    pub heartbeat: u64,
    /// Every record up to this version existed when it signed.
    pub max_version: u64,
    /// [`live_hash`] of its records at that moment.
    pub records_hash: [u8; RECORDS_HASH_LEN],
    /// The author's signature over [`Beat::signed_bytes`].
    pub signature: Signature,
}

impl Beat {
    /// A beat of `author`, signed by `authority` (which must be the author's).
    pub fn sign(
        author: &NodeId,
        authority: &dyn Authority,
        generation: u64,
        heartbeat: u64,
        max_version: u64,
        records_hash: [u8; RECORDS_HASH_LEN],
    ) -> Beat {
        let mut beat = Beat {
            generation,
            heartbeat,
            max_version,
            records_hash,
            signature: Vec::new(),
        };
        beat.signature = authority.sign(&beat.signed_bytes(author));
        beat
    }

    /// The bytes the author signs: every field, bound to the author's id.
    pub fn signed_bytes(&self, author: &NodeId) -> Vec<u8> {
        // postcard of a tuple of plain types cannot fail.
        postcard::to_allocvec(&(
            b"shoal-beat-v1",
            author,
            self.generation,
            self.heartbeat,
            self.max_version,
            self.records_hash,
        ))
        .unwrap_or_default()
    }

    /// True if `author` signed this beat.
    pub fn verify(&self, author: &NodeId, authority: &dyn Authority) -> bool {
        authority.verify(author, &self.signed_bytes(author), &self.signature)
    }

    /// Whether this beat was signed after `other` by the same author: beats of one author are
    /// signed with generation, heartbeat and version never going down.
    pub fn is_newer_than(&self, other: &Beat) -> bool {
        (self.generation, self.heartbeat, self.max_version)
            > (other.generation, other.heartbeat, other.max_version)
    }
}

/// The hash of an author's live records (tombstones left out, so garbage collection does not
/// change it) with versions up to `up_to`, in key order; `None` when some record held is newer
/// than `up_to` (the set cannot be compared with a beat of that version).
pub fn live_hash<'a>(
    records: impl IntoIterator<Item = (&'a String, &'a Record)>,
    up_to: u64,
) -> Option<[u8; RECORDS_HASH_LEN]> {
    let mut hasher = blake3::Hasher::new_derive_key("shoal 2026 mesh live records v1");
    for (key, record) in records {
        if record.version > up_to {
            return None;
        }
        let Some(value) = &record.value else {
            continue;
        };
        hasher.update(&(key.len() as u64).to_le_bytes());
        hasher.update(key.as_bytes());
        hasher.update(&record.version.to_le_bytes());
        hasher.update(&(value.len() as u64).to_le_bytes());
        hasher.update(value.as_bytes());
    }
    Some(*hasher.finalize().as_bytes())
}

/// [`live_hash`] of a delta's records (given in version order), as the author's state would
/// hold them: the newest record per key.
pub fn live_hash_of_part(
    records: &[(String, Record)],
    up_to: u64,
) -> Option<[u8; RECORDS_HASH_LEN]> {
    let mut newest: BTreeMap<&String, &Record> = BTreeMap::new();
    for (key, record) in records {
        let slot = newest.entry(key).or_insert(record);
        if record.version > slot.version {
            *slot = record;
        }
    }
    live_hash(newest, up_to)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::record::SimAuthority;

    fn rec(version: u64, value: Option<&str>) -> Record {
        Record::unsigned(version, value)
    }

    #[test]
    fn a_beat_binds_every_field_to_its_author() {
        let a = NodeId::from_index(1);
        let authority = SimAuthority::new(a);
        let beat = Beat::sign(&a, &authority, 3, 10, 7, [5; 32]);
        assert!(beat.verify(&a, &authority));
        assert!(!beat.verify(&NodeId::from_index(2), &authority));
        for change in 0..4 {
            let mut forged = beat.clone();
            match change {
                0 => forged.generation += 1,
                1 => forged.heartbeat += 1,
                2 => forged.max_version += 1,
                _ => forged.records_hash[0] ^= 1,
            }
            assert!(
                !forged.verify(&a, &authority),
                "change {change} went unnoticed"
            );
        }
        let later = Beat::sign(&a, &authority, 3, 11, 7, [5; 32]);
        assert!(later.is_newer_than(&beat) && !beat.is_newer_than(&later));
    }

    #[test]
    fn the_live_hash_ignores_tombstones_and_sees_omissions() {
        let full: BTreeMap<String, Record> = [
            ("a".to_string(), rec(1, Some("1"))),
            ("b".to_string(), rec(3, None)),
            ("c".to_string(), rec(2, Some("2"))),
        ]
        .into();
        let hash = live_hash(&full, 3).unwrap();
        let mut collected = full.clone();
        collected.remove("b");
        assert_eq!(live_hash(&collected, 3), Some(hash));
        let mut omitted = full.clone();
        omitted.remove("c");
        assert_ne!(live_hash(&omitted, 3), Some(hash));
        assert_eq!(
            live_hash(&full, 2),
            None,
            "a newer record cannot be compared"
        );
        let part: Vec<(String, Record)> = vec![
            ("a".into(), rec(1, Some("1"))),
            ("c".into(), rec(2, Some("2"))),
            ("b".into(), rec(3, None)),
        ];
        assert_eq!(live_hash_of_part(&part, 3), Some(hash));
    }
}
