//! [`Node`]: the node's state, in one place: its context (id, replicated state, connections),
//! its models, its runners, every instance's placement, its downloads and its runners'
//! settings.
//!
//! The node has two faces over this state, each in a file of its own:
//! - **the API** (`Api`, `api/`): the gateway's `Backend`, answering HTTP requests
//!   (instances, the model list, chat through `chat::route`);
//! - **the executor** (`Executor`, `executor.rs`): applies the control plane's effects
//!   (records written, runners started, commanded and stopped).
//!
//! Neither face owns the other: both read and change the node through this type.

use crate::context::NodeContext;
use control::PlacementCache;
use models::fetch::Downloads;
use models::locate::ModelDirs;
use models::registry::ModelRegistry;
use models::ModelSpec;
use runners::{RunnerCommand, Runners};
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// The node's state (see the module docs).
pub struct Node {
    /// The node's id, the replicated state, writes of its own records, connections.
    pub context: Arc<dyn NodeContext>,
    /// How runner processes start, with the settings the flags give.
    pub runner_command: RunnerCommand,
    /// This node's models.
    pub models: ModelRegistry,
    /// This node's runners by instance id.
    pub runners: Runners,
    /// Every instance's placement, computed once per (instance, epoch).
    pub placements: PlacementCache,
    /// Models this node is downloading (or downloaded) on its own.
    pub downloads: Arc<Downloads>,
    /// Counts the instances this start of the node created (part of their ids).
    pub next_instance: AtomicU64,
    /// Wakes the executor (a runner changed state, an instance was created or deleted).
    pub wake: Arc<tokio::sync::Notify>,
}

impl Node {
    /// A node with no runner yet. `runner_command` starts runner processes; `default_model`
    /// is this node's file served as `default`; models are looked for in `dirs` (the Hugging
    /// Face cache and `--models-dir` folders).
    pub fn new(
        context: Arc<dyn NodeContext>,
        runner_command: RunnerCommand,
        default_model: PathBuf,
        dirs: ModelDirs,
    ) -> Node {
        Node {
            context,
            runner_command,
            models: ModelRegistry::new(default_model, dirs, facts::read),
            runners: Runners::default(),
            placements: PlacementCache::new(),
            downloads: Arc::default(),
            next_instance: AtomicU64::new(1),
            wake: Arc::new(tokio::sync::Notify::new()),
        }
    }

    /// The model an intent names, as this node finds it.
    pub fn spec_of(&self, reference: &str) -> ModelSpec {
        self.models.spec_of(reference)
    }

    /// The context as the models see it (downloads and peer copies run tasks of their own).
    pub fn cluster(&self) -> Arc<dyn models::Cluster> {
        self.context.clone()
    }

    /// Waits until instance `id` is ready (`Ok`) or failed (`Err` with why), polling the
    /// state.
    pub async fn wait_ready(&self, id: &str) -> Result<(), String> {
        loop {
            let snapshot = self.context.snapshot();
            let Some(view) = snapshot.instances(&self.placements).remove(id) else {
                return Err("the instance was deleted".into());
            };
            let mine = self.runners.status(id);
            if view.is_ready(&snapshot, mine.as_ref()) {
                return Ok(());
            }
            if let Some(failure) = view.failure(&snapshot, mine.as_ref()) {
                return Err(failure);
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }
}
