//! One replicated record: a key of one author, its version, its value (or a tombstone), and the
//! author's signature, so a record relayed by any node can be checked against its author.

use crate::proto::id::NodeId;
use serde::{Deserialize, Serialize};

/// An ed25519 signature in a real node (64 bytes); a stand-in of the same length in simulations.
pub type Signature = Vec<u8>;

/// Longest signature accepted on the wire (ed25519 is 64 bytes).
pub const MAX_SIGNATURE_LEN: usize = SIGNATURE_LEN;

/// Longest record key, in bytes.
pub const MAX_KEY_LEN: usize = 256;

/// Largest record value (JSON text), in bytes. Bigger values are refused by `set`.
pub const MAX_VALUE_LEN: usize = 64 * 1024;

/// A record as stored and sent: the value is JSON text, `None` once deleted (a tombstone that
/// is kept until garbage collection so the deletion replicates).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Author's version counter at the time of this write; higher wins.
    pub version: u64,
    /// JSON text, or `None` for a tombstone.
    pub value: Option<String>,
    /// The author's signature over [`signed_bytes`].
    pub signature: Signature,
}

impl Record {
    /// Encoded size estimate, used to keep deltas under their byte budgets.
    pub fn wire_size(&self, key: &str) -> usize {
        key.len() + self.value.as_ref().map_or(0, String::len) + self.signature.len() + 16
    }

    /// An unsigned record, for unit tests of what is done with records once verified.
    #[cfg(test)]
    pub(crate) fn unsigned(version: u64, value: Option<&str>) -> Record {
        Record {
            version,
            value: value.map(str::to_string),
            signature: Vec::new(),
        }
    }
}

/// The bytes an author signs for one record: everything that identifies the write, so a
/// signature cannot be replayed under another author, generation, key or version.
pub fn signed_bytes(
    author: &NodeId,
    generation: u64,
    key: &str,
    version: u64,
    value: Option<&str>,
) -> Vec<u8> {
    // postcard of a tuple of plain types cannot fail.
    postcard::to_allocvec(&(b"shoal-record-v1", author, generation, key, version, value))
        .unwrap_or_default()
}

/// Signs this node's records and checks other authors' signatures.
///
/// A real node signs with its iroh secret key (ed25519); the simulator uses a cheap stand-in.
pub trait Authority: Send + Sync {
    /// Signs `message` as this node.
    fn sign(&self, message: &[u8]) -> Signature;
    /// True if `signature` is `author`'s signature over `message`.
    fn verify(&self, author: &NodeId, message: &[u8], signature: &[u8]) -> bool;
}

/// The simulator's stand-in for signatures: 64 bytes (an ed25519 signature's length, so
/// simulated messages have their real size) of FNV-1a hashes of (author, message). It catches
/// records attributed to the wrong author or altered in transit, which is what the protocol
/// logic must handle; it is not cryptography and is never used by a real node.
#[derive(Debug, Clone)]
pub struct SimAuthority {
    id: NodeId,
}

/// Length of an ed25519 signature, which [`SimAuthority`]'s stand-ins match.
pub const SIGNATURE_LEN: usize = 64;

impl SimAuthority {
    /// The stand-in authority of node `id`.
    pub fn new(id: NodeId) -> SimAuthority {
        SimAuthority { id }
    }

    fn tag(author: &NodeId, message: &[u8]) -> Signature {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in author.as_bytes().iter().chain(message) {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        let mut out = Vec::with_capacity(SIGNATURE_LEN);
        for lane in 0..(SIGNATURE_LEN / 8) as u64 {
            let word =
                (hash ^ lane.wrapping_mul(0x9e37_79b9_7f4a_7c15)).wrapping_mul(0x0100_0000_01b3);
            out.extend_from_slice(&word.to_le_bytes());
        }
        out
    }
}

impl Authority for SimAuthority {
    fn sign(&self, message: &[u8]) -> Signature {
        SimAuthority::tag(&self.id, message)
    }

    fn verify(&self, author: &NodeId, message: &[u8], signature: &[u8]) -> bool {
        SimAuthority::tag(author, message) == signature
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stand_in_signatures_have_ed25519_length_and_bind_the_author() {
        let a = SimAuthority::new(NodeId::from_index(1));
        let sig = a.sign(b"record");
        assert_eq!(sig.len(), SIGNATURE_LEN);
        assert!(a.verify(&NodeId::from_index(1), b"record", &sig));
        assert!(!a.verify(&NodeId::from_index(2), b"record", &sig));
        assert!(!a.verify(&NodeId::from_index(1), b"recorD", &sig));
    }
}
