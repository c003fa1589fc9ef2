//! Downloads from the test hub when things go wrong, the hub in one network namespace and the
//! client in another:
//!
//! - the hub dies mid-file and comes back: the download resumes with range requests, every
//!   byte received once;
//! - the hub sends corrupt bytes: detected, fetched again, never kept;
//! - the disk fills up mid-download (the cache on a small tmpfs that another writer fills
//!   while the hub is down): a clear error, the bytes written kept, nothing half-written
//!   linked; once space is freed the download resumes and fetches only what was missing.
//!
//! Needs root (namespaces, a tmpfs) and the model fixture (`cargo xtask setup`): fails
//! otherwise, or with `SHOAL_ALLOW_SKIP=1` is skipped and counted (see `kit::skip`).

mod support;
use support::{hf, hub_world};

use hf::REPO;
use hub::testhub::Faults;
use hub::HubError;
use hub_world::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[test]
fn the_hub_dies_mid_file_and_the_download_resumes_by_range() {
    let faults = dies_after_30_mib();
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
    wait_until_the_hub_dies(&server);
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

/// A tmpfs of `bytes` mounted at `dir` for the test's life (unmounted on drop, even on panic).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, bytes: u64) -> Tmpfs {
        std::fs::create_dir_all(dir).expect("mount point");
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "mount a tmpfs at {}", dir.display());
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Bytes of the files under `dir` whose names end with `suffix`.
fn bytes_ending(dir: &Path, suffix: &str) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| {
            let t = e.file_type().unwrap();
            if t.is_dir() {
                bytes_ending(&e.path(), suffix)
            } else if t.is_file() && e.file_name().to_string_lossy().ends_with(suffix) {
                e.metadata().map_or(0, |m| m.len())
            } else {
                0
            }
        })
        .sum()
}

#[test]
fn the_disk_fills_mid_download_and_the_download_resumes_once_space_is_freed() {
    let faults = dies_after_30_mib();
    let Some(World {
        net: _net,
        fixture,
        scratch,
        server,
        client_ns,
    }) = world("hffull", false, faults)
    else {
        return;
    };
    let repo_bytes: u64 = std::fs::read_dir(&fixture)
        .unwrap()
        .flatten()
        .map(|e| e.metadata().unwrap().len())
        .sum();
    // Room for the model and a little more: the up-front space check passes.
    let disk = scratch.join("disk");
    let tmpfs = Tmpfs::mount(&disk, repo_bytes + (16 << 20));
    let cache = disk.join("hub");
    let client = {
        let config = config(&server.endpoint, &cache);
        std::thread::spawn(move || download(&client_ns, config, REPO, whole()))
    };
    wait_until_the_hub_dies(&server);
    // While the hub is down another writer takes all but 8 MiB of the disk.
    let free = hub::cache::free_space(&disk).expect("free space");
    let filler = disk.join("filler");
    std::fs::write(&filler, vec![1u8; (free - (8 << 20)) as usize]).expect("filler");
    server.restart(Faults::default());
    let (result, fetched_first) = client.join().expect("client");
    let err = result.expect_err("the download cannot finish on a full disk");
    assert!(
        matches!(err, HubError::DiskFull { .. }),
        "not a disk-full error: {err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("is full") && text.contains("free some space") && text.contains("kept"),
        "{text}"
    );
    // What was written is kept for the next try; nothing half-written is linked.
    let kept = bytes_ending(&cache, ".incomplete");
    assert!(kept > 0, "no partial file kept");
    let snapshots = cache
        .join(format!("models--{}", REPO.replace('/', "--")))
        .join("snapshots");
    for commit in std::fs::read_dir(&snapshots)
        .into_iter()
        .flatten()
        .flatten()
    {
        for link in std::fs::read_dir(commit.path()).unwrap().flatten() {
            let name = link.file_name().to_string_lossy().into_owned();
            if name.ends_with(".safetensors") {
                let expected = sha256_file(&fixture.join(&name));
                assert_eq!(
                    sha256_file(&link.path()),
                    expected,
                    "{name} linked but not whole"
                );
            }
        }
    }
    let complete_before = bytes_ending(
        &cache
            .join(format!("models--{}", REPO.replace('/', "--")))
            .join("blobs"),
        "",
    ) - kept;
    eprintln!(
        "disk full: {fetched_first} bytes fetched, {kept} kept in .incomplete files, \
         {complete_before} in complete blobs; error: {text}"
    );
    // Space freed: the download resumes and fetches only what was missing.
    std::fs::remove_file(&filler).expect("remove the filler");
    let (result, fetched_again) = {
        let config = config(&server.endpoint, &cache);
        let ns = _net.nodes[1].netns.clone();
        download(&ns, config, REPO, whole())
    };
    let snap = result.expect("the download finishes once there is room");
    let total: u64 = snap.files.iter().map(|f| f.size).sum();
    assert_eq!(
        fetched_again,
        total - kept - complete_before,
        "bytes already on disk were fetched again"
    );
    for f in snap.files.iter().filter(|f| f.lfs) {
        assert_eq!(sha256_file(&snap.dir.join(&f.path)), f.hash, "{}", f.path);
    }
    drop(tmpfs);
    drop(server);
    let _ = std::fs::remove_dir_all(&scratch);
}
