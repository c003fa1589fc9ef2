//! Inference: transformer decoders on MLX (through mlx-rs), shardable by layer range.
//!
//! - [`config`], [`model`], [`rope`], [`kv_cache`], [`linear`]: the decoder (Llama, Qwen2,
//!   Qwen3) over a layer range.
//! - [`gguf`], [`quant`], [`weights`]: reading GGUF files and Hugging Face folders into the
//!   fastest representation for the backend.
//! - [`tokenizer`], [`detokenizer`]: tokens in and out, chat templates.
//! - [`sampling`], [`engine`]: generation, the API callers use; one loop over any
//!   [`engine::Forward`].
//! - [`ring`], [`pipeline`], [`tensor_stage`]: one model across several processes over MLX's
//!   ring backend (pipeline and tensor parallel).
//! - [`runner`]: one instance (or one rank of it) in its own process, driven by its node.

pub mod config;
pub mod detokenizer;
pub mod engine;
pub mod error;
pub mod export;
pub mod gguf;
pub mod kv_cache;
pub mod linear;
pub mod model;
pub mod pipeline;
pub mod platform;
pub mod quant;
pub mod ring;
pub mod rope;
pub mod runner;
pub mod sampling;
pub mod tensor_stage;
pub mod tokenizer;
pub mod weights;

pub use config::{Architecture, ModelConfig};
pub use engine::{
    Completion, Engine, FinishReason, GenerateRequest, LoadOptions, Prompt, TokenEvent,
};
pub use error::{InferenceError, Result};
pub use model::{ModelShard, ShardInput};
pub use sampling::SamplingParams;
pub use tokenizer::{ChatMessage, Tokenizer};
pub use weights::WeightFormat;
