//! [`LocalRunners`]: this node's runners (one per instance it holds a rank of) as chat
//! routing, the model list and the instance answers read them.
//!
//! The table itself is the executor's (the reconciler creates, drives and stops the
//! runners); readers see it through this trait, so that they do not depend on the executor.

use super::Supervisor;
use crate::models::ModelSpec;
use placement::RunnerStatus;

/// Read access to this node's runners, by instance id.
pub trait LocalRunners: Send + Sync {
    /// This node's runner status for instance `id`, if it runs one.
    fn status(&self, id: &str) -> Option<RunnerStatus>;
    /// Requests queued or running on this node's runner of `id` (0 without one).
    fn load(&self, id: &str) -> usize;
    /// The process id of this node's runner of `id`, while it runs.
    fn pid(&self, id: &str) -> Option<u32>;
    /// This node's runner of `id` when it holds rank 0 and is ready for requests, with the
    /// model it runs.
    fn ready_rank0(&self, id: &str) -> Option<(Supervisor, ModelSpec)>;
}
