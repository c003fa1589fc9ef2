//! A cluster set up as the README tells users to: every member started with the cluster
//! secret (`SHOAL_CLUSTER_SECRET`), an admin key (`SHOAL_API_KEY`) and a chat key
//! (`SHOAL_CHAT_API_KEY`). Three real nodes in network namespaces beside the test hub: A and B
//! are members, C is a stranger on the same LAN with the same namespace and no secret.
//!
//! - A downloads the model; a 2-rank pipeline over A and B placed through A's API (admin key)
//!   becomes ready with B's files copied from A under admission (the hub sends B no weight
//!   byte), and both nodes answer "Paris" with the chat key (streamed and not);
//! - without a key, or with a wrong one, every node answers 401; the chat key may chat but
//!   gets 403 on placing and on the cluster's state;
//! - the stranger C is not in the members' state, nor they in C's, once the pipeline is ready
//!   and again after all that; and C's own API has no instance of theirs to chat with.
//!
//! Needs root (namespaces) and the model fixture (`cargo xtask setup`): fails otherwise, or
//! with `SHOAL_ALLOW_SKIP=1` is skipped and counted (see `kit::skip`).

mod support;
use support::{hf, hf_nodes};

use hf_nodes::HubNodes;
use kit::blocking::{Blocking, Next};
use kit::client::Api;
use kit::sse::SseEvent;
use serde_json::{json, Value};
use std::time::Duration;
use support::{call, logs, ShoalNode, API_PORT};

const SECRET: &str = "5ec2e7c1a55e7c1a55e7c1a55e7c1a55e7c1a55e7c1a55e7c1a55e7c1a55e7c1";
const ADMIN_KEY: &str = "shoal-test-admin-key-0123456789";
const CHAT_KEY: &str = "shoal-test-chat-key-0123456789";

/// `node`'s API as a client holding `key` (none: a stranger to the API).
fn client(node: &ShoalNode, key: Option<&str>) -> Blocking {
    let api = Api::at((node.node.ip(), API_PORT).into()).in_netns(&node.node.netns);
    Blocking::new(match key {
        Some(key) => api.with_key(key),
        None => api,
    })
}

/// The status `client` gets for `method path` (0 when no answer came).
fn status_of(client: &Blocking, method: &str, path: &str, body: Option<&Value>) -> u16 {
    client
        .call(method.parse().unwrap(), path, body, Duration::from_secs(60))
        .map_or(0, |a| a.status.as_u16())
}

/// The node ids `node`'s state lists (its own admin key in its environment).
fn listed(node: &ShoalNode) -> Vec<String> {
    node.state()
        .and_then(|s| s["nodes"].as_object().map(|o| o.keys().cloned().collect()))
        .unwrap_or_default()
}

/// A streamed chat through `client`: the answer's text once `[DONE]` came.
fn streamed(client: &Blocking) -> Result<String, String> {
    let request = json!({
        "model": hf::REPO,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "temperature": 0,
        "max_tokens": 12,
        "stream": true,
    });
    let limit = Duration::from_secs(60);
    let mut stream = client
        .chat_stream(&request, limit)
        .map_err(|e| e.to_string())?;
    let mut text = String::new();
    loop {
        match stream.next(limit) {
            Next::Event(SseEvent::Done) => return Ok(text),
            Next::Event(SseEvent::Data(data)) => {
                let event: Value = serde_json::from_str(&data).unwrap_or_default();
                if event.get("error").is_some() {
                    return Err(data);
                }
                text.push_str(
                    event["choices"][0]["delta"]["content"]
                        .as_str()
                        .unwrap_or(""),
                );
            }
            other => return Err(format!("{other:?} after {text:?}")),
        }
    }
}

/// Checks that the members (`nodes[..2]`) list only each other and the stranger `nodes[2]`
/// (`stranger`) only itself, `when` (said in the failure).
fn stranger_outside(
    nodes: &[ShoalNode],
    members: &std::collections::BTreeSet<String>,
    stranger: &str,
    when: &str,
) {
    for (i, member) in nodes[..2].iter().enumerate() {
        let seen = listed(member);
        assert_eq!(
            &seen
                .iter()
                .cloned()
                .collect::<std::collections::BTreeSet<_>>(),
            members,
            "{when}: node {} lists {seen:?}",
            i + 1
        );
    }
    let c_sees = listed(&nodes[2]);
    assert_eq!(
        c_sees,
        vec![stranger.to_string()],
        "{when}: the stranger sees {c_sees:?}"
    );
}

#[test]
fn a_secured_cluster_serves_its_members_and_refuses_strangers() {
    let Some(HubNodes {
        net,
        hub_node,
        mut nodes,
        server,
        caches: _,
        fixture: _,
    }) = hf_nodes::start("hfsec", 3)
    else {
        return;
    };
    for member in &mut nodes[..2] {
        member.env.extend([
            ("SHOAL_CLUSTER_SECRET".to_string(), SECRET.to_string()),
            ("SHOAL_API_KEY".to_string(), ADMIN_KEY.to_string()),
            ("SHOAL_CHAT_API_KEY".to_string(), CHAT_KEY.to_string()),
        ]);
        member.api = client(member, Some(ADMIN_KEY));
    }
    hf_nodes::download(&nodes[0]);
    let weights_served = |server: &hf::HubInNetns| -> u64 {
        let served = server.report().0;
        (1..=hf::PARTS)
            .map(|p| format!("model-{p:05}-of-{:05}.safetensors", hf::PARTS))
            .map(|name| hf::bytes_of(&served, &name))
            .sum()
    };
    let served_to_a = weights_served(&server);
    let ids = hf_nodes::start_all(&mut nodes);
    let members: std::collections::BTreeSet<String> = ids[..2].iter().cloned().collect();

    let body = json!({"model_id": hf::REPO, "sharding": "Pipeline", "min_nodes": 2});
    let id = hf_nodes::place(&nodes[0], "/place_instance", &body, &nodes);
    let Some((view, took)) = hf_nodes::ready(&nodes[0], &id, Duration::from_secs(180), &nodes)
    else {
        panic!("the pipeline did not become ready\n{}", logs(&nodes));
    };
    let ranks: Vec<String> = kit::instances::ranks(&view)
        .into_iter()
        .flatten()
        .filter_map(|r| r["node"].as_str().map(str::to_string))
        .collect();
    eprintln!("a 2-rank pipeline on {ranks:?} ready in {took:?}");
    stranger_outside(&nodes, &members, &ids[2], "once the pipeline is ready");
    assert_eq!(
        ranks
            .iter()
            .cloned()
            .collect::<std::collections::BTreeSet<_>>(),
        members,
        "{view}"
    );
    assert_eq!(
        weights_served(&server),
        served_to_a,
        "the hub sent B weights: B's files should have come from A"
    );

    for (i, member) in nodes[..2].iter().enumerate() {
        let chat = client(member, Some(CHAT_KEY));
        let text = streamed(&chat).unwrap_or_else(|e| panic!("node {}: {e}", i + 1));
        assert!(text.contains("Paris"), "node {}: {text}", i + 1);
        hf_nodes::assert_says_paris(member, hf::REPO);
        // Keys: none or a wrong one is refused; the chat key may not place or read the state.
        let chat_body = json!({"model": hf::REPO, "messages": [{"role": "user", "content": "Hi"}],
                                "max_tokens": 2});
        for (who, key) in [
            ("no key", None),
            ("a wrong key", Some("not-the-key-0123456789")),
        ] {
            let stranger = client(member, key);
            for (method, path, payload) in [
                ("POST", "/v1/chat/completions", Some(&chat_body)),
                ("GET", "/v1/models", None),
                ("GET", "/state", None),
                ("POST", "/place_instance", Some(&body)),
            ] {
                assert_eq!(
                    status_of(&stranger, method, path, payload),
                    401,
                    "node {} answered {method} {path} with {who}",
                    i + 1
                );
            }
        }
        assert_eq!(status_of(&chat, "GET", "/state", None), 403);
        assert_eq!(
            status_of(&chat, "POST", "/place_instance", Some(&body)),
            403
        );
        assert_eq!(status_of(&chat, "GET", "/v1/models", None), 200);
    }

    // The stranger C: never in the members' state, and they never in C's.
    stranger_outside(&nodes, &members, &ids[2], "at the end");
    let (status, models) = call(&nodes[2], "GET", "/v1/models", None);
    assert_eq!(status, 200, "{models}");
    assert!(
        models["data"]
            .as_array()
            .into_iter()
            .flatten()
            .all(|m| m["ready"] != true),
        "the stranger can chat with a member's instance: {models}"
    );
    drop(server);
    hf_nodes::teardown(net, hub_node, nodes);
}
