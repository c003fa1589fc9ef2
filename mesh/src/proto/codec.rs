//! The wire format of every mesh message: one version byte, then postcard. Decoding checks the
//! size first, the version, the exact length, and the shape of every delta; it never panics.

use crate::proto::delta::Delta;
use crate::proto::digest::Digest;
use serde::{Deserialize, Serialize};

/// Version of the wire format; a node refuses messages of another version.
pub const WIRE_VERSION: u8 = 2;

/// Largest message accepted from the sync stream (the gossip topic has its own, lower limit).
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// Every message exchanged between replicas.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Message {
    /// Anti-entropy, step 1 (initiator to responder): what I know.
    Syn(Digest),
    /// Step 2: what you were missing, and what I know.
    SynAck {
        /// The responder's digest.
        digest: Digest,
        /// What the initiator was missing.
        delta: Delta,
    },
    /// Step 3: what the responder was missing.
    Ack(Delta),
    /// A node's own fresh changes, on the gossip topic.
    Broadcast(Delta),
}

/// Why bytes are not a valid message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// Nothing was received.
    #[error("empty message")]
    Empty,
    /// Over the size limit.
    #[error("message of {len} bytes is over the {max}-byte limit")]
    TooLarge {
        /// Received size.
        len: usize,
        /// Limit.
        max: usize,
    },
    /// Another wire version (a node of a different shoal release).
    #[error("wire version {0} is not supported (this node speaks {WIRE_VERSION}); upgrade all nodes to one shoal release")]
    Version(u8),
    /// Not a valid encoding.
    #[error("malformed message: {0}")]
    Malformed(String),
}

/// Encodes a message.
pub fn encode(message: &Message) -> Vec<u8> {
    let mut out = vec![WIRE_VERSION];
    // Serializing plain owned data into a Vec cannot fail.
    out.extend(postcard::to_allocvec(message).unwrap_or_default());
    out
}

/// Decodes a message of at most `max_bytes`.
pub fn decode(bytes: &[u8], max_bytes: usize) -> Result<Message, CodecError> {
    let (&version, body) = bytes.split_first().ok_or(CodecError::Empty)?;
    if bytes.len() > max_bytes {
        return Err(CodecError::TooLarge {
            len: bytes.len(),
            max: max_bytes,
        });
    }
    if version != WIRE_VERSION {
        return Err(CodecError::Version(version));
    }
    let (message, rest): (Message, &[u8]) =
        postcard::take_from_bytes(body).map_err(|e| CodecError::Malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(CodecError::Malformed(format!(
            "{} bytes after the end of the message",
            rest.len()
        )));
    }
    let deltas: &[&Delta] = match &message {
        Message::Syn(_) => &[],
        Message::SynAck { delta, .. } | Message::Ack(delta) | Message::Broadcast(delta) => &[delta],
    };
    for delta in deltas {
        for part in &delta.nodes {
            part.validate().map_err(CodecError::Malformed)?;
        }
    }
    Ok(message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::delta::NodeDelta;
    use crate::proto::digest::DigestEntry;
    use crate::proto::id::NodeId;
    use crate::proto::record::Record;
    use proptest::prelude::*;

    fn sample() -> Message {
        let mut digest = Digest::default();
        digest.nodes.insert(
            NodeId::from_index(1),
            DigestEntry {
                generation: 1,
                heartbeat: 2,
                max_version: 3,
            },
        );
        Message::SynAck {
            digest,
            delta: Delta {
                nodes: vec![NodeDelta {
                    node: NodeId::from_index(2),
                    beat: crate::proto::beat::Beat {
                        generation: 9,
                        heartbeat: 4,
                        max_version: 2,
                        records_hash: [3; 32],
                        signature: vec![8; 64],
                    },
                    reset: false,
                    from_version: 1,
                    to_version: 2,
                    records: vec![(
                        "profile".into(),
                        Record {
                            version: 2,
                            value: Some("{\"a\":1}".into()),
                            signature: vec![7; 64],
                        },
                    )],
                }],
            },
        }
    }

    #[test]
    fn round_trip() {
        let m = sample();
        assert_eq!(decode(&encode(&m), MAX_MESSAGE_BYTES).unwrap(), m);
    }

    #[test]
    fn refuses_wrong_version_size_and_trailing_bytes() {
        let mut bytes = encode(&sample());
        assert_eq!(decode(&[], 100), Err(CodecError::Empty));
        assert!(matches!(
            decode(&bytes, 10),
            Err(CodecError::TooLarge { .. })
        ));
        bytes.push(0);
        assert!(matches!(
            decode(&bytes, MAX_MESSAGE_BYTES),
            Err(CodecError::Malformed(_))
        ));
        bytes[0] = 1;
        assert_eq!(
            decode(&bytes, MAX_MESSAGE_BYTES),
            Err(CodecError::Version(1))
        );
    }

    #[test]
    fn refuses_inconsistent_delta() {
        let Message::SynAck { digest, mut delta } = sample() else {
            unreachable!()
        };
        delta.nodes[0].from_version = 5;
        let bytes = encode(&Message::SynAck {
            digest: digest.clone(),
            delta: delta.clone(),
        });
        assert!(matches!(
            decode(&bytes, MAX_MESSAGE_BYTES),
            Err(CodecError::Malformed(_))
        ));
        // A range beyond the version the author's beat signs.
        delta.nodes[0].from_version = 1;
        delta.nodes[0].to_version = 3;
        let bytes = encode(&Message::SynAck { digest, delta });
        assert!(matches!(
            decode(&bytes, MAX_MESSAGE_BYTES),
            Err(CodecError::Malformed(_))
        ));
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = decode(&bytes, MAX_MESSAGE_BYTES);
            let mut versioned = vec![WIRE_VERSION];
            versioned.extend(&bytes);
            let _ = decode(&versioned, MAX_MESSAGE_BYTES);
        }

        #[test]
        fn truncated_and_flipped_messages_never_panic(cut in 0usize..400, flip in 0usize..400, bit in 0u8..8) {
            let bytes = encode(&sample());
            let _ = decode(&bytes[..cut.min(bytes.len())], MAX_MESSAGE_BYTES);
            let mut flipped = bytes.clone();
            let i = flip % flipped.len();
            flipped[i] ^= 1 << bit;
            let _ = decode(&flipped, MAX_MESSAGE_BYTES);
        }
    }
}
