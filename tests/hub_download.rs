//! Downloads from a Hugging Face hub (shoal's test hub, serving the SmolLM2 fixture split into
//! three safetensors files, with its CDN on another origin) into empty Hugging Face caches,
//! the hub in one network namespace and the client in another:
//!
//! - a whole model lands in the cache layout (blobs named by hash, relative snapshot links,
//!   `refs/main`), the token goes to the hub and never to the CDN, each weight file's bytes are
//!   served once, a second download fetches nothing, offline mode answers from the cache, and
//!   missing or gated repos say what to do;
//! - a pipeline rank's download holds only the weight files of its layers;
//! - the hub dies mid-file and comes back: the download resumes with range requests, every
//!   byte received once;
//! - the hub sends corrupt bytes: detected, fetched again, never kept.
//!
//! Needs root (namespaces) and the model fixture (`cargo xtask setup`): fails otherwise, or
//! with `SHOAL_ALLOW_SKIP=1` is skipped and counted (see `kit::skip`).

#[path = "support/hf.rs"]
#[allow(dead_code)]
mod hf;

use hf::{HubInNetns, REPO};
use hub::select::{self, Shard};
use hub::testhub::{Faults, ServedRepo};
use hub::{Hub, HubConfig, HubError, ModelId, Progress, RepoFile, Snapshot};
use kit::netns::{Netns, Spec};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

const TOKEN: &str = "hf_shoal_test_token";
/// A repo of two weight files with the same content.
const TWINS: &str = "shoal/twins";

/// Namespaces (node 0 the hub, node 1 the client), the fixture as a repo, a scratch folder.
fn setup(tag: &str) -> Option<(Netns, PathBuf, PathBuf)> {
    if !kit::skip::can_run(kit::netns::available(), kit::netns::NEEDS) {
        return None;
    }
    if !kit::skip::can_run(hf::fixture_repo().map(|_| ()), "run `cargo xtask setup`") {
        return None;
    }
    let prefix = format!("{tag}{}", std::process::id());
    let net = Netns::create(
        &prefix,
        &Spec {
            nodes: 2,
            ..Spec::default()
        },
    )
    .expect("namespaces");
    let scratch = std::env::temp_dir().join(&prefix);
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).expect("scratch");
    Some((net, hf::fixture_repo().expect("fixture"), scratch))
}

/// A test: namespaces, the fixture, a scratch folder, the hub serving the fixture (gated
/// behind [`TOKEN`] when `gated`) with `faults`, and the client's namespace.
struct World {
    net: Netns,
    fixture: PathBuf,
    scratch: PathBuf,
    server: HubInNetns,
    client_ns: String,
}

fn world(tag: &str, gated: bool, faults: Faults) -> Option<World> {
    let (net, fixture, scratch) = setup(tag)?;
    let hub_ns = &net.nodes[0];
    let token = gated.then(|| TOKEN.to_string());
    let mut repos = repos(&fixture, gated);
    // A small repo whose two weight files have the same bytes (one blob).
    let twins = scratch.join("twins");
    std::fs::create_dir_all(&twins).expect("twins repo");
    for name in ["a.safetensors", "b.safetensors"] {
        std::fs::write(twins.join(name), vec![7u8; 3 << 20]).expect("twin file");
    }
    std::fs::write(twins.join("config.json"), b"{}").expect("twin config");
    repos.insert(
        TWINS.into(),
        ServedRepo::from_dir(&twins, false).expect("twins"),
    );
    let server = HubInNetns::start(&hub_ns.netns, hub_ns.ip(), repos, token, faults);
    let client_ns = net.nodes[1].netns.clone();
    Some(World {
        net,
        fixture,
        scratch,
        server,
        client_ns,
    })
}

fn repos(fixture: &Path, gated: bool) -> BTreeMap<String, ServedRepo> {
    let repo = ServedRepo::from_dir(fixture, gated).expect("fixture repo");
    BTreeMap::from([(REPO.to_string(), repo)])
}

fn config(endpoint: &str, cache: &Path) -> HubConfig {
    HubConfig {
        endpoint: endpoint.to_string(),
        token: Some(TOKEN.into()),
        offline: false,
        cache: hub::HfCache::at(cache),
        parallel: 4,
        attempts: 10,
        backoff: Duration::from_millis(200),
    }
}

type Select = dyn Fn(&[RepoFile]) -> Vec<RepoFile> + Send + Sync;

/// Downloads `id` with `config` from inside `netns`: the result and the bytes received.
fn download(
    netns: &str,
    config: HubConfig,
    id: &str,
    select: Arc<Select>,
) -> (Result<Snapshot, HubError>, u64) {
    let id = ModelId::parse(id).expect("model id");
    hf::in_netns(netns, move || {
        let progress = Arc::new(Progress::default());
        let hub = Hub::new(config).expect("client");
        let result = hf::runtime().block_on(hub.download(&id, &*select, progress.clone()));
        (result, progress.totals().fetched)
    })
    .join()
    .expect("download thread")
}

fn whole() -> Arc<Select> {
    Arc::new(|files: &[RepoFile]| select::for_model(files, None).expect("model files"))
}

fn sha256_file(path: &Path) -> String {
    hub::verify::hash_of(true, &std::fs::read(path).expect("read"))
}

fn weight_files(fixture: &Path) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = std::fs::read_dir(fixture)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".safetensors"))
        .map(|n| {
            let size = std::fs::metadata(fixture.join(&n)).unwrap().len();
            (n, size)
        })
        .collect();
    out.sort();
    out
}

#[test]
fn downloads_into_an_empty_cache_in_the_hugging_face_layout() {
    let Some(World {
        net: _net,
        fixture,
        scratch,
        server,
        client_ns,
    }) = world("hfdl", true, Faults::default())
    else {
        return;
    };
    let cache = scratch.join("hub");
    let (result, fetched) = download(&client_ns, config(&server.endpoint, &cache), REPO, whole());
    let snap = result.expect("download");
    let weights = weight_files(&fixture);
    assert_eq!(weights.len(), hf::PARTS);
    let total: u64 = snap.files.iter().map(|f| f.size).sum();
    assert_eq!(fetched, total, "every byte received once");
    let repo_dir = cache.join("models--HuggingFaceTB--SmolLM2-135M-Instruct");
    assert_eq!(
        std::fs::read_to_string(repo_dir.join("refs/main")).unwrap(),
        snap.commit
    );
    for f in &snap.files {
        let link = snap.dir.join(&f.path);
        let target = std::fs::read_link(&link).expect("a symlink");
        assert_eq!(target, Path::new("../../blobs").join(&f.hash), "{}", f.path);
        let original = std::fs::read(fixture.join(&f.path)).unwrap();
        assert_eq!(std::fs::read(&link).unwrap(), original, "{}", f.path);
    }
    for (w, size) in &weights {
        let file = snap
            .files
            .iter()
            .find(|f| &f.path == w)
            .expect("weight file fetched");
        assert!(file.lfs);
        assert_eq!(sha256_file(&snap.dir.join(w)), file.hash);
        let (served, _, _) = server.report();
        assert_eq!(hf::bytes_of(&served, w), *size, "{w} served once");
    }
    let (_, dead, cdn_saw_token) = server.report();
    assert!(!dead);
    assert!(!cdn_saw_token, "the token was sent to the CDN's origin");

    // Again: nothing fetched, nothing served.
    let before = server.report().0.len();
    let (again, fetched) = download(&client_ns, config(&server.endpoint, &cache), REPO, whole());
    assert_eq!(again.expect("second download").commit, snap.commit);
    assert_eq!(fetched, 0);
    assert_eq!(server.report().0.len(), before);

    // Offline: the cache answers; a model it lacks gets a message saying what to do.
    let offline = HubConfig {
        offline: true,
        endpoint: "http://192.0.2.1:1".into(),
        ..config("", &cache)
    };
    let cached = download(&client_ns, offline.clone(), REPO, whole())
        .0
        .expect("offline from cache");
    assert_eq!(cached.dir, snap.dir);
    assert_eq!(cached.files.len(), snap.files.len());
    let e = download(&client_ns, offline, "org/absent", whole())
        .0
        .unwrap_err();
    assert!(e.to_string().contains("shoal download org/absent"), "{e}");

    // A missing repo, and the gated one without a token.
    let e = download(
        &client_ns,
        config(&server.endpoint, &scratch.join("c2")),
        "org/absent",
        whole(),
    )
    .0
    .unwrap_err();
    assert!(matches!(e, HubError::RepoNotFound { .. }), "{e}");
    let no_token = HubConfig {
        token: None,
        ..config(&server.endpoint, &scratch.join("c3"))
    };
    let e = download(&client_ns, no_token, REPO, whole()).0.unwrap_err();
    assert!(
        matches!(e, HubError::Gated { .. }) && e.to_string().contains("HF_TOKEN"),
        "{e}"
    );

    // Two files of one content: fetched once, both linked to the one blob.
    let twins = download(&client_ns, config(&server.endpoint, &cache), TWINS, whole())
        .0
        .expect("twins");
    let (served, _, _) = server.report();
    assert_eq!(
        hf::bytes_of(&served, "a.safetensors") + hf::bytes_of(&served, "b.safetensors"),
        3 << 20
    );
    for name in ["a.safetensors", "b.safetensors"] {
        assert_eq!(
            std::fs::read(twins.dir.join(name)).expect(name),
            vec![7u8; 3 << 20]
        );
    }

    // A pipeline rank of layers 0..10 of 30 takes only the first weight file.
    let index = std::fs::read(fixture.join(select::INDEX)).unwrap();
    let shard = Shard::Layers {
        start: 0,
        end: 10,
        n_layers: 30,
    };
    let pick: Arc<Select> = Arc::new(move |files: &[RepoFile]| {
        select::for_shard(files, Some(&index), shard).expect("shard files")
    });
    let rank_cache = scratch.join("rank0");
    let snap = download(
        &client_ns,
        config(&server.endpoint, &rank_cache),
        REPO,
        pick,
    )
    .0
    .expect("rank download");
    let held: Vec<&str> = snap
        .files
        .iter()
        .filter(|f| f.path.ends_with(".safetensors"))
        .map(|f| f.path.as_str())
        .collect();
    assert_eq!(held, [weights[0].0.as_str()]);
    assert!(!snap.dir.join(&weights[1].0).exists() && !snap.dir.join(&weights[2].0).exists());
    assert!(snap.dir.join("config.json").is_file() && snap.dir.join("tokenizer.json").is_file());
    drop(server);
    let _ = std::fs::remove_dir_all(&scratch);
}

#[test]
fn the_hub_dies_mid_file_and_the_download_resumes_by_range() {
    let die_after = 30 << 20;
    let faults = Faults {
        die_after: Some(die_after),
        ..Faults::default()
    };
    let Some(World {
        net: _net,
        fixture: _,
        scratch,
        server,
        client_ns,
    }) = world("hfdie", false, faults)
    else {
        return;
    };
    let endpoint = server.endpoint.clone();
    let cache = scratch.join("hub");
    let client = {
        let config = config(&endpoint, &cache);
        std::thread::spawn(move || download(&client_ns, config, REPO, whole()))
    };
    // Wait for the hub to die, then bring it back (the client is retrying meanwhile).
    let mut waited = 0;
    while !server.report().1 {
        std::thread::sleep(Duration::from_millis(50));
        waited += 1;
        assert!(waited < 2400, "the hub never reached its fault");
    }
    std::thread::sleep(Duration::from_millis(500));
    server.restart(Faults::default());
    let (result, fetched) = client.join().expect("client");
    let snap = result.expect("the download finishes after the hub comes back");
    let total: u64 = snap.files.iter().map(|f| f.size).sum();
    assert_eq!(
        fetched, total,
        "bytes held before the cut were fetched again"
    );
    let (served, _, _) = server.report();
    let resumed: Vec<_> = served.iter().filter(|s| s.start > 0).collect();
    assert!(
        !resumed.is_empty(),
        "no range request after the cut: {served:?}"
    );
    for r in &resumed {
        let size = snap.files.iter().find(|f| f.path == r.path).unwrap().size;
        assert_eq!(
            r.sent,
            size - r.start,
            "the resumed response {r:?} serves the rest"
        );
    }
    for f in snap.files.iter().filter(|f| f.lfs) {
        assert_eq!(sha256_file(&snap.dir.join(&f.path)), f.hash, "{}", f.path);
    }
    drop(server);
    let _ = std::fs::remove_dir_all(&scratch);
}

#[test]
fn corrupt_bytes_are_detected_fetched_again_and_never_kept() {
    // The split's names are fixed: the middle weight file is sent corrupt once.
    let victim = "model-00002-of-00003.safetensors".to_string();
    let faults = Faults {
        corrupt_once: Some(victim.clone()),
        ..Faults::default()
    };
    let Some(World {
        net: _net,
        fixture,
        scratch,
        server,
        client_ns,
    }) = world("hfbad", false, faults)
    else {
        return;
    };
    let size = std::fs::metadata(fixture.join(&victim))
        .expect("the split's middle file")
        .len();
    let cache = scratch.join("hub");
    let snap = download(&client_ns, config(&server.endpoint, &cache), REPO, whole())
        .0
        .expect("download");
    let (served, _, _) = server.report();
    let full: Vec<_> = served.iter().filter(|s| s.path == victim).collect();
    assert_eq!(
        full.len(),
        2,
        "the corrupt copy was not fetched again: {full:?}"
    );
    assert!(
        full.iter().all(|s| s.start == 0 && s.sent == size),
        "{full:?}"
    );
    let want = sha256_file(&fixture.join(&victim));
    assert_eq!(sha256_file(&snap.dir.join(&victim)), want);
    let blobs = cache.join("models--HuggingFaceTB--SmolLM2-135M-Instruct/blobs");
    for blob in std::fs::read_dir(&blobs).unwrap().flatten() {
        let name = blob.file_name().to_string_lossy().into_owned();
        assert!(!name.ends_with(".incomplete"), "left behind: {name}");
        let lfs = name.len() == 64;
        assert_eq!(
            hub::verify::hash_of(lfs, &std::fs::read(blob.path()).unwrap()),
            name
        );
    }
    drop(server);
    let _ = std::fs::remove_dir_all(&scratch);
}

/// `shoal download` and `shoal generate` as a user runs them, inside a namespace.
fn shoal_in(netns: &str, cache: &Path, endpoint: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new("ip")
        .args(["netns", "exec", netns, env!("CARGO_BIN_EXE_shoal")])
        .args(args)
        .env("HF_ENDPOINT", endpoint)
        .env("HF_HUB_CACHE", cache)
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_OFFLINE")
        .output()
        .expect("run shoal")
}

#[test]
fn shoal_download_then_generate_by_model_id() {
    let Some(World {
        net: _net,
        fixture: _,
        scratch,
        server,
        client_ns,
    }) = world("hfcli", false, Faults::default())
    else {
        return;
    };
    let cache = scratch.join("hub");
    // Not downloaded yet: generate says what to run.
    let out = shoal_in(
        &client_ns,
        &cache,
        &server.endpoint,
        &["generate", "--model", REPO, "-p", "hi"],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("shoal download {REPO}")), "{err}");
    let out = shoal_in(&client_ns, &cache, &server.endpoint, &["download", REPO]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("100%") && err.contains("MB/s") && err.contains("(7/7 files)"),
        "{err}"
    );
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        dir.starts_with(&cache.display().to_string())
            && Path::new(&dir).join(select::INDEX).is_file(),
        "{dir}"
    );
    // Offline, with no hub: the cache is enough.
    let out = shoal_in(
        &client_ns,
        &cache,
        "http://192.0.2.1:1",
        &["download", "--offline", REPO],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = shoal_in(
        &client_ns,
        &cache,
        "http://192.0.2.1:1",
        &[
            "generate",
            "--model",
            REPO,
            "--chat",
            "-p",
            "What is the capital of France?",
            "--max-tokens",
            "12",
            "--dtype",
            "bf16",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("Paris"), "{text}");
    drop(server);
    let _ = std::fs::remove_dir_all(&scratch);
}
