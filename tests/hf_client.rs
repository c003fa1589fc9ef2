//! Hugging Face compatibility checked with Hugging Face's own client: the `huggingface_hub`
//! pinned in the venv (`cargo xtask pyenv`), against shoal's test hub (the SmolLM2 fixture
//! split into three safetensors files) in one network namespace, the client in another.
//!
//! - A cache that `huggingface_hub`'s `snapshot_download` filled is used by a shoal node as
//!   it is: the node places the model by `org/name@commit` (the commit the client wrote),
//!   loads it and answers "Paris", takes no content byte from the hub, and leaves the cache
//!   untouched (the same files, sizes, modification times and link targets).
//! - A cache that `shoal download` filled is read by `huggingface_hub`: `scan_cache_dir` finds
//!   the repo with no warning, one revision (the commit `refs/main` names) holding every file
//!   shoal wrote with its size, and `hf_hub_download(local_files_only=True)` returns each
//!   file's path in that snapshot, with the hub's bytes.
//!
//! Needs root (namespaces), the model fixture (`cargo xtask setup`) and the venv
//! (`cargo xtask pyenv`): fails otherwise, or with `SHOAL_ALLOW_SKIP=1` is skipped and counted
//! (see `kit::skip`).

mod support;
use support::{hf, hf_nodes};

use hf_nodes::HubNodes;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;
use support::{logs, ShoalNode};

/// What the venv's Python needs to run these tests, or what to run to get it.
fn python_ready() -> Result<(), String> {
    let python = kit::dirs::venv_python();
    let probe = std::process::Command::new(&python)
        .args(["-c", "import huggingface_hub"])
        .output();
    match probe {
        Ok(out) if out.status.success() => Ok(()),
        _ => Err(format!(
            "{} cannot import huggingface_hub",
            python.display()
        )),
    }
}

/// Runs `script` with the venv's Python in `node`'s namespace, with the node's environment
/// (its `HF_ENDPOINT` and `HF_HUB_CACHE`) and `args`; the script's stdout parsed as JSON.
fn python_in(node: &ShoalNode, script: &str, args: &[&str]) -> Value {
    let out: Output = node
        .node
        .command(&kit::dirs::venv_python().to_string_lossy())
        .arg("-c")
        .arg(script)
        .args(args)
        .envs(node.env.iter().map(|(k, v)| (k, v)))
        // The test hub speaks the plain HTTP protocol, not Xet.
        .env("HF_HUB_DISABLE_XET", "1")
        .env("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .output()
        .expect("the venv's python");
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("python printed no JSON ({e}): {stdout}"))
}

/// One entry of a cache's tree: a file's size, modification time and inode, or a link's
/// target.
#[derive(Debug, PartialEq, Eq)]
enum Entry {
    File {
        size: u64,
        modified: std::time::SystemTime,
        inode: u64,
    },
    Link(PathBuf),
    Dir,
}

/// Every entry under `root`, by path relative to it (links not followed).
fn tree(root: &Path) -> BTreeMap<PathBuf, Entry> {
    use std::os::unix::fs::MetadataExt;
    let mut out = BTreeMap::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = e.path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let entry = if meta.file_type().is_symlink() {
                Entry::Link(std::fs::read_link(&path).unwrap())
            } else if meta.is_dir() {
                todo.push(path.clone());
                Entry::Dir
            } else {
                Entry::File {
                    size: meta.len(),
                    modified: meta.modified().unwrap(),
                    inode: meta.ino(),
                }
            };
            out.insert(path.strip_prefix(root).unwrap().to_path_buf(), entry);
        }
    }
    out
}

/// Content bytes the hub has served, by path.
fn served_bytes(server: &hf::HubInNetns) -> u64 {
    server.report().0.iter().map(|s| s.sent).sum()
}

const SNAPSHOT_DOWNLOAD: &str = r#"
import json, sys
from huggingface_hub import snapshot_download
path = snapshot_download(sys.argv[1])
print(json.dumps({"path": path}))
"#;

#[test]
fn a_cache_filled_by_huggingface_hub_is_used_as_it_is() {
    if !kit::skip::can_run(python_ready(), "run `cargo xtask pyenv`") {
        return;
    }
    let Some(HubNodes {
        net,
        hub_node,
        mut nodes,
        server,
        caches,
        fixture,
    }) = hf_nodes::start("hfpy", 1)
    else {
        return;
    };
    let got = python_in(&nodes[0], SNAPSHOT_DOWNLOAD, &[hf::REPO]);
    let snapshot = PathBuf::from(got["path"].as_str().expect("a snapshot path"));
    let commit = snapshot.file_name().unwrap().to_string_lossy().into_owned();
    hf_nodes::assert_hub_bytes(&snapshot, &fixture);
    let before = tree(&caches[0]);
    let served_before = served_bytes(&server);

    hf_nodes::start_all(&mut nodes);
    let model = format!("{}@{commit}", hf::REPO);
    let body = json!({"model_id": model, "sharding": "Pipeline", "min_nodes": 1});
    let id = hf_nodes::place(&nodes[0], "/place_instance", &body, &nodes);
    let Some((instance, took)) = hf_nodes::ready(&nodes[0], &id, Duration::from_secs(150), &nodes)
    else {
        panic!("the instance did not become ready\n{}", logs(&nodes));
    };
    eprintln!("{model} ready from huggingface_hub's cache in {took:?}: {instance}");
    hf_nodes::assert_says_paris(&nodes[0], &model);
    assert_eq!(
        served_bytes(&server),
        served_before,
        "the node took content from the hub although the cache held the model"
    );
    let after = tree(&caches[0]);
    let changed: Vec<String> = before
        .keys()
        .chain(after.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .filter(|p| before.get(*p) != after.get(*p))
        .map(|p| format!("{}: {:?} -> {:?}", p.display(), before.get(p), after.get(p)))
        .collect();
    assert!(
        changed.is_empty(),
        "the node changed huggingface_hub's cache: {changed:#?}"
    );
    eprintln!(
        "huggingface_hub's cache: {} entries, none changed by the node",
        after.len()
    );
    drop(server);
    hf_nodes::teardown(net, hub_node, nodes);
}

const READ_CACHE: &str = r#"
import json, sys
from huggingface_hub import scan_cache_dir, hf_hub_download
cache, repo = sys.argv[1], sys.argv[2]
info = scan_cache_dir(cache)
out = {"warnings": [str(w) for w in info.warnings], "repos": [], "downloads": {}}
for r in info.repos:
    out["repos"].append({
        "id": r.repo_id,
        "type": r.repo_type,
        "size_on_disk": r.size_on_disk,
        "nb_files": r.nb_files,
        "refs": {name: rev.commit_hash for name, rev in r.refs.items()},
        "revisions": [
            {"commit": rev.commit_hash,
             "files": {f.file_name: f.size_on_disk for f in rev.files}}
            for rev in r.revisions
        ],
    })
    for rev in r.revisions:
        for f in rev.files:
            out["downloads"][f.file_name] = hf_hub_download(
                repo, f.file_name, cache_dir=cache, local_files_only=True)
print(json.dumps(out))
"#;

#[test]
fn huggingface_hub_reads_a_cache_that_shoal_wrote() {
    if !kit::skip::can_run(python_ready(), "run `cargo xtask pyenv`") {
        return;
    }
    let Some(HubNodes {
        net,
        hub_node,
        nodes,
        server,
        caches,
        fixture,
    }) = hf_nodes::start("hfscan", 1)
    else {
        return;
    };
    hf_nodes::download(&nodes[0]);
    // No hub from here on: huggingface_hub reads the cache alone.
    drop(server);
    let repo_dir = hf_nodes::repo_dir(&caches[0]);
    let commit = std::fs::read_to_string(repo_dir.join("refs/main")).expect("refs/main");
    let snapshot = repo_dir.join("snapshots").join(&commit);
    // What shoal wrote: every file of the snapshot, with its size.
    let written: BTreeMap<String, u64> = std::fs::read_dir(&snapshot)
        .unwrap()
        .flatten()
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let size = std::fs::metadata(e.path()).unwrap().len();
            (name, size)
        })
        .collect();
    assert!(written.len() > hf::PARTS, "{written:?}");

    let cache = caches[0].to_string_lossy().into_owned();
    let read = python_in(&nodes[0], READ_CACHE, &[&cache, hf::REPO]);
    eprintln!("huggingface_hub read: {read}");
    assert_eq!(read["warnings"], json!([]), "{read}");
    let repos = read["repos"].as_array().expect("repos");
    assert_eq!(repos.len(), 1, "{read}");
    let repo = &repos[0];
    assert_eq!(repo["id"], hf::REPO);
    assert_eq!(repo["type"], "model");
    assert_eq!(repo["refs"], json!({"main": commit}), "{repo}");
    let revisions = repo["revisions"].as_array().expect("revisions");
    assert_eq!(revisions.len(), 1, "{repo}");
    assert_eq!(revisions[0]["commit"], commit.as_str());
    let seen: BTreeMap<String, u64> =
        serde_json::from_value(revisions[0]["files"].clone()).expect("files");
    assert_eq!(seen, written, "the files huggingface_hub sees");
    assert_eq!(repo["nb_files"], written.len());
    assert_eq!(repo["size_on_disk"], written.values().sum::<u64>());
    for (name, path) in read["downloads"].as_object().expect("downloads") {
        let path = PathBuf::from(path.as_str().unwrap());
        assert_eq!(
            path,
            snapshot.join(name),
            "hf_hub_download's path of {name}"
        );
        assert!(
            std::fs::read(&path).unwrap() == std::fs::read(fixture.join(name)).unwrap(),
            "{name}: not the hub's bytes"
        );
    }
    assert_eq!(read["downloads"].as_object().unwrap().len(), written.len());
    hf_nodes::teardown(net, hub_node, nodes);
}
