//! Where shoal keeps its files, resolved in one place: the node, the xtask, the tests (through
//! the test kit) and `native/mlx-sys/build.rs` (a build script, so this crate is std only and
//! rarely changes: a change here reruns the bindings' build).
//!
//! - cache (MLX, models, the venv, the shared build directory): `SHOAL_CACHE_DIR`, else
//!   `$XDG_CACHE_HOME/shoal`, else `~/.cache/shoal`;
//! - data (a node's identity and state): `$XDG_DATA_HOME/shoal`, else `~/.local/share/shoal`;
//! - config: `$XDG_CONFIG_HOME/shoal`, else `~/.config/shoal`.
//!
//! An empty variable counts as unset; with no `HOME`, `/` stands in for it. `.ci/run` repeats
//! the cache rule in shell, because cargo needs the target directory before any Rust runs.

use std::path::PathBuf;

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
}
