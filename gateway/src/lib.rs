//! Gateway: the HTTP APIs every node serves, on port 52415.
//!
//! - OpenAI's chat completions (`POST /v1/chat/completions`, whole or streamed as SSE) and
//!   model list (`GET /v1/models`);
//! - `POST /v1/cancel/{id}`: stops a generation this node is answering, for the key that
//!   started it, see [`cancel`];
//! - OpenAI's Responses (`POST /v1/responses`, stateless), see [`responses`];
//! - Anthropic's Messages (`POST /v1/messages`, `POST /v1/messages/count_tokens`), see
//!   [`anthropic`];
//! - Ollama's API at `/api/*` and `/ollama/api/*` (chat, generate, tags, show, ps,
//!   version), see [`ollama`];
//! - exo's cluster API (`GET /node_id`, `GET /state[/{path}]`, `POST /place_instance`,
//!   `POST /instance`, `GET /instance/previews?model_id=`, `GET|DELETE /instance/{id}`);
//! - the dashboard: its page at `GET /` (files built in, see [`dashboard`]) and the state
//!   stream it follows, `GET /events` (see [`events`]).
//!
//! The crate owns HTTP, request validation, response shapes (exo's typed in [`exo`]),
//! streaming and error statuses, and the stop: a server told to stop drains its answers in
//! flight first (see [`drain`]).
//! Everything about the cluster (which instance serves a model, forwarding to another node,
//! queueing, generation) sits behind the [`Backend`] trait, which the `shoal` binary
//! implements; see [`backend`] for the contract.
//!
//! ```no_run
//! # async fn run(backend: std::sync::Arc<dyn gateway::Backend>) -> std::io::Result<()> {
//! let listener = tokio::net::TcpListener::bind(("0.0.0.0", gateway::DEFAULT_API_PORT)).await?;
//! gateway::serve(listener, backend, gateway::GatewayConfig::default(), Default::default()).await
//! # }
//! ```

pub mod access;
pub mod anthropic;
pub mod backend;
pub mod body;
pub mod cancel;
mod chat;
pub mod cluster;
pub mod config;
pub mod dashboard;
pub mod drain;
pub mod error;
pub mod events;
pub mod exo;
#[cfg(any(test, feature = "test-support"))]
pub mod fake;
pub mod fields;
pub mod generation;
pub mod ids;
pub mod images;
mod memory;
pub mod ollama;
pub mod openai;
mod request_body;
pub mod response_format;
pub mod responses;
pub mod router;
pub mod server;
mod steps;
pub mod tools;
#[cfg(test)]
mod writers_tests;

pub use access::{AccessPolicy, KeyError, Scope};
pub use backend::{
    AnswerForm, Backend, BoxFuture, CancellationToken, ChatEvent, ChatEventSender, ChatMessage,
    ChatRequest, ChatStream, FinishReason, ModelInfo, ModelShape, RequestedSampling, TokenLogprob,
    Tool, ToolCall, ToolChoice,
};
pub use config::{EventsConfig, GatewayConfig};
pub use error::{echo, ApiError, ErrorKind};
pub use exo::{CreateInstanceRequest, PlaceInstanceRequest};
pub use router::Router;
pub use server::{serve, serve_with, DEFAULT_API_PORT};
