//! A scripted [`Backend`] for tests, examples and benchmarks: no model, no cluster, just
//! deterministic token streams chosen by the last user message. The `shoal` binary never uses
//! it.
//!
//! Scripts (the last user message):
//! - `echo: TEXT` streams TEXT back in 3-character tokens;
//! - `think: THOUGHT | ANSWER` streams `<think>\nTHOUGHT\n</think>\n\nANSWER`, as a model
//!   that reasons does;
//! - `opened: THOUGHT | ANSWER` streams `THOUGHT\n</think>\n\nANSWER` as the answer to a
//!   prompt whose template opened the thought (DeepSeek-R1 distills'), and says so in the
//!   stream's [`dialects::answer::AnswerForm`];
//! - `params` streams the received request's sampling settings as JSON (stop strings as
//!   lists of character codes, so that they do not stop the answer);
//! - `call: NAME {ARGS}` streams a Hermes-style tool call, `<tool_call>\n{"name": "NAME",
//!   "arguments": {ARGS}}\n</tool_call>`, as Qwen writes one (several `call:` scripts joined by
//!   ` && ` stream several calls, after the text of an `echo:` before them, if any); with a
//!   `tool_choice` that forces a call, the part of that text the node would have forced
//!   into the prompt (`dialects::tools::forced`, Hermes' opening) is not streamed but primed,
//!   as a real node does;
//! - `pieces: ["a", "b", ...]` streams each string of the JSON array as one token (a token
//!   stream recorded from a real tokenizer and its detokenizer, replayed);
//!   `pieces: {"form": FORM, "pieces": [...]}` does the same as the answer of a node whose
//!   template and prompt gave that [`dialects::answer::AnswerForm`] (its dialect, a thought the
//!   prompt opened), so that a family's own dialect parses it;
//! - `request` streams what the request carried for tools, as JSON: `tools`, `tool_choice`,
//!   `enable_thinking`, `reasoning_effort` and each message's role, content and tool fields;
//! - `fail after N` streams N tokens, then fails as a lost instance;
//! - `vanish` streams 2 tokens, then ends the stream without `Done`;
//! - `wait MS` waits MS milliseconds, then streams `done`;
//! - anything else: 16 words drawn from the request's seed (seed 0 for a greedy request,
//!   `temperature: 0`, without one; a fresh one otherwise), so equal seeds give equal answers.

use crate::backend::{
    Backend, BoxFuture, CancellationToken, ChatEvent, ChatRequest, ChatStream,
    CreateInstanceRequest, FinishReason, ModelInfo, PlaceInstanceRequest, TokenLogprob,
};
use crate::error::{echo, ApiError, ErrorKind};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The model every [`FakeBackend`] serves.
pub const FAKE_MODEL: &str = "fake/model";
/// A model the fake backend knows but has no instance of (chat answers 503).
pub const FAKE_IDLE_MODEL: &str = "fake/idle-model";

const WORDS: &[&str] = &[
    "river", "stone", "cloud", "ember", "maple", "harbor", "lantern", "meadow", "copper", "willow",
    "falcon", "quartz", "saffron", "tundra", "violet", "zephyr",
];

/// How many chats the fake backend saw, and how they ended.
#[derive(Debug, Default)]
pub struct FakeCounters {
    /// Chats accepted.
    pub started: AtomicU64,
    /// Chats that saw their cancellation token fire before finishing their script.
    pub cancelled: AtomicU64,
    /// Chats whose script ran to its end.
    pub finished: AtomicU64,
}

/// See the module documentation.
pub struct FakeBackend {
    node_id: String,
    token_delay: Duration,
    models: Mutex<BTreeMap<String, bool>>,
    instances: Mutex<BTreeMap<String, Value>>,
    next_instance: AtomicU64,
    next_seed: AtomicU64,
    /// Shared with tests, to observe cancellations.
    pub counters: Arc<FakeCounters>,
}

impl FakeBackend {
    /// A fake node serving [`FAKE_MODEL`] and knowing [`FAKE_IDLE_MODEL`], sleeping
    /// `token_delay` before each token.
    pub fn new(token_delay: Duration) -> FakeBackend {
        let models = BTreeMap::from([
            (FAKE_MODEL.to_string(), true),
            (FAKE_IDLE_MODEL.to_string(), false),
        ]);
        FakeBackend {
            node_id: "fake-node-0".into(),
            token_delay,
            models: Mutex::new(models),
            instances: Mutex::new(BTreeMap::new()),
            next_instance: AtomicU64::new(1),
            next_seed: AtomicU64::new(0x5eed),
            counters: Arc::new(FakeCounters::default()),
        }
    }

    fn model_ids(&self) -> Vec<String> {
        self.models
            .lock()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }

    fn check_model(&self, model: &str) -> Result<bool, ApiError> {
        let ready = self.models.lock().ok().and_then(|m| m.get(model).copied());
        ready.ok_or_else(|| ApiError::model_not_found(model, &self.model_ids()))
    }

    fn script(&self, request: &ChatRequest) -> Script {
        let last = request
            .messages
            .iter()
            .rev()
            .find(|m| m.role == "user")
            .map(|m| m.content.trim().to_string())
            .unwrap_or_default();
        let chunks = |text: &str| -> Vec<String> {
            let chars: Vec<char> = text.chars().collect();
            chars.chunks(3).map(|c| c.iter().collect()).collect()
        };
        if last.starts_with("call:") || (last.starts_with("echo:") && last.contains(" && call:")) {
            let mut text = String::new();
            for part in last.split(" && ") {
                if let Some(t) = part.strip_prefix("echo:") {
                    text.push_str(t.trim_start());
                } else if let Some(call) = part.strip_prefix("call:") {
                    let (name, args) = call.trim().split_once(' ').unwrap_or((call.trim(), "{}"));
                    text.push_str(&format!(
                        "<tool_call>\n{{\"name\": \"{name}\", \"arguments\": {}}}\n</tool_call>",
                        args.trim()
                    ));
                }
            }
            let mut form = dialects::answer::AnswerForm::default();
            crate::tools::forced_call::apply(request, None, &mut String::new(), &mut form, &|n| {
                n.to_string()
            });
            if let Some(rest) = text.strip_prefix(form.primed.as_str()) {
                if !form.primed.is_empty() {
                    return Script {
                        primed: form.primed,
                        ..Script::tokens(chunks(rest))
                    };
                }
            }
            return Script::tokens(chunks(&text));
        }
        if let Some(text) = last.strip_prefix("echo:") {
            return Script::tokens(chunks(text.trim_start()));
        }
        if let Some(recorded) = last
            .strip_prefix("pieces:")
            .and_then(|p| serde_json::from_str::<Recorded>(p.trim()).ok())
        {
            return match recorded {
                Recorded::Pieces(pieces) => Script::tokens(pieces),
                Recorded::WithForm { form, pieces } => Script {
                    opens_in_thought: form.opens_in_thought,
                    dialect: form.dialect,
                    ..Script::tokens(pieces)
                },
            };
        }
        if let Some((thought, answer)) =
            last.strip_prefix("opened:").and_then(|t| t.split_once('|'))
        {
            let text = format!("{}\n</think>\n\n{}", thought.trim(), answer.trim());
            return Script {
                opens_in_thought: true,
                ..Script::tokens(chunks(&text))
            };
        }
        if let Some((thought, answer)) = last.strip_prefix("think:").and_then(|t| t.split_once('|'))
        {
            let text = format!("<think>\n{}\n</think>\n\n{}", thought.trim(), answer.trim());
            return Script::tokens(chunks(&text));
        }
        if last == "request" {
            let seen = json!({
                "tools": request.tools,
                "tool_choice": request.tool_choice,
                "enable_thinking": request.enable_thinking,
                "reasoning_effort": request.reasoning_effort,
                "messages": request.messages,
            });
            return Script::tokens(chunks(&seen.to_string()));
        }
        if last == "params" {
            // Stop strings go out as their characters' codes, or they would stop this answer.
            let mut params = serde_json::to_value(&request.sampling).unwrap_or_default();
            let codes: Vec<Vec<u32>> = request
                .sampling
                .stop
                .iter()
                .map(|s| s.chars().map(u32::from).collect())
                .collect();
            params["stop"] = json!(codes);
            let text = params.to_string();
            return Script::tokens(chunks(&text));
        }
        if let Some(n) = last
            .strip_prefix("fail after ")
            .and_then(|n| n.parse().ok())
        {
            return Script {
                tokens: vec!["tok ".to_string(); n],
                end: ScriptEnd::Fail,
                wait: Duration::ZERO,
                opens_in_thought: false,
                dialect: Default::default(),
                primed: String::new(),
            };
        }
        if last == "vanish" {
            return Script {
                tokens: vec!["a".into(), "b".into()],
                end: ScriptEnd::Vanish,
                wait: Duration::ZERO,
                opens_in_thought: false,
                dialect: Default::default(),
                primed: String::new(),
            };
        }
        if let Some(ms) = last.strip_prefix("wait ").and_then(|n| n.parse().ok()) {
            return Script {
                tokens: vec!["done".into()],
                end: ScriptEnd::Done,
                wait: Duration::from_millis(ms),
                opens_in_thought: false,
                dialect: Default::default(),
                primed: String::new(),
            };
        }
        // Greedy decoding (temperature 0) is deterministic without a seed too.
        let greedy = (request.sampling.temperature == Some(0.0)).then_some(0);
        let mut state = request
            .sampling
            .seed
            .or(greedy)
            .unwrap_or_else(|| self.next_seed.fetch_add(1, Ordering::Relaxed))
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            | 1;
        let words = (0..16)
            .map(|i| {
                // xorshift64: deterministic for a seed.
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let word = WORDS[(state % WORDS.len() as u64) as usize];
                if i == 0 {
                    word.to_string()
                } else {
                    format!(" {word}")
                }
            })
            .collect();
        Script::tokens(words)
    }
}

/// A `pieces:` script: the pieces alone, or with the answer's form.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Recorded {
    Pieces(Vec<String>),
    WithForm {
        form: dialects::answer::AnswerForm,
        pieces: Vec<String>,
    },
}

enum ScriptEnd {
    Done,
    Fail,
    Vanish,
}

struct Script {
    tokens: Vec<String>,
    end: ScriptEnd,
    wait: Duration,
    /// The answer starts inside a thought the prompt opened.
    opens_in_thought: bool,
    /// How the model writes its calls.
    dialect: dialects::tools::dialect::Dialect,
    /// A forced call's opening, which the prompt would end with.
    primed: String,
}

impl Script {
    fn tokens(tokens: Vec<String>) -> Script {
        Script {
            tokens,
            end: ScriptEnd::Done,
            wait: Duration::ZERO,
            opens_in_thought: false,
            dialect: Default::default(),
            primed: String::new(),
        }
    }
}

impl Backend for FakeBackend {
    fn node_id(&self) -> String {
        self.node_id.clone()
    }

    fn state(&self) -> BoxFuture<'_, Value> {
        Box::pin(async move {
            let instances = self.instances.lock().map(|i| i.clone()).unwrap_or_default();
            json!({
                "nodes": { &self.node_id: { "memory": { "total": 17_179_869_184u64, "available": 8_589_934_592u64 }, "ips": ["127.0.0.1"] } },
                "instances": instances,
                "models": self.model_ids(),
            })
        })
    }

    fn models(&self) -> BoxFuture<'_, Vec<ModelInfo>> {
        Box::pin(async move {
            let models = self.models.lock().map(|m| m.clone()).unwrap_or_default();
            models
                .into_iter()
                .map(|(id, ready)| ModelInfo {
                    id,
                    created: 0,
                    owned_by: "fake".into(),
                    ready,
                    shape: None,
                })
                .collect()
        })
    }

    fn place_instance(
        &self,
        request: PlaceInstanceRequest,
    ) -> BoxFuture<'_, Result<Value, ApiError>> {
        Box::pin(async move {
            self.check_model(&request.model_id)?;
            let id = format!(
                "instance-{}",
                self.next_instance.fetch_add(1, Ordering::Relaxed)
            );
            let instance = json!({
                "instance_id": id,
                "model_id": request.model_id,
                "sharding": crate::exo::sharding_name(request.sharding),
                "instance_meta": crate::exo::instance_meta_name(request.instance_meta),
                "nodes": [self.node_id],
            });
            if let Ok(mut i) = self.instances.lock() {
                i.insert(id, instance.clone());
            }
            if let Ok(mut m) = self.models.lock() {
                m.insert(request.model_id, true);
            }
            Ok(instance)
        })
    }

    fn create_instance(
        &self,
        request: CreateInstanceRequest,
    ) -> BoxFuture<'_, Result<Value, ApiError>> {
        Box::pin(async move {
            let id = request.instance_id.clone().ok_or_else(|| {
                ApiError::invalid_field(
                    "instance.instance_id",
                    "the instance needs an `instance_id`",
                )
            })?;
            let instance = json!({ "instance_id": id, "model_id": request.model_id });
            let mut instances = self
                .instances
                .lock()
                .map_err(|_| ApiError::internal("fake state poisoned"))?;
            if instances.contains_key(&id) {
                return Err(ApiError::new(
                    ErrorKind::Conflict,
                    format!("instance `{}` exists already", echo(&id)),
                ));
            }
            instances.insert(id, instance.clone());
            Ok(instance)
        })
    }

    fn instance_previews(&self, model_id: String) -> BoxFuture<'_, Result<Value, ApiError>> {
        Box::pin(async move {
            self.check_model(&model_id)?;
            Ok(json!({
                "previews": [
                    { "model_id": model_id, "sharding": "Pipeline", "instance_meta": "MlxRing", "nodes": 1,
                      "instance": { "instance_id": "preview-pipeline-1", "model_id": model_id } },
                    { "model_id": model_id, "sharding": "Tensor", "instance_meta": "MlxJaccl", "nodes": 1,
                      "error": "MlxJaccl needs Thunderbolt 5 links; this node has none" },
                ]
            }))
        })
    }

    fn instance(&self, id: String) -> BoxFuture<'_, Result<Value, ApiError>> {
        Box::pin(async move {
            let found = self.instances.lock().ok().and_then(|i| i.get(&id).cloned());
            found.ok_or_else(|| {
                ApiError::new(ErrorKind::NotFound, format!("no instance `{}`", echo(&id)))
            })
        })
    }

    fn delete_instance(&self, id: String) -> BoxFuture<'_, Result<Value, ApiError>> {
        Box::pin(async move {
            let removed = self.instances.lock().ok().and_then(|mut i| i.remove(&id));
            removed
                .map(|instance| json!({ "deleted": id, "instance": instance }))
                .ok_or_else(|| {
                    ApiError::new(ErrorKind::NotFound, format!("no instance `{}`", echo(&id)))
                })
        })
    }

    fn delete_model(&self, model: String) -> BoxFuture<'_, Result<Value, ApiError>> {
        Box::pin(async move {
            // The fake holds its idle model; the served one is in use by its instance.
            match model.as_str() {
                FAKE_IDLE_MODEL => Ok(json!({ "deleted": model, "freed_bytes": 0 })),
                FAKE_MODEL => Err(ApiError::new(
                    ErrorKind::Conflict,
                    format!("instance fake-instance uses `{model}`; delete it first"),
                )),
                _ => Err(ApiError::new(
                    ErrorKind::NotFound,
                    format!("this node holds no copy of `{}`", echo(&model)),
                )),
            }
        })
    }

    fn chat(
        &self,
        request: ChatRequest,
        cancel: CancellationToken,
    ) -> BoxFuture<'_, Result<ChatStream, ApiError>> {
        Box::pin(async move {
            if !self.check_model(&request.model)? {
                return Err(ApiError::no_instance(&request.model));
            }
            let prompt_tokens = request
                .messages
                .iter()
                .map(|m| m.content.split_whitespace().count() as u32 + 3)
                .sum();
            let script = self.script(&request);
            let max = request
                .sampling
                .max_tokens
                .map_or(usize::MAX, |m| m as usize);
            let logprobs = request.sampling.logprobs;
            let delay = self.token_delay;
            let counters = self.counters.clone();
            counters.started.fetch_add(1, Ordering::Relaxed);
            let (tx, stream) = ChatStream::channel(prompt_tokens, 16);
            let stream = stream.with_form(dialects::answer::AnswerForm {
                opens_in_thought: script.opens_in_thought,
                dialect: script.dialect,
                primed: script.primed.clone(),
            });
            tokio::spawn(async move {
                let run = async {
                    tokio::time::sleep(script.wait).await;
                    let mut sent = 0u32;
                    for (i, text) in script.tokens.into_iter().take(max).enumerate() {
                        tokio::time::sleep(delay).await;
                        let logprob = logprobs.map(|k| TokenLogprob {
                            token: text.clone(),
                            logprob: -0.1 * (i as f32 + 1.0),
                            top: (0..k)
                                .map(|j| (format!("alt{j}"), -1.0 - j as f32))
                                .collect(),
                            bytes: Vec::new(),
                        });
                        if tx
                            .send(Ok(ChatEvent::Token { text, logprob }))
                            .await
                            .is_err()
                        {
                            return false;
                        }
                        sent += 1;
                    }
                    let last = match script.end {
                        ScriptEnd::Done => Ok(ChatEvent::Done {
                            finish_reason: if sent as usize >= max {
                                FinishReason::Length
                            } else {
                                FinishReason::Stop
                            },
                            completion_tokens: sent,
                        }),
                        ScriptEnd::Fail => Err(ApiError::instance_lost(
                            "runner 0 exited (scripted failure)",
                        )),
                        ScriptEnd::Vanish => return true,
                    };
                    tx.send(last).await.is_ok()
                };
                tokio::select! {
                    biased;
                    () = cancel.cancelled() => { counters.cancelled.fetch_add(1, Ordering::Relaxed); }
                    completed = run => {
                        if completed {
                            counters.finished.fetch_add(1, Ordering::Relaxed);
                        } else {
                            counters.cancelled.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            });
            Ok(stream)
        })
    }
}
