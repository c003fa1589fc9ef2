//! Deleting a model from this node (`DELETE /models/{model_id}`): its folder of the Hugging
//! Face cache goes (every revision, as `huggingface-cli delete-cache` removes a repository),
//! and with it the node's `files/<model>` and `download/<model>/…` records, so no member
//! tries to copy it from here and a later placement downloads it again.
//!
//! Refused while this node needs the files: an instance with a rank here runs the model, or a
//! download of it is running. Other nodes' copies are theirs: delete on each node that should
//! free its disk.

use super::fetch::{Downloads, DOWNLOAD_PREFIX};
use super::registry::ModelRegistry;
use super::sources::FILES_PREFIX;
use crate::context::NodeContext;
use control::PlacementCache;
use gateway::{ApiError, ErrorKind};
use serde_json::{json, Value};

/// Deletes this node's copy of `model` (see the module docs). Answers what was freed.
pub async fn delete_model(
    context: &dyn NodeContext,
    models: &ModelRegistry,
    downloads: &Downloads,
    placements: &PlacementCache,
    model: &str,
) -> Result<Value, ApiError> {
    let id = hub::ModelId::parse(model).map_err(|e| {
        ApiError::new(
            ErrorKind::InvalidRequest,
            format!(
                "`{model}` is not a Hugging Face model id ({e}); only models downloaded into \
                 the cache can be deleted here, files of your own are yours to remove"
            ),
        )
        .with_code("invalid_model_id")
    })?;
    let repo = id.repo();
    let snapshot = context.snapshot();
    for (instance, view) in snapshot.instances(placements) {
        let same_repo = hub::ModelId::parse(&view.record.intent.model)
            .is_ok_and(|theirs| theirs.repo() == repo);
        if same_repo && view.rank_of(&snapshot.me).is_some() {
            return Err(ApiError::new(
                ErrorKind::Conflict,
                format!(
                    "instance `{instance}` runs `{repo}` with a rank on this node; delete it \
                     first (DELETE /instance/{instance})"
                ),
            )
            .with_code("model_in_use"));
        }
    }
    if downloads.is_running(&repo) {
        return Err(ApiError::new(
            ErrorKind::Conflict,
            format!("a download of `{repo}` is running on this node; try again once it ends"),
        )
        .with_code("model_in_use"));
    }
    let dir = models.hf_cache().repo_dir(&id);
    let removed = tokio::task::spawn_blocking(move || remove_counting(&dir))
        .await
        .map_err(|e| ApiError::internal(format!("deleting the model: {e}")))?
        .map_err(|e| {
            ApiError::internal(format!("cannot delete the model's files: {e}"))
                .with_code("delete_failed")
        })?;
    downloads.forget(&repo);
    let mut records = 0;
    if context.remove(&format!("{FILES_PREFIX}{repo}")) {
        records += 1;
    }
    let prefix = format!("{DOWNLOAD_PREFIX}{repo}/");
    if let Some(own) = snapshot.authors.get(&snapshot.me) {
        for key in own.records.keys().filter(|k| k.starts_with(&prefix)) {
            if context.remove(key) {
                records += 1;
            }
        }
    }
    let Some(freed) = removed else {
        if records > 0 {
            return Ok(json!({ "deleted": repo, "node": snapshot.me, "freed_bytes": 0 }));
        }
        return Err(ApiError::new(
            ErrorKind::NotFound,
            format!("this node holds no copy of `{repo}`"),
        )
        .with_code("model_not_found"));
    };
    tracing::info!(model = %repo, freed, "model deleted from this node's cache");
    Ok(json!({ "deleted": repo, "node": snapshot.me, "freed_bytes": freed }))
}

/// Removes `dir` and everything under it; the bytes of the regular files removed, or `None`
/// if it did not exist. Symbolic links are removed, never followed.
fn remove_counting(dir: &std::path::Path) -> std::io::Result<Option<u64>> {
    if std::fs::symlink_metadata(dir).is_err() {
        return Ok(None);
    }
    let bytes = bytes_under(dir);
    std::fs::remove_dir_all(dir)?;
    Ok(Some(bytes))
}

fn bytes_under(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => bytes_under(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removing_counts_file_bytes_and_never_follows_links() {
        let root = std::env::temp_dir().join(format!("shoal-delete-{}", std::process::id()));
        let outside = root.join("outside");
        let repo = root.join("models--org--name");
        std::fs::create_dir_all(repo.join("blobs")).unwrap();
        std::fs::create_dir_all(repo.join("snapshots/c")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(repo.join("blobs/aa"), vec![0u8; 1000]).unwrap();
        std::fs::write(outside.join("keep"), b"keep").unwrap();
        std::os::unix::fs::symlink("../../blobs/aa", repo.join("snapshots/c/model.bin")).unwrap();
        std::os::unix::fs::symlink(&outside, repo.join("snapshots/c/elsewhere")).unwrap();
        assert_eq!(remove_counting(&repo).unwrap(), Some(1000));
        assert!(!repo.exists());
        assert!(
            outside.join("keep").is_file(),
            "a link's target is not deleted"
        );
        assert_eq!(remove_counting(&repo).unwrap(), None);
        let _ = std::fs::remove_dir_all(&root);
    }
}
