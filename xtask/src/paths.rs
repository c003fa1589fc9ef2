//! Where shoal keeps what it downloads and builds outside the clone: the kit's resolver
//! (`kit::dirs`, shared with the node and the tests), plus the workspace root.

use std::path::PathBuf;

pub use kit::dirs::{cache_dir, target_dir};

/// The workspace root (the parent of `xtask/`).
///
/// `cargo run` gives the running xtask its manifest directory, and that is read first: the
/// compile-time value is the clone that built the binary, and cargo does not rebuild the
/// xtask when the same shared target directory serves another clone (a run from `/work/main`
/// once changed into a deleted clone's directory and every command failed with ENOENT).
pub fn workspace_root() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
        .parent()
        .expect("xtask lives inside the workspace")
        .to_path_buf()
}

/// The SmolLM2 fixture, once setup has fetched it.
pub fn default_model() -> PathBuf {
    kit::dirs::default_model_path()
}
