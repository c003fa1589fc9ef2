//! The official `openai` Python client against a real gateway on 127.0.0.1 (port 0) over the
//! scripted fake backend: listing, whole and streamed chat, stop strings, max_tokens, seeds,
//! sampling passthrough, logprobs and error cases (tests/openai_client.py holds the checks; its
//! model-agnostic half is meant to run against a real node too, without `--fake`).
//!
//! The client lives in the venv that `cargo xtask setup` (or `cargo xtask pyenv`) creates.

mod common;

use gateway::fake::{FAKE_IDLE_MODEL, FAKE_MODEL};
use gateway::GatewayConfig;
use std::path::PathBuf;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_openai_python_client() {
    // `SHOAL_PYTHON`, else `<cache>/venv/bin/python`, resolved by the kit as xtask does.
    let python = kit::dirs::python();
    assert!(
        python.exists(),
        "{} is missing: the openai Python client is installed by `cargo xtask setup` \
         (or just `cargo xtask pyenv`); run it, then this test again",
        python.display()
    );
    let server = common::start(Duration::from_millis(1), GatewayConfig::default()).await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/openai_client.py");
    let mut command = tokio::process::Command::new(&python);
    command
        .arg(&script)
        .arg(format!("http://{}/v1", server.addr))
        .arg(FAKE_MODEL)
        .arg("--fake")
        .arg(FAKE_IDLE_MODEL)
        .kill_on_drop(true);
    // Loopback only: no proxy may intercept.
    for var in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ] {
        command.env_remove(var);
    }
    command.env("NO_PROXY", "*").env("OPENAI_LOG", "");
    let output = tokio::time::timeout(Duration::from_secs(120), command.output())
        .await
        .expect("the Python client finished within 120 s")
        .expect("the venv's python starts");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("all passed"),
        "openai client checks failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
}
