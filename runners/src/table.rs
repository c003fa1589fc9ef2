//! [`Runners`]: this node's runners (one per instance it holds a rank of), by instance id.
//!
//! The node's executor creates, drives and stops them (it holds [`Runners::lock`] while it
//! applies a pass's effects); chat routing, the model list and the API read them through the
//! other methods.

use crate::Supervisor;
use control::{LifecycleCommand, RunnerFacts};
use models::ModelSpec;
use placement::RunnerStatus;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// This node's runners by instance id.
#[derive(Default)]
pub struct Runners {
    table: Mutex<BTreeMap<String, LocalRunner>>,
}

impl Runners {
    /// The table itself, for the executor (a poisoned lock is taken over: the table stays
    /// consistent entry by entry).
    pub fn lock(&self) -> MutexGuard<'_, BTreeMap<String, LocalRunner>> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This node's runner status for instance `id`, if it runs one.
    pub fn status(&self, id: &str) -> Option<RunnerStatus> {
        self.lock().get(id).map(LocalRunner::status)
    }

    /// Requests queued or running on this node's runner of `id` (0 without one).
    pub fn load(&self, id: &str) -> usize {
        self.lock().get(id).map_or(0, LocalRunner::load)
    }

    /// The process id of this node's runner of `id`, while it runs.
    pub fn pid(&self, id: &str) -> Option<u32> {
        self.lock().get(id).and_then(LocalRunner::pid)
    }

    /// This node's runner of `id` when it holds rank 0 and is ready for requests, with the
    /// model it runs.
    pub fn ready_rank0(&self, id: &str) -> Option<(Supervisor, ModelSpec)> {
        let runners = self.lock();
        let local = runners.get(id).filter(|r| r.rank == 0)?;
        local.ready_supervisor().map(|s| (s, local.model.clone()))
    }

    /// Stops every runner and waits for them (node shutdown).
    pub async fn stop_all(&self) {
        let all: Vec<LocalRunner> = std::mem::take(&mut *self.lock()).into_values().collect();
        for runner in all {
            runner.stop().await;
        }
    }
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
    pub supervisor: Option<Supervisor>,
    /// Overrides the process's state: shut down by plan, or failed before it could start.
    pub status: Option<RunnerStatus>,
    /// Lifecycle commands already sent (each is sent once).
    pub sent: BTreeSet<LifecycleCommand>,
}

impl LocalRunner {
    /// A runner of `model` for `rank` of an instance's `epoch`, with no process yet and
    /// `status` set when the node decided it (failed before it could start).
    pub fn new(
        epoch: u32,
        rank: usize,
        model: ModelSpec,
        status: Option<RunnerStatus>,
    ) -> LocalRunner {
        LocalRunner {
            epoch,
            rank,
            model,
            supervisor: None,
            status,
            sent: BTreeSet::new(),
        }
    }

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
    pub fn stop_as(&mut self, status: RunnerStatus) {
        self.status = Some(status);
        if let Some(s) = self.supervisor.take() {
            tokio::spawn(async move { s.shutdown(SHUTDOWN_GRACE).await });
        }
    }

    /// What the control plane knows of it.
    pub fn facts(&self) -> RunnerFacts {
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
