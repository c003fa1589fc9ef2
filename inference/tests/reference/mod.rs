//! Where the reference data that `cargo xtask setup` fetches lives (real chat templates and
//! llama.cpp's tokenizer vectors, from the `llama-cpp-python` sdist; see
//! `xtask/src/reference.rs`), and the Python interpreter with jinja2. Without them a test
//! fails, or with `SHOAL_ALLOW_SKIP=1` is skipped and counted (see `kit::skip`).
#![allow(dead_code)]

use std::path::PathBuf;

pub mod tool_chat;

/// The llama-cpp-python release setup extracts (`xtask/src/reference.rs` pins the same).
const LLAMA_CPP_PYTHON_VERSION: &str = "0.3.36";

/// The shoal cache root.
pub fn cache_dir() -> PathBuf {
    kit::dirs::cache_dir()
}

/// `<cache>/reference/llama.cpp-<version>`, holding `templates/` and `vocab/`.
pub fn reference_dir() -> PathBuf {
    cache_dir()
        .join("reference")
        .join(format!("llama.cpp-{LLAMA_CPP_PYTHON_VERSION}"))
}

/// True when setup has not fetched the reference data and skips are allowed (the caller
/// returns); without the data and without `SHOAL_ALLOW_SKIP=1`, the test fails here.
pub fn skip_without_reference() -> bool {
    let stamp = reference_dir().join(".shoal-ok");
    let check = if stamp.exists() {
        Ok(())
    } else {
        Err(format!(
            "no reference data at {}",
            reference_dir().display()
        ))
    };
    !kit::skip::can_run(check, "run `cargo xtask setup`")
}

/// The venv's Python with jinja2: `SHOAL_PYTHON` (set by `cargo xtask test`), else
/// `<cache>/venv/bin/python`; `None` when it has no jinja2 and skips are allowed (without
/// them the test fails here).
pub fn python_with_jinja2() -> Option<PathBuf> {
    let python = kit::dirs::python();
    let ok = std::process::Command::new(&python)
        .args(["-c", "import jinja2"])
        .output()
        .is_ok_and(|out| out.status.success());
    let check = if ok {
        Ok(())
    } else {
        Err(format!("{} has no jinja2", python.display()))
    };
    kit::skip::can_run(
        check,
        "run `cargo xtask setup` (it installs jinja2 into the venv)",
    )
    .then_some(python)
}

/// Renders jobs (each a JSON object as `jinja2_render.py` reads them, written as text so that
/// the order of keys reaches Python as written) with jinja2 in one Python process: the text,
/// or jinja2's error.
pub fn render_with_jinja2(
    python: &std::path::Path,
    jobs: &[String],
) -> Vec<Result<String, String>> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/reference/jinja2_render.py"
    );
    let mut child = Command::new(python)
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start python");
    let input = format!("[{}]", jobs.join(","));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "jinja2_render.py failed");
    let results: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(results.len(), jobs.len());
    results
        .into_iter()
        .map(|r| match (r.get("ok"), r.get("error")) {
            (Some(serde_json::Value::String(text)), _) => Ok(text.clone()),
            (_, Some(serde_json::Value::String(e))) => Err(e.clone()),
            _ => panic!("bad result {r}"),
        })
        .collect()
}
