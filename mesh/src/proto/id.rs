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

    /// The id as one DNS label (52 lowercase base32 characters; hex would exceed the 63-byte
    /// label limit), used as the mDNS instance name.
    pub fn to_label(&self) -> String {
        const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
        let mut out = String::with_capacity(52);
        let mut buffer: u32 = 0;
        let mut bits = 0;
        for byte in self.0 {
            buffer = (buffer << 8) | u32::from(byte);
            bits += 8;
            while bits >= 5 {
                bits -= 5;
                out.push(ALPHABET[((buffer >> bits) & 31) as usize] as char);
            }
        }
        if bits > 0 {
            out.push(ALPHABET[((buffer << (5 - bits)) & 31) as usize] as char);
        }
        out
    }

    /// Parses [`NodeId::to_label`]'s output (case-insensitive).
    pub fn from_label(label: &str) -> Option<NodeId> {
        if label.len() != 52 {
            return None;
        }
        let mut bytes = Vec::with_capacity(33);
        let mut buffer: u32 = 0;
        let mut bits = 0;
        for c in label.bytes() {
            let value = match c.to_ascii_lowercase() {
                c @ b'a'..=b'z' => c - b'a',
                c @ b'2'..=b'7' => c - b'2' + 26,
                _ => return None,
            };
            buffer = (buffer << 5) | u32::from(value);
            bits += 5;
            if bits >= 8 {
                bits -= 8;
                bytes.push((buffer >> bits) as u8);
            }
        }
        let bytes: [u8; 32] = bytes.get(..32)?.try_into().ok()?;
        Some(NodeId(bytes))
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
    fn label_round_trip() {
        for n in [0u64, 1, u64::MAX, 0x0123_4567_89ab_cdef] {
            let mut bytes = [0xa5u8; 32];
            bytes[..8].copy_from_slice(&n.to_be_bytes());
            let id = NodeId::from_bytes(bytes);
            let label = id.to_label();
            assert_eq!(label.len(), 52);
            assert_eq!(NodeId::from_label(&label), Some(id));
            assert_eq!(NodeId::from_label(&label.to_uppercase()), Some(id));
        }
        assert_eq!(NodeId::from_label("short"), None);
        assert_eq!(NodeId::from_label(&"1".repeat(52)), None);
    }

    #[test]
    fn rejects_bad_text() {
        assert!("abc".parse::<NodeId>().is_err());
        assert!("zz".repeat(32).parse::<NodeId>().is_err());
        assert!("é".repeat(32).parse::<NodeId>().is_err());
    }
}
