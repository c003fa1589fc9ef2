//! This binary's release, kept in one string ([`STAMP`]): `shoal --version`, the handshake
//! every node opens with ([`mesh::net::release`]) and the profile `/state` shows all read it
//! from there, so two builds that differ only in their release differ only in these bytes
//! (the rolling-upgrade test makes such a pair by rewriting them in a copy of the binary).

use mesh::net::release::Release;

/// The build stamp: the package version and the mesh protocol this build speaks.
pub static STAMP: &str = concat!(
    "shoal-build;version=",
    env!("CARGO_PKG_VERSION"),
    ";protocol=",
    mesh::protocol_text!(),
    ";"
);

/// This binary's release, read from [`STAMP`] at run time (never folded in at compile time,
/// so the bytes in the binary are what counts).
pub fn this_release() -> Release {
    let stamp: &str = std::hint::black_box(STAMP);
    Release::from_stamp(stamp).unwrap_or_else(|e| panic!("this binary's {e}"))
}

/// `shoal --version`'s text: the release and its protocol.
pub fn version_text() -> &'static str {
    static TEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TEXT.get_or_init(|| {
        let r = this_release();
        format!("{} (protocol {})", r.version, r.protocol)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stamp_says_the_package_version_and_the_mesh_protocol() {
        let r = this_release();
        assert_eq!(r.version, env!("CARGO_PKG_VERSION"));
        assert_eq!(r.protocol, mesh::net::release::PROTOCOL);
    }
}
