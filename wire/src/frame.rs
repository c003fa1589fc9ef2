//! The frame codec: a 4-byte **little-endian** length, then that many bytes of JSON
//! `{"v": VERSION, "msg": ...}`.
//!
//! A [`Codec`] carries the version and the size limit of one protocol, so each use states
//! them where it is defined (the runner protocol: version 2, 16 MiB; chat forwarding:
//! version 1, 16 MiB). A frame over the limit is refused before its body is read or
//! allocated, a frame of another version is refused, and decoding never panics on any input.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};

/// Bytes of the length prefix.
pub const HEADER_LEN: usize = 4;

/// Errors of the frame layer.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The stream ended cleanly between frames.
    #[error("the stream ended")]
    Closed,
    /// Reading or writing failed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// A frame announced (or would need) more bytes than the protocol allows.
    #[error("a frame of {0} bytes is over the protocol's size limit")]
    TooLarge(usize),
    /// The peer speaks another version of the protocol.
    #[error("frame version {0} is not the version spoken here")]
    Version(u32),
    /// The bytes are not a valid message (or the stream ended inside a frame: the message
    /// then says "ended").
    #[error("malformed frame: {0}")]
    Malformed(String),
    /// A well-formed frame whose message names a request (`"id"`) but does not fit the
    /// protocol: the receiver can answer that request with an error instead of leaving it
    /// waiting.
    #[error("request {id}: malformed message: {reason}")]
    Refused {
        /// The request's id, as the message gave it.
        id: u64,
        /// Why the message was refused.
        reason: String,
    },
}

/// Equal when of the same kind with the same detail (I/O errors: the same
/// [`std::io::ErrorKind`]), so that tests can compare results.
impl PartialEq for FrameError {
    fn eq(&self, other: &FrameError) -> bool {
        match (self, other) {
            (FrameError::Closed, FrameError::Closed) => true,
            (FrameError::Io(a), FrameError::Io(b)) => a.kind() == b.kind(),
            (FrameError::TooLarge(a), FrameError::TooLarge(b)) => a == b,
            (FrameError::Version(a), FrameError::Version(b)) => a == b,
            (FrameError::Malformed(a), FrameError::Malformed(b)) => a == b,
            (
                FrameError::Refused { id: a, reason: r },
                FrameError::Refused { id: b, reason: q },
            ) => a == b && r == q,
            _ => false,
        }
    }
}

/// The version and size limit of one protocol's frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Codec {
    /// The `v` every frame carries; frames of another version are refused.
    pub version: u32,
    /// The largest body accepted or written, in bytes.
    pub max_frame: usize,
}

#[derive(Serialize)]
struct OutFrame<'a, T> {
    v: u32,
    msg: &'a T,
}

#[derive(Deserialize)]
struct InFrame {
    v: u32,
    msg: serde_json::Value,
}

impl Codec {
    /// A codec for frames of `version` with bodies of at most `max_frame` bytes.
    pub const fn new(version: u32, max_frame: usize) -> Codec {
        Codec { version, max_frame }
    }

    /// One whole frame (length prefix and body).
    pub fn encode<T: Serialize>(&self, msg: &T) -> Result<Vec<u8>, FrameError> {
        let body = serde_json::to_vec(&OutFrame {
            v: self.version,
            msg,
        })
        .map_err(|e| FrameError::Malformed(e.to_string()))?;
        if body.len() > self.max_frame {
            return Err(FrameError::TooLarge(body.len()));
        }
        let mut out = Vec::with_capacity(HEADER_LEN + body.len());
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&body);
        Ok(out)
    }

    /// Writes one frame and flushes.
    pub fn write<T: Serialize>(&self, w: &mut impl Write, msg: &T) -> Result<(), FrameError> {
        w.write_all(&self.encode(msg)?)?;
        w.flush()?;
        Ok(())
    }

    /// The body length a frame header announces, refused when over the limit.
    pub fn body_len(&self, header: [u8; HEADER_LEN]) -> Result<usize, FrameError> {
        let len = u32::from_le_bytes(header) as usize;
        if len > self.max_frame {
            return Err(FrameError::TooLarge(len));
        }
        Ok(len)
    }

    /// Decodes the body of one frame.
    pub fn decode_body<T: DeserializeOwned>(&self, body: &[u8]) -> Result<T, FrameError> {
        let frame: InFrame =
            serde_json::from_slice(body).map_err(|e| FrameError::Malformed(e.to_string()))?;
        if frame.v != self.version {
            return Err(FrameError::Version(frame.v));
        }
        let id = frame.msg.get("id").and_then(serde_json::Value::as_u64);
        serde_json::from_value(frame.msg).map_err(|e| match id {
            Some(id) => FrameError::Refused {
                id,
                reason: e.to_string(),
            },
            None => FrameError::Malformed(e.to_string()),
        })
    }

    /// Decodes a whole frame at the start of `bytes`: the message and the bytes used, or
    /// `Ok(None)` when `bytes` holds less than one frame.
    pub fn decode<T: DeserializeOwned>(
        &self,
        bytes: &[u8],
    ) -> Result<Option<(T, usize)>, FrameError> {
        let Some(header) = bytes.get(..HEADER_LEN) else {
            return Ok(None);
        };
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(header);
        let len = self.body_len(h)?;
        let Some(body) = bytes.get(HEADER_LEN..HEADER_LEN + len) else {
            return Ok(None);
        };
        Ok(Some((self.decode_body(body)?, HEADER_LEN + len)))
    }

    /// Reads one frame from a blocking stream; [`FrameError::Closed`] at a clean end of
    /// stream between frames.
    pub fn read<T: DeserializeOwned>(&self, r: &mut impl Read) -> Result<T, FrameError> {
        let mut header = [0u8; HEADER_LEN];
        let mut got = 0;
        while got < HEADER_LEN {
            match r.read(&mut header[got..]) {
                Ok(0) if got == 0 => return Err(FrameError::Closed),
                Ok(0) => {
                    return Err(FrameError::Malformed(
                        "the stream ended inside a frame header".into(),
                    ))
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(FrameError::Io(e)),
            }
        }
        let len = self.body_len(header)?;
        let mut body = vec![0u8; len];
        r.read_exact(&mut body).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => {
                FrameError::Malformed("the stream ended inside a frame".into())
            }
            _ => FrameError::Io(e),
        })?;
        self.decode_body(&body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const CODEC: Codec = Codec::new(3, 64);

    fn frame(body: &[u8]) -> Vec<u8> {
        let mut out = (body.len() as u32).to_le_bytes().to_vec();
        out.extend_from_slice(body);
        out
    }

    #[test]
    fn frames_are_little_endian_length_then_versioned_json() {
        let bytes = CODEC.encode(&"hi").unwrap();
        assert_eq!(&bytes[..4], &[18, 0, 0, 0]);
        assert_eq!(&bytes[4..], br#"{"v":3,"msg":"hi"}"#);
        assert_eq!(
            CODEC.decode::<String>(&bytes).unwrap(),
            Some(("hi".to_string(), 22))
        );
        let mut r = &bytes[..];
        assert_eq!(CODEC.read::<String>(&mut r).unwrap(), "hi");
        assert_eq!(CODEC.read::<String>(&mut r), Err(FrameError::Closed));
    }

    #[test]
    fn the_limit_and_the_version_are_the_codecs() {
        assert_eq!(
            CODEC.encode(&"x".repeat(64)),
            Err(FrameError::TooLarge(66 + 14))
        );
        assert_eq!(
            CODEC.body_len(65u32.to_le_bytes()),
            Err(FrameError::TooLarge(65))
        );
        assert_eq!(CODEC.body_len(64u32.to_le_bytes()), Ok(64));
        let other = Codec::new(4, 64).encode(&1).unwrap();
        assert_eq!(CODEC.decode::<u32>(&other), Err(FrameError::Version(4)));
        assert!(matches!(
            CODEC.decode::<u32>(&frame(br#"{"v":3,"msg":"no"}"#)),
            Err(FrameError::Malformed(_))
        ));
        // Cut short: "not yet" for a buffer, an error naming the end for a stream.
        let full = CODEC.encode(&7u32).unwrap();
        assert_eq!(CODEC.decode::<u32>(&full[..full.len() - 1]), Ok(None));
        assert_eq!(CODEC.decode::<u32>(&full[..3]), Ok(None));
        for cut in [2, full.len() - 1] {
            match CODEC.read::<u32>(&mut &full[..cut]) {
                Err(FrameError::Malformed(m)) => assert!(m.contains("ended"), "{m}"),
                other => panic!("expected a malformed frame, got {other:?}"),
            }
        }
    }

    #[test]
    fn a_message_that_names_its_request_is_refused_by_that_id() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Request {
            id: u64,
            prompt: String,
        }
        match CODEC.decode::<Request>(&frame(br#"{"v":3,"msg":{"id":7,"prompt":1}}"#)) {
            Err(FrameError::Refused { id: 7, reason }) => assert!(reason.contains("string")),
            other => panic!("expected request 7 refused, got {other:?}"),
        }
        // Without a usable id it is only malformed.
        for body in [
            &br#"{"v":3,"msg":{"id":"7","prompt":1}}"#[..],
            br#"{"v":3,"msg":{"prompt":1}}"#,
        ] {
            assert!(matches!(
                CODEC.decode::<Request>(&frame(body)),
                Err(FrameError::Malformed(_))
            ));
        }
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = CODEC.decode::<serde_json::Value>(&bytes);
            let mut r = &bytes[..];
            for _ in 0..4 {
                if CODEC.read::<serde_json::Value>(&mut r).is_err() {
                    break;
                }
            }
        }
    }
}
