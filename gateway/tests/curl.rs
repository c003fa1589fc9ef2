//! The cluster API and a streamed chat through curl, the way users script a node.

mod common;

use gateway::GatewayConfig;
use serde_json::{json, Value};
use std::time::Duration;

/// Runs curl with `args` against the server; returns (status, body).
async fn curl(args: &[&str]) -> (u16, String) {
    let output = tokio::process::Command::new("curl")
        .args([
            "-sS",
            "--noproxy",
            "*",
            "--max-time",
            "10",
            "-w",
            "\n%{http_code}",
        ])
        .args(args)
        .output()
        .await
        .expect("curl is installed (apt-get install curl)");
    assert!(
        output.status.success(),
        "curl failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).expect("utf-8");
    let (body, status) = text.rsplit_once('\n').expect("status line");
    (status.parse().expect("status"), body.to_string())
}

fn parse(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_api_with_curl() {
    let s = common::start(Duration::ZERO, GatewayConfig::default()).await;
    let url = |path: &str| format!("http://{}{path}", s.addr);

    let (status, body) = curl(&[&url("/node_id")]).await;
    assert_eq!((status, parse(&body)), (200, json!("fake-node-0")));
    let (status, body) = curl(&[&url("/state/nodes/fake-node-0/ips")]).await;
    assert_eq!((status, parse(&body)), (200, json!(["127.0.0.1"])));

    let place = json!({"model_id": "fake/model", "sharding": "Pipeline", "instance_meta": "MlxRing", "min_nodes": 1}).to_string();
    let (status, body) = curl(&[
        "-X",
        "POST",
        &url("/place_instance"),
        "-H",
        "content-type: application/json",
        "-d",
        &place,
    ])
    .await;
    assert_eq!(status, 200, "{body}");
    let id = parse(&body)["instance_id"].as_str().unwrap().to_string();
    let (status, body) = curl(&[&url(&format!("/instance/{id}"))]).await;
    assert_eq!(
        (status, parse(&body)["model_id"].clone()),
        (200, json!("fake/model"))
    );
    let (status, body) = curl(&[&url("/instance/previews?model_id=fake/model")]).await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = curl(&["-X", "DELETE", &url(&format!("/instance/{id}"))]).await;
    assert_eq!(status, 200);
    let (status, body) = curl(&[&url(&format!("/instance/{id}"))]).await;
    assert_eq!(status, 404, "{body}");

    let chat = json!({"model": "fake/model", "stream": true, "messages": [{"role": "user", "content": "echo: curl"}]}).to_string();
    let (status, body) = curl(&[
        "-N",
        &url("/v1/chat/completions"),
        "-H",
        "content-type: application/json",
        "-d",
        &chat,
    ])
    .await;
    assert_eq!(status, 200);
    let events = common::parse_sse(&body);
    assert_eq!(common::streamed_text(&events), "curl");
    assert_eq!(events.last(), Some(&common::Sse::Done));

    let (status, body) = curl(&[&url("/v1/chat/completions"), "-d", "{not json"]).await;
    assert_eq!(
        (status, parse(&body)["error"]["code"].clone()),
        (400, json!("invalid_json"))
    );
}
