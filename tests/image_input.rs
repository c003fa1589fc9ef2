//! Images in every API on one real node (`shoal --model default`, the text-only SmolLM2
//! fixture) in a network namespace, driven by the official clients
//! (`tests/image_input_checks.py`): OpenAI chat `image_url` parts, Responses `input_image`,
//! Anthropic `image` blocks and Ollama `images` on `/api/chat` and `/api/generate` each reach
//! the node that renders the prompt, which answers 400 "model default does not accept images"
//! in the API's own error shape (never a silent drop); corrupt, oversized and http(s) images
//! answer 400 saying what is wrong; and the node still answers text afterwards, its process
//! alive.
//!
//! Needs root (namespaces), the model fixture and the Python venv with the clients
//! (`cargo xtask setup`): fails otherwise, or with `SHOAL_ALLOW_SKIP=1` is skipped.

mod support;

use std::time::Duration;
use support::{default_ready, logs, run_script, wait_for, TestNet, API_PORT};

#[test]
fn every_api_carries_images_and_a_text_only_model_refuses_them() {
    let spec = support::netns::Spec {
        nodes: 1,
        off_bridge: Vec::new(),
        links: Vec::new(),
    };
    let Some((test_net, mut nodes)) = TestNet::create("shoalv", &spec) else {
        return;
    };
    nodes[0].extra_args = ["--model", "default"].map(String::from).to_vec();
    nodes[0].start();
    wait_for(Duration::from_secs(300), || {
        default_ready(&nodes[0]).then_some(())
    })
    .unwrap_or_else(|| panic!("the model did not become ready\n{}", logs(&nodes)));
    let root = format!("http://{}:{API_PORT}", nodes[0].node.ip());
    let out = run_script(
        &nodes[0],
        "image_input_checks.py",
        &[&root, "default"],
        Duration::from_secs(300),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("all passed"),
        "image_input_checks.py failed ({}):\n{stdout}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        nodes[0].log_tail()
    );
    eprintln!("{stdout}");
    assert!(
        default_ready(&nodes[0]),
        "the node no longer serves the model after the images\n{}",
        nodes[0].log_tail()
    );
    test_net.teardown(nodes);
}
