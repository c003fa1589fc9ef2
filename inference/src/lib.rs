//! Inference: transformer decoders on MLX (through mlx-rs), shardable by layer range.
//!
//! - [`models`]: the decoders as mlx-lm lays them out (a shared base, one file per family:
//!   Llama, Qwen2, Qwen3) and the shard of a layer range; [`config`], [`rope`], [`kv_cache`],
//!   [`linear`] under them.
//! - [`quant`], [`weights`]: reading GGUF files (through the `formats` crate) and Hugging Face
//!   folders into the fastest representation for the backend; [`loader`]: the one model loader
//!   (with the load watchdog the runner uses).
//! - Tokens in and out (tokenizer, chat templates, detokenizer, constraints, the sampler) are the
//!   `text` crate's; the request and the runner protocol are `wire`'s: neither links MLX.
//! - [`generate`]: generation, one loop over any model; [`engine`]: a whole model in this
//!   process.
//! - [`batch`]: many requests at once (continuous batching), [`sequence`]: each token's
//!   fate, the same alone and in a batch.
//! - [`ring`], [`stage`], [`pipeline`], [`tensor_stage`]: one model across several processes
//!   over MLX's ring backend (the two kinds of [`stage::Stage`]).
//! - [`memory`]: what an instance holds while it runs (what placement counts).
//! - [`runner`]: one instance (or one rank of it) in its own process, driven by its node.

pub mod batch;
pub mod config;
pub mod cpu_kernels;
pub mod cpu_layer_ops;
pub mod engine;
pub mod error;
pub mod export;
pub mod generate;
pub mod ggml_mxfp4;
pub mod ggml_repack;
pub mod kv_cache;
pub mod kv_rows;
pub mod linear;
pub mod loader;
pub mod memory;
pub mod models;
pub mod mrope;
pub mod pipeline;
pub mod platform;
pub mod quant;
pub mod quant_spec;
pub mod quantized;
mod raw_op;
pub mod ring;
pub mod rope;
pub mod runner;
pub mod sequence;
pub mod sequence_forward;
pub mod sliding_window;
pub mod stage;
pub mod tensor_divisors;
pub mod tensor_split;
pub mod tensor_stage;
pub mod vision;
pub mod weights;

// The text side and the GGUF reader are crates below this one (`text`, `formats`), the request
// and the runner protocol `wire`'s; they keep their paths inside this crate.
use formats::{gguf, gguf_kquant};
use text::{constraint, detokenizer, sampling, tokenizer};
use wire::request;

pub use config::{Architecture, ModelConfig};
pub use engine::Engine;
pub use error::{InferenceError, Result};
pub use loader::LoadOptions;
pub use models::shard::{ModelShard, ShardInput};
pub use vision::{ChatImage, ImagePrompt};
pub use weights::WeightFormat;
// The types of this crate's own API (`Engine::generate`, the runner, the tokenizer a model
// loads with), defined below it, so that a caller of a model names them through it.
pub use text::{
    ChatMessage, DateTime, TemplateClock, TemplateInput, Tokenizer, ToolCall, ToolSpec,
};
pub use wire::constraint::OutputConstraint;
pub use wire::request::{
    Completion, FinishReason, GenerateRequest, Prompt, TokenEvent, TokenLogprobs, TopLogprob,
};
pub use wire::sampling::{SamplingParams, MAX_LOGIT_BIAS, MAX_TOP_LOGPROBS};
