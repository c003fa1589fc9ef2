//! The world of the hub download tests (`hub_download.rs`, `hub_faults.rs`): namespaces, the
//! test hub serving the fixture, a client config, and a download run inside a namespace.
#![allow(dead_code)]

use super::hf::{HubInNetns, REPO};
use hub::select;
use hub::testhub::{Faults, ServedRepo};
use hub::{Hub, HubConfig, HubError, ModelId, Progress, RepoFile, Snapshot};
use kit::netns::{Netns, Spec};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub const TOKEN: &str = "hf_shoal_test_token";
/// A repo of two weight files with the same content.
pub const TWINS: &str = "shoal/twins";

/// Namespaces (node 0 the hub, node 1 the client), the fixture as a repo, a scratch folder.
pub fn setup(tag: &str) -> Option<(Netns, PathBuf, PathBuf)> {
    if !kit::skip::can_run(kit::netns::available(), kit::netns::NEEDS) {
        return None;
    }
    if !kit::skip::can_run(
        super::hf::fixture_repo().map(|_| ()),
        "run `cargo xtask setup`",
    ) {
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
    Some((net, super::hf::fixture_repo().expect("fixture"), scratch))
}

/// A test: namespaces, the fixture, a scratch folder, the hub serving the fixture (gated
/// behind [`TOKEN`] when `gated`) with `faults`, and the client's namespace.
pub struct World {
    /// The namespaces (node 0 the hub, node 1 the client).
    pub net: Netns,
    /// The fixture repo on disk.
    pub fixture: PathBuf,
    /// The scratch folder.
    pub scratch: PathBuf,
    /// The hub.
    pub server: HubInNetns,
    /// The client's namespace.
    pub client_ns: String,
}

pub fn world(tag: &str, gated: bool, faults: Faults) -> Option<World> {
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

pub fn repos(fixture: &Path, gated: bool) -> BTreeMap<String, ServedRepo> {
    let repo = ServedRepo::from_dir(fixture, gated).expect("fixture repo");
    BTreeMap::from([(REPO.to_string(), repo)])
}

pub fn config(endpoint: &str, cache: &Path) -> HubConfig {
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

pub type Select = dyn Fn(&[RepoFile]) -> Vec<RepoFile> + Send + Sync;

/// Downloads `id` with `config` from inside `netns`: the result and the bytes received.
pub fn download(
    netns: &str,
    config: HubConfig,
    id: &str,
    select: Arc<Select>,
) -> (Result<Snapshot, HubError>, u64) {
    let id = ModelId::parse(id).expect("model id");
    super::hf::in_netns(netns, move || {
        let progress = Arc::new(Progress::default());
        let hub = Hub::new(config).expect("client");
        let result = super::hf::runtime().block_on(hub.download(&id, &*select, progress.clone()));
        (result, progress.totals().fetched)
    })
    .join()
    .expect("download thread")
}

pub fn whole() -> Arc<Select> {
    Arc::new(|files: &[RepoFile]| select::for_model(files, None).expect("model files"))
}

pub fn sha256_file(path: &Path) -> String {
    hub::verify::hash_of(true, &std::fs::read(path).expect("read"))
}

pub fn weight_files(fixture: &Path) -> Vec<(String, u64)> {
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

/// The hub cuts every connection once it has served 30 MiB of content.
pub fn dies_after_30_mib() -> Faults {
    Faults {
        die_after: Some(30 << 20),
        ..Faults::default()
    }
}

/// Waits (up to 2 minutes) for the hub to reach its `die_after` fault.
pub fn wait_until_the_hub_dies(server: &HubInNetns) {
    let mut waited = 0;
    while !server.report().1 {
        std::thread::sleep(Duration::from_millis(50));
        waited += 1;
        assert!(waited < 2400, "the hub never reached its fault");
    }
}
