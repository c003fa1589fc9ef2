//! [`NodeBackend`]: the node's implementation of the gateway's [`Backend`] trait over local
//! model instances, each served by a runner process (see [`crate::supervisor`]).
//!
//! What it does not know comes from a [`NodeContext`]: the node's id and the cluster state
//! around its own instances. The mesh supplies those; [`LocalOnly`] is the single-node stand-in
//! used until the mesh is wired in (it is not a mock: it is what a node alone knows).
//!
//! **Model ids.** A model is named by its file or folder name without extension (a GGUF file
//! `Foo.Q4_1.gguf` is `Foo.Q4_1`), or by its path. The SmolLM2 fixture that
//! `cargo xtask setup` downloads is served as `default` and also as `SmolLM2-135M-Instruct`;
//! both are listed by `GET /v1/models` and both reach the same instances.
//!
//! **Prompts** are rendered with the model's chat template and tokenized here, in the node,
//! so that the prompt size is known when the request is accepted (`usage.prompt_tokens`, and
//! a 400 for a prompt longer than the context); the runner receives token ids.
//!
//! **Stop strings** are enforced by the gateway, not passed to the engine: the engine holds
//! back text that may start a stop string and releases it only at the end, and the gateway
//! counts every token event towards `max_tokens`, so text released late could be cut.

use crate::supervisor::{GenerationEvent, GenerationFailure, RunnerCommand, Supervisor};
use gateway::{
    ApiError, Backend, BoxFuture, CancellationToken, ChatEvent, ChatRequest, ChatStream, ErrorKind,
    FinishReason, ModelInfo, PlaceInstanceRequest, TokenLogprob,
};
use inference::runner::protocol::RunnerState;
use inference::{GenerateRequest, Prompt, Tokenizer};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The id under which the default model (the SmolLM2 fixture) is served.
pub const DEFAULT_MODEL_ID: &str = "default";
/// The default model's own name, also accepted and listed.
pub const DEFAULT_MODEL_NAME: &str = "SmolLM2-135M-Instruct";

/// How long a deleted instance's runner gets to exit before it is killed.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// What the node knows beyond its own instances: supplied by the mesh (or a lone test node).
pub trait NodeContext: Send + Sync + 'static {
    /// This node's id (`GET /node_id`).
    fn node_id(&self) -> String;
    /// The state `GET /state` answers, given this node's own instances as
    /// `{"instances": {ID: INSTANCE}}`.
    fn state(&self, local: Value) -> Value;
}

/// A node on its own (tests): its id, and a state made of its own instances.
#[cfg(test)]
#[derive(Debug, Clone)]
pub struct LocalOnly {
    node_id: String,
}

#[cfg(test)]
impl LocalOnly {
    /// A lone node with this id.
    pub fn new(node_id: impl Into<String>) -> LocalOnly {
        LocalOnly {
            node_id: node_id.into(),
        }
    }
}

#[cfg(test)]
impl NodeContext for LocalOnly {
    fn node_id(&self) -> String {
        self.node_id.clone()
    }

    fn state(&self, local: Value) -> Value {
        json!({
            "nodes": [self.node_id],
            "instances": local.get("instances").cloned().unwrap_or_else(|| json!({})),
        })
    }
}

/// A model the node can run: where it is and what it is called.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSpec {
    /// The id clients use.
    pub id: String,
    /// Other names that reach it.
    pub aliases: Vec<String>,
    /// GGUF file or Hugging Face folder.
    pub path: PathBuf,
    /// OpenAI's `owned_by`.
    pub owned_by: String,
}

impl ModelSpec {
    /// Whether `name` names this model (its id, an alias, or its path).
    pub fn answers_to(&self, name: &str) -> bool {
        self.id == name || self.aliases.iter().any(|a| a == name) || Path::new(name) == self.path
    }

    fn names(&self) -> impl Iterator<Item = &String> {
        std::iter::once(&self.id).chain(self.aliases.iter())
    }
}

/// What the node knows of a model's files, read once per instance: enough to build prompts.
struct ModelFacts {
    tokenizer: Tokenizer,
    context_length: usize,
    num_layers: usize,
}

impl ModelFacts {
    fn read(path: &Path) -> Result<ModelFacts, String> {
        let opened = inference::engine::open_model(path).map_err(|e| e.to_string())?;
        Ok(ModelFacts {
            tokenizer: opened.tokenizer,
            context_length: opened.config.max_position_embeddings,
            num_layers: opened.config.num_layers,
        })
    }
}

/// One model instance on this node: a whole model in one runner process.
pub struct LocalInstance {
    /// Instance id (path-friendly).
    pub id: String,
    /// The model it serves.
    pub model: ModelSpec,
    /// Its runner.
    pub runner: Supervisor,
    facts: Arc<ModelFacts>,
}

impl LocalInstance {
    fn is_ready(&self) -> bool {
        matches!(
            self.runner.current_state(),
            RunnerState::Ready | RunnerState::Running
        )
    }

    fn to_json(&self, node_id: &str) -> Value {
        json!({
            "instance_id": self.id,
            "model_id": self.model.id,
            "model_path": self.model.path.display().to_string(),
            "sharding": "pipeline",
            "instance_meta": "mlx_ring",
            "ranks": [{
                "node": node_id,
                "start_layer": 0,
                "end_layer": self.facts.num_layers,
            }],
            "runners": { node_id: self.runner.current_state() },
            "runner_pid": self.runner.pid(),
            "queued_requests": self.runner.load(),
        })
    }
}

/// The gateway's backend on a node: local instances and their runners.
pub struct NodeBackend {
    context: Arc<dyn NodeContext>,
    runner_command: RunnerCommand,
    default_model: PathBuf,
    instances: Mutex<BTreeMap<String, Arc<LocalInstance>>>,
    next_instance: AtomicU64,
}

impl NodeBackend {
    /// A backend with no instance yet. `runner_command` starts runner processes;
    /// `default_model` is the file served as `default`.
    pub fn new(
        context: Arc<dyn NodeContext>,
        runner_command: RunnerCommand,
        default_model: PathBuf,
    ) -> NodeBackend {
        NodeBackend {
            context,
            runner_command,
            default_model,
            instances: Mutex::new(BTreeMap::new()),
            next_instance: AtomicU64::new(1),
        }
    }

    fn default_spec(&self) -> ModelSpec {
        ModelSpec {
            id: DEFAULT_MODEL_ID.into(),
            aliases: vec![DEFAULT_MODEL_NAME.into()],
            path: self.default_model.clone(),
            owned_by: "HuggingFaceTB".into(),
        }
    }

    /// The model a name refers to: the default model by its names, or a file or folder
    /// that exists. `None` for anything else.
    pub fn resolve_model(&self, name: &str) -> Option<ModelSpec> {
        let default = self.default_spec();
        if default.answers_to(name) {
            return Some(default);
        }
        let path = Path::new(name);
        if !path.exists() {
            return None;
        }
        let file_name = path.file_name()?.to_string_lossy().into_owned();
        let id = file_name
            .strip_suffix(".gguf")
            .unwrap_or(&file_name)
            .to_string();
        Some(ModelSpec {
            id,
            aliases: vec![],
            path: path.to_path_buf(),
            owned_by: "local".into(),
        })
    }

    fn instances(&self) -> Vec<Arc<LocalInstance>> {
        let map = self.instances.lock().unwrap_or_else(|e| e.into_inner());
        map.values().cloned().collect()
    }

    /// The instance with this id.
    pub fn instance_handle(&self, id: &str) -> Option<Arc<LocalInstance>> {
        let map = self.instances.lock().unwrap_or_else(|e| e.into_inner());
        map.get(id).cloned()
    }

    /// Creates an instance of `model` (a name [`NodeBackend::resolve_model`] knows) on this
    /// node and starts its runner; answers at once, while the runner loads.
    pub async fn place_local(&self, model: &str) -> Result<Arc<LocalInstance>, ApiError> {
        let Some(spec) = self.resolve_model(model) else {
            return Err(ApiError::model_not_found(model, &self.model_ids()));
        };
        let path = spec.path.clone();
        let facts = tokio::task::spawn_blocking(move || ModelFacts::read(&path))
            .await
            .map_err(|e| ApiError::internal(format!("reading the model failed: {e}")))?
            .map_err(|e| {
                ApiError::new(
                    ErrorKind::Unavailable,
                    format!(
                        "cannot read model `{}` at {}: {e} (for the default model, run \
                         `cargo xtask setup`)",
                        spec.id,
                        spec.path.display()
                    ),
                )
                .with_code("model_unreadable")
            })?;
        let runner = Supervisor::start(&self.runner_command, &spec.path.to_string_lossy())
            .map_err(|e| {
                ApiError::internal(format!(
                    "cannot start a runner process ({}): {e}",
                    self.runner_command.program.display()
                ))
            })?;
        let n = self.next_instance.fetch_add(1, Ordering::SeqCst);
        let id = format!("{}-{n}", instance_slug(&spec.id));
        let instance = Arc::new(LocalInstance {
            id: id.clone(),
            model: spec,
            runner,
            facts: Arc::new(facts),
        });
        self.instances
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.clone(), instance.clone());
        tracing::info!(instance = %id, model = %instance.model.id, "instance placed on this node");
        Ok(instance)
    }

    /// Stops every instance's runner (node shutdown).
    pub async fn shutdown(&self) {
        let all: Vec<_> = {
            let mut map = self.instances.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::take(&mut *map).into_values().collect()
        };
        for instance in all {
            instance.runner.shutdown(SHUTDOWN_GRACE).await;
        }
    }

    fn model_infos(&self) -> Vec<ModelInfo> {
        let mut models: BTreeMap<String, ModelInfo> = BTreeMap::new();
        let mut add = |spec: &ModelSpec, ready: bool| {
            for name in spec.names() {
                let entry = models.entry(name.clone()).or_insert_with(|| ModelInfo {
                    id: name.clone(),
                    created: 0,
                    owned_by: spec.owned_by.clone(),
                    ready: false,
                });
                entry.ready |= ready;
            }
        };
        add(&self.default_spec(), false);
        for instance in self.instances() {
            add(&instance.model, instance.is_ready());
        }
        models.into_values().collect()
    }

    fn model_ids(&self) -> Vec<String> {
        self.model_infos().into_iter().map(|m| m.id).collect()
    }

    /// The ready instance of `model` with the fewest requests waiting.
    fn pick_instance(&self, model: &str) -> Result<Arc<LocalInstance>, ApiError> {
        let candidates: Vec<_> = self
            .instances()
            .into_iter()
            .filter(|i| i.model.answers_to(model))
            .collect();
        if candidates.is_empty() {
            return Err(match self.resolve_model(model) {
                Some(_) => ApiError::no_instance(model),
                None => ApiError::model_not_found(model, &self.model_ids()),
            });
        }
        let failed: Vec<String> = candidates
            .iter()
            .filter_map(|i| match i.runner.current_state() {
                RunnerState::Failed { reason } => Some(format!("{}: {reason}", i.id)),
                _ => None,
            })
            .collect();
        let all_failed = failed.len() == candidates.len();
        candidates
            .into_iter()
            .filter(|i| i.is_ready())
            .min_by_key(|i| i.runner.load())
            .ok_or_else(|| {
                let mut e = ApiError::no_instance(model);
                if all_failed {
                    e.message = format!(
                        "every instance of model `{model}` failed ({}); delete it with DELETE \
                         /instance/{{id}} and create a new one with POST /place_instance \
                         {{\"model_id\": \"{model}\"}}",
                        failed.join("; ")
                    );
                }
                e
            })
    }
}

/// A path-friendly form of a model id for instance ids.
fn instance_slug(model_id: &str) -> String {
    model_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect()
}

/// Builds the engine's request from the gateway's: the prompt as token ids, and the sampling
/// settings the request gave (the engine's defaults, greedy among them, for the others).
fn generate_request(
    request: &ChatRequest,
    facts: &ModelFacts,
) -> Result<GenerateRequest, ApiError> {
    let messages: Vec<inference::ChatMessage> = request
        .messages
        .iter()
        .map(|m| {
            // Templates know `system`; OpenAI's newer `developer` role means the same.
            let role = if m.role == "developer" {
                "system"
            } else {
                &m.role
            };
            inference::ChatMessage::new(role, m.content.clone())
        })
        .collect();
    let text = facts
        .tokenizer
        .apply_chat_template(&messages, true)
        .map_err(|e| {
            ApiError::invalid_field("messages", format!("cannot apply the chat template: {e}"))
        })?;
    let ids = facts
        .tokenizer
        .encode(&text)
        .map_err(|e| ApiError::internal(format!("tokenizing the prompt failed: {e}")))?;
    if ids.len() >= facts.context_length {
        return Err(ApiError::invalid_field(
            "messages",
            format!(
                "the prompt is {} tokens, the model's context is {}; shorten the conversation",
                ids.len(),
                facts.context_length
            ),
        )
        .with_code("context_length_exceeded"));
    }
    let s = &request.sampling;
    let max_tokens = s
        .max_tokens
        .map(|m| m as usize)
        .unwrap_or(facts.context_length);
    let mut out = GenerateRequest::new(Prompt::Tokens(ids), max_tokens);
    out.ignore_eos = s.ignore_eos;
    let p = &mut out.sampling;
    if let Some(t) = s.temperature {
        p.temperature = t;
    }
    if let Some(v) = s.top_p {
        p.top_p = v;
    }
    if let Some(v) = s.top_k {
        p.top_k = v as usize;
    }
    if let Some(v) = s.min_p {
        p.min_p = v;
    }
    p.seed = s.seed;
    if let Some(v) = s.presence_penalty {
        p.presence_penalty = v;
    }
    if let Some(v) = s.frequency_penalty {
        p.frequency_penalty = v;
    }
    p.validate()
        .map_err(|e| ApiError::new(ErrorKind::InvalidRequest, e.to_string()))?;
    Ok(out)
}

/// Relays a runner's events for one request into the gateway's stream.
async fn relay(
    mut events: tokio::sync::mpsc::UnboundedReceiver<GenerationEvent>,
    tx: gateway::ChatEventSender,
    want_logprobs: bool,
) {
    while let Some(event) = events.recv().await {
        let item = match event {
            GenerationEvent::Token { text, logprob, .. } => {
                let logprob = want_logprobs.then(|| TokenLogprob {
                    token: text.clone(),
                    logprob,
                    top: vec![],
                });
                Ok(ChatEvent::Token { text, logprob })
            }
            GenerationEvent::Done(completion) => Ok(ChatEvent::Done {
                finish_reason: match completion.finish_reason {
                    inference::FinishReason::Length => FinishReason::Length,
                    inference::FinishReason::Stop | inference::FinishReason::Cancelled => {
                        FinishReason::Stop
                    }
                },
                completion_tokens: completion.tokens.len() as u32,
            }),
            GenerationEvent::Failed(GenerationFailure::InstanceLost(reason)) => {
                Err(ApiError::instance_lost(reason))
            }
            GenerationEvent::Failed(GenerationFailure::Rejected(message)) => Err(
                ApiError::internal(format!("the model could not generate: {message}")),
            ),
        };
        let last = !matches!(item, Ok(ChatEvent::Token { .. }));
        if tx.send(item).await.is_err() || last {
            // Gateway gone (dropping `events` cancels the request) or stream complete.
            return;
        }
    }
    let _ = tx
        .send(Err(ApiError::instance_lost(
            "the runner's supervisor stopped",
        )))
        .await;
}

impl Backend for NodeBackend {
    fn node_id(&self) -> String {
        self.context.node_id()
    }

    fn state(&self) -> BoxFuture<'_, Value> {
        Box::pin(async move {
            let node_id = self.context.node_id();
            let instances: serde_json::Map<String, Value> = self
                .instances()
                .iter()
                .map(|i| (i.id.clone(), i.to_json(&node_id)))
                .collect();
            self.context.state(json!({ "instances": instances }))
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
            if request.min_nodes > 1 {
                return Err(ApiError::new(
                    ErrorKind::Unavailable,
                    format!(
                        "min_nodes is {} but this node serves alone (1 node); start more nodes \
                         or ask for min_nodes 1",
                        request.min_nodes
                    ),
                )
                .with_param("min_nodes")
                .with_code("not_enough_nodes"));
            }
            let instance = self.place_local(&request.model_id).await?;
            Ok(instance.to_json(&self.context.node_id()))
        })
    }

    fn create_instance(&self, instance: Value) -> BoxFuture<'_, Result<Value, ApiError>> {
        Box::pin(async move {
            let model = instance
                .get("model_id")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::missing_field("model_id"))?;
            let created = self.place_local(model).await?;
            Ok(created.to_json(&self.context.node_id()))
        })
    }

    fn instance_previews(&self, model_id: String) -> BoxFuture<'_, Result<Value, ApiError>> {
        Box::pin(async move {
            let Some(spec) = self.resolve_model(&model_id) else {
                return Err(ApiError::model_not_found(&model_id, &self.model_ids()));
            };
            let path = spec.path.clone();
            let facts = tokio::task::spawn_blocking(move || ModelFacts::read(&path))
                .await
                .map_err(|e| ApiError::internal(e.to_string()))?
                .map_err(|e| ApiError::new(ErrorKind::Unavailable, e))?;
            let node_id = self.context.node_id();
            let previews: Vec<Value> = ["pipeline", "tensor"]
                .iter()
                .map(|sharding| {
                    json!({
                        "model_id": spec.id,
                        "sharding": sharding,
                        "instance_meta": "mlx_ring",
                        "node_count": 1,
                        // A ring of one runs pipeline whatever was asked.
                        "placement": {
                            "sharding": "pipeline",
                            "ranks": [{"node": node_id, "start_layer": 0, "end_layer": facts.num_layers}],
                        },
                        "error": null,
                    })
                })
                .collect();
            Ok(json!({ "previews": previews }))
        })
    }

    fn instance(&self, id: String) -> BoxFuture<'_, Result<Value, ApiError>> {
        Box::pin(async move {
            self.instance_handle(&id)
                .map(|i| i.to_json(&self.context.node_id()))
                .ok_or_else(|| instance_not_found(&id))
        })
    }

    fn delete_instance(&self, id: String) -> BoxFuture<'_, Result<Value, ApiError>> {
        Box::pin(async move {
            let removed = self
                .instances
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
            let instance = removed.ok_or_else(|| instance_not_found(&id))?;
            let answer = instance.to_json(&self.context.node_id());
            instance.runner.shutdown(SHUTDOWN_GRACE).await;
            tracing::info!(instance = %id, "instance deleted");
            Ok(json!({ "deleted": answer }))
        })
    }

    fn chat(
        &self,
        request: ChatRequest,
        cancel: CancellationToken,
    ) -> BoxFuture<'_, Result<ChatStream, ApiError>> {
        Box::pin(async move {
            let instance = self.pick_instance(&request.model)?;
            let facts = instance.facts.clone();
            let want_logprobs = request.sampling.logprobs.is_some();
            let generate = tokio::task::spawn_blocking(move || generate_request(&request, &facts))
                .await
                .map_err(|e| ApiError::internal(format!("building the prompt failed: {e}")))??;
            let prompt_tokens = match &generate.prompt {
                Prompt::Tokens(ids) => ids.len() as u32,
                _ => 0,
            };
            let events = instance.runner.generate(generate, cancel);
            let (tx, stream) = ChatStream::channel(prompt_tokens, 64);
            tokio::spawn(relay(events, tx, want_logprobs));
            Ok(stream)
        })
    }
}

fn instance_not_found(id: &str) -> ApiError {
    ApiError::new(
        ErrorKind::NotFound,
        format!("no instance `{id}` on this node; see GET /state for the instances"),
    )
    .with_code("instance_not_found")
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
                env: vec![],
            },
            "/nonexistent/SmolLM2-135M-Instruct.Q4_1.gguf".into(),
        )
    }

    #[test]
    fn default_model_answers_to_both_names() {
        let b = backend();
        for name in [DEFAULT_MODEL_ID, DEFAULT_MODEL_NAME] {
            let spec = b.resolve_model(name).expect(name);
            assert_eq!(spec.id, DEFAULT_MODEL_ID);
        }
        assert!(b.resolve_model("no-such-model").is_none());
    }

    #[test]
    fn models_list_default_names_not_ready() {
        let b = backend();
        let models = b.model_infos();
        let ids: Vec<_> = models.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(ids, vec![DEFAULT_MODEL_NAME, DEFAULT_MODEL_ID]);
        assert!(models.iter().all(|m| !m.ready));
    }

    #[test]
    fn unknown_model_is_404_listing_models_and_known_model_without_instance_is_503() {
        let b = backend();
        let e = b.pick_instance("gpt-4").err().expect("error");
        assert_eq!(e.code.as_deref(), Some("model_not_found"));
        assert!(e.message.contains(DEFAULT_MODEL_ID), "{}", e.message);
        let e = b.pick_instance(DEFAULT_MODEL_ID).err().expect("error");
        assert_eq!(e.code.as_deref(), Some("no_instance"));
        assert_eq!(e.status().as_u16(), 503);
    }

    #[test]
    fn instance_ids_are_path_friendly() {
        assert_eq!(instance_slug("Foo/Bar 7B.Q4"), "foo-bar-7b.q4");
    }
}
