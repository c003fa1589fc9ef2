//! [`NodeBackend`]: the node's implementation of the gateway's [`Backend`] trait over the
//! replicated state.
//!
//! - **Instances are intents in the state** (see [`control::intent`]): `POST /place_instance`
//!   computes a placement from the live nodes and the model's card, and writes the intent
//!   under this node's `instance/<id>`; `DELETE /instance/{id}` on any node writes that node's
//!   `deleted/<id>`. Every node computes every placement from the intents ([`control::view`]).
//! - **Runners** are started by the nodes that hold ranks, in the order the start-up plan
//!   gives ([`crate::reconcile`]).
//! - **Chat** goes to the ready instance of the model with the fewest queued requests: run
//!   here when this node holds its rank 0, else forwarded to that node ([`crate::forward`]).
//!
//! What the backend does not hold itself comes from a [`NodeContext`]: the node's id, the
//! state, writes of its own records, and connections to other nodes. The mesh supplies those
//! (src/node.rs); unit tests use an in-memory single node.
//!
//! **Prompts** are rendered with the model's chat template and tokenized on the node that
//! holds rank 0, so that the prompt size is known when the request is accepted
//! (`usage.prompt_tokens`, and a 400 for a prompt longer than the context); the runner
//! receives token ids.
//!
//! **Stop strings** are enforced by the gateway, not passed to the engine: the engine holds
//! back text that may start a stop string and releases it only at the end, and the gateway
//! counts every token event towards `max_tokens`, so text released late could be cut.

use crate::forward::LocalChat;
use crate::models::{ModelFacts, ModelSpec};
use crate::reconcile::{runner_state_json, LocalRunner};
use crate::supervisor::{GenerationEvent, GenerationFailure, RunnerCommand};
use control::{
    instance_slug, short, DeletedRecord, InstanceRecord, InstanceView, Intent, PlacementCache,
    Snapshot, DELETED_PREFIX, INSTANCE_PREFIX,
};
use gateway::{
    ApiError, Backend, BoxFuture, CancellationToken, ChatEvent, ChatRequest, ChatStream, ErrorKind,
    FinishReason, InstanceMeta, ModelInfo, PlaceInstanceRequest, TokenLogprob,
};
use inference::{GenerateRequest, Prompt};
use placement::{CollectiveBackend, Input, PlaceError, Request, RunnerStatus, Sharding};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// What the node knows beyond its own runners: supplied by the mesh (or a lone test node).
pub trait NodeContext: Send + Sync + 'static {
    /// This node's id (`GET /node_id`).
    fn node_id(&self) -> String;
    /// The replicated state now, with this node's liveness view.
    fn snapshot(&self) -> Snapshot;
    /// The state as `GET /state` shows it (before the instances are added).
    fn state_json(&self) -> Value;
    /// Writes this node's record `key`.
    fn write(&self, key: &str, value: &Value) -> Result<(), String>;
    /// Deletes this node's record `key`; true if it existed.
    fn remove(&self, key: &str) -> bool;
    /// Grows with every start of this node, so ids made now never repeat older ones.
    fn generation(&self) -> u64;
    /// Changes of the state, to react at once (the reconciler also ticks).
    fn subscribe(&self) -> Option<tokio::sync::broadcast::Receiver<mesh::Event>>;
    /// Sends `request` for instance `instance_id` to `node` (its rank 0) and streams the
    /// events back.
    fn forward_chat(
        &self,
        node: String,
        instance_id: String,
        request: ChatRequest,
        cancel: CancellationToken,
    ) -> BoxFuture<'_, Result<ChatStream, ApiError>>;
}

/// A node on its own (unit tests): its records in memory, always alive, and other authors'
/// parts of the state as the test sets them (no network).
#[cfg(test)]
pub struct LocalOnly {
    node_id: String,
    records: Mutex<BTreeMap<String, String>>,
    /// Other nodes' parts of the state.
    pub others: Mutex<BTreeMap<String, control::Author>>,
}

#[cfg(test)]
impl LocalOnly {
    /// A lone node with this id.
    pub fn new(node_id: impl Into<String>) -> LocalOnly {
        LocalOnly {
            node_id: node_id.into(),
            records: Mutex::default(),
            others: Mutex::default(),
        }
    }
}

#[cfg(test)]
impl NodeContext for LocalOnly {
    fn node_id(&self) -> String {
        self.node_id.clone()
    }

    fn snapshot(&self) -> Snapshot {
        let records = self.records.lock().unwrap().clone();
        let mut authors = self.others.lock().unwrap().clone();
        authors.insert(
            self.node_id.clone(),
            control::Author {
                alive: true,
                dead: false,
                records,
            },
        );
        Snapshot {
            me: self.node_id.clone(),
            authors,
        }
    }

    fn state_json(&self) -> Value {
        json!({ "node_id": self.node_id })
    }

    fn write(&self, key: &str, value: &Value) -> Result<(), String> {
        self.records
            .lock()
            .unwrap()
            .insert(key.to_string(), value.to_string());
        Ok(())
    }

    fn remove(&self, key: &str) -> bool {
        self.records.lock().unwrap().remove(key).is_some()
    }

    fn generation(&self) -> u64 {
        1
    }

    fn subscribe(&self) -> Option<tokio::sync::broadcast::Receiver<mesh::Event>> {
        None
    }

    fn forward_chat(
        &self,
        node: String,
        _instance_id: String,
        _request: ChatRequest,
        _cancel: CancellationToken,
    ) -> BoxFuture<'_, Result<ChatStream, ApiError>> {
        Box::pin(async move { Err(ApiError::internal(format!("no peer {node} here"))) })
    }
}

/// The gateway's backend on a node: the cluster's instances, and this node's runners.
pub struct NodeBackend {
    pub(crate) context: Arc<dyn NodeContext>,
    pub(crate) runner_command: RunnerCommand,
    pub(crate) default_model: PathBuf,
    /// This node's runners by instance id.
    pub(crate) runners: Mutex<BTreeMap<String, LocalRunner>>,
    /// This node's `runner/<id>` records as last written.
    pub(crate) published: Mutex<BTreeMap<String, String>>,
    /// Every instance's placement, computed once per (instance, epoch).
    pub(crate) placements: PlacementCache,
    /// Model facts by file, read once.
    facts: tokio::sync::Mutex<BTreeMap<PathBuf, Arc<ModelFacts>>>,
    next_instance: AtomicU64,
    /// Wakes the reconciler (a runner changed state, an instance was created or deleted).
    pub(crate) wake: Arc<tokio::sync::Notify>,
}

/// A placement failure as an API error: bad input is the client's (400), the rest is the
/// cluster's capacity (503), each with the placement's stable code.
fn place_error(e: &PlaceError) -> ApiError {
    let kind = match e {
        PlaceError::InvalidInput { .. } => ErrorKind::InvalidRequest,
        _ => ErrorKind::Unavailable,
    };
    ApiError::new(kind, format!("cannot place the instance: {e}")).with_code(e.code())
}

fn sharding_name(s: Sharding) -> &'static str {
    match s {
        Sharding::Pipeline => "Pipeline",
        Sharding::Tensor => "Tensor",
    }
}

fn meta_name(b: CollectiveBackend) -> &'static str {
    match b {
        CollectiveBackend::Ring => "MlxRing",
        CollectiveBackend::Jaccl => "MlxJaccl",
    }
}

fn instance_not_found(id: &str) -> ApiError {
    ApiError::new(
        ErrorKind::NotFound,
        format!("no instance `{id}`; see GET /state for the instances"),
    )
    .with_code("instance_not_found")
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
            default_model,
            runners: Mutex::default(),
            published: Mutex::default(),
            placements: PlacementCache::new(),
            facts: tokio::sync::Mutex::default(),
            next_instance: AtomicU64::new(1),
            wake: Arc::new(tokio::sync::Notify::new()),
        }
    }

    /// The model a user's name refers to on this node.
    pub fn resolve_model(&self, name: &str) -> Option<ModelSpec> {
        ModelSpec::resolve(name, &self.default_model)
    }

    /// The model an intent names, as this node finds it.
    pub(crate) fn spec_of(&self, reference: &str) -> ModelSpec {
        ModelSpec::of_reference(reference, &self.default_model)
    }

    /// The facts of the model at `path`, read once per file.
    async fn facts(&self, spec: &ModelSpec) -> Result<Arc<ModelFacts>, ApiError> {
        let mut cache = self.facts.lock().await;
        if let Some(f) = cache.get(&spec.path) {
            return Ok(f.clone());
        }
        let path = spec.path.clone();
        let facts = tokio::task::spawn_blocking(move || ModelFacts::read(&path))
            .await
            .map_err(|e| ApiError::internal(format!("reading the model failed: {e}")))?
            .map_err(|e| {
                ApiError::new(
                    ErrorKind::Unavailable,
                    format!(
                        "cannot read model `{}` at {} on node {}: {e} (for the default model, \
                         run `cargo xtask setup`)",
                        spec.id,
                        spec.path.display(),
                        short(&self.context.node_id())
                    ),
                )
                .with_code("model_unreadable")
            })?;
        let facts = Arc::new(facts);
        cache.insert(spec.path.clone(), facts.clone());
        Ok(facts)
    }

    /// This node's runner status for instance `id`, if it runs one.
    pub(crate) fn local_status(&self, id: &str) -> Option<RunnerStatus> {
        let runners = self.runners.lock().unwrap_or_else(|e| e.into_inner());
        runners.get(id).map(LocalRunner::status)
    }

    /// The placement input for `spec` on the live nodes now.
    async fn placement_input(&self, spec: &ModelSpec, request: Request) -> Result<Input, ApiError> {
        let facts = self.facts(spec).await?;
        let (nodes, edges) = crate::view::placement_nodes(&self.context.snapshot());
        Ok(Input {
            nodes,
            edges,
            model: facts.card(&spec.id),
            request,
        })
    }

    /// Creates an instance of `model`: places it on the live nodes and writes the intent.
    /// Answers the instance as `GET /instance/{id}` shows it.
    pub async fn create(
        &self,
        model: &str,
        sharding: Sharding,
        backend: CollectiveBackend,
        min_nodes: u32,
        required_nodes: Vec<String>,
    ) -> Result<Value, ApiError> {
        let Some(spec) = self.resolve_model(model) else {
            return Err(ApiError::model_not_found(model, &self.model_ids()));
        };
        let me = self.context.node_id();
        let n = self.next_instance.fetch_add(1, Ordering::SeqCst);
        let id = format!(
            "{}-{}-{:x}-{n}",
            instance_slug(&spec.id),
            &me[..8.min(me.len())],
            self.context.generation()
        );
        let request = Request {
            sharding,
            backend,
            min_nodes,
            required_nodes,
            instance_id: id.clone(),
        };
        let input = self.placement_input(&spec, request).await?;
        let record = InstanceRecord::new(Intent {
            instance_id: id.clone(),
            model: spec.reference.clone(),
            model_id: spec.id.clone(),
            created_by: me,
            input,
        });
        let placement = self
            .placements
            .place(&record)
            .map_err(|e| place_error(&e))?;
        let value = serde_json::to_value(&record)
            .map_err(|e| ApiError::internal(format!("encoding the intent: {e}")))?;
        self.context
            .write(&format!("{INSTANCE_PREFIX}{id}"), &value)
            .map_err(|e| {
                ApiError::new(
                    ErrorKind::Unavailable,
                    format!("cannot record the instance in the state: {e}"),
                )
            })?;
        tracing::info!(instance = %id, model = %spec.id, ranks = placement.ranks.len(), "instance placed");
        self.wake.notify_one();
        let snapshot = self.context.snapshot();
        let view = InstanceView {
            record,
            placement: Ok(placement),
        };
        Ok(self.instance_json(&view, &snapshot))
    }

    /// The instance as the API shows it: intent, placement (or why none), and each rank's
    /// runner.
    fn instance_json(&self, view: &InstanceView, snapshot: &Snapshot) -> Value {
        let id = view.record.id();
        let mine = self.local_status(id);
        let intent = &view.record.intent;
        let spec = self.spec_of(&intent.model);
        let statuses = view.rank_statuses(snapshot, mine.as_ref());
        let (placement, error) = match &view.placement {
            Ok(p) => (serde_json::to_value(p).unwrap_or(Value::Null), Value::Null),
            Err(e) => (
                Value::Null,
                json!({"code": e.code(), "message": e.message()}),
            ),
        };
        let ranks: Vec<Value> = match &view.placement {
            Ok(p) => p
                .ranks
                .iter()
                .zip(&statuses)
                .enumerate()
                .map(|(rank, (r, (_, record)))| {
                    json!({
                        "rank": rank,
                        "node": r.node,
                        "start_layer": r.start_layer,
                        "end_layer": r.end_layer,
                        "runner": record.as_ref().map(|r| runner_state_json(&r.status)),
                        "queued_requests": record.as_ref().map(|r| r.queued),
                    })
                })
                .collect(),
            Err(_) => vec![],
        };
        let runners: serde_json::Map<String, Value> = statuses
            .iter()
            .filter_map(|(node, r)| {
                r.as_ref()
                    .map(|r| (node.clone(), runner_state_json(&r.status)))
            })
            .collect();
        let failure = view.failure(snapshot, mine.as_ref());
        let status = if view.is_ready(snapshot, mine.as_ref()) {
            "ready"
        } else if view.placement.is_err() {
            "unplaceable"
        } else if failure.is_some() {
            "failed"
        } else {
            "starting"
        };
        let pid = {
            let runners = self.runners.lock().unwrap_or_else(|e| e.into_inner());
            runners.get(id).and_then(LocalRunner::pid)
        };
        let queued = statuses
            .first()
            .and_then(|(_, r)| r.as_ref().map(|r| r.queued));
        let request = &view.record.placement_input().request;
        json!({
            "instance_id": id,
            "model_id": intent.model_id,
            "model": intent.model,
            "model_path": spec.path.display().to_string(),
            "sharding": sharding_name(request.sharding),
            "instance_meta": meta_name(request.backend),
            "min_nodes": intent.input.request.min_nodes,
            "created_by": intent.created_by,
            "epoch": view.record.epoch,
            "excluded": view.record.excluded,
            "status": status,
            "failure": failure,
            "placement": placement,
            "error": error,
            "ranks": ranks,
            "runners": runners,
            "runner_pid": pid,
            "queued_requests": queued,
        })
    }

    fn model_infos(&self, snapshot: &Snapshot) -> Vec<ModelInfo> {
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
        add(&ModelSpec::default_at(&self.default_model), false);
        for view in snapshot.instances(&self.placements).values() {
            let mine = self.local_status(view.record.id());
            add(
                &self.spec_of(&view.record.intent.model),
                view.is_ready(snapshot, mine.as_ref()),
            );
        }
        models.into_values().collect()
    }

    fn model_ids(&self) -> Vec<String> {
        let snapshot = self.context.snapshot();
        self.model_infos(&snapshot)
            .into_iter()
            .map(|m| m.id)
            .collect()
    }

    /// The ready instance of `model` with the fewest queued requests (this node's first on a
    /// tie): its id and its rank-0 node.
    fn pick_instance(&self, model: &str) -> Result<(String, String), ApiError> {
        let snapshot = self.context.snapshot();
        let me = snapshot.me.clone();
        let candidates: Vec<InstanceView> = snapshot
            .instances(&self.placements)
            .into_values()
            .filter(|v| self.spec_of(&v.record.intent.model).answers_to(model))
            .collect();
        if candidates.is_empty() {
            return Err(match self.resolve_model(model) {
                Some(_) => ApiError::no_instance(model),
                None => ApiError::model_not_found(model, &self.model_ids()),
            });
        }
        let mut failures = Vec::new();
        let mut best: Option<((usize, bool, String), String)> = None;
        for view in &candidates {
            let id = view.record.id().to_string();
            let mine = self.local_status(&id);
            if !view.is_ready(&snapshot, mine.as_ref()) {
                if let Some(f) = view.failure(&snapshot, mine.as_ref()) {
                    failures.push(format!("{id}: {f}"));
                }
                continue;
            }
            let Ok(placement) = &view.placement else {
                continue;
            };
            let rank0 = placement.ranks[0].node.clone();
            let load = if rank0 == me {
                let runners = self.runners.lock().unwrap_or_else(|e| e.into_inner());
                runners.get(&id).map_or(0, LocalRunner::load)
            } else {
                snapshot.runner(&rank0, &id).map_or(0, |r| r.queued)
            };
            let key = (load, rank0 != me, id);
            if best.as_ref().is_none_or(|(k, _)| key < *k) {
                best = Some((key, rank0));
            }
        }
        if let Some(((_, _, id), rank0)) = best {
            return Ok((id, rank0));
        }
        let mut e = ApiError::no_instance(model);
        if failures.len() == candidates.len() {
            e.message = format!(
                "every instance of model `{model}` failed ({}); delete it with DELETE \
                 /instance/{{id}} and create a new one with POST /place_instance \
                 {{\"model_id\": \"{model}\"}}",
                failures.join("; ")
            );
        }
        Err(e)
    }

    /// Runs `request` on instance `id`'s rank-0 runner on this node.
    pub async fn chat_here(
        &self,
        id: &str,
        request: ChatRequest,
        cancel: CancellationToken,
    ) -> Result<ChatStream, ApiError> {
        let (runner, model) = {
            let runners = self.runners.lock().unwrap_or_else(|e| e.into_inner());
            let local = runners.get(id).filter(|r| r.rank == 0);
            match local.and_then(|r| r.ready_supervisor().map(|s| (s, r.model.clone()))) {
                Some(found) => found,
                None => {
                    return Err(ApiError::new(
                        ErrorKind::Unavailable,
                        format!(
                            "instance `{id}` is not ready on node {} (its rank 0); retry",
                            short(&self.context.node_id())
                        ),
                    )
                    .with_code("no_instance"))
                }
            }
        };
        let facts = self.facts(&model).await?;
        let want_logprobs = request.sampling.logprobs.is_some();
        let generate = tokio::task::spawn_blocking(move || generate_request(&request, &facts))
            .await
            .map_err(|e| ApiError::internal(format!("building the prompt failed: {e}")))??;
        let prompt_tokens = match &generate.prompt {
            Prompt::Tokens(ids) => ids.len() as u32,
            _ => 0,
        };
        let events = runner.generate(generate, cancel);
        let (tx, stream) = ChatStream::channel(prompt_tokens, 64);
        tokio::spawn(relay(events, tx, want_logprobs));
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

    fn previews_for(&self, spec: &ModelSpec, base: &Input) -> Vec<Value> {
        let nodes = base.nodes.len().max(1);
        let mut out = Vec::new();
        for sharding in [Sharding::Pipeline, Sharding::Tensor] {
            for backend in [CollectiveBackend::Ring, CollectiveBackend::Jaccl] {
                for count in 1..=nodes {
                    let mut input = base.clone();
                    input.request = Request {
                        sharding,
                        backend,
                        min_nodes: count as u32,
                        required_nodes: vec![],
                        instance_id: placement::DEFAULT_INSTANCE_ID.into(),
                    };
                    let (placement, error) = match placement::place(&input) {
                        Ok(p) => (serde_json::to_value(p).unwrap_or(Value::Null), Value::Null),
                        Err(e) => (
                            Value::Null,
                            json!({"code": e.code(), "message": e.message()}),
                        ),
                    };
                    out.push(json!({
                        "model_id": spec.id,
                        "sharding": sharding_name(sharding),
                        "instance_meta": meta_name(backend),
                        "node_count": count,
                        "placement": placement,
                        "error": error,
                    }));
                }
            }
        }
        out
    }
}

/// Reads `sharding` / `instance_meta` / a count from an instance object, in exo's spelling
/// or the placement crate's.
fn field_str<'a>(v: &'a Value, name: &str) -> Option<&'a str> {
    v.get(name).and_then(Value::as_str)
}

fn parse_sharding(v: &Value) -> Result<Sharding, ApiError> {
    match field_str(v, "sharding")
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        None | Some("pipeline") => Ok(Sharding::Pipeline),
        Some("tensor") => Ok(Sharding::Tensor),
        Some(_) => Err(ApiError::invalid_field(
            "sharding",
            "`sharding` must be \"Pipeline\" or \"Tensor\"",
        )),
    }
}

fn parse_meta(v: &Value) -> Result<CollectiveBackend, ApiError> {
    match field_str(v, "instance_meta")
        .map(|s| s.to_ascii_lowercase().replace('_', ""))
        .as_deref()
    {
        None | Some("mlxring") | Some("ring") => Ok(CollectiveBackend::Ring),
        Some("mlxjaccl") | Some("jaccl") => Ok(CollectiveBackend::Jaccl),
        Some(_) => Err(ApiError::invalid_field(
            "instance_meta",
            "`instance_meta` must be \"MlxRing\" or \"MlxJaccl\"",
        )),
    }
}

/// `required_nodes` of an instance object: given, or the nodes of the preview's placement.
fn parse_required(v: &Value) -> Result<Vec<String>, ApiError> {
    let bad = || {
        ApiError::invalid_field(
            "required_nodes",
            "`required_nodes` must be a list of node ids",
        )
    };
    if let Some(list) = v.get("required_nodes").filter(|l| !l.is_null()) {
        return list
            .as_array()
            .ok_or_else(bad)?
            .iter()
            .map(|n| n.as_str().map(str::to_string).ok_or_else(bad))
            .collect();
    }
    Ok(v.pointer("/placement/ranks")
        .and_then(Value::as_array)
        .map(|ranks| {
            ranks
                .iter()
                .filter_map(|r| r.get("node").and_then(Value::as_str).map(str::to_string))
                .collect()
        })
        .unwrap_or_default())
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
            let snapshot = self.context.snapshot();
            let instances: serde_json::Map<String, Value> = snapshot
                .instances(&self.placements)
                .values()
                .map(|v| (v.record.id().to_string(), self.instance_json(v, &snapshot)))
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
            let snapshot = self.context.snapshot();
            self.model_infos(&snapshot)
        })
    }

    fn place_instance(
        &self,
        request: PlaceInstanceRequest,
    ) -> BoxFuture<'_, Result<Value, ApiError>> {
        Box::pin(async move {
            let sharding = match request.sharding {
                gateway::Sharding::Pipeline => Sharding::Pipeline,
                gateway::Sharding::Tensor => Sharding::Tensor,
            };
            let backend = match request.instance_meta {
                InstanceMeta::MlxRing => CollectiveBackend::Ring,
                InstanceMeta::MlxJaccl => CollectiveBackend::Jaccl,
            };
            self.create(
                &request.model_id,
                sharding,
                backend,
                request.min_nodes,
                vec![],
            )
            .await
        })
    }

    fn create_instance(&self, instance: Value) -> BoxFuture<'_, Result<Value, ApiError>> {
        Box::pin(async move {
            let model = field_str(&instance, "model_id")
                .or_else(|| field_str(&instance, "model"))
                .ok_or_else(|| ApiError::missing_field("model_id"))?
                .to_string();
            let sharding = parse_sharding(&instance)?;
            let backend = parse_meta(&instance)?;
            let min_nodes = instance
                .get("min_nodes")
                .or_else(|| instance.get("node_count"))
                .and_then(Value::as_u64)
                .map_or(1, |n| n.clamp(1, 1024) as u32);
            let required = parse_required(&instance)?;
            self.create(&model, sharding, backend, min_nodes, required)
                .await
        })
    }

    fn instance_previews(&self, model_id: String) -> BoxFuture<'_, Result<Value, ApiError>> {
        Box::pin(async move {
            let Some(spec) = self.resolve_model(&model_id) else {
                return Err(ApiError::model_not_found(&model_id, &self.model_ids()));
            };
            let base = self
                .placement_input(
                    &spec,
                    Request {
                        sharding: Sharding::Pipeline,
                        backend: CollectiveBackend::Ring,
                        min_nodes: 1,
                        required_nodes: vec![],
                        instance_id: placement::DEFAULT_INSTANCE_ID.into(),
                    },
                )
                .await?;
            let nodes: Vec<Value> = base
                .nodes
                .iter()
                .map(|n| json!({"node": n.id, "ram_available": n.ram_available, "ram_total": n.ram_total}))
                .collect();
            let previews = self.previews_for(&spec, &base);
            Ok(json!({
                "model_id": spec.id,
                "model": base.model,
                "nodes": nodes,
                "previews": previews,
            }))
        })
    }

    fn instance(&self, id: String) -> BoxFuture<'_, Result<Value, ApiError>> {
        Box::pin(async move {
            let snapshot = self.context.snapshot();
            let view = snapshot
                .instances(&self.placements)
                .remove(&id)
                .ok_or_else(|| instance_not_found(&id))?;
            Ok(self.instance_json(&view, &snapshot))
        })
    }

    fn delete_instance(&self, id: String) -> BoxFuture<'_, Result<Value, ApiError>> {
        Box::pin(async move {
            let snapshot = self.context.snapshot();
            let view = snapshot
                .instances(&self.placements)
                .remove(&id)
                .ok_or_else(|| instance_not_found(&id))?;
            let answer = self.instance_json(&view, &snapshot);
            let record = serde_json::to_value(DeletedRecord {
                instance_id: id.clone(),
            })
            .map_err(|e| ApiError::internal(e.to_string()))?;
            self.context
                .write(&format!("{DELETED_PREFIX}{id}"), &record)
                .map_err(|e| {
                    ApiError::new(
                        ErrorKind::Unavailable,
                        format!("cannot record the deletion in the state: {e}"),
                    )
                })?;
            self.context.remove(&format!("{INSTANCE_PREFIX}{id}"));
            self.wake.notify_one();
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
                env: vec![],
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

    #[test]
    fn instance_objects_name_their_nodes_by_list_or_by_preview() {
        let v = json!({"model_id": "default", "required_nodes": ["a"]});
        assert_eq!(parse_required(&v).unwrap(), vec!["a".to_string()]);
        let v =
            json!({"model_id": "default", "placement": {"ranks": [{"node": "b"}, {"node": "c"}]}});
        assert_eq!(
            parse_required(&v).unwrap(),
            vec!["b".to_string(), "c".to_string()]
        );
        assert!(parse_required(&json!({"required_nodes": "a"})).is_err());
        assert_eq!(
            parse_sharding(&json!({"sharding": "Tensor"})).unwrap(),
            Sharding::Tensor
        );
        assert_eq!(
            parse_meta(&json!({"instance_meta": "mlx_ring"})).unwrap(),
            CollectiveBackend::Ring
        );
        assert!(parse_meta(&json!({"instance_meta": "x"})).is_err());
    }

    #[test]
    fn placement_errors_map_to_statuses() {
        let e = place_error(&PlaceError::NoRingWithEnoughMemory {
            needed: 2,
            available: 1,
            min_nodes: 1,
        });
        assert_eq!(e.status().as_u16(), 503);
        assert_eq!(e.code.as_deref(), Some("no_ring_with_enough_memory"));
        let e = place_error(&PlaceError::InvalidInput {
            field: "nodes".into(),
            reason: "x".into(),
        });
        assert_eq!(e.status().as_u16(), 400);
    }
}
