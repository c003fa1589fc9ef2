//! Two real `shoal` nodes in Linux network namespaces (found by mDNS, no configuration): an
//! instance of the SmolLM2 fixture is created through node A on node A alone, the same greedy
//! chat through node B (forwarded over iroh to A) and through A (served there) gives the
//! same text, and deleting the instance through B stops A's runner.
//!
//! Needs root (namespaces), `curl` and the model fixture (`cargo xtask setup`); skipped with
//! a message without root.

mod support;

use serde_json::{json, Value};
use std::process::Stdio;
use std::time::Duration;
use support::netns::{self, Netns, Spec};
use support::{wait_for, ShoalNode, API_PORT};

/// `curl` inside the node's namespace against its own API: (HTTP status, body).
fn curl(node: &ShoalNode, method: &str, path: &str, body: Option<&Value>) -> Option<(u16, String)> {
    let mut cmd = node.node.command("curl");
    cmd.args([
        "-s",
        "--max-time",
        "120",
        "-X",
        method,
        "-w",
        "\n%{http_code}",
    ])
    .arg(format!("http://{}:{API_PORT}{path}", node.node.ip()));
    if let Some(body) = body {
        cmd.args(["-H", "Content-Type: application/json", "-d"])
            .arg(body.to_string());
    }
    let out = cmd.stdin(Stdio::null()).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n')?;
    Some((status.trim().parse().ok()?, body.to_string()))
}

fn json_of(node: &ShoalNode, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let (status, text) = curl(node, method, path, body).expect("curl runs");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn default_ready(node: &ShoalNode) -> bool {
    let Some((200, text)) = curl(node, "GET", "/v1/models", None) else {
        return false;
    };
    let models: Value = serde_json::from_str(&text).unwrap_or_default();
    models["data"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|m| m["id"] == "default" && m["ready"] == true)
}

fn greedy(node: &ShoalNode) -> String {
    let request = json!({
        "model": "default",
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "temperature": 0,
        "max_tokens": 16,
    });
    let (status, answer) = json_of(node, "POST", "/v1/chat/completions", Some(&request));
    assert_eq!(status, 200, "{answer}\n{}", node.log_tail());
    let tokens = answer["usage"]["completion_tokens"].as_u64().unwrap_or(0);
    assert!((1..=16).contains(&tokens), "{answer}");
    let text = answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default();
    format!("{text} ({tokens} tokens)")
}

#[test]
fn chat_through_either_node_and_delete_from_the_other() {
    if let Err(why) = netns::available() {
        eprintln!("skipping the two-node chat test: {why}");
        return;
    }
    let prefix = format!("shoalc{}", std::process::id());
    let spec = Spec {
        nodes: 2,
        off_bridge: Vec::new(),
        links: Vec::new(),
    };
    let net = Netns::create(&prefix, &spec).expect("create namespaces");
    let dir = std::env::temp_dir().join(&prefix);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut nodes: Vec<ShoalNode> = net
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| ShoalNode::new(n.clone(), &dir, i + 1))
        .collect();
    for node in &mut nodes {
        node.start();
    }
    let logs = |nodes: &[ShoalNode]| {
        nodes
            .iter()
            .enumerate()
            .map(|(i, n)| format!("--- node {} ---\n{}", i + 1, n.log_tail()))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let (a, b) = (&nodes[0], &nodes[1]);

    // Both nodes see both nodes alive.
    let met = wait_for(Duration::from_secs(60), || {
        let sa = a.state()?;
        let sb = b.state()?;
        let alive = |s: &Value| {
            s["liveness"]
                .as_object()
                .is_some_and(|l| l.len() == 2 && l.values().all(|n| n["alive"] == true))
        };
        (alive(&sa) && alive(&sb)).then(|| sa["node_id"].as_str().unwrap_or_default().to_string())
    });
    let Some((id_a, took)) = met else {
        panic!("the nodes did not find each other\n{}", logs(&nodes));
    };
    eprintln!("nodes met in {took:?}");

    // An instance on node A only, created through A.
    let (status, created) = json_of(
        a,
        "POST",
        "/instance",
        Some(&json!({"instance": {"model_id": "default", "required_nodes": [id_a]}})),
    );
    assert_eq!(status, 200, "{created}\n{}", logs(&nodes));
    let instance = created["instance_id"]
        .as_str()
        .expect("instance id")
        .to_string();
    let ranks = created["placement"]["ranks"].as_array().expect("ranks");
    assert_eq!(ranks.len(), 1, "{created}");
    assert_eq!(ranks[0]["node"], id_a.as_str());

    // Both nodes see it ready (B through A's runner record).
    let ready = wait_for(Duration::from_secs(240), || {
        (default_ready(a) && default_ready(b)).then_some(())
    });
    let Some((_, took)) = ready else {
        panic!("the instance did not become ready\n{}", logs(&nodes));
    };
    eprintln!("instance ready on both nodes' view in {took:?}");
    let (_, on_b) = json_of(b, "GET", &format!("/instance/{instance}"), None);
    assert_eq!(on_b["status"], "ready", "{on_b}");
    assert_eq!(on_b["runners"][&id_a]["state"], "ready", "{on_b}");
    let pid = {
        let (_, on_a) = json_of(a, "GET", &format!("/instance/{instance}"), None);
        on_a["runner_pid"].as_u64().expect("A runs the runner")
    };
    assert!(on_b["runner_pid"].is_null(), "B runs no runner: {on_b}");

    // The same greedy answer through B (forwarded to A) and through A.
    let start = std::time::Instant::now();
    let forwarded = greedy(b);
    let forwarded_took = start.elapsed();
    let start = std::time::Instant::now();
    let direct = greedy(a);
    let direct_took = start.elapsed();
    eprintln!(
        "through B (forwarded): {forwarded:?} in {forwarded_took:?}; through A: {direct:?} in \
         {direct_took:?}"
    );
    assert!(direct.contains("Paris"), "{direct}");
    assert_eq!(forwarded, direct, "forwarding changed the answer");

    // Streaming through B: chunks, then [DONE].
    let request = json!({
        "model": "default",
        "messages": [{"role": "user", "content": "Say hello."}],
        "temperature": 0,
        "max_tokens": 8,
        "stream": true,
    });
    let (status, sse) = curl(b, "POST", "/v1/chat/completions", Some(&request)).expect("curl");
    assert_eq!(status, 200, "{sse}");
    assert!(sse.contains("chat.completion.chunk"), "{sse}");
    assert!(sse.trim_end().ends_with("data: [DONE]"), "{sse}");

    // Deleting through B (not the author) removes it on A: runner gone, no instance.
    let (status, deleted) = json_of(b, "DELETE", &format!("/instance/{instance}"), None);
    assert_eq!(status, 200, "{deleted}");
    let gone = wait_for(Duration::from_secs(30), || {
        let sa = a.state()?;
        let none = sa["instances"].as_object().is_some_and(|i| i.is_empty());
        let exited = !std::path::Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.contains(") Z "));
        (none && exited).then_some(())
    });
    let Some((_, took)) = gone else {
        panic!("the deletion did not reach node A\n{}", logs(&nodes));
    };
    eprintln!("deleted through B; A's runner gone after {took:?}");
    let (status, after) = json_of(
        b,
        "POST",
        "/v1/chat/completions",
        Some(&json!({
            "model": "default",
            "messages": [{"role": "user", "content": "hi"}],
        })),
    );
    assert_eq!(status, 503, "{after}");

    drop(nodes);
    drop(net);
    assert!(netns::list(&prefix).is_empty(), "namespaces left behind");
    let _ = std::fs::remove_dir_all(&dir);
}
