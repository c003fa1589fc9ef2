//! A snapshot download: the files of a model that a caller selects, several at once, into the
//! Hugging Face cache layout, each by [`crate::download::fetch_file`]; offline, the snapshot
//! the cache holds. Its own file so that the client ([`crate::client`]) does not depend on
//! the file fetch that depends on it.

use crate::client::Hub;
use crate::error::HubError;
use crate::id::ModelId;
use crate::meta::RepoFile;
use crate::progress::Progress;
use std::path::PathBuf;
use std::sync::Arc;

/// A downloaded (or cached) snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The model.
    pub id: ModelId,
    /// The commit.
    pub commit: String,
    /// `snapshots/<commit>` in the cache.
    pub dir: PathBuf,
    /// The files fetched or found, by path.
    pub files: Vec<RepoFile>,
}

impl Hub {
    /// Downloads the files of `id` that `select` keeps (from the list of all its files) into
    /// the cache, `parallel` at once, resuming what is partly held, and records the revision's
    /// commit in `refs/`. Offline, answers from the cache alone.
    pub async fn download(
        &self,
        id: &ModelId,
        select: &(dyn Fn(&[RepoFile]) -> Vec<RepoFile> + Sync),
        progress: Arc<Progress>,
    ) -> Result<Snapshot, HubError> {
        if self.config.offline {
            return self.cached(id, select);
        }
        let commit = self.commit_of(id).await?;
        let all = self.files(id, &commit).await?;
        let wanted = select(&all);
        self.config.cache.check_free_space(id, &wanted)?;
        for f in &wanted {
            progress.add_file(&f.path, f.size);
        }
        let limit = Arc::new(tokio::sync::Semaphore::new(self.config.parallel.max(1)));
        let mut tasks = tokio::task::JoinSet::new();
        // Files with the same content share one blob: fetch it once, link the others after.
        let mut seen = std::collections::BTreeSet::new();
        let (first, again): (Vec<RepoFile>, Vec<RepoFile>) = wanted
            .iter()
            .cloned()
            .partition(|f| seen.insert(f.hash.clone()));
        for file in first {
            let (hub, id, commit, progress, limit) = (
                self.clone(),
                id.clone(),
                commit.clone(),
                progress.clone(),
                limit.clone(),
            );
            tasks.spawn(async move {
                let _permit = limit.acquire_owned().await;
                crate::download::fetch_file(&hub, &id, &commit, &file, &progress).await
            });
        }
        let mut first_error = None;
        while let Some(done) = tasks.join_next().await {
            let result = done.unwrap_or_else(|e| {
                Err(HubError::BadAnswer {
                    url: self.config.endpoint.clone(),
                    what: format!("a download task failed: {e}"),
                })
            });
            if let Err(e) = result {
                first_error.get_or_insert(e);
                tasks.abort_all();
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        let cache = &self.config.cache;
        for f in &again {
            cache
                .link(id, &commit, &f.path, &f.hash)
                .map_err(|e| HubError::io(&cache.snapshot(id, &commit), e))?;
            progress.complete(&f.path);
        }
        cache
            .write_ref(id, id.revision(), &commit)
            .map_err(|e| HubError::io(&cache.repo_dir(id), e))?;
        Ok(Snapshot {
            id: id.clone(),
            dir: cache.snapshot(id, &commit),
            commit,
            files: wanted,
        })
    }

    /// The snapshot the cache holds for `id`'s revision, with the selected files present.
    pub fn cached(
        &self,
        id: &ModelId,
        select: &(dyn Fn(&[RepoFile]) -> Vec<RepoFile> + Sync),
    ) -> Result<Snapshot, HubError> {
        let cache = &self.config.cache;
        let offline = |what: String| HubError::Offline {
            id: id.to_string(),
            cache: cache.root.display().to_string(),
            what,
        };
        let commit = cache.read_ref(id, id.revision()).ok_or_else(|| {
            offline(format!(
                "no snapshot of revision `{}`; download it first (`shoal download {id}`) or copy a Hugging Face cache here",
                id.revision()
            ))
        })?;
        let dir = cache.snapshot(id, &commit);
        let mut present = Vec::new();
        crate::local::list_files(&dir, &dir, &mut present);
        let wanted = select(&present);
        if let Some(missing) = wanted.iter().find(|f| !dir.join(&f.path).is_file()) {
            return Err(offline(format!(
                "its snapshot {commit} lacks `{}`; download it while online",
                missing.path
            )));
        }
        Ok(Snapshot {
            id: id.clone(),
            commit,
            dir,
            files: wanted,
        })
    }
}
