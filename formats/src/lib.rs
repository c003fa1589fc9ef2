//! formats: model files read without MLX.
//!
//! - [`gguf`]: llama.cpp's GGUF files: metadata, tensor directory, single tensors' raw bytes.
//! - [`gguf_kquant`]: GGML's 5-bit and K-quant block formats and IQ4_NL, dequantized on the host.
//!
//! **Why a crate of its own.** A GGUF file's metadata holds the tokenizer (read by `text`,
//! which the node uses to build prompts) as well as the weights (read by `inference`): with the
//! reader here, the node's prompt side reads a GGUF vocabulary without linking MLX.

pub mod error;
pub mod gguf;
pub mod gguf_kquant;

pub use error::{FormatError, Result};
