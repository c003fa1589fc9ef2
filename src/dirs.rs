//! Where a node keeps its files: XDG data, config and cache directories, each overridable.
//! The kit resolves them (`kit::dirs`), so the node, the xtask and the tests agree.

use std::path::PathBuf;

/// Identity and node state: `$XDG_DATA_HOME/shoal`, else `~/.local/share/shoal`.
pub fn default_data_dir() -> PathBuf {
    kit::dirs::data_dir()
}

/// Optional configuration: `$XDG_CONFIG_HOME/shoal`, else `~/.config/shoal`.
pub fn config_dir() -> PathBuf {
    kit::dirs::config_dir()
}

/// The SmolLM2-135M-Instruct fixture that setup downloads; `--model default` names it:
/// `<cache>/models/...`, the cache being `SHOAL_CACHE_DIR`, else the XDG cache.
pub fn default_model_path() -> PathBuf {
    kit::dirs::default_model_path()
}
