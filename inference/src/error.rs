//! Errors of the inference crate: each says what went wrong and, where it can, what to do.

use std::path::PathBuf;

/// Everything that can go wrong while loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum InferenceError {
    /// A file could not be opened or read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A GGUF file is malformed or truncated.
    #[error("{path} is not a valid GGUF file: {reason}")]
    BadGguf {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// The model folder or file does not hold what a model needs.
    #[error("bad model at {path}: {reason}")]
    BadModel {
        /// The model path.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// The model's architecture is not one this crate implements.
    #[error("unsupported model architecture `{name}`{why} (supported: {supported})")]
    UnsupportedArchitecture {
        /// The `model_type` or GGUF architecture asked for.
        name: String,
        /// For a family known but not run yet, what is missing (`": …"`); else empty.
        why: String,
        /// Every name that would load, from the family registry (GGUF and safetensors names
        /// apart for a GGUF).
        supported: String,
    },
    /// A configuration value is missing or out of range.
    #[error("bad model configuration: {0}")]
    BadConfig(String),
    /// A layer range does not fit the model.
    #[error("layer range {start}..{end} does not fit a model of {layers} layers")]
    BadLayerRange {
        /// First layer.
        start: usize,
        /// One past the last layer.
        end: usize,
        /// Layers of the model.
        layers: usize,
    },
    /// The instance's split (how its ranks share the model) does not fit this model.
    #[error("{0}")]
    BadSplit(String),
    /// Loading took longer than the load watchdog allows (see [`crate::loader::Watchdog`]).
    #[error("model loading timed out after {seconds} s")]
    LoadTimedOut {
        /// The timeout.
        seconds: u64,
    },
    /// A tensor the model needs is absent from the weights.
    #[error("tensor `{0}` is missing from the weights")]
    MissingTensor(String),
    /// A tensor has the wrong shape or an unsupported type.
    #[error("tensor `{name}`: {reason}")]
    BadTensor {
        /// The tensor.
        name: String,
        /// What was wrong.
        reason: String,
    },
    /// The tokenizer could not be built or failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The chat template could not be compiled or rendered.
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// The prompt does not fit the model's context window.
    #[error("the prompt has {prompt_tokens} tokens but the model's context holds {context_length}; shorten the prompt")]
    PromptTooLong {
        /// Tokens in the prompt.
        prompt_tokens: usize,
        /// The model's context length.
        context_length: usize,
    },
    /// The request is not valid (empty prompt, bad sampling parameter, ...).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// MLX reported an error (the message comes from MLX).
    #[error("MLX error: {0}")]
    Mlx(String),
    /// The MLX ring to the other ranks of the instance failed (a lost peer, a refused
    /// operation): the instance cannot go on and must be placed again.
    #[error("the ring to the other ranks failed: {0}")]
    Ring(String),
}

impl From<crate::ring::RingError> for InferenceError {
    fn from(e: crate::ring::RingError) -> Self {
        InferenceError::Ring(e.to_string())
    }
}

/// A model file's fault, as this crate reports it (the same message).
impl From<formats::FormatError> for InferenceError {
    fn from(e: formats::FormatError) -> Self {
        use formats::FormatError as F;
        match e {
            F::Io { path, source } => InferenceError::Io { path, source },
            F::BadGguf { path, reason } => InferenceError::BadGguf { path, reason },
            F::MissingTensor(name) => InferenceError::MissingTensor(name),
            F::BadTensor { name, reason } => InferenceError::BadTensor { name, reason },
        }
    }
}

/// The text side's fault (tokenizer, template, constraint), as this crate reports it (the same
/// message).
impl From<text::TextError> for InferenceError {
    fn from(e: text::TextError) -> Self {
        use text::TextError as T;
        match e {
            T::Format(e) => e.into(),
            T::Io { path, source } => InferenceError::Io { path, source },
            T::BadConfig(m) => InferenceError::BadConfig(m),
            T::Tokenizer(m) => InferenceError::Tokenizer(m),
            T::ChatTemplate(m) => InferenceError::ChatTemplate(m),
            T::InvalidRequest(m) => InferenceError::InvalidRequest(m),
        }
    }
}

/// A request's parameter out of range (`wire` checks sampling parameters and weight formats).
impl From<wire::sampling::InvalidRequest> for InferenceError {
    fn from(e: wire::sampling::InvalidRequest) -> Self {
        InferenceError::InvalidRequest(e.0)
    }
}

impl From<mlx_rs::error::Exception> for InferenceError {
    fn from(e: mlx_rs::error::Exception) -> Self {
        InferenceError::Mlx(e.what().to_owned())
    }
}

/// Result of this crate.
pub type Result<T, E = InferenceError> = std::result::Result<T, E>;
