//! Downloads a node starts on its own. When an instance gives this node a rank of a Hugging
//! Face model whose files for that rank are not in its cache, the reconciler asks for them
//! ([`control::Effect::Download`] with the rank's [`Part`]) and this table runs one download
//! per (model, part): first the configuration, tokenizer and index files, then only the weight
//! files the index says the part needs. Its progress is this node's `download/<model>/<part>`
//! record in the replicated state (bytes done and total, bytes that came over the network,
//! rate, ETA, the file, from where — the hub's endpoint or the member's node id —, how long
//! the last set of files took, the state, the error), and the reconciler is woken when it
//! ends, so the runner loads once the files are complete, or the rank fails with the
//! download's error.
//!
//! The node that places a model it has never seen fetches only the small files first
//! ([`Downloads::fetch_support`]): placement needs the configuration, not the weights.

use crate::cluster::Cluster;
use control::{DownloadKey, DownloadRecord, DownloadState, FetchState, Part};
use hub::select::{self, Shard, INDEX};
use hub::{HfCache, Hub, HubConfig, ModelId, Progress, RepoFile};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a failed download is reported as failed; after that (or when a user places the
/// model again on this node) the next rank that needs the part tries again.
const FAILURE_KEPT: Duration = Duration::from_secs(30);
/// How long a download waits after announcing the files it wants, so that the nodes wanting
/// the same file agree on which of them asks the hub.
const SETTLE: Duration = Duration::from_millis(1500);

/// Whether the model reference `reference` names repository `repo` (at any revision).
fn of_repo(reference: &str, repo: &str) -> bool {
    ModelId::parse(reference).is_ok_and(|id| id.repo() == repo)
}

/// One (model, part) download.
#[derive(Debug, Clone)]
struct Job {
    state: FetchState,
    since: Instant,
}

/// What [`Downloads`] guards with one lock, so that "is a download of this repository
/// writing?" and "this repository is being deleted" are decided together.
#[derive(Debug, Default)]
struct Table {
    /// Part downloads by (model reference, part).
    jobs: BTreeMap<(String, Part), Job>,
    /// Support-file fetches running, by repository.
    support: BTreeMap<String, usize>,
    /// Repositories whose cache folder is being removed: no download of them starts.
    deleting: std::collections::BTreeSet<String>,
}

impl Table {
    fn writing(&self, repo: &str) -> bool {
        self.support.get(repo).is_some_and(|n| *n > 0)
            || self
                .jobs
                .iter()
                .any(|((m, _), j)| of_repo(m, repo) && j.state == FetchState::Running)
    }
}

/// This node's downloads by (model reference, part), and the repositories being deleted.
#[derive(Debug, Default)]
pub struct Downloads {
    table: Mutex<Table>,
}

/// Held while a repository's cache folder is removed (see [`Downloads::begin_delete`]);
/// downloads of it may start again once it is dropped.
pub struct DeleteGuard<'a> {
    downloads: &'a Downloads,
    repo: String,
}

impl Drop for DeleteGuard<'_> {
    fn drop(&mut self) {
        self.downloads.table().deleting.remove(&self.repo);
    }
}

/// Counts one support-file fetch of a repository while it runs.
struct SupportFetch<'a> {
    downloads: &'a Downloads,
    repo: String,
}

impl Drop for SupportFetch<'_> {
    fn drop(&mut self) {
        let mut table = self.downloads.table();
        if let Some(n) = table.support.get_mut(&self.repo) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                table.support.remove(&self.repo);
            }
        }
    }
}

impl Downloads {
    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where each part of `model` stands on this node (recent failures included).
    pub fn parts_of(&self, model: &str) -> BTreeMap<Part, FetchState> {
        let mut table = self.table();
        let jobs = &mut table.jobs;
        jobs.retain(|_, j| {
            !matches!(j.state, FetchState::Failed(_)) || j.since.elapsed() < FAILURE_KEPT
        });
        jobs.iter()
            .filter(|((m, _), _)| m == model)
            .map(|((_, p), j)| (*p, j.state.clone()))
            .collect()
    }

    /// Whether `part` of `model` is complete here (downloaded by this node, or found whole in
    /// its cache by a download that then had nothing to do).
    pub fn is_done(&self, model: &str, part: &Part) -> bool {
        self.table()
            .jobs
            .get(&(model.to_string(), *part))
            .is_some_and(|j| j.state == FetchState::Done)
    }

    /// Forgets `model`'s failed downloads, so that the next rank that needs one tries again.
    pub fn forget_failures(&self, model: &str) {
        self.table()
            .jobs
            .retain(|(m, _), j| m != model || !matches!(j.state, FetchState::Failed(_)));
    }

    /// Marks repository `repo` as being deleted, unless a download of it (any part, any
    /// revision, or its support files) is writing here: then `None`. While the guard lives no
    /// download of it starts (the reconciler's next pass starts it again after), so the folder
    /// is never removed under a download that writes into it.
    pub fn begin_delete(&self, repo: &str) -> Option<DeleteGuard<'_>> {
        let mut table = self.table();
        if table.writing(repo) || !table.deleting.insert(repo.to_string()) {
            return None;
        }
        Some(DeleteGuard {
            downloads: self,
            repo: repo.to_string(),
        })
    }

    /// Forgets every ended download of repository `repo` (its files were deleted: the next
    /// rank that needs a part downloads it again).
    pub fn forget(&self, repo: &str) {
        self.table()
            .jobs
            .retain(|(m, _), j| !of_repo(m, repo) || j.state == FetchState::Running);
    }

    fn set(&self, model: &str, part: Part, state: FetchState) {
        self.table().jobs.insert(
            (model.to_string(), part),
            Job {
                state,
                since: Instant::now(),
            },
        );
    }

    /// Starts downloading `part` of `model` unless a download of it runs or has ended;
    /// `wake` is told when it ends.
    pub fn start(
        self: &Arc<Self>,
        model: &str,
        part: Part,
        context: Arc<dyn Cluster>,
        wake: Arc<tokio::sync::Notify>,
    ) {
        {
            let mut table = self.table();
            let key = (model.to_string(), part);
            let deleting =
                ModelId::parse(model).is_ok_and(|id| table.deleting.contains(&id.repo()));
            if deleting || table.jobs.contains_key(&key) {
                return;
            }
            table.jobs.insert(
                key,
                Job {
                    state: FetchState::Running,
                    since: Instant::now(),
                },
            );
        }
        let (table, model) = (self.clone(), model.to_string());
        tokio::spawn(async move {
            let state = match fetch_part(&model, Some(part), context).await {
                Ok(()) => {
                    tracing::info!(model = %model, part = %part.label(), "the files of this node's part are complete");
                    FetchState::Done
                }
                Err(e) => {
                    tracing::error!(model = %model, part = %part.label(), "download failed: {e}");
                    FetchState::Failed(e)
                }
            };
            table.set(&model, part, state);
            wake.notify_one();
        });
    }

    /// Fetches `model`'s configuration, tokenizer, template and index files (not its weights;
    /// for a GGUF model, its quantization's file, whose header holds the configuration) and
    /// waits: the node placing a model reads its configuration first.
    pub async fn fetch_support(
        &self,
        model: &str,
        context: Arc<dyn Cluster>,
    ) -> Result<(), String> {
        self.forget_failures(model);
        let repo = ModelId::parse(model).map_err(|e| e.to_string())?.repo();
        let _running = {
            let mut table = self.table();
            if table.deleting.contains(&repo) {
                return Err(format!(
                    "`{repo}` is being deleted from this node; place it again once that ends"
                ));
            }
            *table.support.entry(repo.clone()).or_default() += 1;
            SupportFetch {
                downloads: self,
                repo,
            }
        };
        fetch_part(model, None, context).await
    }
}

/// The configuration, tokenizer, template and index files of a repository.
fn support_files(files: &[RepoFile]) -> Vec<RepoFile> {
    files
        .iter()
        .filter(|f| select::is_support_file(&f.path))
        .cloned()
        .collect()
}

/// The hub crate's name for a part.
fn shard_of(part: Part) -> Shard {
    match part {
        Part::Layers {
            start,
            end,
            n_layers,
        } => Shard::Layers {
            start,
            end,
            n_layers,
        },
        Part::Tensor => Shard::Tensor,
    }
}

/// The files `part` needs out of `files` (a repository's, or a snapshot's), given the index
/// text if there is one; GGUF repos (`:QUANT`) need the quantization's file whole.
pub fn files_for(
    id: &ModelId,
    files: &[RepoFile],
    index: Option<&[u8]>,
    part: Part,
) -> Result<Vec<RepoFile>, String> {
    match &id.quant {
        Some(q) => select::for_model(files, Some(q)),
        None => select::for_shard(files, index, shard_of(part)),
    }
}

/// Whether this node's cache already holds every file `part` of `id` needs (no network).
pub fn held(cache: &HfCache, id: &ModelId, part: Part) -> bool {
    let Some(commit) = cache.read_ref(id, id.revision()) else {
        return false;
    };
    let dir = cache.snapshot(id, &commit);
    if !dir.join("config.json").is_file() && id.quant.is_none() {
        return false;
    }
    let mut present = Vec::new();
    hub::local::list_files(&dir, &dir, &mut present);
    let index = std::fs::read(dir.join(INDEX)).ok();
    files_for(id, &present, index.as_deref(), part)
        .is_ok_and(|files| files.iter().all(|f| dir.join(&f.path).is_file()))
}

/// Downloads what `part` of `model` needs (its support files alone for `None`), each file
/// from a member that holds it or else from the hub ([`super::gather`]), writing its progress
/// record every second. The listing (commit and files) comes from the members when one holds
/// the model at the revision asked for, so the hub is not needed at all then.
async fn fetch_part(
    model: &str,
    part: Option<Part>,
    context: Arc<dyn Cluster>,
) -> Result<(), String> {
    let id = ModelId::parse(model).map_err(|e| e.to_string())?;
    let hub = Hub::new(HubConfig::from_env()).map_err(|e| e.to_string())?;
    let cache = hub.config.cache.clone();
    let key = DownloadKey::new(model, part);
    let label = key.label();
    let key = key.to_string();
    let progress = Arc::new(Progress::default());
    let wants: Mutex<BTreeMap<String, String>> = Mutex::default();
    // How long the last set of files took, from the end of the settle wait to the last file
    // verified (the weights' copy time, which `cargo xtask bench peer-copy` reads).
    let transfer_s: Arc<Mutex<Option<f64>>> = Arc::default();
    let started = Instant::now();
    let record = |state: DownloadState| {
        let t = progress.totals();
        let seconds = started.elapsed().as_secs_f64().max(0.001);
        let rate = t.fetched as f64 / seconds;
        let eta = (rate > 0.0).then(|| t.total.saturating_sub(t.done) as f64 / rate);
        let done = progress.per_file();
        let wants: Vec<String> = wants
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(path, _)| !done.get(*path).is_some_and(|f| f.complete))
            .map(|(_, hash)| hash.clone())
            .collect();
        let from = t
            .current_source
            .unwrap_or_else(|| hub.config.endpoint.clone());
        DownloadRecord {
            model: model.to_string(),
            part: label.clone(),
            state,
            done: t.done,
            total: t.total,
            fetched: t.fetched,
            files_complete: t.files_complete,
            files: t.files,
            file: t.current,
            from,
            wants,
            rate_bytes_per_s: rate.round(),
            eta_s: eta.map(f64::round),
            transfer_s: *transfer_s.lock().unwrap_or_else(|p| p.into_inner()),
            error: None,
        }
    };
    let write = |record: &DownloadRecord| match serde_json::to_value(record) {
        Ok(value) => {
            let _ = context.write(&key, &value);
        }
        Err(e) => tracing::warn!("cannot encode {key}: {e}"),
    };
    if part.is_some_and(|p| held(&cache, &id, p)) {
        super::gather::advertise(&*context, &cache, &id);
        write(&record(DownloadState::Complete));
        return Ok(());
    }
    let work = async {
        let snapshot = context.snapshot();
        let (commit, all, from_members) = match super::sources::peer_listing(&snapshot, &id) {
            Some((commit, files)) => (commit, files, true),
            None if hub.config.offline => {
                let what = if part.is_some() {
                    format!("the files of its part {label}")
                } else {
                    "its configuration and tokenizer files".to_string()
                };
                return Err(format!(
                    "offline (HF_HUB_OFFLINE), no member holds {model}, and this node's cache \
                     {} lacks {what}",
                    cache.root.display()
                ));
            }
            None => {
                let commit = hub.commit_of(&id).await.map_err(|e| e.to_string())?;
                let files = hub.files(&id, &commit).await.map_err(|e| e.to_string())?;
                (commit, files, false)
            }
        };
        cache
            .write_ref(&id, id.revision(), &commit)
            .map_err(|e| format!("{}: {e}", cache.repo_dir(&id).display()))?;
        let support = support_files(&all);
        // Announces the files wanted, lets the other nodes see them before deciding who asks
        // the hub, then fetches them.
        let fetch = |files: Vec<RepoFile>| {
            {
                let mut w = wants.lock().unwrap_or_else(|p| p.into_inner());
                for f in &files {
                    w.insert(f.path.clone(), f.hash.clone());
                }
            }
            write(&record(DownloadState::Downloading));
            let (context, hub, id, commit, progress, transfer_s) = (
                context.clone(),
                hub.clone(),
                id.clone(),
                commit.clone(),
                progress.clone(),
                transfer_s.clone(),
            );
            async move {
                tokio::time::sleep(SETTLE).await;
                let start = Instant::now();
                let done =
                    super::gather::gather(context, &hub, &id, &commit, &files, progress).await;
                *transfer_s.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some(start.elapsed().as_secs_f64());
                done
            }
        };
        fetch(support).await?;
        let Some(part) = part else {
            // A GGUF model (`org/name:QUANT`) keeps its configuration in its file's header:
            // the node placing it reads that file (every rank needs it whole anyway).
            if let Some(quant) = &id.quant {
                let gguf = select::for_model(&all, Some(quant))?;
                cache
                    .check_free_space(&id, &gguf)
                    .map_err(|e| e.to_string())?;
                return fetch(gguf).await;
            }
            return Ok(());
        };
        let index = std::fs::read(cache.snapshot(&id, &commit).join(INDEX)).ok();
        let wanted = match files_for(&id, &all, index.as_deref(), part) {
            Ok(w) => w,
            Err(_) if from_members && !hub.config.offline => {
                // The members hold only parts of it: the hub lists the rest.
                let files = hub.files(&id, &commit).await.map_err(|e| e.to_string())?;
                files_for(&id, &files, index.as_deref(), part)?
            }
            Err(e) => return Err(e),
        };
        if wanted.is_empty() {
            return Err(format!(
                "model `{model}` has no files shoal can run for {label}"
            ));
        }
        cache
            .check_free_space(&id, &wanted)
            .map_err(|e| e.to_string())?;
        fetch(wanted).await
    };
    tokio::pin!(work);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let result = loop {
        tokio::select! {
            done = &mut work => break done,
            _ = tick.tick() => write(&record(DownloadState::Downloading)),
        }
    };
    let mut last = record(DownloadState::Complete);
    if let Err(e) = &result {
        last.state = DownloadState::Failed;
        last.error = Some(e.clone());
    }
    write(&last);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repository_is_deleted_only_while_nothing_writes_it_and_one_delete_at_a_time() {
        let downloads = Downloads::default();
        let model = "org/name@main";
        downloads.set(model, Part::Tensor, FetchState::Running);
        assert!(
            downloads.begin_delete("org/name").is_none(),
            "a running download blocks the delete"
        );
        assert!(downloads.begin_delete("org/other").is_some());
        downloads.set(model, Part::Tensor, FetchState::Done);
        let guard = downloads
            .begin_delete("org/name")
            .expect("nothing writes now");
        assert!(
            downloads.begin_delete("org/name").is_none(),
            "a second delete waits for the first"
        );
        assert!(downloads.table().deleting.contains("org/name"));
        drop(guard);
        assert!(downloads.table().deleting.is_empty());
        *downloads
            .table()
            .support
            .entry("org/name".into())
            .or_default() += 1;
        assert!(
            downloads.begin_delete("org/name").is_none(),
            "a support-file fetch blocks the delete"
        );
    }
}
