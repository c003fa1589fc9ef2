//! The shoal node as a library: everything `shoal` (with no subcommand) runs, so it can be used
//! and tested without the binary, which keeps only its command line (`src/main.rs`, `src/cmd/`).
//!
//! Flags, wiring, and the node's two faces over its state ([`Node`]):
//! - flags: [`NodeArgs`] (the node's), [`access`] (API keys), [`logging`], [`release`];
//! - wiring: [`start`] (the mesh, the profile, the probes), [`mesh_state`] (the mesh as the
//!   node's [`context::NodeContext`], the snapshot it reads), [`serve`] (the HTTP API, the
//!   executor, `--model`);
//! - the adapter: [`api`] (the gateway's `Backend`: instances, models, chat);
//! - the executor: [`executor`] (applies the control plane's effects);
//! - chat routing: [`chat`] (pick an instance, run it here or forward it; both halves of
//!   forwarding's protocol in [`chat::forward`]);
//! - `shoal status`'s tables: [`status`];
//! - a test fault: [`late_removals`].
//!
//! The work itself lives in the crates: `control` decides, `placement` places, `models` finds
//! and fetches model files, `runners` supervises runner processes, `prompt` renders prompts,
//! `mesh` replicates the state, `gateway` speaks HTTP, `inference` runs models.

pub mod access;
pub mod api;
mod args;
pub mod chat;
pub mod context;
pub mod executor;
pub mod late_removals;
pub mod logging;
pub mod mesh_state;
pub mod node;
pub mod release;
pub mod serve;
pub mod start;
pub mod status;

pub use args::NodeArgs;
pub use node::Node;
