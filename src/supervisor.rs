//! Runner supervision: one `shoal runner` child process per model instance, driven over the
//! framed protocol of `inference::runner::protocol` on its stdin and stdout.
//!
//! Why a process per instance: an MLX distributed group cannot be re-formed inside a process,
//! and a crash inside MLX must not take the node (and its HTTP API) down with it.
//!
//! The supervisor owns the child and three workers:
//! - a **reader thread** decoding the runner's [`Event`]s from its stdout,
//! - a **writer thread** encoding [`Command`]s onto its stdin,
//! - a **scheduler task** (tokio) that tracks the runner's [`RunnerState`] (published on a
//!   watch channel), keeps a FIFO queue of generation requests, sends the next one to the
//!   runner only when the previous one has finished (the runner generates one request at a
//!   time), and routes each request's token events to that request's own channel.
//!
//! Guarantees: every request submitted gets exactly one end (a `Done`, or a `Failed` with the
//! reason), whatever happens to the runner; a request cancelled while queued never reaches the
//! runner; when the runner dies every waiting request fails with "instance lost" and the state
//! becomes `Failed`. Dropping the last [`Supervisor`] handle kills the child.

use inference::runner::protocol::{
    read_frame, write_frame, Command, Event, FrameError, RunnerState,
};
use inference::{Completion, GenerateRequest};
use std::collections::VecDeque;
use std::io::{BufReader, BufWriter};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// How to start a runner process.
#[derive(Debug, Clone)]
pub struct RunnerCommand {
    /// The executable: normally this very binary (`std::env::current_exe()`).
    pub program: PathBuf,
    /// Its arguments: normally `["runner"]`.
    pub args: Vec<String>,
    /// Extra environment variables (e.g. `SHOAL_FAST_SYNCH`).
    pub env: Vec<(String, String)>,
}

impl RunnerCommand {
    /// `<this executable> runner`.
    pub fn current_exe() -> std::io::Result<RunnerCommand> {
        Ok(RunnerCommand {
            program: std::env::current_exe()?,
            args: vec!["runner".into()],
            env: vec![],
        })
    }
}

/// One event of a generation, as the supervisor hands it to the requester.
#[derive(Debug, Clone, PartialEq)]
pub enum GenerationEvent {
    /// A generated token and the text it completes (possibly empty).
    Token {
        /// Token id.
        token: u32,
        /// New text.
        text: String,
        /// Its log-probability.
        logprob: f32,
    },
    /// The generation finished; the last event of the request.
    Done(Completion),
    /// The generation cannot finish; the last event of the request.
    Failed(GenerationFailure),
}

/// Why a request ended without a completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GenerationFailure {
    /// The runner refused or failed this request but stays usable (bad request, ...).
    Rejected(String),
    /// The runner died or failed as a whole; the instance is gone.
    InstanceLost(String),
}

impl std::fmt::Display for GenerationFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GenerationFailure::Rejected(m) => write!(f, "the runner rejected the request: {m}"),
            GenerationFailure::InstanceLost(m) => write!(f, "the runner is gone: {m}"),
        }
    }
}

/// What the scheduler task reacts to.
enum Input {
    /// A new request from [`Supervisor::generate`].
    Submit {
        id: u64,
        request: Box<GenerateRequest>,
        events: mpsc::UnboundedSender<GenerationEvent>,
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
    events: mpsc::UnboundedSender<GenerationEvent>,
}

/// A handle on one runner process. Cheap to clone; the child is killed when the last clone
/// is dropped.
#[derive(Clone)]
pub struct Supervisor {
    shared: Arc<Shared>,
}

struct Shared {
    inputs: mpsc::UnboundedSender<Input>,
    state: watch::Receiver<RunnerState>,
    next_id: std::sync::atomic::AtomicU64,
    /// Requests submitted and not yet ended (queued or running): the instance's load.
    load: Arc<std::sync::atomic::AtomicUsize>,
    child: Arc<Mutex<Child>>,
    pid: u32,
}

impl Drop for Shared {
    fn drop(&mut self) {
        let _ = self.inputs.send(Input::Shutdown);
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        if let Ok(None) = child.try_wait() {
            let _ = child.kill();
        }
        let _ = child.wait();
    }
}

impl Supervisor {
    /// Starts a runner process and leaves it idle: the node then sends it `Connect`, `Load`
    /// and `WarmUp` as its start-up plan says ([`Supervisor::connect`], [`Supervisor::load_model`],
    /// [`Supervisor::warm_up`]). Must be called inside a tokio runtime.
    pub fn start_idle(command: &RunnerCommand) -> std::io::Result<Supervisor> {
        let mut child = std::process::Command::new(&command.program)
            .args(&command.args)
            .envs(command.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let pid = child.id();
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| std::io::Error::other("no stdin pipe"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("no stdout pipe"))?;
        let (inputs, inputs_rx) = mpsc::unbounded_channel();
        let (state_tx, state) = watch::channel(RunnerState::Idle);
        let (commands, commands_rx) = std::sync::mpsc::channel::<Command>();
        spawn_reader(stdout, inputs.clone(), pid);
        spawn_writer(stdin, commands_rx, pid);
        let child = Arc::new(Mutex::new(child));
        let load = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let scheduler = Scheduler {
            commands,
            state: state_tx,
            queue: VecDeque::new(),
            running: None,
            cancel_sent: false,
            failure: None,
            child: child.clone(),
            load: load.clone(),
        };
        tokio::spawn(scheduler.run(inputs_rx));
        tracing::info!(pid, "runner started");
        Ok(Supervisor {
            shared: Arc::new(Shared {
                inputs,
                state,
                next_id: std::sync::atomic::AtomicU64::new(1),
                load,
                child,
                pid,
            }),
        })
    }

    /// Asks the runner to join its instance's MLX ring as `rank`, `hosts` being every rank's
    /// addresses as this node's ring view has them.
    pub fn connect(&self, rank: usize, hosts: Vec<Vec<String>>, timeout: Duration) {
        self.command(Command::Connect {
            rank,
            hosts,
            timeout_ms: timeout.as_millis() as u64,
        });
    }

    /// Asks the runner to load `model`: layers `[start, end)` of it (all for `None`), split
    /// across the ring as `sharding` says.
    pub fn load_model(
        &self,
        model: &str,
        layers: Option<(usize, usize)>,
        sharding: inference::runner::protocol::Sharding,
    ) {
        tracing::info!(pid = self.pid(), model, ?layers, ?sharding, "runner: load");
        self.command(Command::Load {
            model: model.to_string(),
            layers,
            format: None,
            sharding,
        });
    }

    /// Asks a loaded rank of a multi-rank ring to warm up.
    pub fn warm_up(&self) {
        self.command(Command::WarmUp);
    }

    /// Sends a lifecycle command, unless the runner already failed or was shut down.
    fn command(&self, command: Command) {
        let _ = self.shared.inputs.send(Input::Lifecycle(command));
    }

    /// The runner's state, updated as it reports changes.
    pub fn state(&self) -> watch::Receiver<RunnerState> {
        self.shared.state.clone()
    }

    /// The runner's current state.
    pub fn current_state(&self) -> RunnerState {
        self.shared.state.borrow().clone()
    }

    /// The runner's process id.
    pub fn pid(&self) -> u32 {
        self.shared.pid
    }

    /// Requests queued or running on this runner (for spreading load over instances).
    pub fn load(&self) -> usize {
        self.shared.load.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Queues a generation. Events arrive on the returned channel: tokens, then exactly one
    /// `Done` or `Failed` (a request is never silently dropped). Firing `cancel`, or dropping
    /// the receiver, cancels it: a queued request is removed, a running one is stopped after
    /// its current token.
    pub fn generate(
        &self,
        request: GenerateRequest,
        cancel: CancellationToken,
    ) -> mpsc::UnboundedReceiver<GenerationEvent> {
        let id = self
            .shared
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let (events, rx) = mpsc::unbounded_channel();
        let watcher = events.clone();
        let inputs = self.shared.inputs.clone();
        if inputs
            .send(Input::Submit {
                id,
                request: Box::new(request),
                events,
            })
            .is_err()
        {
            let _ = watcher.send(GenerationEvent::Failed(GenerationFailure::InstanceLost(
                "the runner's supervisor stopped".into(),
            )));
            return rx;
        }
        // Forwards a cancellation (or the requester going away) to the scheduler.
        tokio::spawn(async move {
            tokio::select! {
                () = cancel.cancelled() => {}
                () = watcher.closed() => {}
            }
            let _ = inputs.send(Input::Cancel(id));
        });
        rx
    }

    /// Asks the runner to exit and waits up to `grace` for it; kills it after that.
    pub async fn shutdown(&self, grace: Duration) {
        let _ = self.shared.inputs.send(Input::Shutdown);
        let child = self.shared.child.clone();
        let _ = tokio::task::spawn_blocking(move || {
            let deadline = std::time::Instant::now() + grace;
            let mut child = child.lock().unwrap_or_else(|e| e.into_inner());
            while std::time::Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        })
        .await;
    }
}

fn spawn_reader(stdout: ChildStdout, inputs: mpsc::UnboundedSender<Input>, pid: u32) {
    std::thread::Builder::new()
        .name(format!("runner-{pid}-reader"))
        .spawn(move || {
            let mut reader = BufReader::new(stdout);
            loop {
                match read_frame::<Event>(&mut reader) {
                    Ok(event) => {
                        if inputs.send(Input::Runner(event)).is_err() {
                            return;
                        }
                    }
                    Err(FrameError::Closed) => {
                        let _ = inputs.send(Input::RunnerGone("the runner process exited".into()));
                        return;
                    }
                    Err(FrameError::Malformed(m)) if !m.contains("ended") => {
                        // One bad message in an intact stream: skip it.
                        tracing::warn!(pid, error = %m, "malformed message from runner");
                    }
                    Err(e) => {
                        let _ = inputs.send(Input::RunnerGone(format!(
                            "the runner's output broke ({e})"
                        )));
                        return;
                    }
                }
            }
        })
        .expect("spawning a thread");
}

fn spawn_writer(stdin: ChildStdin, commands: std::sync::mpsc::Receiver<Command>, pid: u32) {
    std::thread::Builder::new()
        .name(format!("runner-{pid}-writer"))
        .spawn(move || {
            let mut writer = BufWriter::new(stdin);
            while let Ok(command) = commands.recv() {
                if let Err(e) = write_frame(&mut writer, &command) {
                    // The reader sees the process go; nothing more to do here.
                    tracing::debug!(pid, error = %e, "writing to runner failed");
                    return;
                }
            }
            // Dropping stdin tells the runner to exit (end of input).
        })
        .expect("spawning a thread");
}

/// The state machine between requesters and the runner (see the module docs).
struct Scheduler {
    commands: std::sync::mpsc::Sender<Command>,
    state: watch::Sender<RunnerState>,
    queue: VecDeque<Pending>,
    running: Option<Pending>,
    /// Whether `Cancel` was already sent for the running request.
    cancel_sent: bool,
    /// Set once the runner failed or exited: why.
    failure: Option<String>,
    child: Arc<Mutex<Child>>,
    load: Arc<std::sync::atomic::AtomicUsize>,
}

impl Scheduler {
    async fn run(mut self, mut inputs: mpsc::UnboundedReceiver<Input>) {
        while let Some(input) = inputs.recv().await {
            match input {
                Input::Submit {
                    id,
                    request,
                    events,
                } => {
                    if let Some(reason) = &self.failure {
                        let _ = events.send(GenerationEvent::Failed(
                            GenerationFailure::InstanceLost(reason.clone()),
                        ));
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
                    let _ = self.state.send(RunnerState::Failed {
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
        } else if let Some(running) = &self.running {
            if running.id == id && !self.cancel_sent {
                self.cancel_sent = true;
                let _ = self.commands.send(Command::Cancel { id });
            }
        }
    }

    fn on_event(&mut self, event: Event) {
        match event {
            Event::State(state) => {
                if let RunnerState::Failed { reason } = &state {
                    tracing::error!(%reason, "runner failed");
                    self.failure = Some(reason.clone());
                    self.fail_all(reason);
                }
                if self.failure.is_none() || matches!(state, RunnerState::Failed { .. }) {
                    let _ = self.state.send(state);
                }
            }
            Event::Token {
                id,
                token,
                text,
                logprob,
            } => {
                if let Some(running) = self.running.as_ref().filter(|r| r.id == id) {
                    let _ = running.events.send(GenerationEvent::Token {
                        token,
                        text,
                        logprob,
                    });
                }
            }
            Event::Done { id, completion } => {
                if let Some(running) = self.take_running(id) {
                    let _ = running.events.send(GenerationEvent::Done(completion));
                }
            }
            Event::Error {
                id: Some(id),
                message,
            } => {
                if let Some(running) = self.take_running(id) {
                    let _ =
                        running
                            .events
                            .send(GenerationEvent::Failed(GenerationFailure::Rejected(
                                message,
                            )));
                }
            }
            Event::Error { id: None, message } => {
                tracing::warn!(%message, "runner reported an error");
            }
        }
    }

    fn take_running(&mut self, id: u64) -> Option<Pending> {
        if self.running.as_ref().is_some_and(|r| r.id == id) {
            self.cancel_sent = false;
            self.finished();
            self.running.take()
        } else {
            None
        }
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
        let _ = self.state.send(RunnerState::Failed {
            reason: reason.clone(),
        });
        self.failure = Some(reason);
    }

    /// Ends every queued and running request with "instance lost".
    fn fail_all(&mut self, reason: &str) {
        for pending in self.running.take().into_iter().chain(self.queue.drain(..)) {
            self.load.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            let _ = pending
                .events
                .send(GenerationEvent::Failed(GenerationFailure::InstanceLost(
                    reason.to_string(),
                )));
        }
    }

    /// Sends the next queued request to the runner if it is free.
    fn start_next(&mut self) {
        if self.running.is_some() || self.failure.is_some() {
            return;
        }
        if !matches!(*self.state.borrow(), RunnerState::Ready) {
            return;
        }
        while let Some(next) = self.queue.pop_front() {
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
                    .send(GenerationEvent::Failed(GenerationFailure::InstanceLost(
                        "the runner's input is closed".into(),
                    )));
                self.finished();
                continue;
            }
            self.running = Some(next);
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inference::{FinishReason, Prompt};

    /// A scheduler driven by hand: events go in as if from the runner, commands come out as
    /// they would go to it. The "runner" process is a `sleep` that the test kills.
    struct Harness {
        inputs: mpsc::UnboundedSender<Input>,
        commands: std::sync::mpsc::Receiver<Command>,
        state: watch::Receiver<RunnerState>,
        load: Arc<std::sync::atomic::AtomicUsize>,
        child: Arc<Mutex<Child>>,
    }

    impl Harness {
        fn new() -> Harness {
            let child = std::process::Command::new("sleep")
                .arg("60")
                .spawn()
                .expect("sleep starts");
            let child = Arc::new(Mutex::new(child));
            let (commands_tx, commands) = std::sync::mpsc::channel();
            let (state_tx, state) = watch::channel(RunnerState::Idle);
            let (inputs, inputs_rx) = mpsc::unbounded_channel();
            let load = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let scheduler = Scheduler {
                commands: commands_tx,
                state: state_tx,
                queue: VecDeque::new(),
                running: None,
                cancel_sent: false,
                failure: None,
                child: child.clone(),
                load: load.clone(),
            };
            tokio::spawn(scheduler.run(inputs_rx));
            Harness {
                inputs,
                commands,
                state,
                load,
                child,
            }
        }

        fn submit(&self, id: u64) -> mpsc::UnboundedReceiver<GenerationEvent> {
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

        h.runner(Event::State(RunnerState::Ready));
        assert_eq!(generate_id(h.next_command().await), 1);
        h.inputs.send(Input::Cancel(2)).unwrap();
        drop(second);
        h.runner(Event::State(RunnerState::Running));
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
        h.runner(Event::State(RunnerState::Ready));
        assert_eq!(
            first.recv().await,
            Some(GenerationEvent::Token {
                token: 7,
                text: "hi".into(),
                logprob: -0.5
            })
        );
        assert_eq!(
            first.recv().await,
            Some(GenerationEvent::Done(completion()))
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
            Some(GenerationEvent::Failed(GenerationFailure::Rejected(
                "stopped".into()
            )))
        );
        assert_eq!(h.load.load(std::sync::atomic::Ordering::SeqCst), 0);
        let _ = h.child.lock().unwrap().kill();
    }

    #[tokio::test]
    async fn runner_death_fails_running_and_queued_requests_and_later_ones() {
        let mut h = Harness::new();
        h.runner(Event::State(RunnerState::Ready));
        let mut running = h.submit(1);
        let mut queued = h.submit(2);
        assert_eq!(generate_id(h.next_command().await), 1);
        h.child.lock().unwrap().kill().unwrap();
        h.inputs
            .send(Input::RunnerGone("the runner process exited".into()))
            .unwrap();
        for rx in [&mut running, &mut queued] {
            match rx.recv().await {
                Some(GenerationEvent::Failed(GenerationFailure::InstanceLost(reason))) => {
                    assert!(reason.contains("exited"), "{reason}")
                }
                other => panic!("expected instance lost, got {other:?}"),
            }
        }
        let state = h
            .state
            .wait_for(|s| matches!(s, RunnerState::Failed { .. }))
            .await
            .unwrap()
            .clone();
        assert!(matches!(state, RunnerState::Failed { .. }));
        let mut late = h.submit(3);
        assert!(matches!(
            late.recv().await,
            Some(GenerationEvent::Failed(GenerationFailure::InstanceLost(_)))
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
        h.runner(Event::State(RunnerState::Failed {
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
        h.runner(Event::State(RunnerState::Failed {
            reason: "model loading timed out after 60 s".into(),
        }));
        assert_eq!(
            waiting.recv().await,
            Some(GenerationEvent::Failed(GenerationFailure::InstanceLost(
                "model loading timed out after 60 s".into()
            )))
        );
        let _ = h.child.lock().unwrap().kill();
    }
}
