//! [`Api`]: the node's face towards HTTP, the adapter between the gateway's [`Backend`] trait
//! and the [`Node`]. It hands each request to its home and answers in the cluster API's types
//! ([`gateway::exo`]), turned into JSON only at the trait's edge:
//! - **instances** (create, get, delete, previews, and their answers): [`instances`];
//! - **the model list** and model files: the `models` crate's registry;
//! - **chat**: [`crate::chat::route`] (pick, then here or forwarded).
//!
//! Runners are not the API's: the executor ([`crate::executor`]) starts them when the state
//! says so.

pub mod instances;

use crate::node::Node;
use gateway::exo::{self, Instance};
use gateway::{
    ApiError, Backend, BoxFuture, CancellationToken, ChatRequest, ChatStream,
    CreateInstanceRequest, ModelInfo, PlaceInstanceRequest,
};
use instances::{Instances, NewInstance};
use serde_json::{json, Value};
use std::sync::Arc;

/// The gateway's backend on a node (see the module docs).
pub struct Api {
    node: Arc<Node>,
}

impl Api {
    /// The API over `node`.
    pub fn new(node: Arc<Node>) -> Api {
        Api { node }
    }

    /// The instances as this node sees them.
    fn instances(&self) -> Instances<'_> {
        Instances { node: &self.node }
    }

    /// Creates an instance (see [`Instances::create`]) and wakes the executor.
    pub async fn create(&self, new: NewInstance) -> Result<Instance, ApiError> {
        let created = self.instances().create(new).await?;
        self.node.wake.notify_one();
        Ok(created)
    }

    /// The model list (`GET /v1/models`).
    fn model_infos(&self) -> Vec<ModelInfo> {
        let node = &self.node;
        let mine = |id: &str| node.runners.status(id);
        node.models
            .list(&node.context.snapshot(), &node.placements, &mine)
    }
}

impl Backend for Api {
    fn node_id(&self) -> String {
        self.node.context.node_id()
    }

    fn state(&self) -> BoxFuture<'_, Value> {
        Box::pin(async move {
            let instances: serde_json::Map<String, Value> = self
                .instances()
                .all()
                .into_iter()
                .map(|(id, instance)| (id, exo::to_value(&instance).unwrap_or(Value::Null)))
                .collect();
            let mut state = self.node.context.state_json();
            if let Some(map) = state.as_object_mut() {
                map.insert("instances".into(), Value::Object(instances));
            }
            state
        })
    }

    fn models(&self) -> BoxFuture<'_, Vec<ModelInfo>> {
        Box::pin(async move { self.model_infos() })
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
            self.node.wake.notify_one();
            Ok(json!({ "deleted": exo::to_value(&deleted)? }))
        })
    }

    fn delete_model(&self, model: String) -> BoxFuture<'_, Result<Value, ApiError>> {
        Box::pin(async move {
            let node = &self.node;
            let context: &dyn models::Cluster = &*node.context;
            models::delete::delete_model(
                context,
                &node.models,
                &node.downloads,
                &node.placements,
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
        Box::pin(crate::chat::route(&self.node, request, cancel))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::LocalOnly;

    fn api() -> Api {
        Api::new(Arc::new(Node::new(
            Arc::new(LocalOnly::new("node-a")),
            runners::RunnerCommand {
                program: "/bin/false".into(),
                args: vec![],
                settings: runners::RunnerSettings::default(),
            },
            "/nonexistent/SmolLM2-135M-Instruct.Q4_1.gguf".into(),
            models::locate::ModelDirs::from_env(&[]),
        )))
    }

    #[test]
    fn models_list_default_names_not_ready() {
        let models = api().model_infos();
        let ids: Vec<_> = models.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(
            ids,
            vec![models::DEFAULT_MODEL_NAME, models::DEFAULT_MODEL_ID]
        );
        assert!(models.iter().all(|m| !m.ready));
    }

    #[test]
    fn unknown_model_is_404_listing_models_and_known_model_without_instance_is_503() {
        let a = api();
        let pick = |model: &str| crate::chat::pick::pick_instance(&a.node, model);
        let e = pick("gpt-4").expect_err("error");
        assert_eq!(e.code.as_deref(), Some("model_not_found"));
        assert!(e.message.contains("default"), "{}", e.message);
        let e = pick("default").expect_err("error");
        assert_eq!(e.code.as_deref(), Some("no_instance"));
        assert_eq!(e.status().as_u16(), 503);
    }
}
