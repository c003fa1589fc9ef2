//! A handle on one runner process: [`Supervisor`] starts `shoal runner` as a child, speaks
//! the framed protocol of `wire::runner` on its stdin and stdout, and hands
//! requests to the [`Scheduler`](crate::scheduler).
//!
//! Why a process per instance: an MLX distributed group cannot be re-formed inside a process,
//! and a crash inside MLX must not take the node (and its HTTP API) down with it.
//!
//! The supervisor owns the child and three workers:
//! - a **reader thread** decoding the runner's [`Event`]s from its stdout,
//! - a **writer thread** encoding [`NodeCommand`]s onto its stdin,
//! - a **scheduler task** (tokio, [`crate::scheduler`]) that tracks the runner's status,
//!   queues requests and routes each request's events to its own channel.
//!
//! Dropping the last [`Supervisor`] handle kills the child.

use crate::scheduler::{instance_lost, Scheduler, SchedulerInput};
use crate::settings::RunnerSettings;
use placement::{RunnerStatus, Sharding};
use std::io::{BufReader, BufWriter};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use wire::request::GenerateRequest;
use wire::runner::{read_frame, write_frame, Event, FrameError, NodeCommand};

/// How to start a runner process.
#[derive(Debug, Clone)]
pub struct RunnerCommand {
    /// The executable: normally this very binary (`std::env::current_exe()`).
    pub program: PathBuf,
    /// Its arguments: normally `["runner"]`.
    pub args: Vec<String>,
    /// The node's settings for its runners: the supervisor's bounds, and the process's
    /// environment ([`RunnerSettings::env`]).
    pub settings: RunnerSettings,
}

impl RunnerCommand {
    /// `<this executable> runner`, with `settings`.
    pub fn current_exe(settings: RunnerSettings) -> std::io::Result<RunnerCommand> {
        Ok(RunnerCommand {
            program: std::env::current_exe()?,
            args: vec!["runner".into()],
            settings,
        })
    }
}

/// A handle on one runner process. Cheap to clone; the child is killed when the last clone
/// is dropped.
#[derive(Clone)]
pub struct Supervisor {
    shared: Arc<Shared>,
}

struct Shared {
    inputs: mpsc::UnboundedSender<SchedulerInput>,
    state: watch::Receiver<RunnerStatus>,
    next_id: std::sync::atomic::AtomicU64,
    /// Requests submitted and not yet ended (queued or running): the instance's load.
    load: Arc<std::sync::atomic::AtomicUsize>,
    /// Requests taken at once at most (the batch plus its queue); past it `generate` refuses.
    capacity: usize,
    child: Arc<Mutex<Child>>,
    pid: u32,
    /// Set by the scheduler when the step deadline passed.
    hung: Arc<std::sync::atomic::AtomicBool>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        let _ = self.inputs.send(SchedulerInput::Shutdown);
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
            .envs(command.settings.env())
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
        let (state_tx, state) = watch::channel(RunnerStatus::Idle);
        let (commands, commands_rx) = std::sync::mpsc::channel::<NodeCommand>();
        spawn_reader(stdout, inputs.clone(), pid);
        spawn_writer(stdin, commands_rx, pid);
        let child = Arc::new(Mutex::new(child));
        let load = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let settings = &command.settings;
        let max_running = settings.max_sequences.max(1);
        let capacity = settings.capacity();
        let step_timeout = settings.step_timeout;
        let scheduler = Scheduler::new(
            commands,
            state_tx,
            child.clone(),
            load.clone(),
            max_running,
            step_timeout,
        );
        let hung = scheduler.hung_flag();
        tokio::spawn(scheduler.run(inputs_rx));
        tracing::info!(pid, "runner started");
        Ok(Supervisor {
            shared: Arc::new(Shared {
                inputs,
                state,
                next_id: std::sync::atomic::AtomicU64::new(1),
                load,
                capacity,
                child,
                pid,
                hung,
            }),
        })
    }

    /// Asks the runner to join its instance's MLX ring as `rank`, `hosts` being every rank's
    /// addresses as this node's ring view has them.
    pub fn connect(&self, rank: usize, hosts: Vec<Vec<String>>, timeout: Duration) {
        self.command(NodeCommand::Connect {
            rank,
            hosts,
            timeout_ms: timeout.as_millis() as u64,
        });
    }

    /// Asks the runner to load `model`: layers `[start, end)` of it (all for `None`), split
    /// across the ring as `sharding` says.
    pub fn load_model(&self, model: &str, layers: Option<(usize, usize)>, sharding: Sharding) {
        tracing::info!(pid = self.pid(), model, ?layers, ?sharding, "runner: load");
        self.command(NodeCommand::Load {
            model: model.to_string(),
            layers,
            format: None,
            sharding,
        });
    }

    /// Asks a loaded rank of a multi-rank ring to warm up.
    pub fn warm_up(&self) {
        self.command(NodeCommand::WarmUp);
    }

    /// Sends a lifecycle command, unless the runner already failed or was shut down.
    fn command(&self, command: NodeCommand) {
        let _ = self.shared.inputs.send(SchedulerInput::Lifecycle(command));
    }

    /// The runner's state, updated as it reports changes.
    pub fn state(&self) -> watch::Receiver<RunnerStatus> {
        self.shared.state.clone()
    }

    /// Whether the runner failed by its step deadline (a rank of its ring hung): its
    /// `Failed` state then makes the control plane place the instance again.
    pub fn hung(&self) -> bool {
        self.shared.hung.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The runner's current state.
    pub fn current_state(&self) -> RunnerStatus {
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

    /// Queues a generation. Events arrive on the returned channel: the runner's `Token`s for
    /// it, then exactly one `Done`, `Error` or `State(Failed)` (see [`crate::scheduler`]; a
    /// request is never silently dropped). Firing `cancel`, or dropping
    /// the receiver, cancels it: a queued request is removed, a running one is stopped after
    /// its current token. Refused with [`Busy`] when the batch and its queue are full.
    pub fn generate(
        &self,
        request: GenerateRequest,
        cancel: CancellationToken,
    ) -> Result<mpsc::UnboundedReceiver<Event>, Busy> {
        let load = self.load();
        if load >= self.shared.capacity {
            return Err(Busy {
                load,
                capacity: self.shared.capacity,
            });
        }
        let id = self
            .shared
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let (events, rx) = mpsc::unbounded_channel();
        let watcher = events.clone();
        let inputs = self.shared.inputs.clone();
        if inputs
            .send(SchedulerInput::Submit {
                id,
                request: Box::new(request),
                events,
            })
            .is_err()
        {
            let _ = watcher.send(instance_lost("the runner's supervisor stopped"));
            return Ok(rx);
        }
        // Forwards a cancellation (or the requester going away) to the scheduler.
        tokio::spawn(async move {
            tokio::select! {
                () = cancel.cancelled() => {}
                () = watcher.closed() => {}
            }
            let _ = inputs.send(SchedulerInput::Cancel(id));
        });
        Ok(rx)
    }

    /// Asks the runner to exit and waits up to `grace` for it; kills it after that.
    pub async fn shutdown(&self, grace: Duration) {
        let _ = self.shared.inputs.send(SchedulerInput::Shutdown);
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

/// A runner that already has as many requests as it takes (running and waiting).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Busy {
    /// Requests it holds.
    pub load: usize,
    /// What it takes: `--max-sequences` plus `--max-queue`.
    pub capacity: usize,
}

impl std::fmt::Display for Busy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the instance is at its limit ({} requests running or waiting, of {})",
            self.load, self.capacity
        )
    }
}

fn spawn_reader(stdout: ChildStdout, inputs: mpsc::UnboundedSender<SchedulerInput>, pid: u32) {
    std::thread::Builder::new()
        .name(format!("runner-{pid}-reader"))
        .spawn(move || {
            let mut reader = BufReader::new(stdout);
            loop {
                match read_frame::<Event>(&mut reader) {
                    Ok(event) => {
                        if inputs.send(SchedulerInput::Runner(event)).is_err() {
                            return;
                        }
                    }
                    Err(FrameError::Closed) => {
                        let _ = inputs.send(SchedulerInput::RunnerGone(
                            "the runner process exited".into(),
                        ));
                        return;
                    }
                    Err(FrameError::Refused { id, reason }) => {
                        // A message about one request that could not be read: that request
                        // fails, the others go on.
                        tracing::warn!(pid, id, error = %reason, "malformed message from runner");
                        let failed = Event::Error {
                            id: Some(id),
                            message: format!("the runner's answer could not be read ({reason})"),
                        };
                        if inputs.send(SchedulerInput::Runner(failed)).is_err() {
                            return;
                        }
                    }
                    Err(FrameError::Malformed(m)) if !m.contains("ended") => {
                        // One bad message in an intact stream: skip it.
                        tracing::warn!(pid, error = %m, "malformed message from runner");
                    }
                    Err(e) => {
                        let _ = inputs.send(SchedulerInput::RunnerGone(format!(
                            "the runner's output broke ({e})"
                        )));
                        return;
                    }
                }
            }
        })
        .expect("spawning a thread");
}

fn spawn_writer(stdin: ChildStdin, commands: std::sync::mpsc::Receiver<NodeCommand>, pid: u32) {
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
