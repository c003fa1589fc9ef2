//! The gateway over real TCP on loopback, against the scripted fake backend: response shapes,
//! streaming, stop strings, max_tokens, errors and statuses, cancellation, the cluster API,
//! and concurrency.

mod common;

use common::*;
use gateway::fake::{FAKE_IDLE_MODEL, FAKE_MODEL};
use gateway::GatewayConfig;
use http_body_util::BodyExt;
use hyper::StatusCode;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::time::Duration;

const CHAT: &str = "/v1/chat/completions";

async fn server() -> TestServer {
    start(Duration::ZERO, GatewayConfig::default()).await
}

async fn stream_events(addr: std::net::SocketAddr, body: &str) -> Vec<Sse> {
    let (status, headers, bytes) = call(addr, "POST", CHAT, body).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    assert_eq!(headers["content-type"], "text/event-stream");
    parse_sse(std::str::from_utf8(&bytes).unwrap())
}

#[tokio::test]
async fn non_streaming_completion_has_openai_shape() {
    let s = server().await;
    let (status, v) = call_json(
        s.addr,
        "POST",
        CHAT,
        &chat_body("echo: hello there", json!({})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["model"], FAKE_MODEL);
    assert!(v["created"].as_u64().unwrap() > 1_600_000_000);
    let choice = &v["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["message"]["content"], "hello there");
    assert_eq!(choice["finish_reason"], "stop");
    // "echo: hello there" is 3 words + 3 for the message; "hello there" is 4 tokens of 3 chars.
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 6, "completion_tokens": 4, "total_tokens": 10,
               "prompt_tokens_details": {"cached_tokens": 0}})
    );
    assert_no_nulls(&v);
}

#[tokio::test]
async fn streaming_sends_role_deltas_finish_usage_and_done() {
    let s = server().await;
    let body = chat_body(
        "echo: stream me",
        json!({"stream": true, "stream_options": {"include_usage": true}}),
    );
    let events = stream_events(s.addr, &body).await;
    let Sse::Data(first) = &events[0] else {
        panic!("{events:?}")
    };
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(streamed_text(&events), "stream me");
    let n = events.len();
    assert_eq!(events[n - 1], Sse::Done);
    let Sse::Data(usage) = &events[n - 2] else {
        panic!("{events:?}")
    };
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 3);
    let Sse::Data(last) = &events[n - 3] else {
        panic!("{events:?}")
    };
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
    let ids: Vec<&Value> = events
        .iter()
        .filter_map(|e| match e {
            Sse::Data(v) => Some(&v["id"]),
            _ => None,
        })
        .collect();
    assert!(
        ids.windows(2).all(|w| w[0] == w[1]),
        "one id per completion"
    );
    for e in &events {
        if let Sse::Data(v) = e {
            assert_no_nulls(v);
            assert_eq!(v["object"], "chat.completion.chunk");
        }
    }
}

#[tokio::test]
async fn streaming_without_include_usage_has_no_usage() {
    let s = server().await;
    let events = stream_events(s.addr, &chat_body("echo: abc", json!({"stream": true}))).await;
    assert!(events
        .iter()
        .all(|e| !matches!(e, Sse::Data(v) if v.get("usage").is_some())));
    assert_eq!(events.last(), Some(&Sse::Done));
}

#[tokio::test]
async fn stop_strings_cut_across_tokens() {
    let s = server().await;
    // Tokens: "hel" "lo " "wor" "ld " "END" ...: the stop string spans "ld |EN|D".
    let text = "echo: hello world END tail";
    let (_, v) = call_json(
        s.addr,
        "POST",
        CHAT,
        &chat_body(text, json!({"stop": ["D t", " EN"]})),
    )
    .await;
    assert_eq!(v["choices"][0]["message"]["content"], "hello world");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let events = stream_events(
        s.addr,
        &chat_body(text, json!({"stop": " EN", "stream": true})),
    )
    .await;
    assert_eq!(streamed_text(&events), "hello world");
}

#[tokio::test]
async fn max_tokens_bounds_the_answer() {
    let s = server().await;
    for field in ["max_tokens", "max_completion_tokens"] {
        let (_, v) = call_json(
            s.addr,
            "POST",
            CHAT,
            &chat_body("tell me", json!({field: 3, "seed": 1})),
        )
        .await;
        assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
        assert_eq!(v["usage"]["completion_tokens"], 3);
        assert_eq!(
            v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .split(' ')
                .count(),
            3
        );
    }
}

#[tokio::test]
async fn seed_gives_reproducible_answers() {
    let s = server().await;
    let answer = |seed: u64| {
        let body = chat_body("tell me", json!({"seed": seed}));
        async move {
            call_json(s.addr, "POST", CHAT, &body).await.1["choices"][0]["message"]["content"]
                .clone()
        }
    };
    assert_eq!(answer(7).await, answer(7).await);
    assert_ne!(answer(7).await, answer(8).await);
}

#[tokio::test]
async fn sampling_fields_reach_the_backend() {
    let s = server().await;
    let extra = json!({"temperature": 0.5, "top_p": 0.75, "top_k": 20, "min_p": 0.125, "seed": 9,
        "stop": ["zz"], "presence_penalty": 0.25, "frequency_penalty": -0.5, "max_tokens": 500,
        "logprobs": true, "top_logprobs": 2, "ignore_eos": true});
    let (_, v) = call_json(s.addr, "POST", CHAT, &chat_body("params", extra)).await;
    let seen: Value =
        serde_json::from_str(v["choices"][0]["message"]["content"].as_str().unwrap()).unwrap();
    assert_eq!(
        seen,
        json!({"max_tokens": 500, "temperature": 0.5, "top_p": 0.75, "top_k": 20,
        "min_p": 0.125, "seed": 9, "stop": [[122, 122]], "presence_penalty": 0.25,
        "frequency_penalty": -0.5, "logprobs": 2, "ignore_eos": true})
    );
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert!(!content.is_empty());
    assert_eq!(content[0]["top_logprobs"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn errors_have_openai_shape_and_status() {
    let s = GatewayConfig {
        body_limit: 1024,
        ..GatewayConfig::default()
    };
    let s = start(Duration::ZERO, s).await;
    let cases: Vec<(String, StatusCode, Option<&str>, Option<&str>)> = vec![
        (
            "{\"model\": ".into(),
            StatusCode::BAD_REQUEST,
            None,
            Some("invalid_json"),
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}]}).to_string(),
            StatusCode::BAD_REQUEST,
            Some("model"),
            Some("missing_required_parameter"),
        ),
        (
            json!({"model": FAKE_MODEL}).to_string(),
            StatusCode::BAD_REQUEST,
            Some("messages"),
            Some("missing_required_parameter"),
        ),
        (
            chat_body("x", json!({"n": 2})),
            StatusCode::BAD_REQUEST,
            Some("n"),
            None,
        ),
        (
            json!({"model": "nope", "messages": [{"role": "user", "content": "x"}]}).to_string(),
            StatusCode::NOT_FOUND,
            Some("model"),
            Some("model_not_found"),
        ),
        (
            json!({"model": FAKE_IDLE_MODEL, "messages": [{"role": "user", "content": "x"}]})
                .to_string(),
            StatusCode::SERVICE_UNAVAILABLE,
            Some("model"),
            Some("no_instance"),
        ),
        (
            chat_body(&"x".repeat(2000), json!({})),
            StatusCode::PAYLOAD_TOO_LARGE,
            None,
            Some("payload_too_large"),
        ),
        (
            chat_body("fail after 2", json!({})),
            StatusCode::SERVICE_UNAVAILABLE,
            None,
            Some("instance_lost"),
        ),
        (
            chat_body("vanish", json!({})),
            StatusCode::SERVICE_UNAVAILABLE,
            None,
            Some("instance_lost"),
        ),
    ];
    for (body, status, param, code) in cases {
        let (got, v) = call_json(s.addr, "POST", CHAT, &body).await;
        assert_eq!(got, status, "{body} -> {v}");
        let e = &v["error"];
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert!(e["type"].is_string());
        assert_eq!(e["param"].as_str(), param, "{v}");
        if code.is_some() {
            assert_eq!(e["code"].as_str(), code, "{v}");
        }
        assert_no_nulls(&v);
    }
    let (_, v) = call_json(
        s.addr,
        "POST",
        CHAT,
        &json!({"model": "nope", "messages": [{"role": "user", "content": "x"}]}).to_string(),
    )
    .await;
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(FAKE_MODEL) && message.contains(FAKE_IDLE_MODEL),
        "{message}"
    );
}

/// A request body sent in chunks, without a `Content-Length`.
struct Chunked(std::collections::VecDeque<bytes::Bytes>);

impl hyper::body::Body for Chunked {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, Self::Error>>> {
        std::task::Poll::Ready(
            self.get_mut()
                .0
                .pop_front()
                .map(|b| Ok(hyper::body::Frame::data(b))),
        )
    }
}

#[tokio::test]
async fn oversized_chunked_body_is_413() {
    let s = start(
        Duration::ZERO,
        GatewayConfig {
            body_limit: 1024,
            ..GatewayConfig::default()
        },
    )
    .await;
    let body = Chunked(
        (0..8)
            .map(|_| bytes::Bytes::from(vec![b' '; 512]))
            .collect(),
    );
    let stream = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let request = hyper::Request::post(CHAT)
        .header("host", "x")
        .body(body)
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    // The node still serves.
    let (status, _) = call_json(s.addr, "GET", "/v1/models", "").await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn instance_lost_mid_stream_sends_error_then_done() {
    let s = server().await;
    for script in ["fail after 2", "vanish"] {
        let events = stream_events(s.addr, &chat_body(script, json!({"stream": true}))).await;
        let n = events.len();
        assert_eq!(events[n - 1], Sse::Done, "{script}: {events:?}");
        let Sse::Data(error) = &events[n - 2] else {
            panic!("{events:?}")
        };
        assert_eq!(error["error"]["code"], "instance_lost", "{script}");
        assert!(error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("retry"));
    }
}

#[tokio::test]
async fn keep_alive_comments_while_waiting() {
    let config = GatewayConfig {
        keep_alive_interval: Duration::from_millis(100),
        ..GatewayConfig::default()
    };
    let s = start(Duration::ZERO, config).await;
    let events = stream_events(s.addr, &chat_body("wait 450", json!({"stream": true}))).await;
    let comments = events
        .iter()
        .filter(|e| **e == Sse::Comment("keep-alive".into()))
        .count();
    assert!(comments >= 2, "{events:?}");
    assert_eq!(streamed_text(&events), "done");
    assert_eq!(events.last(), Some(&Sse::Done));
}

#[tokio::test]
async fn silent_backend_is_a_lost_instance_not_a_hang() {
    let config = GatewayConfig {
        keep_alive_interval: Duration::from_millis(50),
        backend_silence_limit: Duration::from_millis(300),
        ..GatewayConfig::default()
    };
    let s = start(Duration::ZERO, config).await;
    let events = stream_events(s.addr, &chat_body("wait 5000", json!({"stream": true}))).await;
    let n = events.len();
    assert_eq!(events[n - 1], Sse::Done, "{events:?}");
    let Sse::Data(error) = &events[n - 2] else {
        panic!("{events:?}")
    };
    assert_eq!(error["error"]["code"], "instance_lost");
    assert!(events.iter().any(|e| matches!(e, Sse::Comment(_))));
    let (status, v) = call_json(s.addr, "POST", CHAT, &chat_body("wait 5000", json!({}))).await;
    assert_eq!(
        (status, v["error"]["code"].clone()),
        (StatusCode::SERVICE_UNAVAILABLE, json!("instance_lost"))
    );
    // The backend was told to stop both.
    let counters = s.backend.counters.clone();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while counters.cancelled.load(Ordering::Relaxed) < 2 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(counters.cancelled.load(Ordering::Relaxed), 2);
}

#[tokio::test]
async fn client_disconnect_cancels_streaming_generation() {
    let s = start(Duration::from_millis(50), GatewayConfig::default()).await;
    let response = send(
        s.addr,
        build(
            "POST",
            s.addr,
            CHAT,
            &chat_body("tell me", json!({"stream": true})),
        ),
    )
    .await;
    let mut body = response.into_body();
    // Read the first chunk (role), then hang up.
    let first = body.frame().await.unwrap().unwrap();
    assert!(first.data_ref().is_some());
    drop(body);
    let counters = s.backend.counters.clone();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while counters.cancelled.load(Ordering::Relaxed) == 0 && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(counters.cancelled.load(Ordering::Relaxed), 1);
    assert_eq!(counters.finished.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn client_disconnect_cancels_non_streaming_generation() {
    use tokio::io::AsyncWriteExt;
    let s = start(Duration::from_millis(50), GatewayConfig::default()).await;
    let body = chat_body("tell me", json!({}));
    let mut stream = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let head = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    drop(stream);
    let counters = s.backend.counters.clone();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while counters.cancelled.load(Ordering::Relaxed) == 0 && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(counters.started.load(Ordering::Relaxed), 1);
    assert_eq!(counters.cancelled.load(Ordering::Relaxed), 1);
    assert_eq!(counters.finished.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn ollama_load_answers_only_for_a_running_model() {
    let s = server().await;
    let load = |model: &str| json!({"model": model, "prompt": ""}).to_string();
    let (status, body) = call_json(s.addr, "POST", "/api/generate", &load(FAKE_MODEL)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["done_reason"], json!("load"));
    // Known to the cluster but running nowhere: not loaded.
    let (status, body) = call_json(s.addr, "POST", "/api/generate", &load(FAKE_IDLE_MODEL)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.to_string().contains("place_instance"), "{body}");
    let (status, _) = call_json(s.addr, "POST", "/api/generate", &load("nope")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn models_are_listed() {
    let s = server().await;
    for path in ["/v1/models", "/models"] {
        let (status, v) = call_json(s.addr, "GET", path, "").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(v["object"], "list");
        let ids: Vec<&str> = v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, vec![FAKE_IDLE_MODEL, FAKE_MODEL]);
        assert_eq!(v["data"][1]["object"], "model");
        assert_eq!(v["data"][1]["ready"], true);
    }
}

#[tokio::test]
async fn cluster_api_round_trip() {
    let s = server().await;
    let a = s.addr;
    assert_eq!(
        call_json(a, "GET", "/node_id", "").await,
        (StatusCode::OK, json!("fake-node-0"))
    );
    let (status, state) = call_json(a, "GET", "/state", "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(state["nodes"]["fake-node-0"]["ips"][0], "127.0.0.1");
    assert_eq!(
        call_json(a, "GET", "/state/nodes/fake-node-0/ips/0", "").await,
        (StatusCode::OK, json!("127.0.0.1"))
    );
    let (status, v) = call_json(a, "GET", "/state/nodes/elsewhere", "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("nodes/elsewhere"));

    let (status, previews) =
        call_json(a, "GET", "/instance/previews?model_id=fake%2Fmodel", "").await;
    assert_eq!(status, StatusCode::OK, "{previews}");
    assert_eq!(previews["previews"].as_array().unwrap().len(), 2);
    let (status, v) = call_json(a, "GET", "/instance/previews", "").await;
    assert_eq!(
        (status, v["error"]["param"].clone()),
        (StatusCode::BAD_REQUEST, json!("model_id"))
    );
    let (status, _) = call_json(a, "GET", "/instance/previews?model_id=nope", "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let (status, placed) = call_json(a, "POST", "/place_instance", &json!({"model_id": FAKE_IDLE_MODEL, "sharding": "Pipeline", "instance_meta": "MlxRing", "min_nodes": 1}).to_string()).await;
    assert_eq!(status, StatusCode::OK, "{placed}");
    let id = placed["instance_id"].as_str().unwrap().to_string();
    assert_eq!(
        call_json(a, "GET", &format!("/instance/{id}"), "").await,
        (StatusCode::OK, placed.clone())
    );
    assert_eq!(
        call_json(a, "GET", &format!("/state/instances/{id}/model_id"), "")
            .await
            .1,
        json!(FAKE_IDLE_MODEL)
    );
    // Once placed, the idle model answers chat.
    let body =
        json!({"model": FAKE_IDLE_MODEL, "messages": [{"role": "user", "content": "echo: ok"}]})
            .to_string();
    assert_eq!(call_json(a, "POST", CHAT, &body).await.0, StatusCode::OK);

    let preview = previews["previews"][0]["instance"].clone();
    let (status, created) = call_json(
        a,
        "POST",
        "/instance",
        &json!({"instance": preview}).to_string(),
    )
    .await;
    assert_eq!((status, created.clone()), (StatusCode::OK, preview.clone()));
    let (status, _) = call_json(
        a,
        "POST",
        "/instance",
        &json!({"instance": preview}).to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (status, v) = call_json(a, "POST", "/instance", "{}").await;
    assert_eq!(
        (status, v["error"]["param"].clone()),
        (StatusCode::BAD_REQUEST, json!("instance"))
    );

    let (status, deleted) = call_json(a, "DELETE", &format!("/instance/{id}"), "").await;
    assert_eq!(
        (status, deleted["deleted"].clone()),
        (StatusCode::OK, json!(id))
    );
    assert_eq!(
        call_json(a, "GET", &format!("/instance/{id}"), "").await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        call_json(a, "DELETE", &format!("/instance/{id}"), "")
            .await
            .0,
        StatusCode::NOT_FOUND
    );
    let (status, v) = call_json(
        a,
        "POST",
        "/place_instance",
        &json!({"sharding": "Tensor"}).to_string(),
    )
    .await;
    assert_eq!(
        (status, v["error"]["param"].clone()),
        (StatusCode::BAD_REQUEST, json!("model_id"))
    );
}

#[tokio::test]
async fn routing_cors_and_methods() {
    let s = server().await;
    // The node's own pages (same origin) get CORS headers; others are tested in access.rs.
    let own = format!("http://{}", s.addr);
    let (status, headers, _) = call_with(s.addr, "GET", "/node_id", "", &[("origin", &own)]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["access-control-allow-origin"], own.as_str());
    let (status, headers, _) = call_with(s.addr, "OPTIONS", CHAT, "", &[("origin", &own)]).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(headers["access-control-allow-origin"], own.as_str());
    assert!(headers["access-control-allow-methods"]
        .to_str()
        .unwrap()
        .contains("POST"));
    let (status, headers, _) = call(s.addr, "GET", CHAT, "").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(headers["allow"], "POST, OPTIONS");
    let (status, v) = call_json(s.addr, "GET", "/nowhere", "").await;
    assert_eq!(
        (status, v["error"]["code"].clone()),
        (StatusCode::NOT_FOUND, json!("unknown_route"))
    );
}

/// 32 concurrent streams on one node: all complete with their own text; nothing serialises
/// them (with 32 x 16 tokens x 20 ms serialised, this would take 10 s instead of ~0.3 s, but
/// the test asserts completeness, not time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_streams_all_complete() {
    let s = start(Duration::from_millis(20), GatewayConfig::default()).await;
    let mut tasks = Vec::new();
    for i in 0..32 {
        let addr = s.addr;
        tasks.push(tokio::spawn(async move {
            let text = format!("request number {i} says hi");
            let events = stream_events(
                addr,
                &chat_body(&format!("echo: {text}"), json!({"stream": true})),
            )
            .await;
            assert_eq!(streamed_text(&events), text);
            assert_eq!(events.last(), Some(&Sse::Done));
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(s.backend.counters.finished.load(Ordering::Relaxed), 32);
}
