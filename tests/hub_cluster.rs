//! A Hugging Face model on two nodes, as the README tells users to run it: the test hub in one
//! namespace, two `shoal` nodes in two others; each node runs `shoal download org/name` into
//! its own empty Hugging Face cache (only the hub serves), then the model id is placed as a
//! 2-rank pipeline and both nodes' gateways answer "Paris" (greedy).
//!
//! And a GGUF repository holding two quantizations of the fixture (llama.cpp's Q4_K_M and
//! Q6_K): `org/name:Q4_K_M` placed on a node with an empty cache downloads that file alone
//! (the hub sends the Q6_K none of its bytes), loads it and answers.
//!
//! Needs root (namespaces) and the model fixture (`cargo xtask setup`): fails otherwise, or
//! with `SHOAL_ALLOW_SKIP=1` is skipped and counted (see `kit::skip`).

mod support;
use support::{hf, hf_nodes};

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
    for node in &nodes {
        hf_nodes::download(node);
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

/// The GGUF repository of [`a_gguf_quantization_is_downloaded_alone_and_placed`].
const GGUF_REPO: &str = "shoal-test/SmolLM2-135M-Instruct-GGUF";

#[test]
fn a_gguf_quantization_is_downloaded_alone_and_placed() {
    let quants = ["Q4_K_M", "Q6_K"];
    let files: Vec<std::path::PathBuf> = quants
        .iter()
        .map(|q| kit::dirs::kquant_fixture_path(q))
        .collect();
    let present = match files.iter().find(|f| !f.is_file()) {
        Some(missing) => Err(format!("{} is missing", missing.display())),
        None => Ok(()),
    };
    if !kit::skip::can_run(present, "run `cargo xtask setup`") {
        return;
    }
    let Some((net, mut nodes)) = TestNet::create(
        "hfgguf",
        &Spec {
            nodes: 2,
            ..Spec::default()
        },
    ) else {
        return;
    };
    // The repository: the two files as a GGUF repo on the hub has them, nothing else.
    let repo = net.dir.join("gguf-repo");
    std::fs::create_dir_all(&repo).unwrap();
    for file in &files {
        let to = repo.join(file.file_name().unwrap());
        if std::fs::hard_link(file, &to).is_err() {
            std::fs::copy(file, &to).unwrap();
        }
    }
    let served = hub::testhub::ServedRepo::from_dir(&repo, false).expect("the GGUF repo");
    let hub_node = nodes.remove(0);
    let server = hf::HubInNetns::start(
        &hub_node.node.netns,
        hub_node.node.ip(),
        std::collections::BTreeMap::from([(GGUF_REPO.to_string(), served)]),
        None,
        hub::testhub::Faults::default(),
    );
    let cache = net.dir.join("hf1");
    nodes[0].env.extend([
        ("HF_HUB_CACHE".to_string(), cache.display().to_string()),
        ("HF_ENDPOINT".to_string(), server.endpoint.clone()),
    ]);
    hf_nodes::start_all(&mut nodes);
    let model = format!("{GGUF_REPO}:Q4_K_M");
    let body = json!({"model_id": model, "sharding": "Pipeline", "min_nodes": 1});
    let id = hf_nodes::place(&nodes[0], "/place_instance", &body, &nodes);
    let Some((_, took)) = hf_nodes::ready(&nodes[0], &id, Duration::from_secs(180), &nodes) else {
        panic!("{model} did not become ready\n{}", logs(&nodes));
    };
    // A clear greedy answer of the 4-bit K-quant ("The capital of Japan is Tokyo."; France is
    // a close call at 4 bits).
    let text =
        hf_nodes::assert_answers(&nodes[0], &model, "What is the capital of Japan?", "Tokyo");
    let sent = server.report().0;
    let bytes: Vec<(String, u64, u64)> = files
        .iter()
        .map(|f| {
            let name = f.file_name().unwrap().to_string_lossy().into_owned();
            let size = std::fs::metadata(f).unwrap().len();
            (name.clone(), hf::bytes_of(&sent, &name), size)
        })
        .collect();
    eprintln!("{model} ready in {took:?}, answered {text:?}; hub bytes (sent, size): {bytes:?}");
    assert_eq!(bytes[0].1, bytes[0].2, "the Q4_K_M file, once: {bytes:?}");
    assert_eq!(bytes[1].1, 0, "the Q6_K file is not needed: {bytes:?}");
    drop(server);
    hf_nodes::teardown(net, hub_node, nodes);
}
