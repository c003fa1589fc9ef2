//! Getting a list of a model's files onto this node: each file from a member that holds it
//! (copied over iroh, resumed from another holder when one fails mid-file; a member whose copy
//! arrived corrupt is not asked for that file again), else from the hub
//! when this node is the one designated to fetch it ([`sources::designated`]), else waiting
//! for the designated node to hold it. Several files at once; each finished file is announced
//! at once in this node's `files/<model>` record, so other nodes can copy it from here.

use super::{peer, sources};
use crate::cluster::Cluster;
use hub::{HfCache, Hub, ModelId, Progress, RepoFile};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a node waits for another to fetch a file from the hub before giving up.
const WAIT_FOR_OTHERS: Duration = Duration::from_secs(600);
/// How often it looks again.
const POLL: Duration = Duration::from_millis(300);

/// Writes this node's `files/<repo>` record from what its cache holds of `id`.
pub fn advertise(context: &dyn Cluster, cache: &HfCache, id: &ModelId) {
    if let Some(holding) = sources::holding(cache, id) {
        let key = control::Holding::key(&id.repo());
        match serde_json::to_value(&holding) {
            Ok(v) => {
                if let Err(e) = context.write(&key, &v) {
                    tracing::warn!("cannot publish {key}: {e}");
                }
            }
            Err(e) => tracing::warn!("cannot encode {key}: {e}"),
        }
    }
}

/// Announces every model of this node's cache (at start, so members can copy from it).
pub fn advertise_cache(context: &dyn Cluster, cache: &HfCache) {
    for (id, _) in cache.models() {
        advertise(context, cache, &id);
    }
}

/// Fetches `files` of `id` at `commit` into the cache (see the module docs).
pub async fn gather(
    context: Arc<dyn Cluster>,
    hub: &Hub,
    id: &ModelId,
    commit: &str,
    files: &[RepoFile],
    progress: Arc<Progress>,
) -> Result<(), String> {
    for f in files {
        progress.add_file(&f.path, f.size);
    }
    let mut seen = BTreeSet::new();
    let (first, again): (Vec<RepoFile>, Vec<RepoFile>) = files
        .iter()
        .cloned()
        .partition(|f| seen.insert(f.hash.clone()));
    let limit = Arc::new(tokio::sync::Semaphore::new(hub.config.parallel.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    for file in first {
        let (context, hub, id, commit, progress, limit) = (
            context.clone(),
            hub.clone(),
            id.clone(),
            commit.to_string(),
            progress.clone(),
            limit.clone(),
        );
        tasks.spawn(async move {
            let _permit = limit.acquire_owned().await;
            one_file(&*context, &hub, &id, &commit, &file, &progress).await
        });
    }
    let mut first_error = None;
    while let Some(done) = tasks.join_next().await {
        let result = done.unwrap_or_else(|e| Err(format!("a download task failed: {e}")));
        if let Err(e) = result {
            first_error.get_or_insert(e);
            tasks.abort_all();
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    let cache = &hub.config.cache;
    for f in &again {
        cache
            .link(id, commit, &f.path, &f.hash)
            .map_err(|e| format!("{}: {e}", cache.snapshot(id, commit).display()))?;
        progress.complete(&f.path);
    }
    advertise(&*context, cache, id);
    Ok(())
}

/// One file: from a member, else from the hub if designated, else wait for a member.
async fn one_file(
    context: &dyn Cluster,
    hub: &Hub,
    id: &ModelId,
    commit: &str,
    file: &RepoFile,
    progress: &Progress,
) -> Result<(), String> {
    let cache = &hub.config.cache;
    let repo = id.repo();
    let model = id.to_string();
    let started = Instant::now();
    // Members that sent this file corrupt: not asked for it again (they would send the same
    // bytes); the hub, or another member, is.
    let mut corrupt_from: Vec<(String, String)> = Vec::new();
    loop {
        let blob = cache.blob(id, &file.hash);
        if std::fs::metadata(&blob).is_ok_and(|m| m.len() == file.size) {
            cache
                .link(id, commit, &file.path, &file.hash)
                .map_err(|e| e.to_string())?;
            progress.complete(&file.path);
            return Ok(());
        }
        let snapshot = context.snapshot();
        let mut holders = sources::holders(&snapshot, &repo, &file.hash);
        holders.retain(|node| corrupt_from.iter().all(|(bad, _)| bad != node));
        for node in &holders {
            let copied = match context.open_files(node.clone()).await {
                Ok(connection) => peer::copy(&connection, cache, id, commit, file, progress).await,
                Err(e) => Err(e.into()),
            };
            match copied {
                Ok(()) => {
                    tracing::info!(file = %file.path, from = %control::short(node), "copied from a member");
                    advertise(context, cache, id);
                    return Ok(());
                }
                Err(peer::CopyFailed::Corrupt(e)) => {
                    tracing::warn!(
                        file = %file.path, from = %control::short(node),
                        "a member sent a corrupt copy ({e}); it is not asked for this file again"
                    );
                    corrupt_from.push((node.clone(), e));
                }
                Err(e) => tracing::warn!(
                    file = %file.path, from = %control::short(node),
                    "copy from a member failed ({e}); trying another source"
                ),
            }
        }
        if holders.is_empty() && sources::designated(&snapshot, &model, &file.hash) {
            progress.set_source(&file.path, &hub.config.endpoint);
            hub::download::fetch_file(hub, id, commit, file, progress)
                .await
                .map_err(|e| with_corrupt(e.to_string(), &corrupt_from))?;
            tracing::info!(file = %file.path, from = %hub.config.endpoint, "fetched from the hub");
            advertise(context, cache, id);
            return Ok(());
        }
        if started.elapsed() > WAIT_FOR_OTHERS {
            return Err(with_corrupt(
                format!(
                    "`{}`: no member finished fetching it within {WAIT_FOR_OTHERS:?}",
                    file.path
                ),
                &corrupt_from,
            ));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// `error`, and which members sent the file corrupt (they were not asked again), if any.
fn with_corrupt(error: String, corrupt_from: &[(String, String)]) -> String {
    if corrupt_from.is_empty() {
        return error;
    }
    let members: Vec<String> = corrupt_from
        .iter()
        .map(|(node, why)| format!("{}: {why}", control::short(node)))
        .collect();
    format!(
        "{error} (members that sent it corrupt, not asked again: {})",
        members.join("; ")
    )
}
