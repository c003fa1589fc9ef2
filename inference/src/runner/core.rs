//! The runner's lifecycle as a state machine, without IO (as the mesh's protocol core): the
//! node's commands and the outcomes of the work the core asked for go in ([`RunnerInput`]); the
//! events for the node and the work to do come out ([`Output`]). The IO loop
//! ([`super::io`]) reads frames, does the work (joins the ring, loads, generates) and feeds the
//! results back; every decision about what a command means in the current state is made here,
//! so it can be tested by feeding inputs and reading outputs.
//!
//! The lifecycle (see [`super`] for what the node relies on): `idle`, then for a ring of one
//! `Load` → `loading` → `loaded` → `warming_up` → `ready` ⇄ `running`; for a rank of a larger
//! ring `Connect` → `connecting` → `connected`, `Load` → `loading` → `loaded`, `WarmUp` →
//! `warming_up` → `ready` (rank 0 drives, the others serve the ring). Requests run together
//! (the IO loop batches them, [`crate::batch`]): a `Generate` is taken at any time once
//! ready, the status is `running` while any runs and `ready` once none does; cancels are
//! forwarded at once; a `Shutdown` waits until the requests in flight have ended (and new
//! ones are refused meanwhile).

use super::protocol::{Event, NodeCommand, RunnerStatus, Sharding};
use crate::request::{Completion, GenerateRequest, TokenLogprobs};
use crate::weights::WeightFormat;
use std::collections::{BTreeSet, VecDeque};

/// This process's seat in a ring of several ranks, as far as the core needs it (for the
/// reasons it gives when things fail).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seat {
    /// This rank.
    pub rank: usize,
    /// Ranks in the ring.
    pub size: usize,
    /// Its neighbours, as reasons name them: "left neighbour rank 2 (10.99.0.3:5000), ...".
    pub neighbours: String,
}

/// Why a load ended without a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadFailure {
    /// The watchdog's timeout passed (already reported through [`RunnerInput::LoadTimedOut`]).
    TimedOut,
    /// Anything else, with the reason.
    Failed(String),
}

/// Why a generation ended without a completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenerateFailure {
    /// What went wrong.
    pub message: String,
    /// The ring to the other ranks broke: the instance cannot go on.
    pub ring_lost: bool,
}

/// What the core reacts to.
#[derive(Debug, Clone, PartialEq)]
pub enum RunnerInput {
    /// The process is up; `Err` when MLX does not work in it.
    Started(Result<(), String>),
    /// A command from the node.
    Command(NodeCommand),
    /// A frame that could not be read (reported, then skipped).
    BadFrame(String),
    /// A well-formed frame for request `id` whose message could not be read: that request
    /// ends with the error.
    BadRequest {
        /// The request's id.
        id: u64,
        /// Why its message was refused.
        reason: String,
    },
    /// The outcome of [`RunnerAction::Connect`].
    Connected(Result<Seat, String>),
    /// Loading made progress.
    LoadProgress {
        /// Steps done.
        done: usize,
        /// Steps in all.
        total: usize,
    },
    /// The load watchdog's timeout passed while loading.
    LoadTimedOut {
        /// The timeout, in seconds.
        seconds: u64,
    },
    /// The outcome of [`RunnerAction::Load`]: `Ok(whole)`, whether the shard holds every layer.
    Loaded(Result<bool, LoadFailure>),
    /// The outcome of [`RunnerAction::WarmUp`] or [`RunnerAction::Serve`].
    WarmedUp(Result<(), String>),
    /// The generation in flight produced a token.
    Token {
        /// The request.
        id: u64,
        /// Token id.
        token: u32,
        /// New text (may be empty).
        text: String,
        /// Its log-probability.
        logprob: f32,
        /// Its own text and the most likely tokens, when the request asked for them.
        top_logprobs: Option<TokenLogprobs>,
    },
    /// Part of a request's prompt came from the prompt cache.
    Cached {
        /// The request.
        id: u64,
        /// Prompt tokens reused.
        tokens: usize,
    },
    /// The outcome of [`RunnerAction::Generate`].
    Generated {
        /// The request.
        id: u64,
        /// The completion, or why there is none.
        result: Result<Completion, GenerateFailure>,
    },
    /// A serving rank's loop ended: rank 0 said stop (`Ok(steps)`) or the ring broke.
    Served(Result<usize, String>),
    /// A batch step ended without a token (see [`Event::Stepped`]).
    Stepped,
}

/// Work the core asks of its IO loop.
#[derive(Debug, Clone, PartialEq)]
pub enum RunnerAction {
    /// Join the ring as `rank` of `hosts` within `timeout_ms`; answer [`RunnerInput::Connected`].
    Connect {
        /// This rank.
        rank: usize,
        /// Every rank's addresses.
        hosts: Vec<Vec<String>>,
        /// The deadline, in milliseconds.
        timeout_ms: u64,
    },
    /// Load the model (under the watchdog); answer [`RunnerInput::LoadProgress`]… and
    /// [`RunnerInput::Loaded`].
    Load {
        /// GGUF file or Hugging Face folder.
        model: String,
        /// Layers to hold (default: all).
        layers: Option<(usize, usize)>,
        /// Weight representation (default: the backend's fastest).
        format: Option<WeightFormat>,
        /// How the ring splits the model; `None` for a ring of one.
        sharding: Option<Sharding>,
    },
    /// Run a one-token generation (the whole model, or rank 0 through the ring); answer
    /// [`RunnerInput::WarmedUp`].
    WarmUp,
    /// A rank above 0: serve the ring on its own thread; answer [`RunnerInput::WarmedUp`] once it
    /// runs, and [`RunnerInput::Served`] when it ends.
    Serve,
    /// Add a request to the batch; answer [`RunnerInput::Token`]s and [`RunnerInput::Generated`].
    Generate {
        /// The request.
        id: u64,
        /// What to generate.
        request: GenerateRequest,
    },
    /// Cancel request `id` (it ends `cancelled` at the next step).
    Cancel {
        /// The request.
        id: u64,
    },
    /// Rank 0: stop the other ranks (bounded; the process exits right after).
    StopRing,
    /// End the process with this code.
    Exit(i32),
}

/// What the core gives out, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// An event for the node.
    Event(Event),
    /// Work for the IO loop.
    Action(RunnerAction),
}

/// The part of a multi-rank instance this rank plays, or the whole model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// A ring of one.
    Whole,
    /// Rank 0 of a ring: it drives every step.
    Driver,
    /// A rank above 0: it serves the ring.
    Follower,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Before [`RunnerInput::Started`].
    Starting,
    /// Waiting for a `Connect` or a `Load`.
    Unloaded,
    /// Joining the ring.
    Connecting,
    /// Loading; `timed_out` once the watchdog reported.
    Loading { timed_out: bool },
    /// A rank of a ring, loaded, waiting for `WarmUp`.
    Loaded(Role),
    /// Warming up (or, for a follower, starting to serve).
    WarmingUp(Role),
    /// Ready for requests (a follower: serving the ring); requests may be running.
    Ready(Role),
    /// The process is ending.
    Exited,
}

/// The runner's state machine.
#[derive(Debug)]
pub struct RunnerCore {
    phase: Phase,
    /// Whether the warm-up after a ring of one's load is wanted.
    warm_up: bool,
    /// A `Connect` was taken (it comes once).
    connected: bool,
    seat: Option<Seat>,
    /// Requests cancelled before they came.
    cancelled: BTreeSet<u64>,
    /// Requests running (taken, not yet ended).
    running: BTreeSet<u64>,
    /// Inputs held back until no request runs (a shutdown).
    deferred: VecDeque<RunnerInput>,
}

impl RunnerCore {
    /// A runner that warms up a ring of one after loading when `warm_up`.
    pub fn new(warm_up: bool) -> RunnerCore {
        RunnerCore {
            phase: Phase::Starting,
            warm_up,
            connected: false,
            seat: None,
            cancelled: BTreeSet::new(),
            running: BTreeSet::new(),
            deferred: VecDeque::new(),
        }
    }

    /// True once the core has asked the process to end (it ignores every input after).
    pub fn exited(&self) -> bool {
        self.phase == Phase::Exited
    }

    /// Reacts to `input`.
    pub fn handle(&mut self, input: RunnerInput) -> Vec<Output> {
        let mut out = Vec::new();
        self.step(input, &mut out);
        // Inputs held back while requests ran, once none does.
        while self.running.is_empty() && self.phase != Phase::Exited {
            let Some(next) = self.deferred.pop_front() else {
                break;
            };
            self.step(next, &mut out);
        }
        out
    }

    fn step(&mut self, input: RunnerInput, out: &mut Vec<Output>) {
        if self.phase == Phase::Exited {
            return;
        }
        match input {
            RunnerInput::Started(Ok(())) => {
                self.phase = Phase::Unloaded;
                state(out, RunnerStatus::Idle);
            }
            RunnerInput::Started(Err(e)) => {
                self.fail(out, format!("MLX does not work in this process: {e}"))
            }
            RunnerInput::Command(NodeCommand::Cancel { id }) => self.cancel(id, out),
            RunnerInput::Command(NodeCommand::Shutdown) if !self.running.is_empty() => self
                .deferred
                .push_back(RunnerInput::Command(NodeCommand::Shutdown)),
            RunnerInput::Command(command) => self.command(command, out),
            RunnerInput::BadFrame(message) => error(out, None, message),
            RunnerInput::BadRequest { id, reason } => error(
                out,
                Some(id),
                format!("the runner could not read this request ({reason}); nothing was run"),
            ),
            RunnerInput::Connected(Ok(seat)) => {
                self.seat = Some(seat);
                self.phase = Phase::Unloaded;
                state(out, RunnerStatus::Connected);
            }
            RunnerInput::Connected(Err(reason)) => self.fail(out, reason),
            RunnerInput::LoadProgress { done, total } => {
                if self.phase == (Phase::Loading { timed_out: false }) {
                    state(
                        out,
                        RunnerStatus::Loading {
                            layers_loaded: count(done),
                            total: count(total),
                        },
                    );
                }
            }
            RunnerInput::LoadTimedOut { seconds } => {
                self.phase = Phase::Loading { timed_out: true };
                state(
                    out,
                    RunnerStatus::Failed {
                        reason: format!("model loading timed out after {seconds} s"),
                    },
                );
            }
            RunnerInput::Loaded(result) => self.loaded(result, out),
            RunnerInput::WarmedUp(result) => self.warmed_up(result, out),
            RunnerInput::Token {
                id,
                token,
                text,
                logprob,
                top_logprobs,
            } => {
                if self.running.contains(&id) {
                    out.push(Output::Event(Event::Token {
                        id,
                        token,
                        text,
                        logprob,
                        top_logprobs,
                    }));
                }
            }
            RunnerInput::Cached { id, tokens } => {
                if self.running.contains(&id) {
                    out.push(Output::Event(Event::Cached { id, tokens }));
                }
            }
            RunnerInput::Generated { id, result } => self.generated(id, result, out),
            RunnerInput::Stepped => {
                if !self.running.is_empty() {
                    out.push(Output::Event(Event::Stepped));
                }
            }
            RunnerInput::Served(Ok(_steps)) => self.exit(out, 0),
            RunnerInput::Served(Err(e)) => {
                let whom = self.seat.as_ref().map_or(String::new(), |s| {
                    format!("rank {} of {} ({})", s.rank, s.size, s.neighbours)
                });
                self.fail(out, format!("{whom} lost the ring: {e}"));
            }
        }
    }

    fn command(&mut self, command: NodeCommand, out: &mut Vec<Output>) {
        match command {
            NodeCommand::Connect {
                rank,
                hosts,
                timeout_ms,
            } => {
                if self.connected || self.phase != Phase::Unloaded {
                    return error(
                        out,
                        None,
                        "Connect comes once, before Load; start a new runner to join another ring",
                    );
                }
                self.connected = true;
                if hosts.len() == 1 && rank == 0 {
                    return state(out, RunnerStatus::Connected);
                }
                self.phase = Phase::Connecting;
                state(out, RunnerStatus::Connecting);
                act(
                    out,
                    RunnerAction::Connect {
                        rank,
                        hosts,
                        timeout_ms,
                    },
                );
            }
            NodeCommand::Load {
                model,
                layers,
                format,
                sharding,
            } => {
                if self.phase != Phase::Unloaded {
                    return error(out, None, "a model is already loaded; start a new runner");
                }
                if let Some(seat) = &self.seat {
                    if sharding == Sharding::Pipeline && layers.is_none() {
                        let reason = format!(
                            "rank {} of a {}-rank pipeline needs its layer range in Load",
                            seat.rank, seat.size
                        );
                        return self.fail(out, reason);
                    }
                }
                self.phase = Phase::Loading { timed_out: false };
                let sharding = self.seat.as_ref().map(|_| sharding);
                act(
                    out,
                    RunnerAction::Load {
                        model,
                        layers,
                        format,
                        sharding,
                    },
                );
            }
            NodeCommand::WarmUp => match self.phase {
                Phase::Loaded(role) => {
                    self.phase = Phase::WarmingUp(role);
                    state(out, RunnerStatus::WarmingUp);
                    let work = if role == Role::Driver {
                        RunnerAction::WarmUp
                    } else {
                        RunnerAction::Serve
                    };
                    act(out, work);
                }
                Phase::Ready(Role::Whole) => error(
                    out,
                    None,
                    "WarmUp is for ranks of a multi-rank ring; a ring of one warms up while \
                     loading",
                ),
                Phase::Ready(_) => error(out, None, "this rank is already warmed up"),
                _ => error(out, None, "WarmUp needs a loaded model"),
            },
            NodeCommand::Generate { id, request } => match self.phase {
                Phase::Ready(Role::Whole | Role::Driver) if !self.deferred.is_empty() => {
                    error(out, Some(id), "the runner is shutting down")
                }
                Phase::Ready(Role::Whole | Role::Driver) if self.running.contains(&id) => {
                    error(out, Some(id), format!("request {id} is already running"))
                }
                Phase::Ready(Role::Whole | Role::Driver) => {
                    if self.running.is_empty() {
                        state(out, RunnerStatus::Running);
                    }
                    self.running.insert(id);
                    act(out, RunnerAction::Generate { id, request });
                    if self.cancelled.remove(&id) {
                        act(out, RunnerAction::Cancel { id });
                    }
                }
                Phase::Loaded(Role::Driver) | Phase::WarmingUp(Role::Driver) => error(
                    out,
                    Some(id),
                    "the instance is not warmed up yet (send WarmUp)",
                ),
                Phase::Loaded(Role::Follower)
                | Phase::WarmingUp(Role::Follower)
                | Phase::Ready(Role::Follower) => {
                    let rank = self.seat.as_ref().map_or(0, |s| s.rank);
                    error(
                        out,
                        Some(id),
                        format!("only rank 0 takes requests; this is rank {rank}"),
                    )
                }
                _ => error(out, Some(id), "no model is loaded yet"),
            },
            NodeCommand::Cancel { id } => self.cancel(id, out),
            NodeCommand::Shutdown => {
                if matches!(
                    self.phase,
                    Phase::Loaded(Role::Driver)
                        | Phase::WarmingUp(Role::Driver)
                        | Phase::Ready(Role::Driver)
                ) {
                    act(out, RunnerAction::StopRing);
                }
                self.exit(out, 0);
            }
        }
    }

    fn loaded(&mut self, result: Result<bool, LoadFailure>, out: &mut Vec<Output>) {
        if let Phase::Loading { timed_out: true } = self.phase {
            return self.exit(out, 3);
        }
        let whole = match result {
            Ok(whole) => whole,
            Err(LoadFailure::TimedOut) => return self.exit(out, 3),
            Err(LoadFailure::Failed(reason)) => return self.fail(out, reason),
        };
        state(out, RunnerStatus::Loaded);
        match &self.seat {
            None if self.warm_up && whole => {
                self.phase = Phase::WarmingUp(Role::Whole);
                state(out, RunnerStatus::WarmingUp);
                act(out, RunnerAction::WarmUp);
            }
            None => {
                self.phase = Phase::Ready(Role::Whole);
                state(out, RunnerStatus::Ready);
            }
            Some(seat) if seat.rank == 0 => self.phase = Phase::Loaded(Role::Driver),
            Some(_) => self.phase = Phase::Loaded(Role::Follower),
        }
    }

    fn warmed_up(&mut self, result: Result<(), String>, out: &mut Vec<Output>) {
        let Phase::WarmingUp(role) = self.phase else {
            return;
        };
        match result {
            Ok(()) => {
                self.phase = Phase::Ready(role);
                state(out, RunnerStatus::Ready);
            }
            Err(e) => {
                let reason = match role {
                    Role::Whole => format!("warm-up failed: {e}"),
                    Role::Driver => format!("warm-up through the ring failed: {e}"),
                    Role::Follower => format!("cannot start the serving thread: {e}"),
                };
                self.fail(out, reason);
            }
        }
    }

    fn generated(
        &mut self,
        id: u64,
        result: Result<Completion, GenerateFailure>,
        out: &mut Vec<Output>,
    ) {
        let Phase::Ready(role) = self.phase else {
            return;
        };
        if !self.running.remove(&id) {
            return;
        }
        match result {
            Ok(completion) => out.push(Output::Event(Event::Done { id, completion })),
            Err(GenerateFailure {
                message,
                ring_lost: true,
            }) => {
                // The ranks are out of step or one is gone: the request ends with an error,
                // then the whole instance (this rank first) goes down.
                error(out, Some(id), message.clone());
                let ring = self
                    .seat
                    .as_ref()
                    .map_or(String::new(), |s| format!(" ({})", s.neighbours));
                return self.fail(out, format!("rank 0 lost the ring{ring}: {message}"));
            }
            Err(GenerateFailure { message, .. }) => error(out, Some(id), message),
        }
        if self.running.is_empty() {
            self.phase = Phase::Ready(role);
            state(out, RunnerStatus::Ready);
        }
    }

    /// A cancel: forwarded at once for a running request, kept for one still to come (the
    /// node may send it before the request when a client gives up at once).
    fn cancel(&mut self, id: u64, out: &mut Vec<Output>) {
        if self.running.contains(&id) {
            act(out, RunnerAction::Cancel { id });
        } else {
            // Bounded: a cancel for an id that never comes is forgotten with the oldest.
            if self.cancelled.len() >= MAX_EARLY_CANCELS {
                self.cancelled.pop_first();
            }
            self.cancelled.insert(id);
        }
    }

    fn fail(&mut self, out: &mut Vec<Output>, reason: String) {
        state(out, RunnerStatus::Failed { reason });
        self.exit(out, 1);
    }

    fn exit(&mut self, out: &mut Vec<Output>, code: i32) {
        self.phase = Phase::Exited;
        self.deferred.clear();
        act(out, RunnerAction::Exit(code));
    }
}

/// Cancels kept for requests that have not come (see [`RunnerCore::cancel`]).
const MAX_EARLY_CANCELS: usize = 1024;

fn state(out: &mut Vec<Output>, s: RunnerStatus) {
    out.push(Output::Event(Event::State(s)));
}

fn error(out: &mut Vec<Output>, id: Option<u64>, message: impl Into<String>) {
    out.push(Output::Event(Event::Error {
        id,
        message: message.into(),
    }));
}

fn act(out: &mut Vec<Output>, action: RunnerAction) {
    out.push(Output::Action(action));
}

#[cfg(test)]
mod tests;

/// A layer count as the runner status carries it (saturating; no model has 4 billion layers).
fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}
