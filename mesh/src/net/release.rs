//! Which shoal a node runs: its release version and the version of the protocol nodes speak
//! to each other (gossip, state sync, chat forwarding, model copies, the ring set-up). Nodes
//! exchange both before anything else ([`super::handshake`]); a node whose protocol differs is
//! refused admission, with a log line on both sides naming both releases, while nodes of
//! different releases that speak the same protocol form one cluster (a rolling upgrade).

use serde::{Deserialize, Serialize};

/// The protocol this build speaks. Bump it (and [`protocol_text!`]) when a wire format between
/// nodes changes incompatibly; a release that keeps it can join a cluster of older ones.
pub const PROTOCOL: u32 = 1;

/// [`PROTOCOL`] as a literal, for a binary's build stamp (`concat!` takes literals only).
#[macro_export]
macro_rules! protocol_text {
    () => {
        "1"
    };
}

/// Longest version text a handshake carries.
pub const MAX_VERSION_BYTES: usize = 64;

/// A node's release: what `shoal --version` prints and the protocol it speaks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Release {
    /// The release version (`0.1.0`).
    pub version: String,
    /// The protocol version ([`PROTOCOL`] of its build).
    pub protocol: u32,
}

impl Release {
    /// The mesh crate's own release (what a node runs unless its binary says otherwise).
    pub fn of_mesh() -> Release {
        Release {
            version: env!("CARGO_PKG_VERSION").to_string(),
            protocol: PROTOCOL,
        }
    }

    /// Reads a build stamp `shoal-build;version=V;protocol=N;` (a binary keeps its release in
    /// one such string, so two builds that differ only in it differ only there).
    pub fn from_stamp(stamp: &str) -> Result<Release, String> {
        let bad = || {
            format!(
                "a malformed build stamp {:?}",
                stamp.get(..80).unwrap_or(stamp)
            )
        };
        let rest = stamp.strip_prefix("shoal-build;").ok_or_else(bad)?;
        let (mut version, mut protocol) = (None, None);
        for part in rest.split(';').filter(|p| !p.is_empty()) {
            match part.split_once('=') {
                Some(("version", v)) => version = Some(v.to_string()),
                Some(("protocol", p)) => protocol = p.parse::<u32>().ok(),
                _ => return Err(bad()),
            }
        }
        let release = Release {
            version: version.ok_or_else(bad)?,
            protocol: protocol.ok_or_else(bad)?,
        };
        release.check().map_err(|e| format!("{}: {e}", bad()))?;
        Ok(release)
    }

    /// Fails unless the version is short printable text (what a handshake accepts).
    pub fn check(&self) -> Result<(), String> {
        let v = &self.version;
        if v.is_empty() || v.len() > MAX_VERSION_BYTES || !v.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!(
                "a version must be 1 to {MAX_VERSION_BYTES} printable ASCII characters"
            ));
        }
        Ok(())
    }

    /// `shoal 0.1.0 (protocol 1)`.
    pub fn describe(&self) -> String {
        format!("shoal {} (protocol {})", self.version, self.protocol)
    }

    /// Why a node of release `theirs` cannot join one of this release, or `None` when it can
    /// (the same protocol, whatever the versions).
    pub fn refusal(&self, theirs: &Release, peer: &str) -> Option<String> {
        (self.protocol != theirs.protocol).then(|| {
            format!(
                "node {peer} runs {}, this node runs {}: nodes of one cluster must speak the \
                 same protocol, so it is not admitted; run the same shoal release on every \
                 node (`shoal --version` prints it), upgrading one node at a time",
                theirs.describe(),
                self.describe()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_reads_back_and_bad_ones_are_refused() {
        let stamp = concat!("shoal-build;version=0.1.0;protocol=", protocol_text!(), ";");
        let release = Release::from_stamp(stamp).unwrap();
        assert_eq!(release, Release::of_mesh());
        assert_eq!(
            release.describe(),
            format!("shoal 0.1.0 (protocol {PROTOCOL})")
        );
        for bad in [
            "",
            "shoal-build;",
            "shoal-build;version=0.1.0;",
            "shoal-build;version=0.1.0;protocol=x;",
            "shoal-build;version=;protocol=1;",
            "shoal-build;version=a b;protocol=1;",
            "build;version=1;protocol=1;",
        ] {
            assert!(Release::from_stamp(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn only_a_protocol_difference_refuses() {
        let old = Release {
            version: "0.1.0".into(),
            protocol: 1,
        };
        let newer = Release {
            version: "0.2.0".into(),
            protocol: 1,
        };
        let incompatible = Release {
            version: "0.3.0".into(),
            protocol: 2,
        };
        assert_eq!(old.refusal(&newer, "b"), None);
        let why = old.refusal(&incompatible, "c").unwrap();
        assert!(
            why.contains("shoal 0.3.0 (protocol 2)") && why.contains("shoal 0.1.0 (protocol 1)"),
            "{why}"
        );
    }
}
