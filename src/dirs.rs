//! Where a node keeps its files: XDG data, config and cache directories, each overridable.

use std::path::PathBuf;

fn env_dir(var: &str) -> Option<PathBuf> {
    std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

fn home() -> PathBuf {
    env_dir("HOME").unwrap_or_else(|| PathBuf::from("/"))
}

/// Identity and node state: `$XDG_DATA_HOME/shoal`, else `~/.local/share/shoal`.
pub fn default_data_dir() -> PathBuf {
    env_dir("XDG_DATA_HOME")
        .unwrap_or_else(|| home().join(".local/share"))
        .join("shoal")
}

/// Optional configuration: `$XDG_CONFIG_HOME/shoal`, else `~/.config/shoal`.
pub fn config_dir() -> PathBuf {
    env_dir("XDG_CONFIG_HOME")
        .unwrap_or_else(|| home().join(".config"))
        .join("shoal")
}

/// The SmolLM2-135M-Instruct fixture that setup downloads; `--model default` names it. The
/// inference crate owns where models live (`SHOAL_CACHE_DIR`, else the XDG cache).
pub fn default_model_path() -> PathBuf {
    inference::Engine::default_model_path()
}
