//! `SHOAL_QMM=int8` through a node's environment reaches its runner (issue 49 item 10): the
//! setting was measured by the kernel tests and the benchmark, never on a real node. Two nodes
//! in namespaces that cannot see each other serve the SmolLM2 fixture (4-bit weights as they
//! run), one as started by default (activations kept in f32), one with `SHOAL_QMM=int8`
//! (decode products round the activations to int8). The same greedy chat through each:
//! the same tokens (the rounding is small), and log-probabilities that differ — equal ones
//! would mean the setting never reached the products — by little (a bound far above the
//! rounding's measured effect, far below a broken product's).
//!
//! Needs root (namespaces) and the model fixture (`cargo xtask setup`): fails otherwise, or
//! with `SHOAL_ALLOW_SKIP=1` is skipped and counted (see `kit::skip`).

mod support;

use serde_json::json;
use std::time::Duration;
use support::netns::Spec;
use support::{call, logs, wait_for, ShoalNode, TestNet};

/// The largest difference in a token's log-probability allowed between the two paths.
const MOST_LOGPROB_DIFFERENCE: f64 = 0.1;

/// A greedy chat with each answer token's log-probability: (tokens, log-probabilities).
fn greedy_with_logprobs(node: &ShoalNode) -> Option<(Vec<String>, Vec<f64>)> {
    let body = json!({
        "model": "default",
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "temperature": 0,
        "max_tokens": 12,
        "logprobs": true,
    });
    let (status, answer) = call(node, "POST", "/v1/chat/completions", Some(&body));
    if status != 200 {
        return None;
    }
    let content = answer["choices"][0]["logprobs"]["content"].as_array()?;
    let tokens = content
        .iter()
        .map(|t| t["token"].as_str().map(String::from))
        .collect::<Option<Vec<_>>>()?;
    let logprobs = content
        .iter()
        .map(|t| t["logprob"].as_f64())
        .collect::<Option<Vec<_>>>()?;
    Some((tokens, logprobs))
}

#[test]
fn int8_activations_set_in_the_environment_reach_a_real_nodes_products() {
    if !support::default_model_present() {
        return;
    }
    let spec = Spec {
        nodes: 2,
        off_bridge: vec![0, 1],
        ..Spec::default()
    };
    let Some((net, mut nodes)) = TestNet::create("qmmint8", &spec) else {
        return;
    };
    nodes[1]
        .env
        .push((inference::cpu_kernels::QMM_ENV.into(), "int8".into()));
    for node in nodes.iter_mut() {
        node.extra_args = vec!["--model".into(), "default".into()];
        node.start();
    }
    let answers: Vec<(Vec<String>, Vec<f64>)> = nodes
        .iter()
        .map(|node| {
            wait_for(Duration::from_secs(240), || greedy_with_logprobs(node))
                .map(|(answer, _)| answer)
                .unwrap_or_else(|| panic!("no greedy answer\n{}", logs(&nodes)))
        })
        .collect();
    let (exact, int8) = (&answers[0], &answers[1]);
    let differences: Vec<f64> = exact
        .1
        .iter()
        .zip(&int8.1)
        .map(|(a, b)| (a - b).abs())
        .collect();
    let most = differences.iter().cloned().fold(0.0, f64::max);
    eprintln!(
        "answer {:?}; log-probabilities exact {:?}, int8 {:?}; largest difference {most:.2e}",
        exact.0.concat(),
        exact.1,
        int8.1
    );
    assert_eq!(
        exact.0, int8.0,
        "the greedy tokens differ between the paths"
    );
    assert!(
        exact.0.concat().contains("Paris"),
        "the answer is not the model's: {:?}",
        exact.0.concat()
    );
    assert!(
        most > 0.0,
        "int8 gave exactly the default path's log-probabilities: SHOAL_QMM=int8 did not reach \
         the runner's products"
    );
    assert!(
        most <= MOST_LOGPROB_DIFFERENCE,
        "int8 moved a log-probability by {most}: {differences:?}"
    );
    net.teardown(nodes);
}
