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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_openai_python_client() {
    let server = common::start(Duration::from_millis(1), GatewayConfig::default()).await;
    let args = [
        format!("http://{}/v1", server.addr),
        FAKE_MODEL.into(),
        "--fake".into(),
        FAKE_IDLE_MODEL.into(),
    ];
    common::python_script("openai_client.py", &args, Duration::from_secs(120)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_anthropic_python_client() {
    let server = common::start(Duration::from_millis(1), GatewayConfig::default()).await;
    let args = [
        format!("http://{}", server.addr),
        FAKE_MODEL.into(),
        "--fake".into(),
    ];
    common::python_script("anthropic_client.py", &args, Duration::from_secs(120)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_ollama_python_client() {
    let server = common::start(Duration::from_millis(1), GatewayConfig::default()).await;
    let args = [
        format!("http://{}", server.addr),
        FAKE_MODEL.into(),
        "--fake".into(),
    ];
    common::python_script("ollama_client.py", &args, Duration::from_secs(120)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_openai_python_client_responses() {
    let server = common::start(Duration::from_millis(1), GatewayConfig::default()).await;
    let args = [
        format!("http://{}/v1", server.addr),
        FAKE_MODEL.into(),
        "--fake".into(),
    ];
    common::python_script("responses_client.py", &args, Duration::from_secs(120)).await;
}
