//! text: what goes into a model and comes out of it as tokens, with no MLX.
//!
//! - [`tokenizer`]: a model's tokenizer (a Hugging Face `tokenizer.json` or a GGUF's
//!   vocabulary), its special tokens and chat template; each token's bytes (`Tokenizer::token_bytes`).
//! - [`chat_template`], [`template_json`]: chat templates rendered as `transformers` renders
//!   them (minijinja with Python's methods and `tojson`).
//! - [`untrusted_text`]: a client's text tokenized so that it can never become a control token.
//! - [`detokenizer`]: generated tokens back into text as they stream, whole characters only.
//! - [`constraint`]: output that must match a schema or grammar, masked over the vocabulary;
//!   [`sampling`]: choosing the next token from the logits.
//! - [`image_prompt`]: an image's run of image tokens in the prompt, counted by the model's
//!   image processor ([`image_processor`], [`qwen_image_processor`], which also give the
//!   towers in `inference` their pixels).
//!
//! **Why a crate of its own.** The node builds every prompt (template, tokens, a schema's
//! grammar) before a runner sees it; with these here, the node's prompt, model and runner crates
//! do not link MLX, and `inference` keeps only what runs a model.

pub mod chat_template;
pub mod constraint;
pub mod detokenizer;
pub mod error;
pub mod image_processor;
pub mod image_prompt;
pub mod qwen_image_processor;
pub mod sampling;
pub mod template_json;
mod token_bytes;
pub mod tokenizer;
pub mod untrusted_text;

pub use chat_template::{DateTime, TemplateClock, TemplateInput, ToolCall, ToolSpec};
pub use error::{Result, TextError};
pub use tokenizer::{ChatMessage, Tokenizer};
