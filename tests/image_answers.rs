//! Images answered on one real node (issue 47): `shoal --model <the tiny Gemma 3 vision
//! fixture>` (f32, made by mlx-vlm at `cargo xtask setup`) in a network namespace, driven by
//! the official clients (`tests/image_answers_checks.py`): the same image in each API's own
//! form (OpenAI chat, Responses, Anthropic, Ollama chat and generate) gives mlx-vlm's greedy
//! answer token for token with mlx-vlm's prompt length; each test image its own answer; the
//! same image again comes from the prompt cache with the same answer, a follow-up turn reuses
//! the image's prefix, and a new image reuses only the text before its span. `/v1/models`
//! shows the model's vision.
//!
//! Needs root (namespaces), the vision fixtures and the Python venv with the clients
//! (`cargo xtask setup`): fails otherwise, or with `SHOAL_ALLOW_SKIP=1` is skipped.

mod support;

use std::time::Duration;
use support::{call, logs, run_script, wait_for, TestNet, API_PORT};

#[test]
fn a_vision_model_answers_each_apis_image_as_mlx_vlm_does() {
    let fixture = kit::dirs::vision_fixtures_dir().join("gemma3/f32");
    let present = if fixture.join("reference.json").exists() {
        Ok(())
    } else {
        Err(format!("{} is missing", fixture.display()))
    };
    if !kit::skip::can_run(present, "run `cargo xtask setup`") {
        return;
    }
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
    let reference = fixture.join("reference.json");
    let root = format!("http://{}:{API_PORT}", nodes[0].node.ip());
    let images = kit::dirs::vision_fixtures_dir().join("images");
    let out = run_script(
        &nodes[0],
        "image_answers_checks.py",
        &[
            &root,
            &id,
            &reference.display().to_string(),
            &images.display().to_string(),
        ],
        Duration::from_secs(500),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("all passed"),
        "image_answers_checks.py failed ({}):\n{stdout}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        nodes[0].log_tail()
    );
    eprintln!("{stdout}");
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
