//! Structured outputs on one real node (`shoal --model default`, the SmolLM2 fixture) in a
//! network namespace, driven by the official clients (`tests/structured_checks.py`): the
//! OpenAI SDK's `chat.completions.parse` with a Pydantic model, 20 schemas through chat,
//! Responses, Ollama and a streamed chat (8 at a time, so constrained rows share the
//! runner's batch), JSON mode, forced tool calls in OpenAI and Anthropic, and an unsupported
//! keyword refused with a 400. Every answer is validated with Python's `jsonschema`.
//!
//! Then the same node is restarted with `SHOAL_UNCONSTRAINED=1` (the constraint dropped
//! where the prompt is rendered) and the same checks are counted, not asserted: most must
//! fail, so the checks above prove the constraint and not a model that happens to write
//! valid JSON.
//!
//! And across a cluster: the same checks through the node that does not hold rank 0 of a
//! 2-rank pipeline (its chats forwarded to the rank-0 node, the mask applied where the last
//! rank's logits are sampled).
//!
//! Needs root (namespaces), the model fixture and the Python venv with `jsonschema`
//! (`cargo xtask setup`): fails otherwise, or with `SHOAL_ALLOW_SKIP=1` is skipped.

mod support;

use serde_json::Value;
use std::time::{Duration, Instant};
use support::{default_ready, logs, netns, run_script, wait_for, ShoalNode, TestNet, API_PORT};

/// Share of the checks that must fail without the constraint.
const MIN_INVALID_UNCONSTRAINED: f64 = 0.5;

/// Runs the checks against `node` (`unconstrained`: count rather than assert) and returns
/// their summary line.
fn run_checks(node: &ShoalNode, unconstrained: bool) -> Value {
    let root = format!("http://{}:{API_PORT}", node.node.ip());
    let mut args = vec![root.as_str(), "default"];
    if unconstrained {
        args.push("--unconstrained");
    }
    let started = Instant::now();
    let out = run_script(
        node,
        "structured_checks.py",
        &args,
        Duration::from_secs(1500),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary = stdout
        .lines()
        .find(|l| l.starts_with('{'))
        .and_then(|l| serde_json::from_str(l).ok());
    let passed = out.status.success() && (unconstrained || stdout.contains("all passed"));
    match summary {
        Some(summary) if passed => {
            eprintln!(
                "structured checks (unconstrained: {unconstrained}) in {:.0} s: {summary}",
                started.elapsed().as_secs_f64()
            );
            summary
        }
        _ => panic!(
            "structured_checks.py failed ({}):\n{stdout}\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            node.log_tail()
        ),
    }
}

fn wait_ready(nodes: &[ShoalNode]) {
    wait_for(Duration::from_secs(300), || {
        default_ready(&nodes[0]).then_some(())
    })
    .unwrap_or_else(|| panic!("the model did not become ready\n{}", logs(nodes)));
}

#[test]
fn answers_fit_their_schemas_in_every_api_and_not_without_the_constraint() {
    let spec = netns::Spec {
        nodes: 1,
        off_bridge: Vec::new(),
        links: Vec::new(),
    };
    let Some((test_net, mut nodes)) = TestNet::create("shoalso", &spec) else {
        return;
    };
    nodes[0].extra_args = ["--model", "default"].map(String::from).to_vec();
    nodes[0].start();
    wait_ready(&nodes);
    let constrained = run_checks(&nodes[0], false);
    assert_eq!(constrained["invalid"], 0, "{constrained}");

    nodes[0].stop(Duration::from_secs(20));
    nodes[0].env = vec![("SHOAL_UNCONSTRAINED".into(), "1".into())];
    nodes[0].start();
    wait_ready(&nodes);
    let loose = run_checks(&nodes[0], true);
    let invalid = loose["invalid"].as_f64().unwrap_or(0.0);
    let checks = loose["checks"].as_f64().unwrap_or(1.0);
    assert!(
        invalid >= MIN_INVALID_UNCONSTRAINED * checks,
        "without the constraint only {invalid} of {checks} checks failed: {loose}"
    );
    test_net.teardown(nodes);
}

#[test]
fn answers_fit_their_schemas_through_a_pipeline_and_a_forwarding_node() {
    let spec = netns::Spec {
        nodes: 2,
        off_bridge: Vec::new(),
        links: Vec::new(),
    };
    let Some((test_net, mut nodes)) = TestNet::create("shoalsp", &spec) else {
        return;
    };
    for node in nodes.iter_mut() {
        node.start();
    }
    let body = serde_json::json!({"model_id": "default", "sharding": "Pipeline", "min_nodes": 2});
    let created = wait_for(Duration::from_secs(90), || {
        let (status, created) = support::call(&nodes[0], "POST", "/place_instance", Some(&body));
        (status == 200).then_some(created)
    });
    let Some((created, _)) = created else {
        panic!("no 2-rank pipeline was placed\n{}", logs(&nodes));
    };
    let ranks = created["placement"]["ranks"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(ranks.len(), 2, "{created}");
    wait_for(Duration::from_secs(300), || {
        nodes.iter().all(default_ready).then_some(())
    })
    .unwrap_or_else(|| panic!("the pipeline did not become ready\n{}", logs(&nodes)));
    // The node that does not hold rank 0 forwards every chat to the one that does.
    let other = support::node_without_rank0(&nodes, &created);
    let summary = run_checks(other, false);
    assert_eq!(summary["invalid"], 0, "{summary}");
    test_net.teardown(nodes);
}
