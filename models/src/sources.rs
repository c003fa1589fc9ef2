//! Where each file of a download comes from: a cluster member that holds it, else the hub.
//!
//! Every node says which verified files of a model it holds in its `files/<model>` record
//! ([`Holding`]: the revision, its commit and each file's path, size and hub hash), and which
//! it still lacks in the `wants` of its `download/<model>/<part>` record. A node that needs a
//! file copies it from a member that holds it ([`crate::models::peer`]); when none does, only
//! one of the nodes that want it fetches it from the hub — the smallest node id among the
//! live nodes whose running download wants it ([`designated`]) — and the others wait for it
//! to appear in that node's record and copy it from there, so the hub serves each file once
//! to the whole cluster. With no hub at all, the listing comes from the members' records.

use control::{Author, HeldFile, Holding, Snapshot};
use hub::{HfCache, ModelId, RepoFile};
use std::collections::{BTreeMap, BTreeSet};

/// A held file as the hub crate's file.
fn repo_file(f: &HeldFile) -> RepoFile {
    RepoFile {
        path: f.path.clone(),
        size: f.size,
        lfs: f.hash.len() == 64,
        hash: f.hash.clone(),
    }
}

/// What this node's cache holds of `id` (its revision's snapshot), if anything.
pub fn holding(cache: &HfCache, id: &ModelId) -> Option<Holding> {
    let commit = cache.read_ref(id, id.revision())?;
    let dir = cache.snapshot(id, &commit);
    let mut present = Vec::new();
    hub::local::list_files(&dir, &dir, &mut present);
    let files: Vec<HeldFile> = present
        .into_iter()
        .filter(|f| !f.hash.is_empty() && cache.blob(id, &f.hash).is_file())
        .map(|f| HeldFile {
            path: f.path,
            size: f.size,
            hash: f.hash,
        })
        .collect();
    (!files.is_empty()).then(|| Holding {
        revision: id.revision().to_string(),
        commit,
        files,
    })
}

/// The holding records of `model` by live member (this node excluded).
fn holdings<'a>(snapshot: &'a Snapshot, model: &str) -> Vec<(&'a String, Holding)> {
    snapshot
        .authors
        .iter()
        .filter(|(id, a)| a.alive && **id != snapshot.me)
        .filter_map(|(id, a)| Some((id, a.holding(model)?)))
        .collect()
}

/// The live members that hold the file with content hash `hash` of `model`, by id.
pub fn holders(snapshot: &Snapshot, model: &str, hash: &str) -> Vec<String> {
    holdings(snapshot, model)
        .into_iter()
        .filter(|(_, h)| h.files.iter().any(|f| f.hash == hash))
        .map(|(id, _)| id.clone())
        .collect()
}

/// The members' listing of `id`'s revision: the commit most of them hold (ties to the
/// smallest) and the union of their files of it; `None` when no member holds the model.
pub fn peer_listing(snapshot: &Snapshot, id: &ModelId) -> Option<(String, Vec<RepoFile>)> {
    let mut by_commit: BTreeMap<String, (usize, BTreeMap<String, RepoFile>)> = BTreeMap::new();
    for (_, h) in holdings(snapshot, &id.to_string()) {
        if h.revision != id.revision() || !hub::meta::is_commit(&h.commit) {
            continue;
        }
        let entry = by_commit.entry(h.commit.clone()).or_default();
        entry.0 += 1;
        for f in &h.files {
            if hub::meta::safe_relative(&f.path) {
                entry.1.insert(f.path.clone(), repo_file(f));
            }
        }
    }
    let (commit, (_, files)) = by_commit
        .into_iter()
        .max_by(|a, b| a.1 .0.cmp(&b.1 .0).then_with(|| b.0.cmp(&a.0)))?;
    Some((commit, files.into_values().collect()))
}

/// The weight bytes of `id` (its revision, and its quantization for a GGUF repo) each live
/// node holds, this node included, by node id: what placement weighs as download progress, so
/// that an instance goes to the nodes that already have its files (as exo prefers them), and
/// nothing is copied that need not be.
pub fn held_weight_bytes(snapshot: &Snapshot, id: &ModelId) -> BTreeMap<String, u64> {
    snapshot
        .authors
        .iter()
        .filter(|(node, a)| a.alive || **node == snapshot.me)
        .filter_map(|(node, a)| {
            let holding = a.holding(&id.repo())?;
            if holding.revision != id.revision() {
                return None;
            }
            let files: Vec<RepoFile> = holding.files.iter().map(repo_file).collect();
            let weights = hub::select::for_model(&files, id.quant.as_deref()).ok()?;
            let bytes = weights
                .iter()
                .filter(|f| !hub::select::is_support_file(&f.path))
                .map(|f| f.size)
                .sum::<u64>();
            (bytes > 0).then(|| (node.clone(), bytes))
        })
        .collect()
}

/// Whether this node is the one to fetch `hash` of `model` from the hub: the smallest id
/// among live nodes (this one included) whose running download of the model wants it.
pub fn designated(snapshot: &Snapshot, model: &str, hash: &str) -> bool {
    let wants = |a: &Author| a.downloads(model).any(|(_, record)| record.wants(hash));
    let wanting: BTreeSet<&String> = snapshot
        .authors
        .iter()
        .filter(|(id, a)| (a.alive || **id == snapshot.me) && wants(a))
        .map(|(id, _)| id)
        .collect();
    wanting.first().is_none_or(|first| **first == snapshot.me)
}

/// Sets each node's download progress of `model` to the share of its `bytes_on_disk` the node
/// holds (`held`, by node), which placement prefers among rings of one size.
pub fn prefer_holders(
    nodes: &mut [placement::NodeProfile],
    model: &str,
    held: &BTreeMap<String, u64>,
    bytes_on_disk: u64,
) {
    for node in nodes {
        if let Some(&bytes) = held.get(&node.id) {
            let share = bytes as f64 / bytes_on_disk.max(1) as f64;
            node.download.insert(model.to_string(), share.min(1.0));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use control::fixture::author;
    use control::{DownloadKey, DownloadRecord, Part};

    fn holding_of(commit: &str, files: &[(&str, &str)]) -> String {
        let files = files.iter().map(|(path, hash)| HeldFile {
            path: path.to_string(),
            size: 1,
            hash: hash.to_string(),
        });
        let holding = Holding {
            revision: "main".into(),
            commit: commit.into(),
            files: files.collect(),
        };
        serde_json::to_string(&holding).unwrap()
    }

    #[test]
    fn holders_listing_and_the_one_that_fetches_from_the_hub() {
        let c = "0123456789abcdef0123456789abcdef01234567";
        let m = "org/name";
        let h1 = "a".repeat(64);
        let want = |hashes: &[&str]| {
            let record = DownloadRecord {
                wants: hashes.iter().map(|h| h.to_string()).collect(),
                ..DownloadRecord::default()
            };
            serde_json::to_string(&record).unwrap()
        };
        let tensor = DownloadKey::new(m, Some(Part::Tensor)).to_string();
        let snapshot = Snapshot {
            settling: false,
            me: "b".into(),
            authors: [
                (
                    "a".to_string(),
                    author(
                        true,
                        &[(
                            Holding::key(m),
                            holding_of(c, &[("config.json", "11"), ("m1.safetensors", &h1)]),
                        )],
                    ),
                ),
                (
                    "b".to_string(),
                    author(true, &[(tensor.clone(), want(&["22"]))]),
                ),
                (
                    "c".to_string(),
                    author(true, &[(tensor.clone(), want(&["22", "33"]))]),
                ),
                (
                    "0".to_string(),
                    author(false, &[(tensor.clone(), want(&["22"]))]),
                ),
            ]
            .into(),
        };
        assert_eq!(holders(&snapshot, m, &h1), vec!["a".to_string()]);
        assert!(holders(&snapshot, m, "22").is_empty());
        let id = ModelId::parse(m).unwrap();
        let (commit, files) = peer_listing(&snapshot, &id).unwrap();
        assert_eq!(commit, c);
        assert_eq!(files.len(), 2);
        assert!(files[1].lfs && !files[0].lfs);
        // Held weight bytes count weights only (not config), of live nodes only.
        let held = held_weight_bytes(&snapshot, &id);
        assert_eq!(held, BTreeMap::from([("a".to_string(), 1)]));
        let other_revision = ModelId::parse("org/name@v2").unwrap();
        assert!(held_weight_bytes(&snapshot, &other_revision).is_empty());
        // b and c want 22: b (the smaller live id) fetches it; only c wants 33; nobody 44.
        assert!(designated(&snapshot, m, "22"));
        assert!(!designated(&snapshot, m, "33"));
        assert!(designated(&snapshot, m, "44"));
    }
}
