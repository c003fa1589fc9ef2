//! Deleting a model from this node (`DELETE /models/{model_id}`): its folder of the Hugging
//! Face cache goes (every revision, as `huggingface-cli delete-cache` removes a repository),
//! and with it the node's `files/<model>` and `download/<model>/…` records, so no member
//! tries to copy it from here and a later placement downloads it again.
//!
//! Refused while this node needs the files: an instance with a rank here runs the model, or a
//! download of it is running. Other nodes' copies are theirs: delete on each node that should
//! free its disk.

use super::fetch::Downloads;
use super::registry::ModelRegistry;
use crate::cluster::Cluster;
use control::{DownloadKey, Holding, PlacementCache};
use gateway::{ApiError, ErrorKind};
use serde_json::{json, Value};

/// Deletes this node's copy of `model` (see the module docs). Answers what was freed.
pub async fn delete_model(
    context: &dyn Cluster,
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
    let Some(_deleting) = downloads.begin_delete(&repo) else {
        return Err(ApiError::new(
            ErrorKind::Conflict,
            format!(
                "a download of `{repo}` is running on this node (or it is being deleted); try \
                 again once that ends"
            ),
        )
        .with_code("model_in_use"));
    };
    let cache = models.hf_cache().clone();
    let removed = tokio::task::spawn_blocking(move || cache.delete_repo(&id))
        .await
        .map_err(|e| ApiError::internal(format!("deleting the model: {e}")))?
        .map_err(|e| {
            ApiError::internal(format!("cannot delete the model's files: {e}"))
                .with_code("delete_failed")
        })?;
    downloads.forget(&repo);
    let mut records = 0;
    if context.remove(&Holding::key(&repo)) {
        records += 1;
    }
    let prefix = DownloadKey::prefix(&repo);
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
