//! `POST /v1/cancel/{id}` from another connection ends a streaming answer normally (finish
//! reason `stop`, then the stream's own end) and stops the backend's generation; an id that
//! is not running answers 404.

mod common;

use common::*;
use gateway::GatewayConfig;
use http_body_util::BodyExt;
use hyper::StatusCode;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Streams `body` to `path`, reads until the first data line that has an `id` somewhere
/// (`pointer`), cancels that id, and returns the id and the rest of the stream's text.
async fn cancel_mid_stream(s: &TestServer, path: &str, body: Value, pointer: &str) -> String {
    let response = send(s.addr, build("POST", s.addr, path, &body.to_string())).await;
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut text = String::new();
    let id = loop {
        let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .expect("a first event within 10 s")
            .expect("the stream has a first event")
            .expect("frame");
        if let Some(data) = frame.data_ref() {
            text.push_str(&String::from_utf8_lossy(data));
        }
        let id = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .find_map(|v| {
                v.pointer(pointer)
                    .and_then(Value::as_str)
                    .map(str::to_string)
            });
        if let Some(id) = id {
            break id;
        }
    };
    let (status, v) = call_json(s.addr, "POST", &format!("/v1/cancel/{id}"), "").await;
    assert_eq!(
        (status, v),
        (StatusCode::OK, json!({"id": id, "cancelled": true}))
    );
    let rest = tokio::time::timeout(Duration::from_secs(10), body.collect())
        .await
        .expect("the cancelled stream ends within 10 s")
        .expect("body")
        .to_bytes();
    text.push_str(&String::from_utf8_lossy(&rest));
    text
}

#[tokio::test]
async fn cancel_ends_a_stream_normally_and_stops_generation() {
    let s = start(Duration::ZERO, GatewayConfig::default()).await;
    let text = cancel_mid_stream(
        &s,
        "/v1/chat/completions",
        json!({"model": gateway::fake::FAKE_MODEL, "stream": true,
               "messages": [{"role": "user", "content": "wait 60000"}]}),
        "/id",
    )
    .await;
    let events = parse_sse(&text);
    assert_eq!(events.last(), Some(&Sse::Done), "{text}");
    let finishes: Vec<&Value> = events
        .iter()
        .filter_map(|e| match e {
            Sse::Data(v) => v.pointer("/choices/0/finish_reason"),
            _ => None,
        })
        .collect();
    assert_eq!(finishes, [&json!("stop")], "{text}");
    assert_eq!(streamed_text(&events), "");

    let text = cancel_mid_stream(
        &s,
        "/v1/messages",
        json!({"model": gateway::fake::FAKE_MODEL, "stream": true, "max_tokens": 10,
               "messages": [{"role": "user", "content": "wait 60000"}]}),
        "/message/id",
    )
    .await;
    assert!(text.contains("\"stop_reason\":\"end_turn\""), "{text}");
    assert!(
        text.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"),
        "{text}"
    );

    // The backend saw both cancellations; nothing is left registered.
    for _ in 0..100 {
        if s.backend.counters.cancelled.load(Ordering::Relaxed) == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(s.backend.counters.cancelled.load(Ordering::Relaxed), 2);
    let (status, v) = call_json(s.addr, "POST", "/v1/cancel/chatcmpl-nope", "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(v["error"]["code"], "request_not_found");
}

/// On a node with API keys only the key that started a request may cancel it: another key
/// (or none) gets the 404 an unknown id gets, so the id is not confirmed, and the stream goes
/// on; the starting key's cancel ends it.
#[tokio::test]
async fn only_the_key_that_started_a_stream_cancels_it() {
    const A: &str = "chat-key-a-0123456789";
    const B: &str = "chat-key-b-0123456789";
    let access = gateway::AccessPolicy::new(&[], &[A.into(), B.into()], &[]).unwrap();
    let s = start_with(Duration::ZERO, GatewayConfig::default(), access).await;
    let body = json!({"model": gateway::fake::FAKE_MODEL, "stream": true,
                      "messages": [{"role": "user", "content": "wait 60000"}]});
    let mut request = build("POST", s.addr, "/v1/chat/completions", &body.to_string());
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {A}").parse().unwrap());
    let response = send(s.addr, request).await;
    assert_eq!(response.status(), StatusCode::OK);
    let mut stream = response.into_body();
    let mut text = String::new();
    let id = loop {
        let frame = tokio::time::timeout(Duration::from_secs(10), stream.frame())
            .await
            .expect("a first event within 10 s")
            .expect("a first event")
            .expect("frame");
        if let Some(data) = frame.data_ref() {
            text.push_str(&String::from_utf8_lossy(data));
        }
        let found = parse_sse(&text).into_iter().find_map(|e| match e {
            Sse::Data(v) => v["id"].as_str().map(str::to_string),
            _ => None,
        });
        if let Some(id) = found {
            break id;
        }
    };
    let cancel = |key: Option<&'static str>| {
        let path = format!("/v1/cancel/{id}");
        async move {
            let auth = key.map(|k| format!("Bearer {k}"));
            let headers: Vec<(&str, &str)> = auth
                .as_deref()
                .map(|a| vec![("authorization", a)])
                .unwrap_or_default();
            let (status, _, bytes) = call_with(s.addr, "POST", &path, "", &headers).await;
            let v: Value = serde_json::from_slice(&bytes).unwrap_or_default();
            (status, v["error"]["code"].clone())
        }
    };
    assert_eq!(
        cancel(Some(B)).await,
        (StatusCode::NOT_FOUND, json!("request_not_found")),
        "another key"
    );
    assert_eq!(cancel(None).await.0, StatusCode::UNAUTHORIZED, "no key");
    // The stream goes on: nothing ends it within half a second, and the backend saw no cancel.
    let more = tokio::time::timeout(Duration::from_millis(500), stream.frame()).await;
    assert!(more.is_err(), "the stream ended after another key's cancel");
    assert_eq!(s.backend.counters.cancelled.load(Ordering::Relaxed), 0);
    assert_eq!(cancel(Some(A)).await, (StatusCode::OK, Value::Null));
    let rest = tokio::time::timeout(Duration::from_secs(10), stream.collect())
        .await
        .expect("the cancelled stream ends within 10 s")
        .expect("body")
        .to_bytes();
    text.push_str(&String::from_utf8_lossy(&rest));
    assert_eq!(parse_sse(&text).last(), Some(&Sse::Done), "{text}");
}
