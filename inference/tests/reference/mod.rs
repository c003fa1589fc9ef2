//! Where the reference data that `cargo xtask setup` fetches lives (real chat templates and
//! llama.cpp's tokenizer vectors, from the `llama-cpp-python` sdist; see
//! `xtask/src/reference.rs`), and the Python interpreter with jinja2.
#![allow(dead_code)]

use inference::Engine;
use std::path::PathBuf;

/// The llama-cpp-python release setup extracts (`xtask/src/reference.rs` pins the same).
const LLAMA_CPP_PYTHON_VERSION: &str = "0.3.36";

/// The shoal cache root, resolved as the inference crate resolves it for the default model.
pub fn cache_dir() -> PathBuf {
    let model = Engine::default_model_path();
    model
        .parent()
        .and_then(|models| models.parent())
        .expect("the default model lives in <cache>/models")
        .to_path_buf()
}

/// `<cache>/reference/llama.cpp-<version>`, holding `templates/` and `vocab/`.
pub fn reference_dir() -> PathBuf {
    cache_dir()
        .join("reference")
        .join(format!("llama.cpp-{LLAMA_CPP_PYTHON_VERSION}"))
}

/// True (after saying why) when setup has not fetched the reference data.
pub fn skip_without_reference() -> bool {
    let stamp = reference_dir().join(".shoal-ok");
    if stamp.exists() {
        return false;
    }
    eprintln!(
        "SKIPPED: no reference data at {} (run `cargo xtask setup`)",
        reference_dir().display()
    );
    true
}

/// The venv's Python with jinja2: `SHOAL_PYTHON` (set by `cargo xtask test`), else
/// `<cache>/venv/bin/python`; `None` (after saying why) when it has no jinja2.
pub fn python_with_jinja2() -> Option<PathBuf> {
    let python = std::env::var_os("SHOAL_PYTHON")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_dir().join("venv/bin/python"));
    let ok = std::process::Command::new(&python)
        .args(["-c", "import jinja2"])
        .output()
        .is_ok_and(|out| out.status.success());
    if ok {
        Some(python)
    } else {
        eprintln!(
            "SKIPPED: {} has no jinja2 (run `cargo xtask setup`)",
            python.display()
        );
        None
    }
}
