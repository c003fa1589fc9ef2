//! [`RunnerTable`]: this node's runners (one per instance it holds a rank of) as chat
//! routing, the model list and the instance answers read them.
//!
//! The table itself is the executor's (the reconciler creates, drives and stops the
//! runners); readers see it through this trait, so that they do not depend on the executor.

use super::Supervisor;
use crate::models::ModelSpec;
use control::{Command, RunnerFacts};
use placement::RunnerStatus;
use std::collections::BTreeSet;
use std::time::Duration;

/// Read access to this node's runners, by instance id.
pub trait RunnerTable: Send + Sync {
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

/// How long a runner gets to exit before it is killed.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// This node's runner for its rank of one instance.
pub struct LocalRunner {
    /// The instance epoch it was started for.
    pub epoch: u32,
    /// Its rank.
    pub rank: usize,
    /// The model, as this node finds it.
    pub model: ModelSpec,
    /// The process, while it runs.
    pub(crate) supervisor: Option<Supervisor>,
    /// Overrides the process's state: shut down by plan, or failed before it could start.
    pub(crate) status: Option<RunnerStatus>,
    /// Lifecycle commands already sent (each is sent once).
    pub(crate) sent: BTreeSet<Command>,
}

impl LocalRunner {
    /// Its status as the plan and the state see it.
    pub fn status(&self) -> RunnerStatus {
        if let Some(status) = &self.status {
            return status.clone();
        }
        match &self.supervisor {
            Some(s) => s.current_state(),
            None => RunnerStatus::Shutdown,
        }
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.supervisor.as_ref().map(Supervisor::pid)
    }

    /// Requests queued or running on it.
    pub fn load(&self) -> usize {
        self.supervisor.as_ref().map_or(0, Supervisor::load)
    }

    /// Its supervisor, if the runner is ready for requests.
    pub fn ready_supervisor(&self) -> Option<Supervisor> {
        self.status()
            .is_serving()
            .then(|| self.supervisor.clone())
            .flatten()
    }

    /// Stops the process (if any) and waits for it.
    pub async fn stop(mut self) {
        if let Some(s) = self.supervisor.take() {
            s.shutdown(SHUTDOWN_GRACE).await;
        }
    }

    /// Stops the process in the background, keeping the entry with `status`.
    pub(crate) fn stop_as(&mut self, status: RunnerStatus) {
        self.status = Some(status);
        if let Some(s) = self.supervisor.take() {
            tokio::spawn(async move { s.shutdown(SHUTDOWN_GRACE).await });
        }
    }

    /// What the control plane knows of it.
    pub(crate) fn facts(&self) -> RunnerFacts {
        RunnerFacts {
            epoch: self.epoch,
            rank: self.rank,
            status: self.status(),
            process: self.supervisor.is_some(),
            sent: self.sent.clone(),
            queued: self.load(),
            model_ready: self.model.path.exists(),
            // A status the node set (stopped, failed before starting) is not the process's.
            hung: self.status.is_none() && self.supervisor.as_ref().is_some_and(Supervisor::hung),
        }
    }
}
