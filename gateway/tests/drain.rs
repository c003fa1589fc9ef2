//! Stopping the server drains it (see `gateway::drain`): the listener closes, a request on a
//! connection already open is answered 503 `node_stopping`, an answer that finishes within
//! the grace period ends normally, and one that does not is ended with a `node_stopping`
//! error frame and `[DONE]`; the server returns once both ended.

mod common;

use common::*;
use gateway::fake::FakeBackend;
use gateway::GatewayConfig;
use http_body_util::BodyExt;
use hyper::StatusCode;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Opens a stream of a chat whose answer comes after `wait_ms`; answers its body.
async fn open_stream(addr: std::net::SocketAddr, wait_ms: u64) -> hyper::body::Incoming {
    let body = json!({"model": gateway::fake::FAKE_MODEL, "stream": true,
                      "messages": [{"role": "user", "content": format!("wait {wait_ms}")}]});
    let response = send(
        addr,
        build("POST", addr, "/v1/chat/completions", &body.to_string()),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    response.into_body()
}

async fn read_all(body: hyper::body::Incoming) -> String {
    let bytes = tokio::time::timeout(Duration::from_secs(10), body.collect())
        .await
        .expect("the stream ends within 10 s")
        .expect("body")
        .to_bytes();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[tokio::test]
async fn stopping_finishes_short_answers_and_cuts_long_ones_with_an_error() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let config = GatewayConfig {
        drain_grace: Duration::from_secs(2),
        ..GatewayConfig::default()
    };
    let server = tokio::spawn(gateway::serve(
        listener,
        Arc::new(FakeBackend::new(Duration::ZERO)),
        config,
        shutdown.clone(),
    ));
    let short = open_stream(addr, 500).await;
    let long = open_stream(addr, 60_000).await;
    // A keep-alive connection opened before the stop.
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut open, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    // One request on it, so the server has taken the connection before it stops.
    let models = open
        .send_request(build("GET", addr, "/v1/models", ""))
        .await
        .unwrap();
    assert_eq!(models.status(), StatusCode::OK);
    models.into_body().collect().await.unwrap();
    let stopped = Instant::now();
    shutdown.cancel();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // No new connection; a new chat on the open one is refused with a clear error.
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "still listening"
    );
    let chat = chat_body("hello", json!({}));
    let refused = open
        .send_request(build("POST", addr, "/v1/chat/completions", &chat))
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    let bytes = refused.into_body().collect().await.unwrap().to_bytes();
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["error"]["code"], "node_stopping", "{v}");

    let short = read_all(short).await;
    let events = parse_sse(&short);
    assert_eq!(events.last(), Some(&Sse::Done), "{short}");
    assert_eq!(streamed_text(&events), "done", "{short}");
    assert!(!short.contains("\"error\""), "{short}");

    let long = read_all(long).await;
    let events = parse_sse(&long);
    assert_eq!(events.last(), Some(&Sse::Done), "{long}");
    let error = events
        .iter()
        .find_map(|e| match e {
            Sse::Data(v) if v.get("error").is_some() => Some(v["error"].clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no error frame: {long}"));
    assert_eq!(error["code"], "node_stopping", "{error}");
    let cut_after = stopped.elapsed();
    assert!(
        cut_after >= Duration::from_secs(2) && cut_after < Duration::from_secs(5),
        "cut after {cut_after:?}, the grace is 2 s"
    );
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("the server returns once drained")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn an_idle_server_stops_at_once() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(gateway::serve(
        listener,
        Arc::new(FakeBackend::new(Duration::ZERO)),
        GatewayConfig::default(),
        shutdown.clone(),
    ));
    shutdown.cancel();
    // Nothing in flight: it returns at once, not after the 10 s grace.
    tokio::time::timeout(Duration::from_secs(1), server)
        .await
        .expect("an idle server stops within a second")
        .unwrap()
        .unwrap();
}
