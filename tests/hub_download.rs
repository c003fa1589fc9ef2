//! Downloads from a Hugging Face hub (shoal's test hub, serving the SmolLM2 fixture split into
//! three safetensors files, with its CDN on another origin) into empty Hugging Face caches,
//! the hub in one network namespace and the client in another:
//!
//! - a whole model lands in the cache layout (blobs named by hash, relative snapshot links,
//!   `refs/main`), the token goes to the hub and never to the CDN, each weight file's bytes are
//!   served once, a second download fetches nothing, offline mode answers from the cache, and
//!   missing or gated repos say what to do;
//! - a pipeline rank's download holds only the weight files of its layers;
//! - `shoal download` and `shoal generate` by model id, as a user runs them.
//!
//! Faults (the hub dying, corrupt bytes, a full disk) are in `hub_faults.rs`.
//!
//! Needs root (namespaces) and the model fixture (`cargo xtask setup`): fails otherwise, or
//! with `SHOAL_ALLOW_SKIP=1` is skipped and counted (see `kit::skip`).

mod support;
use support::{hf, hub_world};

use hf::REPO;
use hub::select::{self, Shard};
use hub::testhub::Faults;
use hub::{HubConfig, HubError, RepoFile};
use hub_world::*;
use std::path::Path;
use std::sync::Arc;

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
