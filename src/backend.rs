//! [`NodeBackend`]: the adapter between the gateway's [`Backend`] trait and the node.
//!
//! It holds what the node's API needs and hands each request to its home:
//! - **instances** (create, get, delete, previews, and their answers): [`crate::instances`];
//! - **the model list** and model files: [`crate::models::registry`];
//! - **chat**: [`crate::chat`] picks the instance by load and runs it here when this node
//!   holds its rank 0, else [`NodeContext::forward_chat`] sends it to the node that does
//!   ([`crate::forward`]);
//! - **runners** are started by the nodes that hold ranks, in the order the start-up plan
//!   gives ([`crate::reconcile`], which owns the runner table below).
//!
//! What the backend does not hold itself comes from a [`NodeContext`] (the node's id, the
//! state, writes of its own records, connections to other nodes): the mesh supplies it
//! (src/node.rs); unit tests use an in-memory single node.

#[cfg(test)]
pub use crate::context::LocalOnly;
pub use crate::context::NodeContext;
use crate::forward::LocalChat;
use crate::instances::{Instances, NewInstance};
use crate::models::registry::ModelRegistry;
use crate::models::ModelSpec;
use crate::runner::table::LocalRunner;
use crate::runner::table::RunnerTable;
use crate::runner::{RunnerCommand, Supervisor};
use control::{short, PlacementCache};
use gateway::exo::{self, Instance};
use gateway::{
    ApiError, Backend, BoxFuture, CancellationToken, ChatRequest, ChatStream,
    CreateInstanceRequest, ModelInfo, PlaceInstanceRequest,
};
use placement::RunnerStatus;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

/// The gateway's backend on a node: the cluster's instances, and this node's runners.
pub struct NodeBackend {
    pub(crate) context: Arc<dyn NodeContext>,
    pub(crate) runner_command: RunnerCommand,
    /// This node's models.
    pub(crate) models: ModelRegistry,
    /// This node's runners by instance id.
    pub(crate) runners: Mutex<BTreeMap<String, LocalRunner>>,
    /// This node's `runner/<id>` records as last written.
    pub(crate) published: Mutex<BTreeMap<String, String>>,
    /// Every instance's placement, computed once per (instance, epoch).
    pub(crate) placements: PlacementCache,
    /// Counts the instances this start of the node created (part of their ids).
    next_instance: AtomicU64,
    /// Wakes the reconciler (a runner changed state, an instance was created or deleted).
    pub(crate) wake: Arc<tokio::sync::Notify>,
    /// Models this node is downloading (or downloaded) on its own.
    pub(crate) downloads: Arc<crate::models::fetch::Downloads>,
}

impl RunnerTable for NodeBackend {
    fn status(&self, id: &str) -> Option<RunnerStatus> {
        self.local_status(id)
    }

    fn load(&self, id: &str) -> usize {
        let runners = self.runners.lock().unwrap_or_else(|e| e.into_inner());
        runners.get(id).map_or(0, LocalRunner::load)
    }

    fn pid(&self, id: &str) -> Option<u32> {
        let runners = self.runners.lock().unwrap_or_else(|e| e.into_inner());
        runners.get(id).and_then(LocalRunner::pid)
    }

    fn ready_rank0(&self, id: &str) -> Option<(Supervisor, ModelSpec)> {
        let runners = self.runners.lock().unwrap_or_else(|e| e.into_inner());
        let local = runners.get(id).filter(|r| r.rank == 0)?;
        local.ready_supervisor().map(|s| (s, local.model.clone()))
    }
}

impl NodeBackend {
    /// A backend with no runner yet. `runner_command` starts runner processes;
    /// `default_model` is this node's file served as `default`.
    pub fn new(
        context: Arc<dyn NodeContext>,
        runner_command: RunnerCommand,
        default_model: PathBuf,
    ) -> NodeBackend {
        NodeBackend {
            context,
            runner_command,
            models: ModelRegistry::new(
                default_model,
                crate::models::locate::ModelDirs::from_env(&[]),
            ),
            runners: Mutex::default(),
            published: Mutex::default(),
            placements: PlacementCache::new(),
            next_instance: AtomicU64::new(1),
            wake: Arc::new(tokio::sync::Notify::new()),
            downloads: Arc::default(),
        }
    }

    /// Looks for models in `dirs` (the Hugging Face cache and `--models-dir` folders).
    pub fn with_model_dirs(mut self, dirs: crate::models::locate::ModelDirs) -> NodeBackend {
        self.models = ModelRegistry::new(self.models.default_model().to_path_buf(), dirs);
        self
    }

    /// The model an intent names, as this node finds it.
    pub(crate) fn spec_of(&self, reference: &str) -> ModelSpec {
        self.models.spec_of(reference)
    }

    /// This node's runner status for instance `id`, if it runs one.
    pub(crate) fn local_status(&self, id: &str) -> Option<RunnerStatus> {
        let runners = self.runners.lock().unwrap_or_else(|e| e.into_inner());
        runners.get(id).map(LocalRunner::status)
    }

    /// The instances as this node sees them.
    fn instances(&self) -> Instances<'_> {
        Instances {
            context: &*self.context,
            models: &self.models,
            runners: self,
            placements: &self.placements,
            downloads: &self.downloads,
            shared: self.context.clone(),
        }
    }

    /// Creates an instance (see [`Instances::create`]) and wakes the reconciler.
    pub async fn create(&self, new: NewInstance) -> Result<Instance, ApiError> {
        let created = self.instances().create(new, &self.next_instance).await?;
        self.wake.notify_one();
        Ok(created)
    }

    #[cfg(test)]
    fn model_infos(&self, snapshot: &control::Snapshot) -> Vec<ModelInfo> {
        self.models.list(snapshot, &self.placements, self)
    }

    /// The ready instance of `model` to chat with: its id and its rank-0 node.
    fn pick_instance(&self, model: &str) -> Result<(String, String), ApiError> {
        crate::chat::pick_instance(
            &self.context.snapshot(),
            &self.placements,
            model,
            &self.models,
            self,
        )
    }

    /// Runs `request` on instance `id`'s rank-0 runner on this node.
    pub async fn chat_here(
        &self,
        id: &str,
        request: ChatRequest,
        cancel: CancellationToken,
    ) -> Result<ChatStream, ApiError> {
        let node = self.context.node_id();
        let stream = crate::chat::chat_here(id, request, cancel, self, &self.models, &node).await?;
        // The queue length changed: publish it soon.
        self.wake.notify_one();
        Ok(stream)
    }

    /// Stops every runner of this node (node shutdown).
    pub async fn shutdown(&self) {
        let all: Vec<LocalRunner> = {
            let mut map = self.runners.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::take(&mut *map).into_values().collect()
        };
        for runner in all {
            runner.stop().await;
        }
    }

    /// Waits until instance `id` is ready (`Ok`) or failed (`Err` with why), polling the
    /// state.
    pub async fn wait_ready(&self, id: &str) -> Result<(), String> {
        loop {
            let snapshot = self.context.snapshot();
            let Some(view) = snapshot.instances(&self.placements).remove(id) else {
                return Err("the instance was deleted".into());
            };
            let mine = self.local_status(id);
            if view.is_ready(&snapshot, mine.as_ref()) {
                return Ok(());
            }
            if let Some(failure) = view.failure(&snapshot, mine.as_ref()) {
                return Err(failure);
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }
}

impl Backend for NodeBackend {
    fn node_id(&self) -> String {
        self.context.node_id()
    }

    fn state(&self) -> BoxFuture<'_, Value> {
        Box::pin(async move {
            let instances: serde_json::Map<String, Value> = self
                .instances()
                .all()
                .into_iter()
                .map(|(id, instance)| (id, exo::to_value(&instance).unwrap_or(Value::Null)))
                .collect();
            let mut state = self.context.state_json();
            if let Some(map) = state.as_object_mut() {
                map.insert("instances".into(), Value::Object(instances));
            }
            state
        })
    }

    fn models(&self) -> BoxFuture<'_, Vec<ModelInfo>> {
        Box::pin(async move {
            self.models
                .list(&self.context.snapshot(), &self.placements, self)
        })
    }

    fn place_instance(
        &self,
        request: PlaceInstanceRequest,
    ) -> BoxFuture<'_, Result<Value, ApiError>> {
        Box::pin(async move {
            let created = self
                .create(NewInstance {
                    model: request.model_id,
                    sharding: request.sharding,
                    backend: request.instance_meta,
                    min_nodes: request.min_nodes,
                    required_nodes: vec![],
                })
                .await?;
            exo::to_value(&created)
        })
    }

    fn create_instance(
        &self,
        request: CreateInstanceRequest,
    ) -> BoxFuture<'_, Result<Value, ApiError>> {
        Box::pin(async move {
            let created = self
                .create(NewInstance {
                    model: request.model_id,
                    sharding: request.sharding,
                    backend: request.instance_meta,
                    min_nodes: request.min_nodes,
                    required_nodes: request.required_nodes,
                })
                .await?;
            exo::to_value(&created)
        })
    }

    fn instance_previews(&self, model_id: String) -> BoxFuture<'_, Result<Value, ApiError>> {
        Box::pin(async move { exo::to_value(&self.instances().previews(&model_id).await?) })
    }

    fn instance(&self, id: String) -> BoxFuture<'_, Result<Value, ApiError>> {
        Box::pin(async move { exo::to_value(&self.instances().get(&id)?) })
    }

    fn delete_instance(&self, id: String) -> BoxFuture<'_, Result<Value, ApiError>> {
        Box::pin(async move {
            let deleted = self.instances().delete(&id)?;
            self.wake.notify_one();
            Ok(json!({ "deleted": exo::to_value(&deleted)? }))
        })
    }

    fn delete_model(&self, model: String) -> BoxFuture<'_, Result<Value, ApiError>> {
        Box::pin(async move {
            crate::models::delete::delete_model(
                self.context.as_ref(),
                &self.models,
                &self.downloads,
                &self.placements,
                &model,
            )
            .await
        })
    }

    fn chat(
        &self,
        request: ChatRequest,
        cancel: CancellationToken,
    ) -> BoxFuture<'_, Result<ChatStream, ApiError>> {
        Box::pin(async move {
            let (id, rank0) = self.pick_instance(&request.model)?;
            if rank0 == self.context.node_id() {
                self.chat_here(&id, request, cancel).await
            } else {
                tracing::debug!(instance = %id, node = %short(&rank0), "forwarding a chat");
                self.context.forward_chat(rank0, id, request, cancel).await
            }
        })
    }
}

impl LocalChat for NodeBackend {
    fn chat_local(
        &self,
        instance_id: String,
        request: ChatRequest,
        cancel: CancellationToken,
    ) -> BoxFuture<'_, Result<ChatStream, ApiError>> {
        Box::pin(async move { self.chat_here(&instance_id, request, cancel).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend() -> NodeBackend {
        NodeBackend::new(
            Arc::new(LocalOnly::new("node-a")),
            RunnerCommand {
                program: "/bin/false".into(),
                args: vec![],
                settings: crate::runner::RunnerSettings::default(),
            },
            "/nonexistent/SmolLM2-135M-Instruct.Q4_1.gguf".into(),
        )
    }

    #[test]
    fn models_list_default_names_not_ready() {
        let b = backend();
        let models = b.model_infos(&b.context.snapshot());
        let ids: Vec<_> = models.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(
            ids,
            vec![
                crate::models::DEFAULT_MODEL_NAME,
                crate::models::DEFAULT_MODEL_ID
            ]
        );
        assert!(models.iter().all(|m| !m.ready));
    }

    #[test]
    fn unknown_model_is_404_listing_models_and_known_model_without_instance_is_503() {
        let b = backend();
        let e = b.pick_instance("gpt-4").expect_err("error");
        assert_eq!(e.code.as_deref(), Some("model_not_found"));
        assert!(e.message.contains("default"), "{}", e.message);
        let e = b.pick_instance("default").expect_err("error");
        assert_eq!(e.code.as_deref(), Some("no_instance"));
        assert_eq!(e.status().as_u16(), 503);
    }
}
