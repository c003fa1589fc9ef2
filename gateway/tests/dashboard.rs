//! The dashboard's routes over a real server: its files at `/` and `/dashboard/{file}` with
//! their types and policy, and the state stream `GET /events`: the state at once, each change,
//! heartbeats, the stream limit (429 with Retry-After), slots freed by clients that leave, and
//! bad requests refused without harm.

mod common;

use common::{call, call_json, send, start};
use gateway::config::EventsConfig;
use gateway::GatewayConfig;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Response, StatusCode};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::Duration;

fn config(events: EventsConfig) -> GatewayConfig {
    GatewayConfig {
        events,
        ..GatewayConfig::default()
    }
}

#[tokio::test]
async fn the_page_and_its_files_are_served_with_their_types() {
    let s = start(Duration::ZERO, GatewayConfig::default()).await;
    let (status, headers, body) = call(s.addr, "GET", "/", "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "text/html; charset=utf-8");
    let csp = headers["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("connect-src 'self'"), "{csp}");
    assert_eq!(headers["x-content-type-options"], "nosniff");
    let page = String::from_utf8(body.to_vec()).unwrap();
    assert!(page.contains(r#"<script type="module" src="/dashboard/app.js">"#));
    let mut total = 0;
    for file in gateway::dashboard::FILES {
        let path = if file.name == "index.html" {
            "/".to_string()
        } else {
            format!("/dashboard/{}", file.name)
        };
        let (status, headers, body) = call(s.addr, "GET", &path, "").await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert_eq!(headers["content-type"], file.content_type, "{path}");
        assert_eq!(body, file.body.as_bytes(), "{path}");
        total += body.len();
    }
    assert!(total < 1 << 20, "the dashboard's files are {total} bytes");
    // HEAD answers the headers without the body.
    let (status, headers, body) = call(s.addr, "HEAD", "/dashboard/app.js", "").await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/javascript"));
    assert!(body.is_empty());
}

#[tokio::test]
async fn unknown_files_and_other_methods_are_refused() {
    let s = start(Duration::ZERO, GatewayConfig::default()).await;
    for path in [
        "/dashboard/nothing.js",
        "/dashboard/",
        "/dashboard/../Cargo.toml",
        "/dashboard/%2e%2e/lib.rs",
        "/index.html",
    ] {
        let (status, v) = call_json(s.addr, "GET", path, "").await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {v}");
        assert_eq!(v["error"]["code"], "unknown_route", "{path}");
    }
    for (method, path) in [
        ("POST", "/"),
        ("DELETE", "/dashboard/app.js"),
        ("POST", "/events"),
    ] {
        let (status, headers, _) = call(s.addr, method, path, "{}").await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
        assert_eq!(headers["allow"], "GET, HEAD, OPTIONS", "{method} {path}");
    }
    // The node still serves.
    let (status, _) = call_json(s.addr, "GET", "/v1/models", "").await;
    assert_eq!(status, StatusCode::OK);
}

/// What a stream has sent so far, read frame by frame.
struct Stream {
    response: Response<Incoming>,
    text: String,
}

impl Stream {
    async fn open(addr: SocketAddr) -> Stream {
        let response = send(addr, common::build("GET", addr, "/events", "")).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        Stream {
            response,
            text: String::new(),
        }
    }

    /// The next event (its lines), within 5 s.
    async fn next(&mut self) -> Vec<String> {
        let read = async {
            loop {
                if let Some(cut) = self.text.find("\n\n") {
                    let event: String = self.text.drain(..cut + 2).collect();
                    return event.trim_end().lines().map(str::to_string).collect();
                }
                let frame = self.response.body_mut().frame().await;
                let frame = frame.expect("the stream ended").expect("a frame");
                if let Ok(data) = frame.into_data() {
                    self.text.push_str(std::str::from_utf8(&data).unwrap());
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(5), read)
            .await
            .expect("no event within 5 s")
    }

    /// The next `state` event's id and data.
    async fn state(&mut self) -> (u64, Value) {
        loop {
            let lines = self.next().await;
            if lines.iter().any(|l| l == "event: state") {
                let id = lines[0].strip_prefix("id: ").unwrap().parse().unwrap();
                let data = lines.iter().find_map(|l| l.strip_prefix("data: ")).unwrap();
                return (id, serde_json::from_str(data).unwrap());
            }
        }
    }
}

#[tokio::test]
async fn a_stream_sends_the_state_then_each_change_and_heartbeats() {
    let s = start(
        Duration::ZERO,
        config(EventsConfig {
            poll_interval: Duration::from_millis(20),
            heartbeat: Duration::from_millis(200),
            ..EventsConfig::default()
        }),
    )
    .await;
    let mut stream = Stream::open(s.addr).await;
    assert_eq!(stream.next().await, vec!["retry: 2000".to_string()]);
    let (id, first) = stream.state().await;
    assert_eq!(id, 1);
    assert_eq!(first["instances"], json!({}));
    assert_eq!(first["models"], json!(["fake/idle-model", "fake/model"]));
    // A quiet state sends heartbeats only.
    assert_eq!(stream.next().await, vec![": heartbeat".to_string()]);
    // A change comes as the next state.
    let (status, placed) = call_json(
        s.addr,
        "POST",
        "/place_instance",
        r#"{"model_id": "fake/model"}"#,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{placed}");
    let (id, second) = stream.state().await;
    assert_eq!(id, 2);
    let instance = placed["instance_id"].as_str().unwrap();
    assert_eq!(second["instances"][instance]["model_id"], "fake/model");
    // A second stream starts from the state now.
    let mut other = Stream::open(s.addr).await;
    let (id, now) = other.state().await;
    assert_eq!((id, &now), (1, &second));
}

#[tokio::test]
async fn streams_past_the_limit_get_429_and_a_closed_one_frees_its_slot() {
    let s = start(
        Duration::ZERO,
        config(EventsConfig {
            max_streams: 2,
            poll_interval: Duration::from_millis(20),
            ..EventsConfig::default()
        }),
    )
    .await;
    let mut a = Stream::open(s.addr).await;
    let mut b = Stream::open(s.addr).await;
    a.state().await;
    b.state().await;
    let (status, headers, body) = call(s.addr, "GET", "/events", "").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers["retry-after"], "1");
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["code"], "too_many_streams", "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("2 event streams"));
    // The other routes still answer.
    let (status, _) = call_json(s.addr, "GET", "/state", "").await;
    assert_eq!(status, StatusCode::OK);
    // One client leaves: its slot is free again within a moment.
    drop(a);
    let reopened = async {
        loop {
            let response = send(s.addr, common::build("GET", s.addr, "/events", "")).await;
            if response.status() == StatusCode::OK {
                return response;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let response = tokio::time::timeout(Duration::from_secs(5), reopened)
        .await
        .expect("the closed stream's slot was not freed");
    let mut c = Stream {
        response,
        text: String::new(),
    };
    let (id, now) = c.state().await;
    assert_eq!(id, 1);
    let (_, state) = call_json(s.addr, "GET", "/state", "").await;
    assert_eq!(now, gateway::events::event_state(state));
    drop(b);
}

#[tokio::test]
async fn head_on_the_stream_answers_without_holding_a_slot() {
    let s = start(
        Duration::ZERO,
        config(EventsConfig {
            max_streams: 1,
            ..EventsConfig::default()
        }),
    )
    .await;
    for _ in 0..3 {
        let (status, headers, body) = call(s.addr, "HEAD", "/events", "").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers["content-type"], "text/event-stream");
        assert!(body.is_empty());
    }
    let freed = async {
        loop {
            let response = send(s.addr, common::build("GET", s.addr, "/events", "")).await;
            if response.status() == StatusCode::OK {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), freed)
        .await
        .expect("HEAD requests kept their slots");
}
