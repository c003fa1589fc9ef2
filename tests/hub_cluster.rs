//! A Hugging Face model on two nodes, as the README tells users to run it: the test hub in one
//! namespace, two `shoal` nodes in two others; each node runs `shoal download org/name` into
//! its own empty Hugging Face cache (only the hub serves), then the model id is placed as a
//! 2-rank pipeline and both nodes' gateways answer "Paris" (greedy).
//!
//! Needs root (namespaces) and the model fixture (`cargo xtask setup`): fails otherwise, or
//! with `SHOAL_ALLOW_SKIP=1` is skipped and counted (see `kit::skip`).

mod support;

#[path = "support/hf.rs"]
#[allow(dead_code)]
mod hf;

use serde_json::json;
use std::time::Duration;
use support::netns::Spec;
use support::{call, logs, wait_for, ShoalNode, TestNet};

#[test]
fn a_model_id_runs_as_a_two_node_pipeline() {
    if !kit::skip::can_run(hf::fixture_repo().map(|_| ()), "run `cargo xtask setup`") {
        return;
    }
    let Some((net, mut nodes)) = TestNet::create(
        "hfclu",
        &Spec {
            nodes: 3,
            ..Spec::default()
        },
    ) else {
        return;
    };
    let fixture = hf::fixture_repo().unwrap();
    let hub_node = nodes.remove(0);
    let (server, _caches) = hf::serve_fixture(
        &hub_node.node.netns,
        hub_node.node.ip(),
        &net.dir,
        nodes.iter_mut().map(|n| &mut n.env),
    );
    for node in nodes.iter_mut() {
        let out = node
            .node
            .command(support::shoal_bin())
            .args(["download", "--quiet", hf::REPO])
            .envs(node.env.iter().map(|(k, v)| (k, v)))
            .output()
            .expect("shoal download");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let (served, _, _) = server.report();
    for f in std::fs::read_dir(&fixture).unwrap().flatten() {
        let name = f.file_name().to_string_lossy().into_owned();
        if name.ends_with(".safetensors") {
            let size = f.metadata().unwrap().len();
            assert_eq!(
                hf::bytes_of(&served, &name),
                2 * size,
                "{name}: one download per node"
            );
        }
    }
    for node in &mut nodes {
        node.start();
    }
    let placed = wait_for(Duration::from_secs(90), || {
        let (status, created) = call(
            &nodes[0],
            "POST",
            "/place_instance",
            Some(&json!({"model_id": hf::REPO, "sharding": "Pipeline", "min_nodes": 2})),
        );
        (status == 200).then_some(created)
    });
    let Some((created, _)) = placed else {
        panic!("no two-node placement\n{}", logs(&nodes));
    };
    assert_eq!(
        created["placement"]["ranks"].as_array().map(Vec::len),
        Some(2),
        "{created}"
    );
    let ready = |node: &ShoalNode| {
        let (_, models) = call(node, "GET", "/v1/models", None);
        models["data"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|m| m["id"] == hf::REPO && m["ready"] == true)
    };
    wait_for(Duration::from_secs(300), || {
        nodes.iter().all(ready).then_some(())
    })
    .unwrap_or_else(|| panic!("the instance did not become ready\n{}", logs(&nodes)));
    for node in &nodes {
        let request = json!({
            "model": hf::REPO,
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "temperature": 0,
            "max_tokens": 12,
        });
        let (status, answer) = call(node, "POST", "/v1/chat/completions", Some(&request));
        assert_eq!(status, 200, "{answer}\n{}", logs(&nodes));
        let text = answer["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default();
        assert!(text.contains("Paris"), "{text}");
    }
    drop(server);
    nodes.insert(0, hub_node);
    net.teardown(nodes);
}
