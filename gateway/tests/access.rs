//! Who may use the API, over real TCP on loopback against the fake backend: every protected
//! route of every API answers 401 in its own error shape without a key and 2xx with one, a
//! chat key is refused on the admin routes, foreign web pages are refused before anything
//! runs, and the limits on connections, body bytes and body time hold.

mod common;

use common::*;
use gateway::fake::{FAKE_IDLE_MODEL, FAKE_MODEL};
use gateway::{AccessPolicy, GatewayConfig};
use hyper::StatusCode;
use serde_json::{json, Value};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const ADMIN: &str = "admin-0123456789abcdef";
const CHAT_KEY: &str = "chat-0123456789abcdef";

async fn locked() -> TestServer {
    let access = AccessPolicy::new(&[ADMIN.into()], &[CHAT_KEY.into()], &[]).unwrap();
    start_with(Duration::ZERO, GatewayConfig::default(), access).await
}

/// Whose error shape a route answers in.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Shape {
    OpenAi,
    Anthropic,
    Ollama,
}

/// Every route that needs a key: method, path, a body that succeeds, the error shape, and
/// whether it needs an admin key.
fn protected_routes() -> Vec<(&'static str, String, String, Shape, bool)> {
    let chat = json!({"model": FAKE_MODEL, "messages": [{"role": "user", "content": "echo: hi"}]});
    let anthropic = json!({"model": FAKE_MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "echo: hi"}]});
    let ollama_chat = json!({"model": FAKE_MODEL, "stream": false, "messages": [{"role": "user", "content": "echo: hi"}]});
    let ollama_gen = json!({"model": FAKE_MODEL, "stream": false, "prompt": "echo: hi"});
    let place = json!({"model_id": FAKE_IDLE_MODEL, "sharding": "Pipeline", "instance_meta": "MlxRing", "min_nodes": 1});
    let create = json!({"instance": {"instance_id": "made-by-test", "model_id": FAKE_MODEL}});
    let s = |v: Value| v.to_string();
    vec![
        (
            "POST",
            "/v1/chat/completions".into(),
            s(chat.clone()),
            Shape::OpenAi,
            false,
        ),
        (
            "POST",
            "/v1/messages".into(),
            s(anthropic.clone()),
            Shape::Anthropic,
            false,
        ),
        (
            "POST",
            "/v1/messages/count_tokens".into(),
            s(anthropic),
            Shape::Anthropic,
            false,
        ),
        (
            "POST",
            "/v1/responses".into(),
            s(json!({"model": FAKE_MODEL, "input": "echo: hi"})),
            Shape::OpenAi,
            false,
        ),
        (
            "POST",
            "/api/chat".into(),
            s(ollama_chat.clone()),
            Shape::Ollama,
            false,
        ),
        (
            "POST",
            "/ollama/api/chat".into(),
            s(ollama_chat),
            Shape::Ollama,
            false,
        ),
        (
            "POST",
            "/api/generate".into(),
            s(ollama_gen),
            Shape::Ollama,
            false,
        ),
        (
            "POST",
            "/api/show".into(),
            s(json!({"model": FAKE_MODEL})),
            Shape::Ollama,
            false,
        ),
        (
            "GET",
            "/api/tags".into(),
            String::new(),
            Shape::Ollama,
            false,
        ),
        ("GET", "/api/ps".into(), String::new(), Shape::Ollama, false),
        (
            "GET",
            "/api/version".into(),
            String::new(),
            Shape::Ollama,
            false,
        ),
        (
            "GET",
            "/v1/models".into(),
            String::new(),
            Shape::OpenAi,
            false,
        ),
        ("GET", "/models".into(), String::new(), Shape::OpenAi, false),
        ("GET", "/state".into(), String::new(), Shape::OpenAi, true),
        (
            "GET",
            "/state/nodes".into(),
            String::new(),
            Shape::OpenAi,
            true,
        ),
        (
            "GET",
            "/instance/previews?model_id=fake%2Fmodel".into(),
            String::new(),
            Shape::OpenAi,
            true,
        ),
        (
            "POST",
            "/place_instance".into(),
            s(place),
            Shape::OpenAi,
            true,
        ),
        ("POST", "/instance".into(), s(create), Shape::OpenAi, true),
        (
            "GET",
            "/instance/made-by-test".into(),
            String::new(),
            Shape::OpenAi,
            true,
        ),
        (
            "DELETE",
            "/instance/made-by-test".into(),
            String::new(),
            Shape::OpenAi,
            true,
        ),
        (
            "DELETE",
            format!("/models/{FAKE_IDLE_MODEL}"),
            String::new(),
            Shape::OpenAi,
            true,
        ),
    ]
}

fn assert_auth_error(shape: Shape, status: StatusCode, v: &Value, want: StatusCode, what: &str) {
    assert_eq!(status, want, "{what}: {v}");
    match shape {
        Shape::OpenAi => {
            let code = v["error"]["code"].as_str().unwrap_or_default();
            assert!(
                ["missing_api_key", "invalid_api_key", "admin_key_required"].contains(&code),
                "{what}: {v}"
            );
            assert!(
                v["error"]["message"].as_str().unwrap().contains("key"),
                "{what}: {v}"
            );
        }
        Shape::Anthropic => {
            assert_eq!(v["type"], "error", "{what}: {v}");
            let kind = if want == StatusCode::UNAUTHORIZED {
                "authentication_error"
            } else {
                "permission_error"
            };
            assert_eq!(v["error"]["type"], kind, "{what}: {v}");
        }
        Shape::Ollama => assert!(v["error"].as_str().unwrap().contains("key"), "{what}: {v}"),
    }
}

#[tokio::test]
async fn every_protected_route_needs_a_key_in_its_own_shape() {
    let s = locked().await;
    let bad = "Bearer not-a-key-0123456789";
    for (method, path, body, shape, _) in protected_routes() {
        let what = format!("{method} {path}");
        let (status, headers, bytes) = call(s.addr, method, &path, &body).await;
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_auth_error(shape, status, &v, StatusCode::UNAUTHORIZED, &what);
        assert_eq!(
            headers["www-authenticate"], "Bearer realm=\"shoal\"",
            "{what}"
        );
        let (status, _, bytes) =
            call_with(s.addr, method, &path, &body, &[("authorization", bad)]).await;
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_auth_error(shape, status, &v, StatusCode::UNAUTHORIZED, &what);
    }
    // Nothing ran: no instance was placed or created.
    let (status, _, bytes) = call_with(
        s.addr,
        "GET",
        "/state",
        "",
        &[("authorization", &format!("Bearer {ADMIN}"))],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let state: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(state["instances"], json!({}), "{state}");
}

#[tokio::test]
async fn admin_keys_open_every_route_and_chat_keys_only_chat() {
    let s = locked().await;
    let admin = format!("Bearer {ADMIN}");
    for (method, path, body, shape, needs_admin) in protected_routes() {
        let what = format!("{method} {path}");
        if needs_admin {
            let (status, _, bytes) =
                call_with(s.addr, method, &path, &body, &[("x-api-key", CHAT_KEY)]).await;
            let v: Value = serde_json::from_slice(&bytes).unwrap();
            assert_auth_error(shape, status, &v, StatusCode::FORBIDDEN, &what);
        } else {
            // A chat key, once as Bearer and once as Anthropic's x-api-key.
            let bearer = format!("Bearer {CHAT_KEY}");
            for header in [("authorization", bearer.as_str()), ("x-api-key", CHAT_KEY)] {
                let (status, _, bytes) = call_with(s.addr, method, &path, &body, &[header]).await;
                assert!(
                    status.is_success(),
                    "{what} with {header:?}: {status} {bytes:?}"
                );
            }
        }
        let (status, _, bytes) =
            call_with(s.addr, method, &path, &body, &[("authorization", &admin)]).await;
        assert!(status.is_success(), "{what}: {status} {bytes:?}");
    }
}

#[tokio::test]
async fn public_routes_and_the_event_stream_token() {
    let s = locked().await;
    assert_eq!(call(s.addr, "GET", "/node_id", "").await.0, StatusCode::OK);
    assert_eq!(call(s.addr, "GET", "/", "").await.0, StatusCode::OK);
    // EventSource sends no headers: the stream takes the key in the query, nothing else does.
    let events = |path: String| {
        let addr = s.addr;
        async move {
            let response = send(addr, build("GET", addr, &path, "")).await;
            response.status()
        }
    };
    assert_eq!(events("/events".into()).await, StatusCode::UNAUTHORIZED);
    assert_eq!(
        events(format!("/events?access_token={CHAT_KEY}")).await,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        events(format!("/events?access_token={ADMIN}")).await,
        StatusCode::OK
    );
    let (status, _, _) = call(s.addr, "GET", &format!("/state?access_token={ADMIN}"), "").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn foreign_web_pages_cannot_drive_the_node() {
    // Open (no keys), as a node is by default: only the origin rule protects it.
    let s = start(Duration::ZERO, GatewayConfig::default()).await;
    let evil = [
        ("origin", "https://evil.example"),
        ("content-type", "text/plain"),
    ];
    let place = json!({"model_id": FAKE_IDLE_MODEL, "sharding": "Pipeline", "instance_meta": "MlxRing", "min_nodes": 1}).to_string();
    let (status, headers, bytes) =
        call_with(s.addr, "POST", "/place_instance", &place, &evil).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{bytes:?}");
    assert!(headers.get("access-control-allow-origin").is_none());
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["error"]["code"], "origin_not_allowed");
    // A preflight for DELETE from that page is refused too.
    let preflight = [
        ("origin", "https://evil.example"),
        ("access-control-request-method", "DELETE"),
    ];
    let (status, headers, _) = call_with(s.addr, "OPTIONS", "/instance/x", "", &preflight).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(headers.get("access-control-allow-origin").is_none());
    // A page on a domain re-pointed at the node (DNS rebinding) sends its own Host.
    let rebound = [
        ("origin", "http://evil.example:52415"),
        ("host", "evil.example:52415"),
    ];
    assert_eq!(
        call_with(s.addr, "POST", "/place_instance", &place, &rebound)
            .await
            .0,
        StatusCode::FORBIDDEN
    );
    let (_, _, bytes) = call(s.addr, "GET", "/state", "").await;
    let state: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        state["instances"],
        json!({}),
        "a refused request ran: {state}"
    );
    // The node's own page (the dashboard) is served.
    let own = format!("http://{}", s.addr);
    let (status, headers, _) = call_with(
        s.addr,
        "POST",
        "/place_instance",
        &place,
        &[("origin", &own)],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["access-control-allow-origin"], own.as_str());
    // A configured origin is served.
    let access = AccessPolicy::new(&[], &[], &["http://tools.lan:3000".into()]).unwrap();
    let s = start_with(Duration::ZERO, GatewayConfig::default(), access).await;
    let (status, headers, _) = call_with(
        s.addr,
        "GET",
        "/v1/models",
        "",
        &[("origin", "http://tools.lan:3000")],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        headers["access-control-allow-origin"],
        "http://tools.lan:3000"
    );
}

/// Writes the head of a POST announcing `length` body bytes (and that the connection closes
/// after the answer), and `sent` of them.
async fn half_post(addr: std::net::SocketAddr, length: usize, sent: usize) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         content-length: {length}\r\nconnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&vec![b' '; sent]).await.unwrap();
    stream
}

/// Reads what the server sends until it closes the connection (bounded by `within`).
async fn read_until_closed(stream: &mut TcpStream, within: Duration) -> String {
    let mut out = Vec::new();
    tokio::time::timeout(within, stream.read_to_end(&mut out))
        .await
        .expect("the server kept the connection open")
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn a_body_that_never_finishes_is_cut_off() {
    let config = GatewayConfig {
        body_timeout: Duration::from_millis(500),
        ..GatewayConfig::default()
    };
    let s = start(Duration::ZERO, config).await;
    let started = std::time::Instant::now();
    // 50 half-sent bodies, as the finding had (they all stayed open past 60 s before).
    let mut streams = Vec::new();
    for _ in 0..50 {
        streams.push(half_post(s.addr, 1000, 10).await);
    }
    for stream in &mut streams {
        let answer = read_until_closed(stream, Duration::from_secs(5)).await;
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("body_timeout"), "{answer}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn bodies_beyond_the_budget_are_refused_not_held() {
    let config = GatewayConfig {
        body_budget: 1024 * 1024,
        ..GatewayConfig::default()
    };
    let s = start(Duration::ZERO, config).await;
    // Connections that announce large bodies and send nothing hold none of the budget (two
    // such once locked every POST out for a minute): a chat still passes beside them.
    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(half_post(s.addr, 1024 * 1024, 0).await);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let body = json!({"model": FAKE_MODEL, "messages": [{"role": "user", "content": "echo: ok"}]});
    assert_eq!(
        call(s.addr, "POST", "/v1/chat/completions", &body.to_string())
            .await
            .0,
        StatusCode::OK
    );
    drop(idle);
    // One body holds 800 KiB of the 1 MiB budget as its bytes arrive...
    let mut first = half_post(s.addr, 900 * 1024, 800 * 1024).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    // ...so a second is refused once its bytes pass what is left, with Retry-After, and
    // closed.
    let mut second = half_post(s.addr, 900 * 1024, 300 * 1024).await;
    let answer = read_until_closed(&mut second, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 1"),
        "{answer}"
    );
    assert!(answer.contains("body_budget_exhausted"), "{answer}");
    // Small chats still pass.
    assert_eq!(
        call(s.addr, "POST", "/v1/chat/completions", &body.to_string())
            .await
            .0,
        StatusCode::OK
    );
    // Once the first gives up, its share is free again.
    drop(first.shutdown().await);
    drop(first);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut third = half_post(s.addr, 800 * 1024, 800 * 1024).await;
    let answer = read_until_closed(&mut third, Duration::from_secs(5)).await;
    // A body of spaces is no JSON: refused as such, which means it was read whole.
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
}

#[tokio::test]
async fn connections_beyond_the_cap_get_503_and_close() {
    let config = GatewayConfig {
        max_connections: 4,
        ..GatewayConfig::default()
    };
    let s = start(Duration::ZERO, config).await;
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(TcpStream::connect(s.addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut extra = TcpStream::connect(s.addr).await.unwrap();
    let answer = read_until_closed(&mut extra, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("too_many_connections"), "{answer}");
    held.pop();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(call(s.addr, "GET", "/node_id", "").await.0, StatusCode::OK);
}
