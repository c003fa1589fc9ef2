//! A cluster with no hub at all: node A downloaded the model while the hub was up, then the
//! hub is gone; node B, with an empty cache, gets the listing and every file it needs from A
//! over iroh, and the model id placed as a 2-rank pipeline answers "Paris" on both nodes. A
//! machine on the same LAN that is not a cluster member asking A for a file on the file-copy
//! ALPN is refused.
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
use support::{call, logs, wait_for, TestNet};

/// Asks `node_id` at `ip` for blob `hash` of the fixture from a fresh iroh endpoint (not a
/// member) in namespace `netns`; answers the server's first frame.
fn ask_as_stranger(netns: &str, ip: std::net::Ipv4Addr, node_id: &str, hash: &str) -> String {
    let (node_id, hash) = (node_id.to_string(), hash.to_string());
    hf::in_netns(netns, move || {
        hf::runtime().block_on(async move {
            let key: iroh::PublicKey = node_id.parse().expect("a node id is an iroh key");
            let endpoint = iroh::Endpoint::builder(iroh::endpoint::presets::Minimal)
                .relay_mode(iroh::RelayMode::Disabled)
                .clear_address_lookup()
                .bind()
                .await
                .expect("bind");
            let addr = iroh::EndpointAddr::new(key).with_ip_addr(std::net::SocketAddr::from((
                ip,
                mesh::net::DEFAULT_MESH_PORT,
            )));
            let alpn = mesh::net::namespaced_alpn(b"shoal/files/1/", "shoal");
            let connection = match endpoint.connect(addr, &alpn).await {
                Ok(c) => c,
                Err(e) => return format!("connection refused: {e}"),
            };
            let (mut send, mut recv) = connection.open_bi().await.expect("a stream");
            let ask =
                serde_json::to_vec(&json!({"model": hf::REPO, "hash": hash, "offset": 0})).unwrap();
            send.write_all(&(ask.len() as u32).to_le_bytes())
                .await
                .unwrap();
            send.write_all(&ask).await.unwrap();
            let mut len = [0u8; 4];
            if let Err(e) = recv.read_exact(&mut len).await {
                return format!("stream closed: {e}");
            }
            let mut body = vec![0u8; u32::from_le_bytes(len).min(1 << 16) as usize];
            recv.read_exact(&mut body).await.expect("the answer");
            String::from_utf8_lossy(&body).into_owned()
        })
    })
    .join()
    .expect("stranger thread")
}

#[test]
fn with_no_hub_members_copy_the_model_from_the_one_that_holds_it() {
    if !kit::skip::can_run(hf::fixture_repo().map(|_| ()), "run `cargo xtask setup`") {
        return;
    }
    let Some((net, mut nodes)) = TestNet::create(
        "hfpeer",
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
    let out = nodes[0]
        .node
        .command(support::shoal_bin())
        .args(["download", "--quiet", hf::REPO])
        .envs(nodes[0].env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("shoal download");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // No hub from here on.
    drop(server);
    for node in &mut nodes {
        node.start();
    }
    let (a_id, _) = wait_for(Duration::from_secs(30), || {
        let (status, id) = call(&nodes[0], "GET", "/node_id", None);
        (status == 200).then(|| id.as_str().unwrap_or_default().to_string())
    })
    .unwrap_or_else(|| panic!("node A does not answer\n{}", logs(&nodes)));

    // A stranger on the LAN (the hub's machine, not a member) is refused a file A holds.
    let weight = std::fs::read(fixture.join("model-00001-of-00003.safetensors")).unwrap();
    let hash = hub::verify::hash_of(true, &weight);
    let answer = wait_for(Duration::from_secs(20), || {
        let a = ask_as_stranger(&hub_node.node.netns, nodes[0].node.ip(), &a_id, &hash);
        (!a.starts_with("connection refused")).then_some(a)
    })
    .map(|(a, _)| a)
    .unwrap_or_else(|| panic!("A's endpoint does not answer\n{}", logs(&nodes)));
    assert!(answer.contains("not a member"), "{answer}");

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
    let id = created["instance_id"].as_str().unwrap().to_string();
    wait_for(Duration::from_secs(150), || {
        let (_, instance) = call(&nodes[0], "GET", &format!("/instance/{id}"), None);
        assert_ne!(instance["status"], "failed", "{instance}\n{}", logs(&nodes));
        (instance["status"] == "ready").then_some(())
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
    nodes.insert(0, hub_node);
    net.teardown(nodes);
}
