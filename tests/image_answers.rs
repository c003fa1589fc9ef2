//! Images answered on one real node (issue 47): `shoal --model <the tiny Gemma 3 vision
//! fixture>` (f32, made by mlx-vlm at `cargo xtask setup`) in a network namespace, driven by
//! the official clients (`tests/image_answers_checks.py`): the same image in each API's own
//! form (OpenAI chat, Responses, Anthropic, Ollama chat and generate) gives mlx-vlm's greedy
//! answer token for token with mlx-vlm's prompt length; each test image its own answer; the
//! same image again comes from the prompt cache with the same answer, a follow-up turn reuses
//! the image's prefix, and a new image reuses only the text before its span. `/v1/models`
//! shows the model's vision.
//!
//! And through a 2-rank pipeline and a 2-rank tensor ring on two nodes: rank 0's runner alone
//! holds the tower (a pipeline's rank 0 splices; a tensor ring's rank 0 shares its image rows
//! with rank 1, which splices them too), the chats sent to the node holding rank 1 are forwarded
//! with their images, and every API's form still gets mlx-vlm's answer.
//!
//! Needs root (namespaces), the vision fixtures and the Python venv with the clients
//! (`cargo xtask setup`): fails otherwise, or with `SHOAL_ALLOW_SKIP=1` is skipped.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;
use support::{call, logs, run_script, wait_for, ShoalNode, TestNet, API_PORT};

/// The f32 vision fixture, or `None` when the test is skipped without it.
fn fixture() -> Option<PathBuf> {
    let fixture = kit::dirs::vision_fixtures_dir().join("gemma3/f32");
    let present = if fixture.join("reference.json").exists() {
        Ok(())
    } else {
        Err(format!("{} is missing", fixture.display()))
    };
    kit::skip::can_run(present, "run `cargo xtask setup`").then_some(fixture)
}

/// Runs `image_answers_checks.py` through `node` for model `id` (`extra`: its options) and
/// asserts that every check passed.
fn run_checks(node: &ShoalNode, id: &str, fixture: &Path, extra: &[&str]) {
    let root = format!("http://{}:{API_PORT}", node.node.ip());
    let reference = fixture.join("reference.json").display().to_string();
    let images = kit::dirs::vision_fixtures_dir().join("images");
    let images = images.display().to_string();
    let mut args = vec![root.as_str(), id, &reference, &images];
    args.extend(extra);
    let out = run_script(
        node,
        "image_answers_checks.py",
        &args,
        Duration::from_secs(500),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("all passed"),
        "image_answers_checks.py failed ({}):\n{stdout}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        node.log_tail()
    );
    eprintln!("{stdout}");
}

#[test]
fn a_vision_model_answers_each_apis_image_as_mlx_vlm_does() {
    let Some(fixture) = fixture() else {
        return;
    };
    let spec = support::netns::Spec {
        nodes: 1,
        off_bridge: Vec::new(),
        links: Vec::new(),
    };
    let Some((test_net, mut nodes)) = TestNet::create("shoalva", &spec) else {
        return;
    };
    nodes[0].extra_args = vec!["--model".into(), fixture.display().to_string()];
    nodes[0].env.push(("HF_HUB_OFFLINE".into(), "1".into()));
    nodes[0].start();
    let (model, _) = wait_for(Duration::from_secs(300), || {
        let (_, models) = call(&nodes[0], "GET", "/v1/models", None);
        models["data"].as_array()?.iter().find_map(|m| {
            (m["ready"] == true).then(|| (m["id"].as_str().unwrap_or("").to_string(), m.clone()))
        })
    })
    .unwrap_or_else(|| panic!("the vision model did not become ready\n{}", logs(&nodes)));
    let (id, listed) = model;
    run_checks(&nodes[0], &id, &fixture, &[]);
    assert!(
        nodes[0].log_tail().contains("vision tower loaded"),
        "the runner did not say it loaded the tower\n{}",
        nodes[0].log_tail()
    );
    assert_eq!(
        listed["shape"]["capabilities"],
        serde_json::json!(["vision"]),
        "/v1/models: {listed}"
    );
    let (_, shown) = call(
        &nodes[0],
        "POST",
        "/api/show",
        Some(&serde_json::json!({ "model": id })),
    );
    assert_eq!(
        shown["capabilities"],
        serde_json::json!(["completion", "vision"]),
        "/api/show: {shown}"
    );
    test_net.teardown(nodes);
}

/// Places the f32 fixture as a 2-rank `sharding` instance on two nodes of namespace `ns` and
/// runs every check through the node that does not hold rank 0 (its chats, images included,
/// are forwarded to the one that does). Only rank 0's runner loads the tower.
fn two_ranks_answer_images(sharding: &str, ns: &str) {
    let Some(fixture) = fixture() else {
        return;
    };
    let spec = support::netns::Spec {
        nodes: 2,
        off_bridge: Vec::new(),
        links: Vec::new(),
    };
    let Some((test_net, mut nodes)) = TestNet::create(ns, &spec) else {
        return;
    };
    let folder = fixture.parent().expect("gemma3/").display().to_string();
    for node in nodes.iter_mut() {
        node.extra_args = vec!["--models-dir".into(), folder.clone()];
        node.env.push(("HF_HUB_OFFLINE".into(), "1".into()));
        node.start();
    }
    let body = serde_json::json!({
        "model_id": fixture.display().to_string(), "sharding": sharding, "min_nodes": 2});
    let (created, _) = wait_for(Duration::from_secs(90), || {
        let (status, created) = call(&nodes[0], "POST", "/place_instance", Some(&body));
        (status == 200).then_some(created)
    })
    .unwrap_or_else(|| panic!("no 2-rank {sharding} instance was placed\n{}", logs(&nodes)));
    let ranks = created["placement"]["ranks"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(ranks.len(), 2, "{created}");
    assert_eq!(created["sharding"], sharding, "{created}");
    let ready = |node: &ShoalNode| {
        let (_, models) = call(node, "GET", "/v1/models", None);
        models["data"].as_array().and_then(|list| {
            list.iter()
                .find(|m| m["ready"] == true)
                .map(|m| (m["id"].as_str().unwrap_or("").to_string(), m.clone()))
        })
    };
    let (listed, _) = wait_for(Duration::from_secs(300), || {
        let listed: Vec<(String, serde_json::Value)> = nodes.iter().filter_map(ready).collect();
        (listed.len() == 2).then_some(listed)
    })
    .unwrap_or_else(|| {
        panic!(
            "the {sharding} instance did not become ready\n{}",
            logs(&nodes)
        )
    });
    // A multi-rank instance keeps no prompt cache (its state lives across the ranks).
    let other = support::node_without_rank0(&nodes, &created);
    run_checks(other, &listed[0].0, &fixture, &["no-cache"]);
    // Every node that has read the model's configuration (rank 0's at least, which renders
    // the prompts) shows that it accepts images.
    let shown: Vec<serde_json::Value> = nodes
        .iter()
        .filter_map(ready)
        .map(|(_, m)| m["shape"]["capabilities"].clone())
        .filter(|c| !c.is_null())
        .collect();
    assert!(
        !shown.is_empty() && shown.iter().all(|c| *c == serde_json::json!(["vision"])),
        "/v1/models' capabilities: {shown:?}"
    );
    let towers: Vec<bool> = nodes
        .iter()
        .map(|n| n.log_last(usize::MAX).contains("vision tower loaded"))
        .collect();
    let rank0 = nodes
        .iter()
        .position(|n| !std::ptr::eq(n, other))
        .expect("rank 0's node");
    let mut want = [false, false];
    want[rank0] = true;
    assert_eq!(
        towers,
        want,
        "only rank 0 loads the tower\n{}",
        logs(&nodes)
    );
    test_net.teardown(nodes);
}

#[test]
fn a_two_rank_pipeline_answers_images_through_the_node_without_rank_0() {
    two_ranks_answer_images("Pipeline", "shoalvp");
}

/// Rank 0 runs the tower and shares its image rows with rank 1 at each step; both ranks splice
/// them, so the ring gives mlx-vlm's answer like one process.
#[test]
fn a_two_rank_tensor_ring_answers_images_as_mlx_vlm_does() {
    two_ranks_answer_images("Tensor", "shoalvt");
}

/// A Qwen3.5 vision model (the tiny f32 fixture mlx-vlm made: Qwen3-VL's tower, M-RoPE
/// positions) on one node: each test image, its token count following its size, gives mlx-vlm's
/// greedy answer through the official `openai` client (`tests/qwen_image_checks.py`).
#[test]
fn a_qwen3_5_vision_node_answers_each_image_as_mlx_vlm_does() {
    let fixture = kit::dirs::vision_fixtures_dir().join("qwen3_5/f32");
    let present = if fixture.join("reference.json").exists() {
        Ok(())
    } else {
        Err(format!("{} is missing", fixture.display()))
    };
    if !kit::skip::can_run(present, "run `cargo xtask vision-fixtures`") {
        return;
    }
    let spec = support::netns::Spec {
        nodes: 1,
        off_bridge: Vec::new(),
        links: Vec::new(),
    };
    let Some((test_net, mut nodes)) = TestNet::create("shoalvq", &spec) else {
        return;
    };
    nodes[0].extra_args = vec!["--model".into(), fixture.display().to_string()];
    nodes[0].env.push(("HF_HUB_OFFLINE".into(), "1".into()));
    nodes[0].start();
    let (id, _) = wait_for(Duration::from_secs(300), || {
        let (_, models) = call(&nodes[0], "GET", "/v1/models", None);
        models["data"]
            .as_array()?
            .iter()
            .find_map(|m| (m["ready"] == true).then(|| m["id"].as_str().unwrap_or("").to_string()))
    })
    .unwrap_or_else(|| {
        panic!(
            "the Qwen3.5 vision model did not become ready\n{}",
            logs(&nodes)
        )
    });
    let root = format!("http://{}:{API_PORT}", nodes[0].node.ip());
    let reference = fixture.join("reference.json").display().to_string();
    let vision = kit::dirs::vision_fixtures_dir();
    let images = vision.join("images").display().to_string();
    let big = vision.join("qwen3_5/big.png").display().to_string();
    let out = run_script(
        &nodes[0],
        "qwen_image_checks.py",
        &[root.as_str(), &id, &reference, &images, &big],
        Duration::from_secs(300),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("all passed"),
        "qwen_image_checks.py failed ({}):\n{stdout}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        nodes[0].log_tail()
    );
    eprintln!("{stdout}");
    test_net.teardown(nodes);
}
