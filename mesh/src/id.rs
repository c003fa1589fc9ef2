//! Node identity as the replicated state sees it: 32 bytes (an iroh public key in a real node).
//!
//! The core keeps its own type so that it stays free of IO and can be simulated with made-up
//! ids; the iroh driver converts with [`NodeId::from_bytes`] / [`NodeId::as_bytes`].

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The id of a node: its public key. Ordered bytewise, so maps keyed by it iterate the same way
/// on every node.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeId([u8; 32]);

impl NodeId {
    /// Wraps 32 bytes of a public key.
    pub const fn from_bytes(bytes: [u8; 32]) -> NodeId {
        NodeId(bytes)
    }

    /// The raw key bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// A made-up id for simulations and tests: `n` in the first eight bytes.
    pub fn from_index(n: u64) -> NodeId {
        let mut bytes = [0u8; 32];
        bytes[..8].copy_from_slice(&n.to_be_bytes());
        NodeId(bytes)
    }

    /// The first 10 hex digits, enough to tell nodes apart in logs and tables.
    pub fn short(&self) -> String {
        self.to_string()[..10].to_string()
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeId({})", self.short())
    }
}

/// Why a text is not a node id.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("a node id is 64 hex digits (a 32-byte public key), got {0:?}")]
pub struct ParseNodeIdError(String);

impl FromStr for NodeId {
    type Err = ParseNodeIdError;

    fn from_str(s: &str) -> Result<NodeId, ParseNodeIdError> {
        let err = || ParseNodeIdError(s.chars().take(80).collect());
        if s.len() != 64 || !s.is_ascii() {
            return Err(err());
        }
        let mut bytes = [0u8; 32];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| err())?;
        }
        Ok(NodeId(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip() {
        let id = NodeId::from_index(0xdead_beef);
        let text = id.to_string();
        assert_eq!(text.len(), 64);
        assert!(text.starts_with("00000000deadbeef"));
        assert_eq!(text.parse::<NodeId>().unwrap(), id);
    }

    #[test]
    fn rejects_bad_text() {
        assert!("abc".parse::<NodeId>().is_err());
        assert!("zz".repeat(32).parse::<NodeId>().is_err());
        assert!("é".repeat(32).parse::<NodeId>().is_err());
    }
}
