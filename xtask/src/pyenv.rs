//! `cargo xtask pyenv`: a Python virtual environment with the official `openai`, `anthropic` and
//! `ollama` clients, for the tests that drive the gateway the way users do, jinja2, for the
//! chat-template tests, Selenium, for the dashboard's browser tests, and gguf-py, for the
//! K-quant tests.
//!
//! The venv lives at `<cache>/venv` (see `kit::dirs`), outside the clone. Every package
//! is pinned (the client and what it pulled from PyPI when it was pinned), so every machine
//! tests against the same client. A stamp holding the pinned list makes a second run free;
//! changing the list reinstalls.

use crate::util::{command_exists, run, Step};
pub use kit::dirs::{venv_dir, venv_python};
use std::fs;
use std::path::PathBuf;
use std::process::Command;

/// The `openai` client and its dependencies, pinned.
pub const PYTHON_REQUIREMENTS: &[&str] = &[
    "openai==3.57.0",
    "annotated-types==0.8.0",
    "anyio==4.16.0",
    "h11==0.16.0",
    "httpcore2==2.16.2",
    "httpx2==2.16.2",
    "idna==3.20",
    "jiter==0.19.0",
    "pydantic==2.14.4",
    "pydantic_core==2.50.5",
    "sniffio==1.3.1",
    "truststore==0.10.5",
    "typing-inspection==0.4.5",
    "typing_extensions==4.16.0",
    // Python's jinja2, the reference the chat-template tests compare minijinja's renders with.
    "jinja2==3.1.6",
    "MarkupSafe==3.0.4",
    // The official `anthropic` and `ollama` clients, for the Messages and Ollama API tests,
    // and what they pulled in beyond the packages above.
    "anthropic==2.10.0",
    "ollama==0.6.3",
    "certifi==2026.10.19.post1",
    "docstring_parser==0.18.0",
    "httpcore==1.0.9",
    "httpx==0.28.1",
    "opentelemetry-api==1.45.2",
    // huggingface_hub, the peer `cargo xtask bench download` measures `shoal download` against
    // (and the client the test hub is checked with), and what it pulls beyond the above.
    "huggingface_hub==2.4.0",
    "click==8.5.1",
    "filelock==4.3.1",
    "fsspec==2026.9.0",
    "hf-xet==1.8.0",
    "packaging==26.4",
    "PyYAML==6.0.4",
    "tqdm==4.70.1",
    // Selenium, which drives Debian's headless Chromium (through its chromedriver) in the
    // dashboard's browser tests, and what it pulls beyond the above.
    "selenium==4.51.0",
    "attrs==26.1.0",
    "outcome==1.3.0.post0",
    "PySocks==1.7.1",
    "sortedcontainers==2.4.0",
    "trio==0.35.0",
    "trio-websocket==0.12.2",
    "urllib3==2.8.0",
    "websocket-client==1.9.2",
    "wsproto==1.3.2",
    // gguf-py, llama.cpp's Python GGUF library: its `gguf.quants.dequantize` is the reference
    // the K-quant tests compare shoal's dequantization with; and what it pulls beyond the above.
    "gguf==0.19.0",
    "numpy==2.4.6",
    // jsonschema, which validates every structured output against the schema sent (issue
    // 45), and what it pulls beyond the above.
    "jsonschema==4.26.0",
    "jsonschema-specifications==2025.9.1",
    "referencing==0.37.0",
    "rpds-py==2026.9.1",
    "requests==2.34.2",
    "charset-normalizer==3.4.7",
];

/// Creates or updates the venv; returns its interpreter.
pub fn pyenv(step: Step) -> Result<PathBuf, String> {
    let dir = venv_dir();
    let python = venv_python();
    let stamp = dir.join(".shoal-requirements");
    let wanted = PYTHON_REQUIREMENTS.join("\n");
    if python.exists() && fs::read_to_string(&stamp).ok().as_deref() == Some(wanted.as_str()) {
        step.cached(&dir.display().to_string());
        return Ok(python);
    }
    if !python.exists() {
        if !command_exists("python3") {
            return Err(
                "python3 is needed for the openai client's venv; install python3 and \
                        python3-venv, then run `cargo xtask setup` again"
                    .into(),
            );
        }
        step.progress(&format!("creating {}", dir.display()));
        let _ = fs::remove_dir_all(&dir);
        run(Command::new("python3").arg("-m").arg("venv").arg(&dir)).map_err(|e| {
            format!("{e}\n(on Debian or Ubuntu, `apt-get install python3-venv` provides the venv module)")
        })?;
    }
    step.progress("installing the pinned openai client and jinja2 from PyPI");
    run(Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(PYTHON_REQUIREMENTS))?;
    fs::write(&stamp, wanted).map_err(|e| format!("cannot write {}: {e}", stamp.display()))?;
    step.done(&python.display().to_string());
    Ok(python)
}
