//! Worker planning: what a node's runner for one instance should do next.
//!
//! A pure function of the replicated state ([`PlanInput`]) to one [`Action`]; the node's
//! supervisor calls it on every state change (or on a tick), performs the action, and the
//! runner reports its new [`RunnerStatus`] into the state. Every node runs the same rule, so
//! the ranks of an instance move through start-up together with no coordinator.
//!
//! # The rule (the seed's accepting/connecting order)
//! Checks run in this order and the first that applies wins:
//! 1. **Shut down** a live runner when the instance is gone, or when a sibling rank failed
//!    (an MLX group cannot be re-formed inside a process, so the whole instance restarts).
//! 2. **Create** the runner when the instance is live and this node has none.
//! 3. **Download** the model while this node does not have all of it (idempotent: the caller
//!    starts or continues a download).
//! 4. **Connect** (join the MLX ring) from `Idle`: ranks `0..n−1` at once — they accept; the
//!    last rank `n−1` only when every other rank is at least `Connecting` — it connects last,
//!    so it never dials a rank that is not listening yet.
//! 5. **Load** from `Connected`, when every rank is at least `Connected` and every node has
//!    the whole model.
//! 6. **Warm up** from `Loaded`: ranks below `n−1` when every runner is at least `Loaded`
//!    (loaded or warming), rank `n−1` only when every other rank is at least `WarmingUp`.
//!    Warm-up runs collectives, so the ranks that wait inside them start first and the rank
//!    that completes the ring starts last.
//!
//! Otherwise: [`Action::Wait`]. Start-up cannot deadlock under this rule: each wait is on
//! ranks strictly ahead in the order (ranks `< n−1` never wait on anyone to connect or warm
//! up, and rank `n−1` waits only on them), and loading waits only on states every rank reaches
//! without waiting on loading. A ring of one is rank `n−1` with no others and never waits.

use crate::node::NodeId;
use serde::{Deserialize, Serialize};

/// A runner's lifecycle state, as its node reports it into the replicated state.
///
/// JSON: `"idle"`, `{"loading": {"layers_loaded": 3, "total": 10}}`, `{"failed": {"reason":
/// "..."}}` (externally tagged, so binary formats such as postcard can carry it too).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RunnerStatus {
    /// Process started, nothing done yet.
    Idle,
    /// Joining the MLX group.
    Connecting,
    /// In the MLX group.
    Connected,
    /// Loading its layers.
    Loading {
        /// Layers loaded so far.
        layers_loaded: u32,
        /// Layers to load.
        total: u32,
    },
    /// Weights loaded.
    Loaded,
    /// Running a first generation to compile kernels and check the ring.
    WarmingUp,
    /// Ready for requests.
    Ready,
    /// Serving a request.
    Running,
    /// Stopping.
    ShuttingDown,
    /// Stopped.
    Shutdown,
    /// Failed; the runner exits.
    Failed {
        /// What went wrong, for the user.
        reason: String,
    },
}

/// Where an instance stands as a whole, from its placement and its ranks' runners (the rule
/// is `control`'s `InstanceView::status`; the cluster API shows it as `status`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum InstanceStatus {
    /// Every rank's runner is ready (or generating).
    Ready,
    /// No placement on the nodes there are.
    Unplaceable,
    /// A rank failed.
    Failed,
    /// On its way.
    Starting,
}

impl RunnerStatus {
    /// The state's name, as the API, the runner protocol and progress lines spell it
    /// (`idle`, `loading`, `warming_up`, `failed`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            RunnerStatus::Idle => "idle",
            RunnerStatus::Connecting => "connecting",
            RunnerStatus::Connected => "connected",
            RunnerStatus::Loading { .. } => "loading",
            RunnerStatus::Loaded => "loaded",
            RunnerStatus::WarmingUp => "warming_up",
            RunnerStatus::Ready => "ready",
            RunnerStatus::Running => "running",
            RunnerStatus::ShuttingDown => "shutting_down",
            RunnerStatus::Shutdown => "shutdown",
            RunnerStatus::Failed { .. } => "failed",
        }
    }

    /// Whether a runner in this state serves requests (ready, or running some): the one
    /// place that says which states take chat requests, so that routing, the instance answers
    /// and the tests' readers agree.
    pub fn is_serving(&self) -> bool {
        matches!(self, RunnerStatus::Ready | RunnerStatus::Running)
    }

    /// Whether a runner in this state holds its model's memory (its weights are loaded):
    /// loaded, warming up or serving. What a new placement must leave to it.
    pub fn holds_memory(&self) -> bool {
        self.stage().is_some_and(|stage| stage >= LOADED)
    }

    /// Position in start-up, for "at least" checks; `None` once stopping, stopped or failed.
    fn stage(&self) -> Option<u8> {
        Some(match self {
            RunnerStatus::Idle => 0,
            RunnerStatus::Connecting => 1,
            RunnerStatus::Connected => 2,
            RunnerStatus::Loading { .. } => 3,
            RunnerStatus::Loaded => 4,
            RunnerStatus::WarmingUp => 5,
            _ if self.is_serving() => 6,
            // Stopping, stopped or failed.
            _ => return None,
        })
    }
}

const CONNECTING: u8 = 1;
const CONNECTED: u8 = 2;
const LOADED: u8 = 4;
const WARMING_UP: u8 = 5;

/// One rank of the instance, as the replicated state shows it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct RankView {
    /// The node that runs the rank.
    pub node: NodeId,
    /// Its runner's last reported status, if it has a runner.
    pub runner: Option<RunnerStatus>,
    /// Whether that node has the whole model on disk.
    pub model_ready: bool,
}

/// What one node knows when it plans its runner for one instance.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct PlanInput {
    /// Whether the instance still exists in the state (not deleted).
    pub instance_live: bool,
    /// This node's rank in the instance.
    pub my_rank: usize,
    /// Every rank, in rank order.
    pub ranks: Vec<RankView>,
}

/// Why a runner is shut down.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ShutdownReason {
    /// The instance was deleted.
    InstanceGone,
    /// Another rank's runner failed.
    SiblingFailed {
        /// The lowest failed rank.
        rank: usize,
    },
}

/// The next thing this node should do for the instance.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Start a runner process for this rank.
    CreateRunner,
    /// Start or continue downloading the model.
    Download,
    /// Tell the runner to join the MLX ring.
    Connect,
    /// Tell the runner to load its layers.
    Load,
    /// Tell the runner to warm up.
    WarmUp,
    /// Stop the runner.
    ShutDown(ShutdownReason),
    /// Nothing to do until the state changes.
    Wait,
}

/// The next action for this node's runner (see the module docs for the rule).
pub fn next_action(input: &PlanInput) -> Action {
    let Some(me) = input.ranks.get(input.my_rank) else {
        return Action::Wait;
    };
    let alive = me.runner.as_ref().is_some_and(|r| r.stage().is_some());
    if !input.instance_live {
        return if alive {
            Action::ShutDown(ShutdownReason::InstanceGone)
        } else {
            Action::Wait
        };
    }
    let failed = input.ranks.iter().enumerate().find(|(rank, view)| {
        *rank != input.my_rank && matches!(view.runner, Some(RunnerStatus::Failed { .. }))
    });
    if let Some((rank, _)) = failed {
        return if alive {
            Action::ShutDown(ShutdownReason::SiblingFailed { rank })
        } else {
            Action::Wait
        };
    }
    let Some(my_stage) = me.runner.as_ref().map(RunnerStatus::stage) else {
        return Action::CreateRunner;
    };
    let Some(my_stage) = my_stage else {
        return Action::Wait;
    };
    if !me.model_ready && my_stage < LOADED {
        return Action::Download;
    }
    let last = input.ranks.len() - 1;
    let others_at_least = |stage: u8| {
        input.ranks.iter().enumerate().all(|(rank, view)| {
            rank == input.my_rank
                || view
                    .runner
                    .as_ref()
                    .and_then(RunnerStatus::stage)
                    .is_some_and(|s| s >= stage)
        })
    };
    let ready = match me.runner.as_ref() {
        Some(RunnerStatus::Idle) => {
            (input.my_rank < last || others_at_least(CONNECTING)).then_some(Action::Connect)
        }
        Some(RunnerStatus::Connected) => (others_at_least(CONNECTED)
            && input.ranks.iter().all(|view| view.model_ready))
        .then_some(Action::Load),
        Some(RunnerStatus::Loaded) => {
            let others = if input.my_rank < last {
                LOADED
            } else {
                WARMING_UP
            };
            others_at_least(others).then_some(Action::WarmUp)
        }
        _ => None,
    };
    ready.unwrap_or(Action::Wait)
}
