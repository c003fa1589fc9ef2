//! Property tests of the whole router: random methods, paths, queries and bodies always get a
//! 2xx or 4xx answer, never a panic or a 5xx; and a server fed garbage bytes keeps serving.

mod common;

use bytes::Bytes;
use common::*;
use gateway::fake::{FakeBackend, FAKE_MODEL};
use gateway::{GatewayConfig, Router};
use http_body_util::{BodyExt, Full};
use hyper::Request;
use proptest::prelude::*;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A method and a path: mostly a route with the method it takes (so that most cases reach a
/// handler), sometimes any method on any path.
fn arb_target() -> impl Strategy<Value = (&'static str, String)> {
    let routed = prop::sample::select(vec![
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/chat/completions"),
        ("GET", "/v1/models"),
        ("GET", "/models"),
        ("GET", "/node_id"),
        ("GET", "/state"),
        ("GET", "/state/"),
        ("GET", "/state/nodes"),
        ("GET", "/state/nodes/fake-node-0/ips/0"),
        ("GET", "/state/instances/x%2Fy"),
        ("POST", "/place_instance"),
        ("POST", "/place_instance"),
        ("POST", "/instance"),
        ("GET", "/instance/previews"),
        ("GET", "/instance/previews?model_id=fake%2Fmodel"),
        ("GET", "/instance/previews?model_id=%zz"),
        ("GET", "/instance/instance-1"),
        ("DELETE", "/instance/instance-1"),
        ("DELETE", "/models/fake/idle-model"),
        ("DELETE", "/models/%zz"),
        ("GET", "/instance/%ff%fe"),
        ("POST", "/v1/messages"),
        ("POST", "/v1/messages"),
        ("POST", "/v1/messages/count_tokens"),
        ("POST", "/v1/responses"),
        ("POST", "/v1/responses"),
        ("POST", "/api/chat"),
        ("POST", "/api/chat"),
        ("POST", "/api/generate"),
        ("POST", "/ollama/api/generate"),
        ("POST", "/api/show"),
        ("GET", "/api/tags"),
        ("GET", "/ollama/api/ps"),
        ("GET", "/api/version"),
        ("POST", "/api/pull"),
        ("POST", "/v1/cancel/chatcmpl-1"),
    ])
    .prop_map(|(m, p)| (m, p.to_string()));
    let method = prop::sample::select(vec![
        "GET", "POST", "DELETE", "PUT", "PATCH", "OPTIONS", "HEAD",
    ]);
    let path = "(/[a-zA-Z0-9_%.~-]{0,12}){1,4}(\\?[a-z_]{1,8}=[a-zA-Z0-9%+]{0,8})?";
    let known_path = routed.clone().prop_map(|(_, p)| p);
    prop_oneof![
        6 => routed,
        1 => (method.clone(), known_path),
        1 => (method, path),
    ]
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        (-10.0f64..10.0).prop_map(Value::from),
        "(user|assistant|system|text|fake/model|echo: hi|params|Pipeline|Tensor|[a-z]{0,5})"
            .prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map(
                "(model|messages|role|content|text|type|n|stop|seed|stream|max_tokens|model_id|instance|sharding|min_nodes|system|stop_sequences|input|instructions|max_output_tokens|options|num_predict|prompt|[a-z]{1,4})",
                inner,
                0..5
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn arb_body() -> impl Strategy<Value = Vec<u8>> {
    let mutated_chat = (
        "(model|messages|n|max_tokens|temperature|stop|seed|stream|stream_options|logprobs|top_logprobs)",
        arb_json(),
    )
        .prop_map(|(key, v)| {
            let mut body = json!({"model": FAKE_MODEL, "messages": [{"role": "user", "content": "echo: hi"}]});
            body[key.as_str()] = v;
            body.to_string().into_bytes()
        });
    let valid_chat = (
        prop::sample::select(vec!["echo: hello world", "params", "tell me"]),
        any::<bool>(),
        any::<bool>(),
        1u32..20,
        prop::sample::select(vec!["", "o", "ll", " w"]),
        any::<u64>(),
    )
        .prop_map(|(content, stream, usage, max_tokens, stop, seed)| {
            json!({
                "model": FAKE_MODEL,
                "messages": [{"role": "user", "content": content}],
                "stream": stream,
                "stream_options": {"include_usage": usage},
                "max_tokens": max_tokens,
                "stop": stop,
                "seed": seed,
            })
            .to_string()
            .into_bytes()
        });
    let place = ("(fake/model|fake/idle-model|nope)", any::<u32>()).prop_map(|(model, n)| {
        json!({"model_id": model, "min_nodes": n % 3, "instance": {"instance_id": model}})
            .to_string()
            .into_bytes()
    });
    // A valid body of each new API with one field replaced by arbitrary JSON.
    let mutated_api = (
        prop::sample::select(vec![
            (json!({"model": FAKE_MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "echo: hi"}]}),
             "(model|max_tokens|messages|system|stop_sequences|stream|temperature|top_k|tools|tool_choice|thinking|metadata)"),
            (json!({"model": FAKE_MODEL, "input": "echo: hi"}),
             "(model|input|instructions|max_output_tokens|stream|temperature|tools|text|previous_response_id)"),
            (json!({"model": FAKE_MODEL, "messages": [{"role": "user", "content": "echo: hi"}], "stream": false}),
             "(model|messages|stream|options|format)"),
            (json!({"model": FAKE_MODEL, "prompt": "echo: hi", "options": {"num_predict": 4}}),
             "(model|prompt|system|raw|options|stream|images)"),
        ]),
        arb_json(),
        any::<u8>(),
    )
        .prop_map(|((mut body, keys), v, pick)| {
            let keys: Vec<&str> = keys.trim_matches(|c| c == '(' || c == ')').split('|').collect();
            let key = keys[pick as usize % keys.len()];
            body[key] = v;
            body.to_string().into_bytes()
        });
    prop_oneof![
        2 => valid_chat,
        3 => mutated_api,
        1 => place,
        2 => arb_json().prop_map(|v| v.to_string().into_bytes()),
        2 => mutated_chat,
        1 => prop::collection::vec(any::<u8>(), 0..256),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn any_request_gets_2xx_or_4xx((method, path) in arb_target(), body in arb_body()) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let router = Router::new(
            Arc::new(FakeBackend::new(Duration::ZERO)),
            GatewayConfig { body_limit: 4096, ..GatewayConfig::default() },
        );
        let request = Request::builder()
            .method(method)
            .uri(path.as_str())
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let (status, text) = runtime.block_on(async {
            let response = tokio::time::timeout(Duration::from_secs(5), router.handle(request))
                .await
                .expect("the router answered within 5 s");
            let status = response.status();
            // Read the whole body too: streams must end.
            let bytes = tokio::time::timeout(Duration::from_secs(5), response.into_body().collect())
                .await
                .expect("the body ended within 5 s")
                .unwrap()
                .to_bytes();
            (status, String::from_utf8_lossy(&bytes).into_owned())
        });
        prop_assert!(status.is_success() || status.is_client_error(), "{method} {path}: {status} {text}");
        if status.is_client_error() && method != "HEAD" && method != "OPTIONS" {
            let v: Value = serde_json::from_str(&text).expect("errors are JSON");
            prop_assert!(error_in_its_shape(&path, &v), "{method} {path}: {text}");
        }
    }
}

/// Whether an error body has the shape of the API its path belongs to: Anthropic's
/// `{"type": "error", "error": {"type", "message"}}`, Ollama's `{"error": "..."}`, else
/// OpenAI's `{"error": {"message", "type"}}`.
fn error_in_its_shape(path: &str, v: &Value) -> bool {
    let path = path.split('?').next().unwrap_or(path);
    if path.starts_with("/v1/messages")
        && matches!(path, "/v1/messages" | "/v1/messages/count_tokens")
    {
        v["type"] == "error" && v["error"]["type"].is_string() && v["error"]["message"].is_string()
    } else if path.starts_with("/api/") || path.starts_with("/ollama/api/") {
        v["error"].is_string()
    } else {
        v["error"]["message"].is_string() && v["error"]["type"].is_string()
    }
}

/// Bad bodies on every new API's routes get a 4xx in that API's shape, and the same server
/// then answers each API normally.
#[tokio::test]
async fn bad_bodies_on_new_routes_leave_the_server_serving() {
    let s = start(Duration::ZERO, GatewayConfig::default()).await;
    let routes = [
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/responses",
        "/api/chat",
        "/api/generate",
        "/ollama/api/chat",
    ];
    let bad = [
        "",
        "{",
        "[]",
        "null",
        "{\"model\": 5}",
        "{\"model\": \"fake/model\", \"messages\": \"x\", \"input\": 3, \"prompt\": []}",
        "{\"model\": \"fake/model\", \"max_tokens\": -1, \"prompt\": 5, \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image\"}]}]}",
        "{\"model\": \"no-such\", \"max_tokens\": 2, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"input\": \"x\", \"prompt\": \"x\"}",
    ];
    for route in routes {
        for body in bad {
            let (status, v) = call_json(s.addr, "POST", route, body).await;
            assert!(status.is_client_error(), "{route} {body}: {status} {v}");
            assert!(error_in_its_shape(route, &v), "{route} {body}: {v}");
        }
    }
    for body in ["", "{", "{\"model\": 5}", "{\"model\": \"no-such\"}"] {
        let (status, v) = call_json(s.addr, "POST", "/api/show", body).await;
        assert!(
            status.is_client_error() && error_in_its_shape("/api/show", &v),
            "{body}: {v}"
        );
    }
    let good = [
        (
            "/v1/messages",
            json!({"model": FAKE_MODEL, "max_tokens": 9, "messages": [{"role": "user", "content": "echo: still here"}]}),
            "/content/0/text",
        ),
        (
            "/v1/responses",
            json!({"model": FAKE_MODEL, "input": "echo: still here"}),
            "/output/0/content/0/text",
        ),
        (
            "/api/chat",
            json!({"model": FAKE_MODEL, "stream": false, "messages": [{"role": "user", "content": "echo: still here"}]}),
            "/message/content",
        ),
        (
            "/api/generate",
            json!({"model": FAKE_MODEL, "stream": false, "prompt": "echo: still here"}),
            "/response",
        ),
    ];
    for (route, body, pointer) in good {
        let (status, v) = call_json(s.addr, "POST", route, &body.to_string()).await;
        assert_eq!(status.as_u16(), 200, "{route}: {v}");
        assert_eq!(
            v.pointer(pointer),
            Some(&json!("still here")),
            "{route}: {v}"
        );
    }
}

/// Garbage on the socket closes that connection (or answers 400), and the server keeps serving
/// the next client.
#[tokio::test]
async fn garbage_on_the_wire_does_not_stop_the_server() {
    let s = start(Duration::ZERO, GatewayConfig::default()).await;
    let garbage: Vec<Vec<u8>> = vec![
        b"\x00\x01\x02\xff\r\n\r\n".to_vec(),
        b"GET / HTTP/9.9\r\n\r\n".to_vec(),
        b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: -5\r\n\r\n".to_vec(),
        b"POST /v1/chat/completions HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n".to_vec(),
        b"GET /state/%%% HTTP/1.1\r\nhost: x\r\n\r\n".to_vec(),
        vec![b'A'; 100_000],
    ];
    for bytes in garbage {
        let mut stream = tokio::net::TcpStream::connect(s.addr).await.unwrap();
        let _ = stream.write_all(&bytes).await;
        let _ = stream.shutdown().await;
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
        let text = String::from_utf8_lossy(&answer);
        assert!(!text.contains(" 500 "), "{text}");
        let (status, v) = call_json(s.addr, "GET", "/node_id", "").await;
        assert_eq!((status.as_u16(), v), (200, json!("fake-node-0")));
    }
}
