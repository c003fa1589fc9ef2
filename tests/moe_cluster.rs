//! A Mixture-of-Experts model through real nodes, as a user meets it: the Qwen3-MoE fixture
//! that mlx-lm made and quantized to 4 bits (routers at 8 by per-path entries; see
//! `inference/tests/families.rs`), served by the test hub as a three-file repo, placed from its
//! id on nodes in namespaces with empty Hugging Face caches.
//!
//! - As a 3-rank pipeline: each node downloads only its layers' files, and every node's
//!   gateway answers the official `openai` client with mlx-lm's own greedy answer to the same
//!   chat, token for token (its `chat_reference.json`), in one answer and streamed.
//! - As a 2-rank tensor ring, the 4-bit experts cut at their quantization groups: the same
//!   answer; and structured outputs (JSON Schema in every API, forced calls) validate on the
//!   ring, asked of its node and of the node outside it that forwards.
//! - On one node: the same answer.
//! - After each deletion the instance stays gone, while two of the three nodes see other
//!   nodes' removals of their copies 2 s late (`SHOAL_FAULT_LATE_COPY_REMOVALS_MS`): the order
//!   in which a deleted instance once came back, made certain.
//!
//! And every family mlx-lm made a 4-bit fixture of (Qwen3-MoE, GLM-4.5, MiniMax M2,
//! DeepSeek V3, gpt-oss, Gemma 3; gpt-oss also in its own mxfp4), each served as a repo of its
//! own: mlx-lm's greedy answer from every node of a 2-node pipeline, of a 2-node tensor ring,
//! and from one node.
//!
//! Needs root (namespaces), the family fixtures and the Python venv (`cargo xtask setup`).

mod support;
use support::hf;

use hub::select::{Shard, INDEX};
use hub::testhub::{split::split, Faults, ServedRepo};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use support::netns::Spec;
use support::{call, logs, wait_for, ShoalNode, TestNet, API_PORT};

/// The id the fixture is served under.
const REPO: &str = "shoal-fixtures/Qwen3-MoE-tiny-4bit";
/// The fixture's layers.
const LAYERS: usize = 3;
/// What a repo of the model holds (the fixture folder also has mlx-lm's references).
const REPO_FILES: &[&str] = &[
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
];

/// The 4-bit fixture as a three-file Hugging Face repo under `dir`, and its reference answer.
fn moe_repo(dir: &Path) -> Result<(PathBuf, PathBuf), String> {
    let fixture = kit::dirs::family_fixture_dir("qwen3_moe", "q4");
    let answer = fixture.join("chat_reference.json");
    if !answer.is_file() {
        return Err(format!("{} is missing", answer.display()));
    }
    let stage = dir.join("moe-stage");
    std::fs::create_dir_all(&stage).map_err(|e| e.to_string())?;
    for f in REPO_FILES {
        std::fs::copy(fixture.join(f), stage.join(f))
            .map_err(|e| format!("{}: {e}", fixture.join(f).display()))?;
    }
    let repo = dir.join("moe-repo");
    split(&stage, &repo, 3).map_err(|e| format!("splitting the fixture: {e}"))?;
    Ok((repo, answer))
}

/// Runs the Python check `script` (under `tests/`) with `args` inside `node`'s namespace; its
/// output when it exits 0 and says "all passed", else its output and errors.
fn run_checks(node: &ShoalNode, script: &str, args: &[&str]) -> Result<String, String> {
    let python = kit::dirs::python();
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(script);
    let out = node
        .node
        .command(&python.display().to_string())
        .arg(script)
        .args(args)
        .output()
        .map_err(|e| format!("{}: {e}", python.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() && stdout.contains("all passed") {
        Ok(stdout)
    } else {
        Err(format!(
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Runs `tests/node_checks.py BASE_URL REPO answer REFERENCE` inside `node`'s namespace.
fn answers_as_mlx_lm(node: &ShoalNode, repo: &str, reference: &Path) -> Result<String, String> {
    let url = format!("http://{}:{API_PORT}/v1", node.node.ip());
    let reference = reference.display().to_string();
    run_checks(node, "node_checks.py", &[&url, repo, "answer", &reference])
}

/// Runs `tests/structured_checks.py ROOT_URL REPO --bounded` inside `node`'s namespace: every
/// answer of the structured-output checks whose answers the schema bounds (JSON Schema through
/// chat, Responses, Ollama and a stream; forced calls in OpenAI and Anthropic) validates. On a
/// random-weight model the checks cannot pass by the model's judgement, only by the grammar.
fn fits_schemas(node: &ShoalNode, repo: &str) -> Result<String, String> {
    let url = format!("http://{}:{API_PORT}", node.node.ip());
    run_checks(node, "structured_checks.py", &[&url, repo, "--bounded"])
}

/// Whether `node`'s `/v1/models` lists `repo` as ready.
fn ready(node: &ShoalNode, repo: &str) -> bool {
    let (_, models) = call(node, "GET", "/v1/models", None);
    models["data"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|m| m["id"] == repo && m["ready"] == true)
}

/// Places `repo` (`sharding`, at least `min_nodes`) from `nodes[0]` and waits until `serving`
/// all report it ready; the `/place_instance` answer.
fn place_and_wait(
    nodes: &[ShoalNode],
    repo: &str,
    serving: &[usize],
    sharding: &str,
    min_nodes: usize,
) -> Value {
    let request = json!({"model_id": repo, "sharding": sharding, "min_nodes": min_nodes});
    let mut last = Value::Null;
    let placed = wait_for(Duration::from_secs(90), || {
        let (status, created) = call(&nodes[0], "POST", "/place_instance", Some(&request));
        if status == 200 {
            return Some(created);
        }
        last = json!({"status": status, "answer": created});
        None
    });
    let Some((created, _)) = placed else {
        panic!(
            "no {sharding} placement of {repo} on {min_nodes}: the last answer was {last}\n{}",
            logs(nodes)
        );
    };
    let id = created["instance_id"].as_str().unwrap().to_string();
    wait_for(Duration::from_secs(240), || {
        let (_, instance) = call(&nodes[0], "GET", &format!("/instance/{id}"), None);
        assert_ne!(instance["status"], "failed", "{instance}\n{}", logs(nodes));
        // This instance, not any instance of the repo, must be the one ready.
        (instance["status"] == "ready" && serving.iter().all(|&i| ready(&nodes[i], repo)))
            .then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "the {sharding} instance of {repo} did not become ready\n{}",
            logs(nodes)
        )
    });
    // The answers that follow come from this instance: the only one of the repo.
    for node in nodes {
        let of_repo = instances_of(node, repo);
        assert_eq!(of_repo, vec![id.clone()], "instances of {repo} in /state");
    }
    created
}

/// The ids of the instances of `repo` in `node`'s `/state`.
fn instances_of(node: &ShoalNode, repo: &str) -> Vec<String> {
    let (_, state) = call(node, "GET", "/state", None);
    state["instances"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, i)| i["model_id"] == repo)
        .map(|(id, _)| id.clone())
        .collect()
}

/// Deletes the instance `created` of `repo` and waits until no node reports it ready.
fn delete(nodes: &[ShoalNode], repo: &str, created: &Value) {
    let id = created["instance_id"].as_str().unwrap();
    let (status, answer) = call(&nodes[0], "DELETE", &format!("/instance/{id}"), None);
    assert!(status < 300, "DELETE /instance/{id}: {status} {answer}");
    wait_for(Duration::from_secs(60), || {
        nodes.iter().all(|n| !ready(n, repo)).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "instance {id} still serves after its deletion\n{}",
            logs(nodes)
        )
    });
    // And it stays gone: several gossip rounds later no node holds it or its runners (a
    // deleted instance once came back 0.5 s after, its runners created again).
    std::thread::sleep(Duration::from_secs(3));
    for node in nodes {
        assert!(
            instances_of(node, repo).is_empty(),
            "instance {id} came back after its deletion\n{}",
            logs(nodes)
        );
        assert!(
            !ready(node, repo),
            "{repo} is ready again after the deletion"
        );
    }
}

/// The node ids of `created`'s ranks with their layer ranges.
fn ranks(created: &Value) -> BTreeMap<String, (usize, usize)> {
    created["ranks"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            (
                r["node"].as_str().unwrap_or_default().to_string(),
                (
                    r["start_layer"].as_u64().unwrap_or(0) as usize,
                    r["end_layer"].as_u64().unwrap_or(0) as usize,
                ),
            )
        })
        .collect()
}

/// How late the nodes named in [`HubCluster::start`]'s `late_view` see other nodes' removals
/// of instance copies (`SHOAL_FAULT_LATE_COPY_REMOVALS_MS`, `node/src/late_removals.rs`): the order
/// in which a deleted instance once came back, made certain. Shorter than [`delete`]'s wait
/// after the deletion, so a copy that stays is one written again.
const LATE_VIEW_MS: u64 = 2_000;

/// Each test runs its own cluster of model runners: one at a time on a small machine (run
/// side by side, a deletion once took over 60 s to reach every node's model list).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A cluster for one test: the test hub serving `repos` (made under the net's folder by
/// `make_repos`) in the first namespace, and `workers` shoal nodes with empty Hugging Face
/// caches pointed at it.
struct HubCluster {
    net: TestNet,
    hub_node: ShoalNode,
    nodes: Vec<ShoalNode>,
    caches: Vec<PathBuf>,
    server: hf::HubInNetns,
}

impl HubCluster {
    /// `None` when the test cannot run here (no namespaces, or setup's fixtures missing: a
    /// counted skip). `late_view`: the workers that see copy removals late ([`LATE_VIEW_MS`]). `exact_x`: the nodes keep x in f32 in quantized CPU products
    /// (`SHOAL_QMM=exact`, also the default; said explicitly so that a changed default cannot
    /// loosen this test), for answers compared token for token with mlx-lm's (int8 x, opt-in
    /// through `SHOAL_QMM=int8`, is bounded in `inference/tests/cpu_qmm_int8.rs`; on
    /// random-weight models its rounding changes a greedy path within a few tokens).
    fn start(
        tag: &str,
        workers: usize,
        exact_x: bool,
        late_view: &[usize],
        make_repos: impl FnOnce(&Path) -> Result<BTreeMap<String, ServedRepo>, String>,
    ) -> Option<HubCluster> {
        let python = kit::dirs::python();
        let (net, mut nodes) = TestNet::create(
            tag,
            &Spec {
                nodes: workers + 1,
                ..Spec::default()
            },
        )?;
        let ready_to_run = make_repos(&net.dir).and_then(|r| {
            python
                .exists()
                .then_some(r)
                .ok_or_else(|| format!("{} is missing", python.display()))
        });
        let repos = match ready_to_run {
            Ok(r) => r,
            Err(e) => {
                let _ = kit::skip::can_run(Err::<(), String>(e), "run `cargo xtask setup`");
                net.teardown(nodes);
                return None;
            }
        };
        let hub_node = nodes.remove(0);
        let server = hf::HubInNetns::start(
            &hub_node.node.netns,
            hub_node.node.ip(),
            repos,
            None,
            Faults::default(),
        );
        let mut caches = Vec::new();
        for (i, node) in nodes.iter_mut().enumerate() {
            let cache = net.dir.join(format!("hf{i}"));
            node.env
                .push(("HF_HUB_CACHE".into(), cache.display().to_string()));
            node.env
                .push(("HF_ENDPOINT".into(), server.endpoint.clone()));
            if exact_x {
                node.env.push(("SHOAL_QMM".into(), "exact".into()));
            }
            if late_view.contains(&i) {
                node.env.push((
                    "SHOAL_FAULT_LATE_COPY_REMOVALS_MS".into(),
                    LATE_VIEW_MS.to_string(),
                ));
            }
            caches.push(cache);
            node.start();
        }
        Some(HubCluster {
            net,
            hub_node,
            nodes,
            caches,
            server,
        })
    }

    /// Stops the hub and every node and removes the namespaces.
    fn teardown(self) {
        let HubCluster {
            net,
            hub_node,
            mut nodes,
            server,
            ..
        } = self;
        drop(server);
        nodes.insert(0, hub_node);
        net.teardown(nodes);
    }
}

#[test]
fn a_4bit_moe_model_answers_as_mlx_lm_as_pipeline_tensor_ring_and_one_node() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let mut reference = PathBuf::new();
    // Nodes 1 and 2 see copy removals late: node 0, which deletes, must keep its deletion
    // while they still see a copy.
    let Some(cluster) = HubCluster::start("moe", 3, false, &[1, 2], |dir| {
        let (repo, answer) = moe_repo(dir)?;
        reference = answer;
        let served = ServedRepo::from_dir(&repo, false).map_err(|e| e.to_string())?;
        Ok(BTreeMap::from([(REPO.to_string(), served)]))
    }) else {
        return;
    };
    let (nodes, caches) = (&cluster.nodes, &cluster.caches);
    let repo = cluster.net.dir.join("moe-repo");

    // A 3-rank pipeline: every node answers as mlx-lm, each holding only its layers' files.
    let created = place_and_wait(nodes, REPO, &[0, 1, 2], "Pipeline", 3);
    let placed = ranks(&created);
    assert_eq!(placed.len(), 3, "{created}");
    // The placing node read the model's configuration: its list shows the experts.
    let (_, models) = call(&nodes[0], "GET", "/v1/models", None);
    let entry = models["data"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["id"] == REPO)
        .cloned()
        .unwrap_or_default();
    let shape = &entry["shape"];
    assert_eq!(shape["family"], "qwen3_moe", "{entry}");
    assert_eq!(
        (
            shape["experts"].as_u64(),
            shape["experts_per_token"].as_u64()
        ),
        (Some(8), Some(2)),
        "{entry}"
    );
    let (all, active) = (
        shape["parameters"].as_u64().unwrap_or(0),
        shape["active_parameters"].as_u64().unwrap_or(0),
    );
    assert!(active > 0 && active < all, "{entry}");
    for node in nodes {
        let answer = answers_as_mlx_lm(node, REPO, &reference)
            .unwrap_or_else(|e| panic!("{e}\n{}", logs(nodes)));
        eprintln!(
            "pipeline: {}",
            answer.lines().rev().nth(1).unwrap_or_default()
        );
    }
    let index = std::fs::read(repo.join(INDEX)).unwrap();
    for (node, cache) in nodes.iter().zip(caches) {
        let (_, me) = call(node, "GET", "/node_id", None);
        let me = me.as_str().unwrap_or_default().to_string();
        let (start, end) = placed[&me];
        let expected = hub::select::weight_files(
            &index,
            Shard::Layers {
                start,
                end,
                n_layers: LAYERS,
            },
        )
        .unwrap();
        assert!(expected.len() < 3, "layers {start}..{end} need every file");
        assert_eq!(
            hf::weight_files_held(cache, REPO),
            expected,
            "node {me}, layers {start}..{end}"
        );
    }
    delete(nodes, REPO, &created);

    // A 2-rank tensor ring over the 4-bit weights.
    let created = place_and_wait(nodes, REPO, &[0], "Tensor", 2);
    assert_eq!(ranks(&created).len(), 2, "{created}");
    let answer = answers_as_mlx_lm(&nodes[0], REPO, &reference)
        .unwrap_or_else(|e| panic!("{e}\n{}", logs(nodes)));
    eprintln!(
        "tensor: {}",
        answer.lines().rev().nth(1).unwrap_or_default()
    );
    // Structured outputs on the ring, from a node of the ring and through one that forwards:
    // the grammar travels with the request and masks the logits where the ring samples.
    let on_ring = ranks(&created);
    let held = |i: &usize| {
        let (_, me) = call(&nodes[*i], "GET", "/node_id", None);
        on_ring.contains_key(me.as_str().unwrap_or_default())
    };
    let inside = (0..nodes.len()).find(held).expect("a node holds a rank");
    let outside = (0..nodes.len())
        .find(|i| !held(i))
        .expect("a 2-rank ring on 3 nodes leaves one out");
    for i in [inside, outside] {
        let summary = fits_schemas(&nodes[i], REPO).unwrap_or_else(|e| {
            panic!(
                "structured outputs on the tensor ring, node {i}: {e}\n{}",
                logs(nodes)
            )
        });
        eprintln!(
            "tensor, structured, node {i}: {}",
            summary.lines().rev().nth(1).unwrap_or_default()
        );
    }
    delete(nodes, REPO, &created);

    // One node.
    let created = place_and_wait(nodes, REPO, &[0], "Pipeline", 1);
    assert_eq!(ranks(&created).len(), 1, "{created}");
    let answer = answers_as_mlx_lm(&nodes[0], REPO, &reference)
        .unwrap_or_else(|e| panic!("{e}\n{}", logs(nodes)));
    eprintln!(
        "one node: {}",
        answer.lines().rev().nth(1).unwrap_or_default()
    );

    cluster.teardown();
}

/// The families' 4-bit fixtures (and gpt-oss's mxfp4), each as `(repo id, fixture folder)`.
const FAMILY_REPOS: &[(&str, &str, &str)] = &[
    ("shoal-fixtures/qwen3-moe-tiny-4bit", "qwen3_moe", "q4"),
    ("shoal-fixtures/glm4-moe-tiny-4bit", "glm4_moe", "q4"),
    ("shoal-fixtures/minimax-m2-tiny-4bit", "minimax", "q4"),
    ("shoal-fixtures/deepseek-v3-tiny-4bit", "deepseek_v3", "q4"),
    (
        "shoal-fixtures/glm4-moe-lite-tiny-4bit",
        "glm4_moe_lite",
        "q4",
    ),
    ("shoal-fixtures/gpt-oss-tiny-4bit", "gpt_oss", "q4"),
    ("shoal-fixtures/gpt-oss-tiny-mxfp4", "gpt_oss", "mxfp4"),
    ("shoal-fixtures/gemma3-tiny-4bit", "gemma3_text", "q4"),
    ("shoal-fixtures/qwen3.5-tiny-4bit", "qwen3_5", "q4"),
    ("shoal-fixtures/qwen3.5-moe-tiny-4bit", "qwen3_5_moe", "q4"),
    ("shoal-fixtures/qwen3-next-tiny-4bit", "qwen3_next", "q4"),
    ("shoal-fixtures/gemma4-tiny-4bit", "gemma4_text", "q4"),
    ("shoal-fixtures/llama4-text-tiny-4bit", "llama4_text", "q4"),
    ("shoal-fixtures/step3p5-tiny-4bit", "step3p5", "q4"),
    (
        "shoal-fixtures/deepseek-v3.2-tiny-4bit",
        "deepseek_v32",
        "q4",
    ),
    ("shoal-fixtures/glm-5-tiny-4bit", "glm_moe_dsa", "q4"),
    ("shoal-fixtures/mistral-small-4-tiny-4bit", "mistral4", "q4"),
    ("shoal-fixtures/kimi-linear-tiny-4bit", "kimi_linear", "q4"),
    ("shoal-fixtures/kimi-k3-tiny-4bit", "kimi_k3", "q4"),
    ("shoal-fixtures/nemotron-h-tiny-4bit", "nemotron_h", "q4"),
    (
        "shoal-fixtures/nemotron-3-super-tiny-4bit",
        "nemotron_h_latent",
        "q4",
    ),
    (
        "shoal-fixtures/gemma4-e2b-tiny-4bit",
        "gemma4_text_e2b",
        "q4",
    ),
    ("shoal-fixtures/minimax-m3-tiny-4bit", "minimax_m3_vl", "q4"),
];

/// Each of [`FAMILY_REPOS`] as a one-file repo under `dir`.
fn family_repos(dir: &Path) -> Result<BTreeMap<String, ServedRepo>, String> {
    let mut repos = BTreeMap::new();
    for (id, family, layout) in FAMILY_REPOS {
        let fixture = kit::dirs::family_fixture_dir(family, layout);
        let stage = dir.join(format!("{family}-{layout}"));
        std::fs::create_dir_all(&stage).map_err(|e| e.to_string())?;
        for f in REPO_FILES {
            std::fs::copy(fixture.join(f), stage.join(f))
                .map_err(|e| format!("{}: {e}", fixture.join(f).display()))?;
        }
        let served = ServedRepo::from_dir(&stage, false).map_err(|e| e.to_string())?;
        repos.insert(id.to_string(), served);
    }
    // Qwen3.5-MoE's files under a config.json of one Gated DeltaNet key head (two value
    // heads): a 2-rank ring would cut it, so placement must refuse before anything loads.
    let stage = dir.join("one-key-head");
    std::fs::create_dir_all(&stage).map_err(|e| e.to_string())?;
    let fixture = kit::dirs::family_fixture_dir("qwen3_5_moe", "q4");
    for f in REPO_FILES {
        std::fs::copy(fixture.join(f), stage.join(f)).map_err(|e| e.to_string())?;
    }
    let config = stage.join("config.json");
    let mut json: Value =
        serde_json::from_str(&std::fs::read_to_string(&config).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    json["text_config"]["linear_num_key_heads"] = json!(1);
    json["text_config"]["linear_num_value_heads"] = json!(2);
    std::fs::write(&config, json.to_string()).map_err(|e| e.to_string())?;
    let served = ServedRepo::from_dir(&stage, false).map_err(|e| e.to_string())?;
    repos.insert(ONE_KEY_HEAD.to_string(), served);
    Ok(repos)
}

/// A repo whose Gated DeltaNet layers have one key head (see [`family_repos`]).
const ONE_KEY_HEAD: &str = "shoal-fixtures/qwen3.5-moe-one-key-head-4bit";

#[test]
fn every_family_at_4_bits_answers_as_mlx_lm_on_one_node_a_pipeline_and_a_tensor_ring() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let Some(cluster) = HubCluster::start("fam", 2, true, &[], family_repos) else {
        return;
    };
    let nodes = &cluster.nodes;
    // While working on one family: SHOAL_TEST_FAMILIES=nemotron_h,... runs only those (CI runs
    // every one).
    let only = std::env::var("SHOAL_TEST_FAMILIES").ok();
    let chosen = |family: &str| {
        only.as_deref()
            .is_none_or(|list| list.split(',').any(|f| f == family))
    };
    for (repo, family, layout) in FAMILY_REPOS.iter().filter(|(_, f, _)| chosen(f)) {
        let reference = kit::dirs::family_fixture_dir(family, layout).join("chat_reference.json");
        for (sharding, min_nodes, serving) in [
            ("Pipeline", 2, &[0, 1][..]),
            ("Tensor", 2, &[0, 1][..]),
            ("Pipeline", 1, &[0][..]),
        ] {
            let created = place_and_wait(nodes, repo, serving, sharding, min_nodes);
            assert_eq!(ranks(&created).len(), min_nodes, "{created}");
            for &i in serving {
                let answer = answers_as_mlx_lm(&nodes[i], repo, &reference).unwrap_or_else(|e| {
                    panic!(
                        "{family}/{layout} {sharding} on {min_nodes}: {e}\n{}",
                        logs(nodes)
                    )
                });
                eprintln!(
                    "{family}/{layout} {sharding} on {min_nodes}, node {i}: {}",
                    answer.lines().rev().nth(1).unwrap_or_default()
                );
            }
            delete(nodes, repo, &created);
        }
    }
    if chosen("qwen3_5_moe") {
        // A ring size that would cut a head is refused with the count, before loading.
        let request = json!({"model_id": ONE_KEY_HEAD, "sharding": "Tensor", "min_nodes": 2});
        let (status, answer) = call(&nodes[0], "POST", "/place_instance", Some(&request));
        assert!(
            status >= 400 && answer.to_string().contains("1 linear-attention key heads"),
            "a ring cutting a key head must be refused naming it: {status} {answer}"
        );
        eprintln!("one key head, Tensor on 2: refused ({status}): {answer}");
    }
    cluster.teardown();
}
