//! The runner: one model instance in its own process (an MLX distributed group lives and
//! dies with its process), driven by its node over framed messages on stdin/stdout.
//!
//! Lifecycle: `idle` → `loading {done, total}` → `loaded` → `warming_up` → `ready` ⇄
//! `running`; any fatal problem → `failed {reason}` and exit. Loading runs under a watchdog
//! of `SHOAL_MODEL_LOAD_TIMEOUT` seconds (default 60) plus one second per 5 GB of the shard.

pub mod protocol;

use crate::engine::{open_model, Engine, GenerateRequest, Prompt};
use crate::error::Result;
use crate::model::ModelShard;
use crate::weights::WeightFormat;
use protocol::{read_frame, write_frame, Command, Event, FrameError, RunnerState};
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// Internal marker: the timeout was already reported as `failed`.
const LOAD_TIMED_OUT: &str = "model loading timed out";

/// Environment variable with the base load timeout in seconds.
pub const LOAD_TIMEOUT_ENV: &str = "SHOAL_MODEL_LOAD_TIMEOUT";

/// How long loading `shard_bytes` of weights may take: `base` plus one second per 5 GB.
pub fn load_timeout(base: Duration, shard_bytes: u64) -> Duration {
    base + Duration::from_secs(shard_bytes / 5_000_000_000)
}

/// The base timeout: `SHOAL_MODEL_LOAD_TIMEOUT` seconds, else 60.
pub fn base_load_timeout() -> Duration {
    let secs = std::env::var(LOAD_TIMEOUT_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .unwrap_or(60.0);
    Duration::from_secs_f64(secs)
}

/// Settings of a runner.
pub struct RunnerOptions {
    /// Base of the load watchdog.
    pub load_timeout_base: Duration,
    /// Called after `failed` was reported because loading timed out; the real runner exits
    /// the process here (a load stuck inside MLX cannot be interrupted otherwise).
    pub on_load_timeout: Arc<dyn Fn() + Send + Sync>,
    /// Generate one token after loading, so the first request does not pay for warm-up.
    pub warm_up: bool,
}

impl Default for RunnerOptions {
    fn default() -> Self {
        RunnerOptions {
            load_timeout_base: base_load_timeout(),
            on_load_timeout: Arc::new(|| std::process::exit(3)),
            warm_up: true,
        }
    }
}

/// Makes sure MLX reports errors to mlx-rs (which returns them as `Err`) instead of its
/// default handler, which prints and calls `exit(-1)`. mlx-rs installs its handler before its
/// first operation; this runs one so that it is in place before anything else happens.
pub fn install_mlx_error_handler() -> Result<()> {
    let a = mlx_rs::Array::from_f32(1.0);
    let b = mlx_rs::ops::add(&a, &a)?;
    b.eval()?;
    Ok(())
}

type SharedOut = Arc<Mutex<Box<dyn Write + Send>>>;

fn send(out: &SharedOut, event: &Event) -> bool {
    let mut w = out.lock().unwrap_or_else(|e| e.into_inner());
    write_frame(&mut *w, event).is_ok()
}

fn fail(out: &SharedOut, reason: String) -> i32 {
    tracing::error!(%reason, "runner failed");
    send(out, &Event::State(RunnerState::Failed { reason }));
    1
}

/// Serves one runner over `input`/`output` until `Shutdown`, the end of input, or a fatal
/// error. Returns the process exit code (0 on a clean shutdown).
pub fn serve(
    input: impl Read + Send + 'static,
    output: impl Write + Send + 'static,
    options: RunnerOptions,
) -> i32 {
    let out: SharedOut = Arc::new(Mutex::new(Box::new(output)));
    if let Err(e) = install_mlx_error_handler() {
        return fail(&out, format!("MLX does not work in this process: {e}"));
    }
    send(&out, &Event::State(RunnerState::Idle));
    let cancelled: Arc<Mutex<BTreeSet<u64>>> = Arc::default();
    let (tx, rx) = mpsc::channel::<Result<Command, String>>();
    {
        let cancelled = cancelled.clone();
        let mut input = input;
        std::thread::spawn(move || loop {
            match read_frame::<Command>(&mut input) {
                Ok(Command::Cancel { id }) => {
                    cancelled
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(id);
                }
                Ok(cmd) => {
                    if tx.send(Ok(cmd)).is_err() {
                        return;
                    }
                }
                Err(FrameError::Closed) => {
                    let _ = tx.send(Ok(Command::Shutdown));
                    return;
                }
                Err(e) => {
                    // A bad body of a well-framed message can be skipped; a broken stream cannot.
                    let fatal = !matches!(e, FrameError::Malformed(ref m) if !m.contains("ended"))
                        && !matches!(e, FrameError::Version(_));
                    let _ = tx.send(Err(e.to_string()));
                    if fatal {
                        let _ = tx.send(Ok(Command::Shutdown));
                        return;
                    }
                }
            }
        });
    }
    let mut engine: Option<Engine> = None;
    while let Ok(msg) = rx.recv() {
        let cmd = match msg {
            Ok(c) => c,
            Err(message) => {
                send(&out, &Event::Error { id: None, message });
                continue;
            }
        };
        match cmd {
            Command::Connect { rank, hosts, .. } => {
                if hosts.len() == 1 && rank == 0 {
                    send(&out, &Event::State(RunnerState::Connected));
                } else {
                    send(
                        &out,
                        &Event::Error {
                            id: None,
                            message: format!(
                                "rank {rank} of a ring of {}: multi-rank runners are not \
                                 implemented yet",
                                hosts.len()
                            ),
                        },
                    );
                }
            }
            Command::WarmUp => {
                send(
                    &out,
                    &Event::Error {
                        id: None,
                        message: "WarmUp is for ranks of a multi-rank ring; a ring of one \
                                  warms up while loading"
                            .into(),
                    },
                );
            }
            Command::Load {
                model,
                layers,
                format,
                sharding: _,
            } => {
                if engine.is_some() {
                    send(
                        &out,
                        &Event::Error {
                            id: None,
                            message: "a model is already loaded; start a new runner".into(),
                        },
                    );
                    continue;
                }
                match load(&out, Path::new(&model), layers, format, &options) {
                    Ok(e) => engine = Some(e),
                    Err(reason) if reason == LOAD_TIMED_OUT => return 3,
                    Err(reason) => return fail(&out, reason),
                }
            }
            Command::Generate { id, request } => {
                let Some(e) = engine.as_ref() else {
                    send(
                        &out,
                        &Event::Error {
                            id: Some(id),
                            message: "no model is loaded yet".into(),
                        },
                    );
                    continue;
                };
                send(&out, &Event::State(RunnerState::Running));
                let result = e.generate(&request, |ev| {
                    send(
                        &out,
                        &Event::Token {
                            id,
                            token: ev.token,
                            text: ev.text.to_owned(),
                            logprob: ev.logprob,
                        },
                    );
                    if cancelled
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&id)
                    {
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue(())
                    }
                });
                cancelled
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&id);
                match result {
                    Ok(completion) => send(&out, &Event::Done { id, completion }),
                    Err(err) => send(
                        &out,
                        &Event::Error {
                            id: Some(id),
                            message: err.to_string(),
                        },
                    ),
                };
                send(&out, &Event::State(RunnerState::Ready));
            }
            Command::Cancel { .. } => {}
            Command::Shutdown => return 0,
        }
    }
    0
}

fn load(
    out: &SharedOut,
    path: &Path,
    layers: Option<(usize, usize)>,
    format: Option<WeightFormat>,
    options: &RunnerOptions,
) -> Result<Engine, String> {
    send(
        out,
        &Event::State(RunnerState::Loading { done: 0, total: 1 }),
    );
    let mut opened = open_model(path).map_err(|e| e.to_string())?;
    let range = layers
        .map(|(a, b)| a..b)
        .unwrap_or(0..opened.config.num_layers);
    let shard_bytes = opened.bytes_on_disk * range.len().min(opened.config.num_layers) as u64
        / opened.config.num_layers.max(1) as u64;
    let timeout = load_timeout(options.load_timeout_base, shard_bytes);
    // Whoever settles first wins: the loader (finished in time) or the timeout (reported by
    // the watchdog while the load is stuck, or by the loader if it finished too late).
    let started = Instant::now();
    let settled = Arc::new(AtomicBool::new(false));
    let time_out = {
        let out = out.clone();
        let settled = settled.clone();
        let on_timeout = options.on_load_timeout.clone();
        move || {
            if !settled.swap(true, Ordering::SeqCst) {
                let reason = format!("model loading timed out after {} s", timeout.as_secs());
                send(&out, &Event::State(RunnerState::Failed { reason }));
                on_timeout();
                true
            } else {
                false
            }
        }
    };
    let watchdog = {
        let settled = settled.clone();
        let time_out = time_out.clone();
        std::thread::spawn(move || {
            while !settled.load(Ordering::SeqCst) {
                if started.elapsed() >= timeout {
                    time_out();
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let format = format
        .unwrap_or_else(|| WeightFormat::choose(&opened.config, &range, opened.bytes_on_disk));
    let result = ModelShard::load(
        &opened.config,
        range,
        opened.source.as_mut(),
        format,
        &mut |d, t| {
            send(
                out,
                &Event::State(RunnerState::Loading { done: d, total: t }),
            );
        },
    );
    let late = started.elapsed() >= timeout && time_out();
    let timed_out = late || settled.swap(true, Ordering::SeqCst);
    let _ = watchdog.join();
    if timed_out {
        return Err(LOAD_TIMED_OUT.into());
    }
    let model = result.map_err(|e| e.to_string())?;
    send(out, &Event::State(RunnerState::Loaded));
    let engine = Engine {
        model,
        tokenizer: opened.tokenizer,
    };
    if options.warm_up && engine.model.is_first() && engine.model.is_last() {
        send(out, &Event::State(RunnerState::WarmingUp));
        let mut req = GenerateRequest::new(
            Prompt::Tokens(vec![engine.tokenizer.bos_token_id.unwrap_or(0)]),
            1,
        );
        req.ignore_eos = true;
        engine
            .generate(&req, |_| ControlFlow::Continue(()))
            .map_err(|e| format!("warm-up failed: {e}"))?;
    }
    send(out, &Event::State(RunnerState::Ready));
    Ok(engine)
}
