//! Namespaced `shoal` nodes around the test hub: one namespace for the hub serving the fixture
//! (`hf.rs`), one per node, each node pointed at the hub with a cache of its own. For the tests
//! that include both `support` and `hf` (peer copies, `huggingface_hub` compatibility).

#![allow(dead_code)]

use super::hf;
use super::{call, logs, ShoalNode, TestNet};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// The hub and the nodes around it (none started yet).
pub struct HubNodes {
    /// The namespaces and scratch folder.
    pub net: TestNet,
    /// The hub's namespace (no `shoal` runs there).
    pub hub_node: ShoalNode,
    /// The nodes; `caches[i]` is node i's `HF_HUB_CACHE`.
    pub nodes: Vec<ShoalNode>,
    /// The hub serving the fixture as [`hf::REPO`].
    pub server: hf::HubInNetns,
    /// Each node's Hugging Face cache (empty at first).
    pub caches: Vec<PathBuf>,
    /// The fixture repo on disk (what the hub serves).
    pub fixture: PathBuf,
}

/// The hub and `count` nodes in fresh namespaces (`tag` as in [`TestNet::create`]). Fails,
/// or with `SHOAL_ALLOW_SKIP=1` answers `None` after counting the skip, where namespaces or
/// the fixture are missing (see `kit::skip`).
pub fn start(tag: &str, count: usize) -> Option<HubNodes> {
    if !kit::skip::can_run(hf::fixture_repo().map(|_| ()), "run `cargo xtask setup`") {
        return None;
    }
    let (net, mut nodes) = TestNet::create(
        tag,
        &kit::netns::Spec {
            nodes: count + 1,
            ..kit::netns::Spec::default()
        },
    )?;
    let fixture = hf::fixture_repo().expect("checked above");
    let hub_node = nodes.remove(0);
    let (server, caches) = hf::serve_fixture(
        &hub_node.node.netns,
        hub_node.node.ip(),
        &net.dir,
        nodes.iter_mut().map(|n| &mut n.env),
    );
    Some(HubNodes {
        net,
        hub_node,
        nodes,
        server,
        caches,
        fixture,
    })
}

/// Stops the nodes and deletes the namespaces (see [`TestNet::teardown`]).
pub fn teardown(net: TestNet, hub_node: ShoalNode, mut nodes: Vec<ShoalNode>) {
    nodes.insert(0, hub_node);
    net.teardown(nodes);
}

/// `shoal download --quiet` of [`hf::REPO`] run in `node`'s namespace with its environment,
/// as a user runs it; panics with its output if it fails.
pub fn download(node: &ShoalNode) {
    let out = node
        .node
        .command(super::shoal_bin())
        .args(["download", "--quiet", hf::REPO])
        .envs(node.env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("shoal download");
    assert!(
        out.status.success(),
        "shoal download: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The folder of [`hf::REPO`] in `cache` (`models--org--name`).
pub fn repo_dir(cache: &Path) -> PathBuf {
    cache.join(format!("models--{}", hf::REPO.replace('/', "--")))
}

/// The one snapshot folder of [`hf::REPO`] in `cache`.
pub fn snapshot_dir(cache: &Path) -> PathBuf {
    std::fs::read_dir(repo_dir(cache).join("snapshots"))
        .expect("a snapshots folder")
        .flatten()
        .next()
        .expect("a snapshot")
        .path()
}

/// Panics unless every weight file of the fixture in `snapshot` has the hub's bytes.
pub fn assert_hub_bytes(snapshot: &Path, fixture: &Path) {
    for part in 1..=hf::PARTS {
        let name = format!("model-{part:05}-of-{:05}.safetensors", hf::PARTS);
        assert!(
            std::fs::read(snapshot.join(&name)).unwrap()
                == std::fs::read(fixture.join(&name)).unwrap(),
            "{name} in {} differs from the hub's",
            snapshot.display()
        );
    }
}

/// Asks `node` (greedy, 12 tokens) `question` of `model`; panics unless the answer holds
/// `word`. Answers the text.
pub fn assert_answers(node: &ShoalNode, model: &str, question: &str, word: &str) -> String {
    let request = json!({
        "model": model,
        "messages": [{"role": "user", "content": question}],
        "temperature": 0,
        "max_tokens": 12,
    });
    let (status, answer) = call(node, "POST", "/v1/chat/completions", Some(&request));
    let text = answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default();
    assert!(status == 200 && text.contains(word), "{status}: {answer}");
    text.to_string()
}

/// [`assert_answers`] "What is the capital of France?" with "Paris".
pub fn assert_says_paris(node: &ShoalNode, model: &str) {
    assert_answers(node, model, "What is the capital of France?", "Paris");
}

/// Starts every node and waits (30 s each) until it answers `GET /node_id`: their ids, in
/// order.
pub fn start_all(nodes: &mut [ShoalNode]) -> Vec<String> {
    for node in nodes.iter_mut() {
        node.start();
    }
    nodes
        .iter()
        .map(|n| {
            super::wait_for(std::time::Duration::from_secs(30), || {
                let (status, id) = call(n, "GET", "/node_id", None);
                (status == 200).then(|| id.as_str().unwrap_or_default().to_string())
            })
            .unwrap_or_else(|| panic!("a node does not answer\n{}", logs(nodes)))
            .0
        })
        .collect()
}

/// Places an instance through `node`'s `path` (`/instance` or `/place_instance`) with `body`,
/// asked again until the node accepts it (60 s: placing needs the node to see its peers):
/// the instance id. Panics with the logs of `nodes` if it never does.
pub fn place(node: &ShoalNode, path: &str, body: &Value, nodes: &[ShoalNode]) -> String {
    let mut last = Value::Null;
    let placed = super::wait_for(std::time::Duration::from_secs(60), || {
        let (status, created) = call(node, "POST", path, Some(body));
        if status == 200 {
            return Some(created);
        }
        last = json!({"status": status, "answer": created});
        None
    });
    let Some((created, _)) = placed else {
        panic!("{body} was not placed: {last}\n{}", logs(nodes));
    };
    created["instance_id"]
        .as_str()
        .expect("an instance id")
        .to_string()
}

/// `node`'s view of instance `id` once it is ready (and how long that took), or `None` after
/// `limit`; panics with the logs of `nodes` if it turns `failed`.
pub fn ready(
    node: &ShoalNode,
    id: &str,
    limit: std::time::Duration,
    nodes: &[ShoalNode],
) -> Option<(Value, std::time::Duration)> {
    super::wait_for(limit, || {
        let (_, i) = call(node, "GET", &format!("/instance/{id}"), None);
        assert_ne!(i["status"], "failed", "{i}\n{}", logs(nodes));
        (i["status"] == "ready").then_some(i)
    })
}
