//! The chat prompt as a model reads it: a gateway [`gateway::ChatRequest`] rendered by the
//! model's chat template (tools included, described by the node for a template that ignores
//! them) and tokenized, into the engine's [`wire::request::GenerateRequest`].
//!
//! **Why a crate of its own.** Prompt rendering is model knowledge (templates, tool dialects,
//! the context limit), not node wiring: it sits beside the model facts it reads
//! ([`models::ModelFacts`]) so that the binary keeps only chat routing.

mod prompt;
mod structured;
mod tools_prompt;

pub use prompt::generate_request;
