//! Downloads in the lifecycle: the test hub in one namespace, three `shoal` nodes in three
//! others, each with an empty Hugging Face cache and no `--model`. Placing the model id as a
//! 3-rank pipeline makes the placing node fetch the configuration (not the weights), and every
//! rank's node fetch only the weight files of its layers when it sees its rank; the runners
//! load when those are complete, and every node's gateway answers "Paris" to the official
//! `openai` client. Each node's progress is a `download/<model>/<part>` record in the state,
//! and the hub serves each weight file once: a second node that needs it copies it from the
//! first over iroh.
//!
//! Needs root (namespaces), the model fixture and the Python venv (`cargo xtask setup`): fails
//! otherwise, or with `SHOAL_ALLOW_SKIP=1` is skipped and counted (see `kit::skip`).

mod support;
use support::hf;

use hub::select::{Shard, INDEX};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};
use support::netns::Spec;
use support::{call, logs, wait_for, ShoalNode, TestNet, API_PORT};

/// Runs `tests/node_checks.py BASE_URL MODEL paris` inside `node`'s namespace.
fn paris(node: &ShoalNode) -> Result<String, String> {
    let python = kit::dirs::python();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/node_checks.py");
    let url = format!("http://{}:{API_PORT}/v1", node.node.ip());
    let out = node
        .node
        .command(&python.display().to_string())
        .arg(script)
        .args([&url, hf::REPO, "paris"])
        .output()
        .map_err(|e| format!("{}: {e}", python.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() && stdout.contains("Paris") {
        Ok(stdout)
    } else {
        Err(format!(
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

#[test]
fn placing_a_model_id_downloads_each_ranks_layers_and_answers_everywhere() {
    let python = kit::dirs::python();
    let ready = hf::fixture_repo().map(|_| ()).and_then(|()| {
        python
            .exists()
            .then_some(())
            .ok_or_else(|| format!("{} is missing", python.display()))
    });
    if !kit::skip::can_run(ready, "run `cargo xtask setup`") {
        return;
    }
    let Some((net, mut nodes)) = TestNet::create(
        "hfpipe",
        &Spec {
            nodes: 4,
            ..Spec::default()
        },
    ) else {
        return;
    };
    let fixture = hf::fixture_repo().unwrap();
    let hub_node = nodes.remove(0);
    let (server, caches) = hf::serve_fixture(
        &hub_node.node.netns,
        hub_node.node.ip(),
        &net.dir,
        nodes.iter_mut().map(|n| &mut n.env),
    );
    for node in nodes.iter_mut() {
        node.start();
    }
    let started = Instant::now();
    let placed = wait_for(Duration::from_secs(90), || {
        let (status, created) = call(
            &nodes[0],
            "POST",
            "/place_instance",
            Some(&json!({"model_id": hf::REPO, "sharding": "Pipeline", "min_nodes": 3})),
        );
        (status == 200).then_some(created)
    });
    let Some((created, _)) = placed else {
        panic!("no three-node placement\n{}", logs(&nodes));
    };
    let ranks = created["ranks"].as_array().cloned().unwrap_or_default();
    assert_eq!(ranks.len(), 3, "{created}");
    let id = created["instance_id"].as_str().unwrap().to_string();
    let ready = |node: &ShoalNode| {
        let (_, models) = call(node, "GET", "/v1/models", None);
        models["data"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|m| m["id"] == hf::REPO && m["ready"] == true)
    };
    wait_for(Duration::from_secs(150), || {
        let (_, instance) = call(&nodes[0], "GET", &format!("/instance/{id}"), None);
        assert_ne!(instance["status"], "failed", "{instance}\n{}", logs(&nodes));
        nodes.iter().all(ready).then_some(())
    })
    .unwrap_or_else(|| panic!("the instance did not become ready\n{}", logs(&nodes)));
    eprintln!(
        "placed, downloaded and loaded in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    for node in &nodes {
        let answer = paris(node).unwrap_or_else(|e| panic!("{e}\n{}", logs(&nodes)));
        eprintln!("{}", answer.lines().last().unwrap_or_default());
    }

    // Each node holds exactly the weight files of its layers, and its download record in the
    // state says so.
    let index = std::fs::read(fixture.join(INDEX)).unwrap();
    let (_, state) = call(&nodes[0], "GET", "/state", None);
    let mut needed_by: BTreeMap<String, usize> = BTreeMap::new();
    for (node, cache) in nodes.iter().zip(&caches) {
        let (_, me) = call(node, "GET", "/node_id", None);
        let me = me.as_str().unwrap().to_string();
        let rank = ranks
            .iter()
            .find(|r| r["node"] == me.as_str())
            .unwrap_or_else(|| panic!("node {me} has no rank: {created}"));
        let (start, end) = (
            rank["start_layer"].as_u64().unwrap() as usize,
            rank["end_layer"].as_u64().unwrap() as usize,
        );
        let expected = hub::select::weight_files(
            &index,
            Shard::Layers {
                start,
                end,
                n_layers: 30,
            },
        )
        .unwrap();
        assert!(
            expected.len() < hf::PARTS,
            "{me} needs every file: {expected:?}"
        );
        assert_eq!(
            hf::weight_files_held(cache, hf::REPO),
            expected,
            "node {me} with layers {start}..{end}"
        );
        for f in &expected {
            *needed_by.entry(f.clone()).or_default() += 1;
        }
        let key = format!("download/{}/layers-{start}-{end}-of-30", hf::REPO);
        let record = &state["nodes"][&me]["records"][&key];
        assert_eq!(record["state"], "complete", "{key} of {me}: {record}");
        assert_eq!(record["done"], record["total"], "{record}");
    }
    // The hub served each needed weight file's bytes once in total (a second node that needed
    // it copied it from the first over iroh), and no other weight file at all.
    let (served, _, _) = server.report();
    for f in std::fs::read_dir(&fixture).unwrap().flatten() {
        let name = f.file_name().to_string_lossy().into_owned();
        if name.ends_with(".safetensors") {
            let size = f.metadata().unwrap().len();
            let once = u64::from(needed_by.contains_key(&name));
            assert_eq!(hf::bytes_of(&served, &name), once * size, "{name}");
        }
    }
    assert!(
        needed_by.values().any(|n| *n > 1),
        "some weight file is needed by two nodes: {needed_by:?}"
    );
    drop(server);
    nodes.insert(0, hub_node);
    net.teardown(nodes);
}
