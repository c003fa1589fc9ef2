//! Model acquisition for shoal: from a Hugging Face model id to files on this node.
//!
//! - [`id`]: model ids as users write them (`org/name@revision:QUANT`);
//! - [`cache`]: the Hugging Face cache layout (`models--org--name/{blobs,snapshots,refs}`), so
//!   `huggingface-cli`'s downloads are used as they are and shoal's are visible to it;
//! - [`client`], [`download`], [`snapshot`], [`http`]: the hub protocol as `huggingface_hub` speaks it, over
//!   hyper (https with rustls for huggingface.co, http for a local mirror): revision and tree
//!   APIs, `resolve` with its redirect to a CDN, resume by range, verification, retries;
//! - [`meta`]: parsing the hub's headers and JSON without trusting them;
//! - [`select`]: which files a shard needs (from `model.safetensors.index.json`);
//! - [`progress`]: download progress for the CLI and the replicated state.
//!
//! Why a crate of its own: acquisition is one job (network, disk, hashes) that neither the
//! inference crate (tensors) nor the mesh (membership, records) should carry.

pub mod cache;
pub mod client;
pub mod download;
pub mod error;
pub mod http;
pub mod id;
pub mod local;
pub mod meta;
pub mod progress;
pub mod select;
pub mod snapshot;
pub mod verify;

pub use cache::HfCache;
pub use client::{Hub, HubConfig};
pub use error::HubError;
pub use id::ModelId;
pub use meta::RepoFile;
pub use progress::Progress;
pub use snapshot::Snapshot;
#[cfg(feature = "test-hub")]
pub mod testhub;
