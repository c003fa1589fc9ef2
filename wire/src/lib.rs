//! wire: what crosses process and node boundaries, in one place.
//!
//! - [`frame`]: the one frame codec (a 4-byte little-endian length, then versioned JSON)
//!   used by the runner protocol (node ↔ runner process, over pipes) and by chat forwarding
//!   (node ↔ node, over iroh streams). Each use states its own version and size limit.
//! - [`runner`]: the runner protocol (the node's commands, the runner's events) and the
//!   environment the node sets for a runner; [`request`]: what a generation asks for and
//!   gives back, with its [`sampling`] parameters, its output [`constraint`] and the
//!   [`weight_format`] a runner loads in.
//! - [`runner_status`]: the runner status as the runner protocol and the HTTP API spell it
//!   (`{"state": "loading", "done": 3, "total": 30}`). The type itself is
//!   [`placement::RunnerStatus`], the one the replicated state and the worker plan use.
//! - [`token_map`]: maps from token ids (`logit_bias`), read the same inside tagged messages.
//! - [`chat`]: a chat's messages and tool calls, from the API through forwarding to the chat
//!   template.
//!
//! The crate exists because `gateway` and `inference` do not depend on each other, yet both
//! speak these shapes; both may depend on it (it depends on `placement` only). The node's
//! runner supervisor speaks the runner protocol from here without linking MLX.

pub mod chat;
pub mod constraint;
pub mod frame;
pub mod request;
pub mod runner;
pub mod runner_status;
pub mod sampling;
pub mod token_map;
pub mod weight_format;

pub use frame::{Codec, FrameError};
