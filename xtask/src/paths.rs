//! Where shoal keeps what it downloads and builds outside the clone.

use std::env;
use std::path::PathBuf;

/// The cache root: `SHOAL_CACHE_DIR`, else `$XDG_CACHE_HOME/shoal`, else `~/.cache/shoal`.
/// `native/mlx-sys/build.rs` resolves the same directory the same way.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = env::var_os("SHOAL_CACHE_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(dir) = env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("shoal");
    }
    home().join(".cache").join("shoal")
}

fn home() -> PathBuf {
    PathBuf::from(env::var_os("HOME").unwrap_or_else(|| "/root".into()))
}

/// Cargo's target directory: `CARGO_TARGET_DIR` if set, else `<cache>/target`, outside the
/// clone so that a fresh clone on the same machine (CI) reuses earlier builds.
pub fn target_dir() -> PathBuf {
    env::var_os("CARGO_TARGET_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_dir().join("target"))
}

/// The workspace root (the parent of `xtask/`).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives inside the workspace")
        .to_path_buf()
}

/// The SmolLM2 fixture, once setup has fetched it.
pub fn default_model() -> PathBuf {
    cache_dir()
        .join("models")
        .join("SmolLM2-135M-Instruct.Q4_1.gguf")
}
