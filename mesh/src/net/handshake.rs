//! The first bytes two nodes exchange on the admission ALPN, whatever their release: each
//! side's [`Release`] and whether it holds a cluster secret. The format is fixed for good (a
//! protocol change must still be able to say so): 4 bytes of protocol (little-endian), 1 byte
//! of flags (bit 0: a secret guards the node), 1 byte of version length, then the version
//! (printable ASCII, at most [`MAX_VERSION_BYTES`]). With a secret, the proofs follow
//! ([`super::admission`]).

use super::release::{Release, MAX_VERSION_BYTES};
use iroh::endpoint::{RecvStream, SendStream};

/// What a node says about itself first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hello {
    /// Its release.
    pub release: Release,
    /// Whether a cluster secret guards it.
    pub closed: bool,
}

impl Hello {
    /// The bytes on the wire.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let version = self.release.version.as_bytes();
        let len = version.len().min(MAX_VERSION_BYTES);
        let mut out = Vec::with_capacity(6 + len);
        out.extend_from_slice(&self.release.protocol.to_le_bytes());
        out.push(u8::from(self.closed));
        out.push(len as u8);
        out.extend_from_slice(&version[..len]);
        out
    }

    /// Reads a hello from its 6-byte head and the version bytes the head announces
    /// (`read_rest(n)` gives the next `n` bytes).
    pub(crate) fn decode(head: [u8; 6], rest: &[u8]) -> anyhow::Result<Hello> {
        let protocol = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
        if head[4] > 1 {
            anyhow::bail!("a handshake with unknown flags {:#04x}", head[4]);
        }
        let release = Release {
            version: String::from_utf8_lossy(rest).into_owned(),
            protocol,
        };
        release
            .check()
            .map_err(|e| anyhow::anyhow!("a handshake's version: {e}"))?;
        Ok(Hello {
            release,
            closed: head[4] == 1,
        })
    }

    /// Writes this hello.
    pub(crate) async fn send(&self, send: &mut SendStream) -> anyhow::Result<()> {
        send.write_all(&self.encode()).await?;
        Ok(())
    }

    /// Reads the peer's hello (bounded: at most 6 + [`MAX_VERSION_BYTES`] bytes).
    pub(crate) async fn receive(recv: &mut RecvStream) -> anyhow::Result<Hello> {
        let mut head = [0u8; 6];
        recv.read_exact(&mut head).await?;
        let len = head[5] as usize;
        if len == 0 || len > MAX_VERSION_BYTES {
            anyhow::bail!("a handshake announcing a version of {len} bytes");
        }
        let mut rest = vec![0u8; len];
        recv.read_exact(&mut rest).await?;
        Hello::decode(head, &rest)
    }

    /// Why a node saying `theirs` cannot be admitted by this one (`peer` names it), if it
    /// cannot: another protocol, or one side guarded by a secret and the other not.
    pub(crate) fn refusal(&self, theirs: &Hello, peer: &str) -> Option<String> {
        if let Some(why) = self.release.refusal(&theirs.release, peer) {
            return Some(why);
        }
        match (self.closed, theirs.closed) {
            (true, false) => Some(format!(
                "node {peer} has no cluster secret and this node has one; start every node \
                 with the same --cluster-secret"
            )),
            (false, true) => Some(format!(
                "node {peer} is guarded by a cluster secret and this node has none; start \
                 every node with the same --cluster-secret"
            )),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(version: &str, protocol: u32, closed: bool) -> Hello {
        Hello {
            release: Release {
                version: version.into(),
                protocol,
            },
            closed,
        }
    }

    #[test]
    fn a_hello_round_trips_and_bad_bytes_are_errors() {
        let h = hello("0.1.0", 7, true);
        let bytes = h.encode();
        let head: [u8; 6] = bytes[..6].try_into().unwrap();
        assert_eq!(Hello::decode(head, &bytes[6..]).unwrap(), h);
        // Unknown flags, a version that is not printable text.
        let mut flags = head;
        flags[4] = 2;
        assert!(Hello::decode(flags, &bytes[6..]).is_err());
        assert!(Hello::decode(head, b"0.1\n0").is_err());
        assert!(Hello::decode(head, &[0xff; 5]).is_err());
    }

    #[test]
    fn a_secret_on_one_side_only_or_another_protocol_refuses() {
        let ours = hello("0.1.0", 1, false);
        assert_eq!(ours.refusal(&hello("0.9.0", 1, false), "b"), None);
        assert!(ours
            .refusal(&hello("0.9.0", 2, false), "b")
            .unwrap()
            .contains("protocol 2"));
        assert!(ours
            .refusal(&hello("0.1.0", 1, true), "b")
            .unwrap()
            .contains("cluster secret"));
    }
}
