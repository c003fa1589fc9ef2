//! Helpers shared by the gateway's integration tests: a real server on 127.0.0.1 (port 0)
//! over the fake backend, and a minimal hyper client.
#![allow(dead_code)]

use bytes::Bytes;
use gateway::fake::FakeBackend;
use gateway::{CancellationToken, GatewayConfig};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{HeaderMap, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;

pub struct TestServer {
    pub addr: SocketAddr,
    pub backend: Arc<FakeBackend>,
    shutdown: CancellationToken,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Starts a gateway over a fresh fake backend on an ephemeral loopback port.
pub async fn start(token_delay: Duration, config: GatewayConfig) -> TestServer {
    start_with(token_delay, config, gateway::AccessPolicy::default()).await
}

/// [`start`], enforcing `access`.
pub async fn start_with(
    token_delay: Duration,
    config: GatewayConfig,
    access: gateway::AccessPolicy,
) -> TestServer {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let backend = Arc::new(FakeBackend::new(token_delay));
    let shutdown = CancellationToken::new();
    tokio::spawn(gateway::serve_with(
        listener,
        backend.clone(),
        config,
        access,
        shutdown.clone(),
    ));
    TestServer {
        addr,
        backend,
        shutdown,
    }
}

/// Sends one request on a fresh connection and returns the response with its body unread.
pub async fn send(addr: SocketAddr, request: Request<Full<Bytes>>) -> Response<Incoming> {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender.send_request(request).await.unwrap()
}

/// One whole request with extra headers: status, headers, body bytes (10 s bound).
pub async fn call_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    extra: &[(&str, &str)],
) -> (StatusCode, HeaderMap, Bytes) {
    let mut request = build(method, addr, path, body);
    for (name, value) in extra {
        request.headers_mut().insert(
            hyper::header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
    }
    let fut = async {
        let response = send(addr, request).await;
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, headers, bytes)
    };
    tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .expect("request did not finish within 10 s")
}

pub fn build(method: &str, addr: SocketAddr, path: &str, body: &str) -> Request<Full<Bytes>> {
    Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// One whole request: status, headers, body bytes (10 s bound, so a hang fails the test).
pub async fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> (StatusCode, HeaderMap, Bytes) {
    call_with(addr, method, path, body, &[]).await
}

/// A request whose answer is JSON.
pub async fn call_json(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> (StatusCode, Value) {
    let (status, _, bytes) = call(addr, method, path, body).await;
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)));
    (status, value)
}

/// The events of an SSE body: `Data(json)`, `Done`, or `Comment(text)`.
#[derive(Debug, Clone, PartialEq)]
pub enum Sse {
    Data(Value),
    Done,
    Comment(String),
}

pub fn parse_sse(text: &str) -> Vec<Sse> {
    text.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|event| {
            if let Some(comment) = event.strip_prefix(':') {
                Sse::Comment(comment.trim().to_string())
            } else if let Some(data) = event.strip_prefix("data: ") {
                if data == "[DONE]" {
                    Sse::Done
                } else {
                    Sse::Data(
                        serde_json::from_str(data)
                            .unwrap_or_else(|e| panic!("bad data {data}: {e}")),
                    )
                }
            } else {
                panic!("unexpected SSE event {event:?}")
            }
        })
        .collect()
}

/// The text of every content delta, concatenated.
pub fn streamed_text(events: &[Sse]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            Sse::Data(v) => v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string),
            _ => None,
        })
        .collect()
}

/// Recursively checks that no field of `value` is null.
pub fn assert_no_nulls(value: &Value) {
    match value {
        Value::Null => panic!("null field in response"),
        Value::Array(items) => items.iter().for_each(assert_no_nulls),
        Value::Object(map) => {
            for (k, v) in map {
                assert!(!v.is_null(), "field `{k}` is null");
                assert_no_nulls(v);
            }
        }
        _ => {}
    }
}

pub fn chat_body(content: &str, extra: Value) -> String {
    let mut body = serde_json::json!({
        "model": gateway::fake::FAKE_MODEL,
        "messages": [{"role": "user", "content": content}],
    });
    if let (Value::Object(b), Value::Object(e)) = (&mut body, extra) {
        b.extend(e);
    }
    body.to_string()
}

/// Runs one of the gateway's Python client scripts (`tests/NAME`) with the venv's interpreter
/// (`SHOAL_PYTHON`, else `<cache>/venv/bin/python`, resolved by the kit as xtask does), on
/// loopback only, within `limit`; panics with its output unless it exits 0 and printed
/// "all passed". Returns its stdout.
pub async fn python_script(name: &str, args: &[String], limit: Duration) -> String {
    let python = kit::dirs::python();
    assert!(
        python.exists(),
        "{} is missing: the official Python clients are installed by `cargo xtask setup` \
         (or just `cargo xtask pyenv`); run it, then this test again",
        python.display()
    );
    let script = package_dir().join("tests").join(name);
    let mut command = tokio::process::Command::new(&python);
    command.arg(&script).args(args).kill_on_drop(true);
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
    let output = tokio::time::timeout(limit, command.output())
        .await
        .unwrap_or_else(|_| panic!("{name} finished within {limit:?}"))
        .expect("the venv's python starts");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("all passed"),
        "{name} failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    stdout
}

/// This package's folder, as cargo names it to the running test (a test binary reused from
/// another checkout of the same sources, in a shared target folder, carries that checkout's
/// path in `env!`), else as it was at compile time.
pub fn package_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}
