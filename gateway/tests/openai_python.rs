//! The official Python clients against a real gateway on 127.0.0.1 (port 0) over the scripted
//! fake backend. `openai` (tests/openai_client.py): listing, whole and streamed chat, stop
//! strings, max_tokens, seeds, sampling passthrough, logprobs and error cases; `anthropic`
//! (tests/anthropic_client.py): the Messages API; `ollama` (tests/ollama_client.py): the
//! Ollama API at /api and /ollama/api; `openai` again (tests/responses_client.py): the
//! Responses API. Each script's model-agnostic half runs
//! against a real node too (tests/serve_local.rs), without `--fake`.
//!
//! The clients live in the venv that `cargo xtask setup` (or `cargo xtask pyenv`) creates.

mod common;

use gateway::fake::{FAKE_IDLE_MODEL, FAKE_MODEL};
use gateway::GatewayConfig;
use std::time::Duration;

/// Runs `script` against a fresh fake-backed gateway at `http://ADDR{path}`, with `--fake`
/// and `extra` arguments after the model.
async fn run_fake(script: &str, path: &str, extra: &[&str]) {
    let server = common::start(Duration::from_millis(1), GatewayConfig::default()).await;
    let mut args = vec![
        format!("http://{}{path}", server.addr),
        FAKE_MODEL.to_string(),
        "--fake".to_string(),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    common::python_script(script, &args, Duration::from_secs(120)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_openai_python_client() {
    run_fake("openai_client.py", "/v1", &[FAKE_IDLE_MODEL]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_anthropic_python_client() {
    run_fake("anthropic_client.py", "", &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_ollama_python_client() {
    run_fake("ollama_client.py", "", &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_openai_python_client_responses() {
    run_fake("responses_client.py", "/v1", &[]).await;
}
