//! The scheduler: the state machine between requesters and one runner process.
//!
//! It tracks the runner's [`RunnerStatus`] (published on a watch channel), keeps a FIFO queue
//! of generation requests, keeps up to `max_running` of them in the runner at once (the runner
//! batches them: every step decodes all of them), sends the next as soon as one ends, and
//! routes each request's events to that request's own channel. The queue's bound is the
//! supervisor's ([`crate::Supervisor::generate`] refuses past it).
//!
//! A request's channel carries the runner protocol's own [`Event`]s for it: `Token`s, then
//! exactly one end, `Done`, `Error` (the runner refused or failed this request and stays
//! usable), or `State(Failed)` (the runner is gone: the instance is lost). A request is never
//! silently dropped; a request cancelled while queued never reaches the runner; when the
//! runner dies every waiting request ends with `State(Failed)` and the status becomes
//! `Failed`.
//!
//! **The step deadline.** While requests run, the runner sends an event at least once per
//! batch step (a token, or [`Event::Stepped`] for a step that only computed a prompt chunk).
//! When none comes for the step timeout, the runner — or a rank of its ring, which it waits
//! on inside MLX, where nothing times out — has hung (a process frozen without closing its
//! sockets): the scheduler kills it, ends every request with `State(Failed)` naming the
//! timeout, the status becomes `Failed`, and the runner is marked hung
//! ([`Scheduler::hung_flag`], published as [`control::RunnerRecord::hung`]), which makes the
//! control plane place the instance again.

use placement::RunnerStatus;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use wire::request::GenerateRequest;
use wire::runner::{Event, NodeCommand};

/// Where one request's events go (see the module docs for what it receives).
pub type RequestEvents = mpsc::UnboundedSender<Event>;

/// What the scheduler task reacts to.
pub(super) enum SchedulerInput {
    /// A new request from [`crate::Supervisor::generate`].
    Submit {
        /// The supervisor's id for it (unique per runner).
        id: u64,
        /// What to generate.
        request: Box<GenerateRequest>,
        /// Where its events go.
        events: RequestEvents,
    },
    /// The requester cancelled (or went away).
    Cancel(u64),
    /// An event from the runner's stdout.
    Runner(Event),
    /// The runner's stdout ended or broke: the process is gone (or going).
    RunnerGone(String),
    /// Shut the runner down cleanly.
    Shutdown,
    /// A lifecycle command for the runner (connect, load, warm up).
    Lifecycle(NodeCommand),
}

/// A request waiting for, or using, the runner.
struct Pending {
    id: u64,
    request: Box<GenerateRequest>,
    events: RequestEvents,
}

/// The state machine between requesters and the runner (see the module docs).
pub(super) struct Scheduler {
    commands: std::sync::mpsc::Sender<NodeCommand>,
    state: watch::Sender<RunnerStatus>,
    queue: VecDeque<Pending>,
    /// Requests in the runner, by id.
    running: BTreeMap<u64, Pending>,
    /// Running requests whose `Cancel` was already sent.
    cancel_sent: BTreeSet<u64>,
    /// Requests kept in the runner at once at most.
    max_running: usize,
    /// Set once the runner failed or exited: why.
    failure: Option<String>,
    child: Arc<Mutex<Child>>,
    load: Arc<std::sync::atomic::AtomicUsize>,
    /// Longest wait for the runner's next event while requests run (see the module docs).
    step_timeout: Duration,
    /// When the runner last showed progress (or its first request went in).
    last_progress: Instant,
    /// Set when the step deadline passed (see the module docs).
    hung: Arc<AtomicBool>,
}

/// The event that ends a request when the runner is gone: the instance is lost.
pub fn instance_lost(reason: impl Into<String>) -> Event {
    Event::State(RunnerStatus::Failed {
        reason: reason.into(),
    })
}

impl Scheduler {
    /// A scheduler for a runner started just now (status `idle`): it sends commands on
    /// `commands`, publishes the status on `state`, counts queued and running requests in
    /// `load`, asks `child` for its exit status once the runner's output ends, keeps up
    /// to `max_running` requests in the runner at once, and ends the runner when no event
    /// comes for `step_timeout` while requests run.
    pub(super) fn new(
        commands: std::sync::mpsc::Sender<NodeCommand>,
        state: watch::Sender<RunnerStatus>,
        child: Arc<Mutex<Child>>,
        load: Arc<std::sync::atomic::AtomicUsize>,
        max_running: usize,
        step_timeout: Duration,
    ) -> Scheduler {
        Scheduler {
            commands,
            state,
            queue: VecDeque::new(),
            running: BTreeMap::new(),
            cancel_sent: BTreeSet::new(),
            max_running: max_running.max(1),
            failure: None,
            child,
            load,
            step_timeout,
            last_progress: Instant::now(),
            hung: Arc::default(),
        }
    }

    /// Whether the runner was ended by the step deadline, for whoever holds the runner's
    /// handle once the scheduler runs.
    pub(super) fn hung_flag(&self) -> Arc<AtomicBool> {
        self.hung.clone()
    }

    /// Runs until every input sender is gone.
    pub(super) async fn run(mut self, mut inputs: mpsc::UnboundedReceiver<SchedulerInput>) {
        loop {
            let waiting = !self.running.is_empty() && self.failure.is_none();
            let deadline = self.last_progress + self.step_timeout;
            let input = tokio::select! {
                input = inputs.recv() => input,
                () = tokio::time::sleep_until(deadline), if waiting => {
                    self.hung();
                    continue;
                }
            };
            let Some(input) = input else {
                return;
            };
            if matches!(input, SchedulerInput::Runner(_)) {
                self.last_progress = Instant::now();
            }
            match input {
                SchedulerInput::Submit {
                    id,
                    request,
                    events,
                } => {
                    if let Some(reason) = &self.failure {
                        let _ = events.send(instance_lost(reason.clone()));
                        continue;
                    }
                    self.load.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    self.queue.push_back(Pending {
                        id,
                        request,
                        events,
                    });
                }
                SchedulerInput::Cancel(id) => self.cancel(id),
                SchedulerInput::Runner(event) => self.on_event(event),
                SchedulerInput::RunnerGone(reason) => self.on_gone(reason),
                SchedulerInput::Lifecycle(command) => {
                    if self.failure.is_none() {
                        let _ = self.commands.send(command);
                    }
                }
                SchedulerInput::Shutdown => {
                    self.fail_all("the instance was shut down");
                    let _ = self.commands.send(NodeCommand::Shutdown);
                    let _ = self.state.send(RunnerStatus::Failed {
                        reason: "shut down".into(),
                    });
                    self.failure = Some("the instance was shut down".into());
                }
            }
            self.start_next();
        }
    }

    /// The step deadline passed with requests running (see the module docs).
    fn hung(&mut self) {
        let reason = format!(
            "hung: no step finished in {} s: a rank of the ring stopped answering (frozen, or \
             its link is down); the instance is placed again",
            self.step_timeout.as_secs_f64()
        );
        self.hung.store(true, Ordering::SeqCst);
        tracing::error!(%reason, "runner hung: ending it");
        {
            let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
            if let Ok(None) = child.try_wait() {
                let _ = child.kill();
            }
        }
        self.fail_all(&reason);
        let _ = self.state.send(RunnerStatus::Failed {
            reason: reason.clone(),
        });
        self.failure = Some(reason);
    }

    fn cancel(&mut self, id: u64) {
        if let Some(pos) = self.queue.iter().position(|p| p.id == id) {
            // Never reached the runner: drop it here. The requester stopped listening.
            self.queue.remove(pos);
            self.finished();
        } else if self.running.contains_key(&id) && self.cancel_sent.insert(id) {
            let _ = self.commands.send(NodeCommand::Cancel { id });
        }
    }

    fn on_event(&mut self, event: Event) {
        match event {
            Event::State(state) => {
                if let RunnerStatus::Failed { reason } = &state {
                    tracing::error!(%reason, "runner failed");
                    self.failure = Some(reason.clone());
                    self.fail_all(reason);
                }
                if self.failure.is_none() || matches!(state, RunnerStatus::Failed { .. }) {
                    let _ = self.state.send(state);
                }
            }
            Event::Token { id, .. } | Event::Cached { id, .. } => {
                if let Some(running) = self.running.get(&id) {
                    let _ = running.events.send(event);
                }
            }
            Event::Done { id, .. } | Event::Error { id: Some(id), .. } => {
                if let Some(running) = self.take_running(id) {
                    let _ = running.events.send(event);
                }
            }
            Event::Error { id: None, message } => {
                tracing::warn!(%message, "runner reported an error");
            }
            Event::Stepped => {}
        }
    }

    fn take_running(&mut self, id: u64) -> Option<Pending> {
        let running = self.running.remove(&id)?;
        self.cancel_sent.remove(&id);
        self.finished();
        Some(running)
    }

    fn finished(&self) {
        self.load.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }

    fn on_gone(&mut self, reason: String) {
        // The exit status says more than "stdout closed"; the process is gone or about to be.
        let status = {
            let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
            let mut status = None;
            for _ in 0..50 {
                if let Ok(Some(s)) = child.try_wait() {
                    status = Some(s);
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            status
        };
        let reason = match (self.failure.take(), status) {
            (Some(failed), _) => failed,
            (None, Some(status)) => format!("{reason} ({status})"),
            (None, None) => reason,
        };
        tracing::warn!(%reason, "runner gone");
        self.fail_all(&reason);
        let _ = self.state.send(RunnerStatus::Failed {
            reason: reason.clone(),
        });
        self.failure = Some(reason);
    }

    /// Ends every queued and running request with "instance lost".
    fn fail_all(&mut self, reason: &str) {
        self.cancel_sent.clear();
        let running = std::mem::take(&mut self.running).into_values();
        for pending in running.chain(self.queue.drain(..)) {
            self.load.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            let _ = pending.events.send(instance_lost(reason));
        }
    }

    /// Sends queued requests to the runner while it has room.
    fn start_next(&mut self) {
        if self.failure.is_some() {
            return;
        }
        if !self.state.borrow().is_serving() {
            return;
        }
        while self.running.len() < self.max_running {
            let Some(next) = self.queue.pop_front() else {
                return;
            };
            if next.events.is_closed() {
                self.finished();
                continue;
            }
            let command = NodeCommand::Generate {
                id: next.id,
                request: (*next.request).clone(),
            };
            if self.running.is_empty() {
                self.last_progress = Instant::now();
            }
            if self.commands.send(command).is_err() {
                let _ = next
                    .events
                    .send(instance_lost("the runner's input is closed"));
                self.finished();
                continue;
            }
            self.running.insert(next.id, next);
        }
    }
}

#[cfg(test)]
#[path = "scheduler_tests.rs"]
mod tests;
