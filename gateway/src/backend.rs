//! The seam between the HTTP layer and the rest of the node: the [`Backend`] trait.
//!
//! The gateway parses and validates requests, speaks OpenAI's and exo's shapes, streams SSE and
//! maps errors to statuses; everything that needs the cluster goes through this trait. The
//! `shoal` binary implements it over mesh (the replicated state), placement and inference:
//!
//! - **Routing and forwarding live behind [`Backend::chat`].** The implementation finds the
//!   instances of `request.model` in the replicated state, picks one by load (requests spread
//!   over several instances of one model), and either runs the request on the local runner or
//!   forwards it over an iroh stream to the node holding the instance's first rank, relaying
//!   the events it sends back. The gateway neither knows nor cares which happened.
//! - **Queueing lives behind it too.** The gateway never serialises requests: every request
//!   calls `chat` concurrently, and the backend queues or batches them on the instance. A
//!   request waiting in a queue simply produces no event yet; the gateway keeps the client's
//!   connection alive with SSE comments meanwhile.
//! - **Cancellation.** Each chat gets a [`CancellationToken`]. The gateway cancels it when the
//!   client disconnects (the response body is dropped), when a stop string matched or when
//!   `max_tokens` was reached. The backend should then stop generating and free the slot; a
//!   dropped event receiver means the same.
//!
//! Requests arrive typed ([`PlaceInstanceRequest`], [`CreateInstanceRequest`], [`ChatRequest`]).
//! Instance and preview answers travel as JSON values, so that a backend answers the shape it
//! has; the node's shapes are typed in [`crate::exo`].
//!
//! [`ChatRequest`] and [`ChatEvent`] are also what travels between nodes when a chat is
//! forwarded (their serde forms are that wire format; see [`ChatEvent`]).

use crate::error::ApiError;
pub use crate::exo::{CreateInstanceRequest, PlaceInstanceRequest};
pub use crate::response_format::ResponseFormat;
pub use crate::tools::{Tool, ToolCall, ToolChoice};
pub use dialects::answer::AnswerForm;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::future::Future;
use std::pin::Pin;
use tokio::sync::mpsc;
pub use tokio_util::sync::CancellationToken;

/// A boxed, sendable future: what the trait's async methods return, so that the trait stays
/// object-safe (`Arc<dyn Backend>`) without a macro.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What the cluster offers to the HTTP layer. Implemented once by the `shoal` binary (over mesh,
/// placement and inference) and by `fake::FakeBackend` in tests (the `test-support` feature).
///
/// Every method may be called from many connections at once.
pub trait Backend: Send + Sync + 'static {
    /// This node's id, as `GET /node_id` answers it (a JSON string). Peers probe it to verify
    /// topology edges, so it must be cheap and never fail.
    fn node_id(&self) -> String;

    /// The replicated state as JSON, as `GET /state` answers it. `GET /state/{path}` selects a
    /// subtree of this value, so keys should be path-friendly (node ids, instance ids).
    fn state(&self) -> BoxFuture<'_, Value>;

    /// The models chat can be asked for: those with an instance, and the known local ones
    /// (with `ready: false` when no instance serves them yet). Sorted by id.
    fn models(&self) -> BoxFuture<'_, Vec<ModelInfo>>;

    /// `POST /place_instance`: compute a placement for the request and write the instance intent
    /// into the state. Answers the created instance (JSON) or why it cannot be placed
    /// ([`ApiError`] with kind `Unavailable` for "not enough memory", `NotFound` for an
    /// unknown model, ...).
    fn place_instance(
        &self,
        request: PlaceInstanceRequest,
    ) -> BoxFuture<'_, Result<Value, ApiError>>;

    /// `POST /instance`: create the instance given (typically one taken from the previews).
    fn create_instance(
        &self,
        request: CreateInstanceRequest,
    ) -> BoxFuture<'_, Result<Value, ApiError>>;

    /// `GET /instance/previews?model_id=`: every sharding × backend × node count, each with its
    /// placement or the reason it is impossible, plus memory per node.
    fn instance_previews(&self, model_id: String) -> BoxFuture<'_, Result<Value, ApiError>>;

    /// `GET /instance/{id}`: the instance and its runners' states; `NotFound` if absent.
    fn instance(&self, id: String) -> BoxFuture<'_, Result<Value, ApiError>>;

    /// `DELETE /instance/{id}`: remove the instance (its runners shut down); answers what was
    /// deleted, `NotFound` if absent.
    fn delete_instance(&self, id: String) -> BoxFuture<'_, Result<Value, ApiError>>;

    /// `DELETE /models/{model_id}`: frees this node's downloaded copy of a Hugging Face model
    /// (its whole folder of the cache) and stops announcing it to the cluster. `Conflict` while
    /// an instance with a rank here, or a download here, uses it; `NotFound` if nothing is held.
    fn delete_model(&self, model: String) -> BoxFuture<'_, Result<Value, ApiError>>;

    /// Starts a chat completion. Resolve as soon as the request is accepted or refused:
    /// refusals are errors here, with their kind deciding the status (unknown model →
    /// [`ApiError::model_not_found`], no instance → [`ApiError::no_instance`]); waiting for a
    /// free slot happens inside the returned stream.
    ///
    /// The stream yields [`ChatEvent::Token`]s and ends with one [`ChatEvent::Done`]. An `Err`
    /// item (for instance [`ApiError::instance_lost`]) ends it with a failure; a stream that
    /// ends without `Done` is treated as a lost instance. After `cancel` fires, the backend may
    /// stop sending at any point.
    fn chat(
        &self,
        request: ChatRequest,
        cancel: CancellationToken,
    ) -> BoxFuture<'_, Result<ChatStream, ApiError>>;
}

/// A model as `GET /v1/models` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelInfo {
    /// The id clients put in `model`.
    pub id: String,
    /// Unix seconds; OpenAI's field (0 when unknown).
    pub created: u64,
    /// Who provides it (OpenAI's `owned_by`), e.g. the Hugging Face organisation.
    pub owned_by: String,
    /// Whether at least one instance can serve it right now.
    pub ready: bool,
    /// Its size and, for a Mixture of Experts, its experts, once this node has read the
    /// model's configuration (absent before).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shape: Option<ModelShape>,
}

/// A model's size as `GET /v1/models` shows it (a field OpenAI's list does not have; clients
/// ignore it): what a user choosing a model across machines weighs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelShape {
    /// The family (`model_type`: `qwen3_moe`, `deepseek_v3`, ...).
    pub family: String,
    /// Parameters, every expert counted.
    pub parameters: u64,
    /// Parameters one token runs through (the router and its top-k experts in an MoE layer).
    pub active_parameters: u64,
    /// Routed experts per MoE layer (absent for a dense model).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub experts: Option<u32>,
    /// Experts each token runs through.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub experts_per_token: Option<u32>,
    /// What it takes besides text: `["vision"]` for a model that accepts images (Ollama's
    /// name for it, which `/api/show` lists too); absent for text only.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
}

/// One message of the conversation, its content flattened to text, with the tool calls an
/// assistant turn made and, for a `tool` turn, the call it answers. The tool fields are left
/// out of a forwarded chat's JSON when empty.
pub use wire::chat::ChatMessage;

/// Sampling and stopping settings, passed through from the request. `None` means the
/// engine's default.
///
/// This is what the *client asked*; the engine's resolved settings (every value set) are
/// `inference::SamplingParams`, built from this on the node that runs the request. A
/// forwarded chat carries this one (its serde form, every field present, `null` when unset).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RequestedSampling {
    /// Upper bound on generated tokens (`max_completion_tokens`, else `max_tokens`). The
    /// gateway also enforces it on the events it receives.
    pub max_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub min_p: Option<f32>,
    /// Same seed, same prompt, same instance → same output.
    pub seed: Option<u64>,
    /// Stop strings, non-empty. The gateway enforces them on the text (holding back partial
    /// matches and cutting at a match); an engine may also stop on them itself.
    pub stop: Vec<String>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// Return log probabilities; `Some(k)` also asks for the `k` most likely alternatives.
    pub logprobs: Option<u32>,
    /// Keep generating past the model's end-of-sequence tokens, up to `max_tokens` (the
    /// non-OpenAI `ignore_eos` field, as vLLM has it): benchmarks need an exact token count.
    pub ignore_eos: bool,
    /// Added to these tokens' logits before sampling (OpenAI's `logit_bias`: token id → bias
    /// in [-100, 100]); the ids are checked against the vocabulary where the model runs, and
    /// log probabilities are reported unbiased. Left out of a forwarded chat's JSON when
    /// empty, so that peers without it read the same bytes.
    #[serde(
        skip_serializing_if = "std::collections::BTreeMap::is_empty",
        deserialize_with = "wire::token_map::deserialize"
    )]
    pub logit_bias: std::collections::BTreeMap<u32, f32>,
}

/// A validated chat request, as the backend receives it (and as a forwarded chat travels).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<ChatMessage>,
    /// Absent on the wire: every setting the engine's default.
    #[serde(default)]
    pub sampling: RequestedSampling,
    /// OpenAI's end-user id, for logs.
    #[serde(default)]
    pub user: Option<String>,
    /// The functions the model may call, rendered into the prompt by the model's chat
    /// template (those [`ToolChoice::offered`] keeps); the answer's calls are parsed by the
    /// gateway. Left out of the JSON when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<Tool>,
    #[serde(default, skip_serializing_if = "ToolChoice::is_auto")]
    pub tool_choice: ToolChoice,
    /// The template's thinking switch (`enable_thinking`, Qwen3's), when the client set one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_thinking: Option<bool>,
    /// The template's `reasoning_effort` (gpt-oss's), when the client set one: `minimal`,
    /// `low`, `medium` or `high` ([`crate::fields::reasoning_effort`] refuses anything else,
    /// since the template prints it into the prompt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_effort: Option<String>,
    /// Structured output: the answer decoded under a JSON Schema or as any JSON object
    /// ([`crate::response_format`]). Left out of the JSON when absent, so that peers without
    /// it read the same bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<ResponseFormat>,
}

/// An accepted chat: its prompt size and the events to come.
#[derive(Debug)]
pub struct ChatStream {
    /// Tokens in the prompt after the chat template, for `usage.prompt_tokens`.
    pub prompt_tokens: u32,
    /// Tokens, then `Done`; or an error.
    pub events: mpsc::Receiver<Result<ChatEvent, ApiError>>,
    /// How to read the output (the prompt opened a thought; the template's call dialect),
    /// known where the prompt was rendered.
    pub form: AnswerForm,
}

/// What a backend's generation task sends into a [`ChatStream`].
pub type ChatEventSender = mpsc::Sender<Result<ChatEvent, ApiError>>;

impl ChatStream {
    /// A stream and the sender that feeds it. `capacity` bounds how many events may wait
    /// unread (a slow client then slows the sender rather than growing memory); a send that
    /// fails means the gateway is gone and generation should stop.
    pub fn channel(prompt_tokens: u32, capacity: usize) -> (ChatEventSender, ChatStream) {
        let (tx, events) = mpsc::channel(capacity.max(1));
        (
            tx,
            ChatStream {
                prompt_tokens,
                events,
                form: AnswerForm::default(),
            },
        )
    }

    /// The same stream, its output read as `form` says.
    pub fn with_form(mut self, form: AnswerForm) -> ChatStream {
        self.form = form;
        self
    }
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The model produced an end-of-sequence token, or a stop string matched.
    Stop,
    /// `max_tokens` or the context length was reached.
    Length,
}

impl FinishReason {
    /// OpenAI's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// A sampled token's log probability, with the most likely alternatives when asked.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct TokenLogprob {
    /// The token's own text (OpenAI's `logprobs.content[].token`), which may differ from the
    /// text its event streams (a character split across tokens, text held back).
    pub token: String,
    pub logprob: f32,
    /// (token, logprob), most likely first.
    pub top: Vec<(String, f32)>,
    /// The bytes the token stands for and then those of each of `top`, in order, when the
    /// engine knows them; empty: each is its text's UTF-8. They differ where a token holds
    /// part of a multi-byte character (its text then reads U+FFFD), and the APIs' `bytes`
    /// fields exist so that a client can join such tokens into the character.
    pub bytes: Vec<Vec<u8>>,
}

impl TokenLogprob {
    /// The bytes the token stands for.
    pub fn token_bytes(&self) -> &[u8] {
        self.bytes
            .first()
            .map_or(self.token.as_bytes(), Vec::as_slice)
    }

    /// The bytes alternative `i` of [`TokenLogprob::top`] stands for.
    pub fn top_bytes(&self, i: usize) -> &[u8] {
        match self.bytes.get(i + 1) {
            Some(bytes) => bytes,
            None => self.top.get(i).map_or(&[][..], |(t, _)| t.as_bytes()),
        }
    }
}

/// One event of a generation.
///
/// Its serde form is what a forwarded chat's events look like between nodes:
/// `{"type": "token", "text": "Paris", "logprob": -0.25}` (`logprob` null when not asked
/// for; `top`, a list of `[token, logprob]`, only when there are alternatives; `token`, the
/// token's own text, only when it differs from `text`),
/// `{"type": "cached", "tokens": 412}` and
/// `{"type": "done", "finish_reason": "stop", "completion_tokens": 16}`.
#[derive(Debug, Clone, PartialEq)]
pub enum ChatEvent {
    /// One generated token: its text (possibly empty while a multi-byte character is
    /// incomplete; the engine's detokenizer owns UTF-8 boundaries) and, when asked, its
    /// log probability.
    Token {
        text: String,
        logprob: Option<TokenLogprob>,
    },
    /// Leading prompt tokens the engine did not compute again (its prompt cache held their
    /// state): at most once, before the first token (`usage`'s `cached_tokens` in each API).
    Cached { tokens: u32 },
    /// Generation ended. `completion_tokens` counts the tokens generated.
    Done {
        finish_reason: FinishReason,
        completion_tokens: u32,
    },
}

impl Serialize for ChatEvent {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(None)?;
        match self {
            ChatEvent::Token { text, logprob } => {
                map.serialize_entry("type", "token")?;
                map.serialize_entry("text", text)?;
                map.serialize_entry("logprob", &logprob.as_ref().map(|l| l.logprob))?;
                if let Some(l) = logprob.as_ref().filter(|l| !l.top.is_empty()) {
                    map.serialize_entry("top", &l.top)?;
                }
                if let Some(l) = logprob.as_ref().filter(|l| !l.bytes.is_empty()) {
                    map.serialize_entry("bytes", &l.bytes)?;
                }
                if let Some(l) = logprob.as_ref().filter(|l| l.token != *text) {
                    map.serialize_entry("token", &l.token)?;
                }
            }
            ChatEvent::Cached { tokens } => {
                map.serialize_entry("type", "cached")?;
                map.serialize_entry("tokens", tokens)?;
            }
            ChatEvent::Done {
                finish_reason,
                completion_tokens,
            } => {
                map.serialize_entry("type", "done")?;
                map.serialize_entry("finish_reason", finish_reason.as_str())?;
                map.serialize_entry("completion_tokens", completion_tokens)?;
            }
        }
        map.end()
    }
}

/// The fields either event may carry on the wire.
#[derive(Deserialize)]
struct EventFields {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
    logprob: Option<f32>,
    #[serde(default)]
    top: Vec<(String, f32)>,
    /// The token's own text when it differs from `text` (absent from older peers' events).
    token: Option<String>,
    /// The token's and its alternatives' bytes (absent from older peers' events).
    #[serde(default)]
    bytes: Vec<Vec<u8>>,
    finish_reason: Option<String>,
    completion_tokens: Option<u32>,
    tokens: Option<u32>,
}

impl<'de> Deserialize<'de> for ChatEvent {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<ChatEvent, D::Error> {
        use serde::de::Error;
        let f = EventFields::deserialize(d)?;
        match f.kind.as_str() {
            "token" => {
                let text = f.text.ok_or_else(|| D::Error::missing_field("text"))?;
                Ok(ChatEvent::Token {
                    logprob: f.logprob.map(|logprob| TokenLogprob {
                        token: f.token.unwrap_or_else(|| text.clone()),
                        logprob,
                        top: f.top,
                        bytes: f.bytes,
                    }),
                    text,
                })
            }
            "cached" => Ok(ChatEvent::Cached {
                tokens: f.tokens.ok_or_else(|| D::Error::missing_field("tokens"))?,
            }),
            "done" => Ok(ChatEvent::Done {
                // Anything but "length" ended as a stop (an end token or a stop string).
                finish_reason: match f.finish_reason.as_deref() {
                    Some("length") => FinishReason::Length,
                    Some(_) => FinishReason::Stop,
                    None => return Err(D::Error::missing_field("finish_reason")),
                },
                completion_tokens: f
                    .completion_tokens
                    .ok_or_else(|| D::Error::missing_field("completion_tokens"))?,
            }),
            other => Err(D::Error::unknown_variant(
                other,
                &["token", "cached", "done"],
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tokens_own_text_and_alternatives_travel_and_old_events_still_read() {
        let rich = ChatEvent::Token {
            text: "".into(),
            logprob: Some(TokenLogprob {
                token: "\u{FFFD}".into(),
                logprob: -0.5,
                top: vec![("\u{FFFD}".into(), -0.5), (" a".into(), -1.5)],
                bytes: vec![vec![0xe2, 0x82], vec![0xe2, 0x82], b" a".to_vec()],
            }),
        };
        let json = serde_json::to_string(&rich).unwrap();
        assert_eq!(
            json,
            r#"{"type":"token","text":"","logprob":-0.5,"top":[["�",-0.5],[" a",-1.5]],"bytes":[[226,130],[226,130],[32,97]],"token":"�"}"#
        );
        assert_eq!(serde_json::from_str::<ChatEvent>(&json).unwrap(), rich);
        // A peer without `token` (or whose token is its text) means the text.
        let old: ChatEvent =
            serde_json::from_str(r#"{"type":"token","text":"Paris","logprob":-0.25}"#).unwrap();
        let ChatEvent::Token {
            logprob: Some(l), ..
        } = old
        else {
            panic!("{old:?}")
        };
        assert_eq!(
            (l.token.as_str(), l.logprob, l.top.len()),
            ("Paris", -0.25, 0)
        );
    }

    #[test]
    fn logit_bias_is_left_out_when_empty_and_read_as_none_when_absent() {
        let plain = serde_json::to_value(RequestedSampling::default()).unwrap();
        assert!(plain.get("logit_bias").is_none(), "{plain}");
        let biased = RequestedSampling {
            logit_bias: [(50256, -100.0)].into(),
            ..RequestedSampling::default()
        };
        let json = serde_json::to_value(&biased).unwrap();
        assert_eq!(json["logit_bias"], serde_json::json!({"50256": -100.0}));
        assert_eq!(
            serde_json::from_value::<RequestedSampling>(json).unwrap(),
            biased
        );
        let old: RequestedSampling = serde_json::from_str(r#"{"max_tokens":3}"#).unwrap();
        assert!(old.logit_bias.is_empty());
    }
}
