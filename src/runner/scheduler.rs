//! The scheduler: the state machine between requesters and one runner process.
//!
//! It tracks the runner's [`RunnerStatus`] (published on a watch channel), keeps a FIFO queue
//! of generation requests, keeps up to `max_running` of them in the runner at once (the runner
//! batches them: every step decodes all of them), sends the next as soon as one ends, and
//! routes each request's events to that request's own channel. The queue's bound is the
//! supervisor's ([`super::Supervisor::generate`] refuses past it).
//!
//! A request's channel carries the runner protocol's own [`Event`]s for it: `Token`s, then
//! exactly one end, `Done`, `Error` (the runner refused or failed this request and stays
//! usable), or `State(Failed)` (the runner is gone: the instance is lost). A request is never
//! silently dropped; a request cancelled while queued never reaches the runner; when the
//! runner dies every waiting request ends with `State(Failed)` and the status becomes
//! `Failed`.

use inference::runner::protocol::{Command, Event};
use inference::GenerateRequest;
use placement::RunnerStatus;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// Where one request's events go (see the module docs for what it receives).
pub type RequestEvents = mpsc::UnboundedSender<Event>;

/// What the scheduler task reacts to.
pub(super) enum Input {
    /// A new request from [`super::Supervisor::generate`].
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
    Lifecycle(Command),
}

/// A request waiting for, or using, the runner.
struct Pending {
    id: u64,
    request: Box<GenerateRequest>,
    events: RequestEvents,
}

/// The state machine between requesters and the runner (see the module docs).
pub(super) struct Scheduler {
    commands: std::sync::mpsc::Sender<Command>,
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
    /// `load`, asks `child` for its exit status once the runner's output ends, and keeps up
    /// to `max_running` requests in the runner at once.
    pub(super) fn new(
        commands: std::sync::mpsc::Sender<Command>,
        state: watch::Sender<RunnerStatus>,
        child: Arc<Mutex<Child>>,
        load: Arc<std::sync::atomic::AtomicUsize>,
        max_running: usize,
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
        }
    }

    /// Runs until every input sender is gone.
    pub(super) async fn run(mut self, mut inputs: mpsc::UnboundedReceiver<Input>) {
        while let Some(input) = inputs.recv().await {
            match input {
                Input::Submit {
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
                Input::Cancel(id) => self.cancel(id),
                Input::Runner(event) => self.on_event(event),
                Input::RunnerGone(reason) => self.on_gone(reason),
                Input::Lifecycle(command) => {
                    if self.failure.is_none() {
                        let _ = self.commands.send(command);
                    }
                }
                Input::Shutdown => {
                    self.fail_all("the instance was shut down");
                    let _ = self.commands.send(Command::Shutdown);
                    let _ = self.state.send(RunnerStatus::Failed {
                        reason: "shut down".into(),
                    });
                    self.failure = Some("the instance was shut down".into());
                }
            }
            self.start_next();
        }
    }

    fn cancel(&mut self, id: u64) {
        if let Some(pos) = self.queue.iter().position(|p| p.id == id) {
            // Never reached the runner: drop it here. The requester stopped listening.
            self.queue.remove(pos);
            self.finished();
        } else if self.running.contains_key(&id) && self.cancel_sent.insert(id) {
            let _ = self.commands.send(Command::Cancel { id });
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
        if !matches!(
            *self.state.borrow(),
            RunnerStatus::Ready | RunnerStatus::Running
        ) {
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
            let command = Command::Generate {
                id: next.id,
                request: (*next.request).clone(),
            };
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
mod tests {
    use super::*;
    use inference::{Completion, FinishReason, Prompt};

    /// A scheduler driven by hand: events go in as if from the runner, commands come out as
    /// they would go to it. The "runner" process is a `sleep` that the test kills.
    struct Harness {
        inputs: mpsc::UnboundedSender<Input>,
        commands: std::sync::mpsc::Receiver<Command>,
        state: watch::Receiver<RunnerStatus>,
        load: Arc<std::sync::atomic::AtomicUsize>,
        child: Arc<Mutex<Child>>,
    }

    impl Harness {
        fn new() -> Harness {
            Harness::with_limit(1)
        }

        /// A scheduler that keeps up to `max_running` requests in the runner.
        fn with_limit(max_running: usize) -> Harness {
            let child = std::process::Command::new("sleep")
                .arg("60")
                .spawn()
                .expect("sleep starts");
            let child = Arc::new(Mutex::new(child));
            let (commands_tx, commands) = std::sync::mpsc::channel();
            let (state_tx, state) = watch::channel(RunnerStatus::Idle);
            let (inputs, inputs_rx) = mpsc::unbounded_channel();
            let load = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let scheduler = Scheduler::new(
                commands_tx,
                state_tx,
                child.clone(),
                load.clone(),
                max_running,
            );
            tokio::spawn(scheduler.run(inputs_rx));
            Harness {
                inputs,
                commands,
                state,
                load,
                child,
            }
        }

        fn submit(&self, id: u64) -> mpsc::UnboundedReceiver<Event> {
            let (events, rx) = mpsc::unbounded_channel();
            let request = GenerateRequest::new(Prompt::Tokens(vec![1, 2, 3]), 4);
            self.inputs
                .send(Input::Submit {
                    id,
                    request: Box::new(request),
                    events,
                })
                .unwrap();
            rx
        }

        fn runner(&self, event: Event) {
            self.inputs.send(Input::Runner(event)).unwrap();
        }

        /// The next command sent to the runner, if one comes within a second.
        async fn next_command(&self) -> Option<Command> {
            for _ in 0..100 {
                if let Ok(c) = self.commands.try_recv() {
                    return Some(c);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            None
        }

        async fn settle(&self) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn completion() -> Completion {
        Completion {
            text: "hi".into(),
            tokens: vec![7],
            logprobs: vec![-0.5],
            finish_reason: FinishReason::Length,
            prompt_tokens: 3,
            cached_tokens: 0,
            prompt_seconds: 0.0,
            generation_seconds: 0.0,
        }
    }

    fn generate_id(command: Option<Command>) -> u64 {
        match command {
            Some(Command::Generate { id, .. }) => id,
            other => panic!("expected a Generate, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn requests_run_one_at_a_time_in_order_and_queued_cancels_never_reach_the_runner() {
        let h = Harness::new();
        let mut first = h.submit(1);
        let second = h.submit(2);
        let mut third = h.submit(3);
        h.settle().await;
        assert!(
            h.next_command().await.is_none(),
            "nothing is sent before the runner is ready"
        );
        assert_eq!(h.load.load(std::sync::atomic::Ordering::SeqCst), 3);

        h.runner(Event::State(RunnerStatus::Ready));
        assert_eq!(generate_id(h.next_command().await), 1);
        h.inputs.send(Input::Cancel(2)).unwrap();
        drop(second);
        h.runner(Event::State(RunnerStatus::Running));
        h.runner(Event::Token {
            id: 1,
            token: 7,
            text: "hi".into(),
            logprob: -0.5,
        });
        h.settle().await;
        assert!(h.next_command().await.is_none(), "one request at a time");
        h.runner(Event::Done {
            id: 1,
            completion: completion(),
        });
        h.runner(Event::State(RunnerStatus::Ready));
        assert_eq!(
            first.recv().await,
            Some(Event::Token {
                id: 1,
                token: 7,
                text: "hi".into(),
                logprob: -0.5
            })
        );
        assert_eq!(
            first.recv().await,
            Some(Event::Done {
                id: 1,
                completion: completion()
            })
        );
        // Request 2 was cancelled while queued: the next one sent is 3.
        assert_eq!(generate_id(h.next_command().await), 3);
        assert_eq!(h.load.load(std::sync::atomic::Ordering::SeqCst), 1);

        // Cancelling the running request forwards a Cancel to the runner, once.
        h.inputs.send(Input::Cancel(3)).unwrap();
        h.inputs.send(Input::Cancel(3)).unwrap();
        assert_eq!(h.next_command().await, Some(Command::Cancel { id: 3 }));
        assert!(h.next_command().await.is_none());
        h.runner(Event::Error {
            id: Some(3),
            message: "stopped".into(),
        });
        assert_eq!(
            third.recv().await,
            Some(Event::Error {
                id: Some(3),
                message: "stopped".into()
            })
        );
        assert_eq!(h.load.load(std::sync::atomic::Ordering::SeqCst), 0);
        let _ = h.child.lock().unwrap().kill();
    }

    #[tokio::test]
    async fn up_to_the_limit_run_at_once_and_the_next_starts_when_one_ends() {
        let h = Harness::with_limit(2);
        h.runner(Event::State(RunnerStatus::Ready));
        let mut first = h.submit(1);
        let mut second = h.submit(2);
        let _third = h.submit(3);
        assert_eq!(generate_id(h.next_command().await), 1);
        // The runner is `running` now: the second still goes in, the third waits.
        h.runner(Event::State(RunnerStatus::Running));
        assert_eq!(generate_id(h.next_command().await), 2);
        assert!(h.next_command().await.is_none(), "two at once at most");
        // Tokens of the two interleave, each to its own requester.
        for id in [2, 1, 2] {
            h.runner(Event::Token {
                id,
                token: id as u32,
                text: "x".into(),
                logprob: 0.0,
            });
        }
        // Cancelling one running request reaches the runner; the other keeps going.
        h.inputs.send(Input::Cancel(1)).unwrap();
        assert_eq!(h.next_command().await, Some(Command::Cancel { id: 1 }));
        h.runner(Event::Done {
            id: 1,
            completion: completion(),
        });
        assert_eq!(generate_id(h.next_command().await), 3);
        let tokens = |rx: &mut mpsc::UnboundedReceiver<Event>| {
            let mut v = Vec::new();
            while let Ok(Event::Token { token, .. }) = rx.try_recv() {
                v.push(token);
            }
            v
        };
        h.settle().await;
        assert_eq!(tokens(&mut first), vec![1]);
        assert_eq!(tokens(&mut second), vec![2, 2]);
        assert_eq!(h.load.load(std::sync::atomic::Ordering::SeqCst), 2);
        let _ = h.child.lock().unwrap().kill();
    }

    #[tokio::test]
    async fn runner_death_fails_running_and_queued_requests_and_later_ones() {
        let mut h = Harness::new();
        h.runner(Event::State(RunnerStatus::Ready));
        let mut running = h.submit(1);
        let mut queued = h.submit(2);
        assert_eq!(generate_id(h.next_command().await), 1);
        h.child.lock().unwrap().kill().unwrap();
        h.inputs
            .send(Input::RunnerGone("the runner process exited".into()))
            .unwrap();
        for rx in [&mut running, &mut queued] {
            match rx.recv().await {
                Some(Event::State(RunnerStatus::Failed { reason })) => {
                    assert!(reason.contains("exited"), "{reason}")
                }
                other => panic!("expected instance lost, got {other:?}"),
            }
        }
        let state = h
            .state
            .wait_for(|s| matches!(s, RunnerStatus::Failed { .. }))
            .await
            .unwrap()
            .clone();
        assert!(matches!(state, RunnerStatus::Failed { .. }));
        let mut late = h.submit(3);
        assert!(matches!(
            late.recv().await,
            Some(Event::State(RunnerStatus::Failed { .. }))
        ));
        assert_eq!(h.load.load(std::sync::atomic::Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn lifecycle_commands_pass_through_until_the_runner_fails() {
        let h = Harness::new();
        let connect = Command::Connect {
            rank: 0,
            hosts: vec![vec!["0.0.0.0:50000".into()]],
            timeout_ms: 1000,
        };
        h.inputs.send(Input::Lifecycle(connect.clone())).unwrap();
        assert_eq!(h.next_command().await, Some(connect));
        h.runner(Event::State(RunnerStatus::Failed {
            reason: "neighbour 10.0.0.2 never came".into(),
        }));
        h.settle().await;
        h.inputs.send(Input::Lifecycle(Command::WarmUp)).unwrap();
        assert!(
            h.next_command().await.is_none(),
            "a failed runner gets no more commands"
        );
        let _ = h.child.lock().unwrap().kill();
    }

    #[tokio::test]
    async fn a_runner_that_reports_failure_fails_its_requests_with_the_reason() {
        let h = Harness::new();
        let mut waiting = h.submit(1);
        h.runner(Event::State(RunnerStatus::Failed {
            reason: "model loading timed out after 60 s".into(),
        }));
        assert_eq!(
            waiting.recv().await,
            Some(instance_lost("model loading timed out after 60 s"))
        );
        let _ = h.child.lock().unwrap().kill();
    }
}
