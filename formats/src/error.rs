//! Errors of reading a model file: each names the file or tensor and what was wrong.
//!
//! Their messages are those `inference::InferenceError` prints for the same failure, so that a
//! model that fails to load reads the same whichever crate found the fault.

use std::path::PathBuf;

/// What can go wrong while reading a model file.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
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
    /// A tensor the model needs is absent from the file.
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
}

/// Result of this crate.
pub type Result<T, E = FormatError> = std::result::Result<T, E>;
