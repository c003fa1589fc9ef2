//! Where shoal keeps what it downloads and builds outside the clone: the kit's resolver
//! (`kit::dirs`, shared with the node and the tests), plus the workspace root.

use std::path::PathBuf;

pub use kit::dirs::{cache_dir, target_dir};

/// The workspace root (the parent of `xtask/`).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives inside the workspace")
        .to_path_buf()
}

/// The SmolLM2 fixture, once setup has fetched it.
pub fn default_model() -> PathBuf {
    kit::dirs::default_model_path()
}
