//! Errors of the text side: each says what went wrong and, where it can, what to do.
//!
//! Their messages are those `inference::TextError` prints for the same failure (it takes
//! each variant into its own of the same name), so an error reads the same whichever crate found it.

use std::path::PathBuf;

/// What can go wrong while reading a tokenizer, rendering a template or compiling a constraint.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    /// A model file (a GGUF holding the vocabulary) could not be read.
    #[error(transparent)]
    Format(#[from] formats::FormatError),
    /// A file could not be opened or read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A configuration value is missing or out of range.
    #[error("bad model configuration: {0}")]
    BadConfig(String),
    /// The tokenizer could not be built or failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The chat template could not be compiled or rendered.
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// The request is not valid (a schema that does not compile, a bad sampling parameter).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
}

impl From<wire::sampling::InvalidRequest> for TextError {
    fn from(e: wire::sampling::InvalidRequest) -> Self {
        TextError::InvalidRequest(e.0)
    }
}

/// Result of this crate.
pub type Result<T, E = TextError> = std::result::Result<T, E>;
