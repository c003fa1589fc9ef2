//! Where shoal keeps its files, resolved in one place for the node, the xtask and the tests.
//!
//! - cache (MLX, models, the venv, the shared build directory): `SHOAL_CACHE_DIR`, else
//!   `$XDG_CACHE_HOME/shoal`, else `~/.cache/shoal`;
//! - data (a node's identity and state): `$XDG_DATA_HOME/shoal`, else `~/.local/share/shoal`;
//! - config: `$XDG_CONFIG_HOME/shoal`, else `~/.config/shoal`.
//!
//! An empty variable counts as unset. `native/mlx-sys/build.rs` (a build script, which cannot
//! depend on this crate without rebuilding MLX's bindings) resolves the cache the same way.

use std::path::PathBuf;

/// File name of the SmolLM2 fixture that `cargo xtask setup` downloads.
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// A source of environment variables: the process's, or a fixed list in tests.
pub trait Env {
    /// The variable's value, `None` when unset or empty.
    fn var(&self, name: &str) -> Option<PathBuf>;
}

/// The process environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<PathBuf> {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    }
}

impl Env for [(&str, &str)] {
    fn var(&self, name: &str) -> Option<PathBuf> {
        self.iter()
            .find(|(k, v)| *k == name && !v.is_empty())
            .map(|(_, v)| PathBuf::from(v))
    }
}

fn home(env: &(impl Env + ?Sized)) -> PathBuf {
    env.var("HOME").unwrap_or_else(|| PathBuf::from("/"))
}

/// The cache root in `env` (see the module docs).
pub fn cache_dir_in(env: &(impl Env + ?Sized)) -> PathBuf {
    if let Some(dir) = env.var("SHOAL_CACHE_DIR") {
        return dir;
    }
    env.var("XDG_CACHE_HOME")
        .unwrap_or_else(|| home(env).join(".cache"))
        .join("shoal")
}

/// The cache root of this process.
pub fn cache_dir() -> PathBuf {
    cache_dir_in(&ProcessEnv)
}

/// A node's default data directory (identity and node state) in `env`.
pub fn data_dir_in(env: &(impl Env + ?Sized)) -> PathBuf {
    env.var("XDG_DATA_HOME")
        .unwrap_or_else(|| home(env).join(".local/share"))
        .join("shoal")
}

/// A node's default data directory.
pub fn data_dir() -> PathBuf {
    data_dir_in(&ProcessEnv)
}

/// Optional configuration in `env`.
pub fn config_dir_in(env: &(impl Env + ?Sized)) -> PathBuf {
    env.var("XDG_CONFIG_HOME")
        .unwrap_or_else(|| home(env).join(".config"))
        .join("shoal")
}

/// Optional configuration.
pub fn config_dir() -> PathBuf {
    config_dir_in(&ProcessEnv)
}

/// Cargo's target directory: `CARGO_TARGET_DIR` if set, else `<cache>/target`, outside the
/// clone so that a fresh clone on the same machine (CI) reuses earlier builds.
pub fn target_dir() -> PathBuf {
    ProcessEnv
        .var("CARGO_TARGET_DIR")
        .unwrap_or_else(|| cache_dir().join("target"))
}

/// Where downloaded models live: `<cache>/models`.
pub fn models_dir() -> PathBuf {
    cache_dir().join("models")
}

/// The SmolLM2 fixture (`--model default`), once setup has fetched it.
pub fn default_model_path() -> PathBuf {
    models_dir().join(DEFAULT_MODEL_FILE)
}

/// The Python venv with the pinned `openai` client and jinja2: `<cache>/venv`.
pub fn venv_dir() -> PathBuf {
    cache_dir().join("venv")
}

/// The venv's own interpreter (what `cargo xtask pyenv` creates).
pub fn venv_python() -> PathBuf {
    venv_dir().join("bin").join("python")
}

/// The interpreter tests run: `SHOAL_PYTHON` (set by `cargo xtask test`), else
/// [`venv_python`].
pub fn python() -> PathBuf {
    python_in(&ProcessEnv)
}

/// [`python`] in `env`.
pub fn python_in(env: &(impl Env + ?Sized)) -> PathBuf {
    env.var("SHOAL_PYTHON")
        .unwrap_or_else(|| cache_dir_in(env).join("venv").join("bin").join("python"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_prefers_shoal_then_xdg_then_home() {
        let env: &[(&str, &str)] = &[
            ("SHOAL_CACHE_DIR", "/c"),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/h"),
        ];
        assert_eq!(cache_dir_in(env), PathBuf::from("/c"));
        let env: &[(&str, &str)] = &[
            ("SHOAL_CACHE_DIR", ""),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/h"),
        ];
        assert_eq!(cache_dir_in(env), PathBuf::from("/x/shoal"));
        let env: &[(&str, &str)] = &[("HOME", "/h")];
        assert_eq!(cache_dir_in(env), PathBuf::from("/h/.cache/shoal"));
        let env: &[(&str, &str)] = &[];
        assert_eq!(cache_dir_in(env), PathBuf::from("/.cache/shoal"));
    }

    #[test]
    fn data_and_config_follow_xdg() {
        let env: &[(&str, &str)] = &[("HOME", "/h")];
        assert_eq!(data_dir_in(env), PathBuf::from("/h/.local/share/shoal"));
        assert_eq!(config_dir_in(env), PathBuf::from("/h/.config/shoal"));
        let env: &[(&str, &str)] = &[
            ("HOME", "/h"),
            ("XDG_DATA_HOME", "/d"),
            ("XDG_CONFIG_HOME", "/cfg"),
        ];
        assert_eq!(data_dir_in(env), PathBuf::from("/d/shoal"));
        assert_eq!(config_dir_in(env), PathBuf::from("/cfg/shoal"));
    }

    #[test]
    fn python_is_shoal_python_else_the_venv() {
        let env: &[(&str, &str)] = &[("SHOAL_PYTHON", "/usr/bin/python3"), ("HOME", "/h")];
        assert_eq!(python_in(env), PathBuf::from("/usr/bin/python3"));
        let env: &[(&str, &str)] = &[("SHOAL_CACHE_DIR", "/c")];
        assert_eq!(python_in(env), PathBuf::from("/c/venv/bin/python"));
    }
}
