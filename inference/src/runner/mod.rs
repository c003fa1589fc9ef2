//! The runner: one model instance, or one rank of it, in its own process (an MLX distributed
//! group lives and dies with its process), driven by its node over framed messages on
//! stdin/stdout ([`protocol`] has the messages and the lifecycle the node relies on).
//!
//! - **A ring of one**: `idle` → `loading {done, total}` → `loaded` → `warming_up` → `ready`
//!   ⇄ `running`.
//! - **A rank of a ring of n > 1**: `Connect` → `connecting` → `connected` (the ring joined
//!   under the node's deadline, or `failed` naming the neighbour that never came); `Load` →
//!   `loading` → `loaded` (its layer range for a pipeline, the whole model cut to its slice for
//!   tensor parallelism); `WarmUp` → `warming_up` → `ready`: rank 0 runs a one-token generation
//!   through the ring, the other ranks start serving the ring (their `ready` means "serving")
//!   and then only follow rank 0. Only rank 0 accepts `Generate`. `Shutdown` of rank 0 sends a
//!   stop around the ring, so every rank exits 0 on its own; a `Shutdown` of another rank exits
//!   it at once (its ring thread may be blocked inside MLX).
//! - Any fatal problem → `failed {reason}` and a non-zero exit: a ring that does not form, a
//!   load that fails or times out, a neighbour lost while serving or generating (rank 0's
//!   request in flight ends with an `Error` event first). Exit codes: 0 after a shutdown, 1
//!   after `failed`, 3 after a load timeout.
//!
//! Loading runs under a watchdog of `SHOAL_MODEL_LOAD_TIMEOUT` seconds (default 60) plus one
//! second per 5 GB of the shard, on every rank.

pub mod protocol;

use crate::engine::{self, open_model, Engine, Forward, GenerateRequest, Prompt};
use crate::error::{InferenceError, Result};
use crate::model::ModelShard;
use crate::pipeline::PipelineStage;
use crate::ring::{RingConfig, RingGroup};
use crate::tensor_stage::TensorStage;
use crate::tokenizer::Tokenizer;
use crate::weights::WeightFormat;
use protocol::{read_frame, write_frame, Command, Event, FrameError, RunnerStatus, Sharding};
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
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

/// Environment variable asking for MLX's fast synchronisation: `1`/`true`/`on` or
/// `0`/`false`/`off` (the node's `--fast-synch`/`--no-fast-synch`).
pub const FAST_SYNCH_ENV: &str = "SHOAL_FAST_SYNCH";

/// The variable MLX reads. It matters to the JACCL backend over Thunderbolt on macOS; on Linux
/// (the ring backend over TCP) nothing reads it: the setting only reaches MLX's environment.
pub const MLX_FAST_SYNCH_ENV: &str = "MLX_METAL_FAST_SYNCH";

/// Parses a fast-synch setting; `None` for anything else (left to MLX's default).
pub fn parse_fast_synch(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" => Some(true),
        "0" | "false" | "off" | "no" => Some(false),
        _ => None,
    }
}

/// Passes a fast-synch choice (`Some(true)`/`Some(false)`, or `None` for
/// [`FAST_SYNCH_ENV`]'s value, if any) on to MLX's environment. Call before MLX starts.
pub fn apply_fast_synch(choice: Option<bool>) {
    let choice = choice.or_else(|| {
        std::env::var(FAST_SYNCH_ENV)
            .ok()
            .and_then(|v| parse_fast_synch(&v))
    });
    if let Some(on) = choice {
        // Set before MLX or any other thread starts (`shoal runner` calls this first).
        std::env::set_var(MLX_FAST_SYNCH_ENV, if on { "1" } else { "0" });
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

fn state(out: &SharedOut, s: RunnerStatus) {
    send(out, &Event::State(s));
}

fn error(out: &SharedOut, id: Option<u64>, message: impl Into<String>) {
    send(
        out,
        &Event::Error {
            id,
            message: message.into(),
        },
    );
}

fn fail(out: &SharedOut, reason: String) -> i32 {
    tracing::error!(%reason, "runner failed");
    state(out, RunnerStatus::Failed { reason });
    1
}

/// How long rank 0's shutdown waits for the stop to go around the ring (a tensor-parallel stop
/// is a collective that ranks which are not serving yet would hold up).
const STOP_GRACE: Duration = Duration::from_secs(3);

/// One rank's part of a multi-rank instance.
enum Stage {
    Pipeline(PipelineStage),
    Tensor(TensorStage),
}

impl Stage {
    fn forward(&mut self) -> &mut dyn Forward {
        match self {
            Stage::Pipeline(p) => p,
            Stage::Tensor(t) => t,
        }
    }

    fn serve(&mut self) -> Result<usize> {
        match self {
            Stage::Pipeline(p) => p.serve(),
            Stage::Tensor(t) => t.serve(),
        }
    }

    fn stop(&mut self) -> Result<()> {
        match self {
            Stage::Pipeline(p) => p.stop(),
            Stage::Tensor(t) => t.stop(),
        }
    }
}

/// This process's place in a ring of several ranks.
struct Ring {
    config: RingConfig,
    group: Arc<RingGroup>,
}

impl Ring {
    fn rank(&self) -> usize {
        self.config.rank
    }

    fn size(&self) -> usize {
        self.config.hosts.len()
    }

    /// "left neighbour rank 2 (10.99.0.3:5000), right neighbour rank 1 (10.99.0.2:5000)".
    fn neighbours(&self) -> String {
        let (l, r) = (self.config.left(), self.config.right());
        let at = |i: usize| self.config.hosts[i].join(",");
        if l == r {
            format!("neighbour rank {l} ({})", at(l))
        } else {
            format!(
                "left neighbour rank {l} ({}), right neighbour rank {r} ({})",
                at(l),
                at(r)
            )
        }
    }
}

/// What the runner holds after `Load`.
enum Model {
    /// A ring of one: the whole model.
    Whole(Engine),
    /// Rank 0 of a ring: it drives every step; `ready` after its warm-up.
    Driver {
        stage: Stage,
        tokenizer: Tokenizer,
        ready: bool,
    },
    /// A rank above 0, loaded and waiting for `WarmUp`.
    Follower(Stage),
    /// A rank above 0 serving the ring on its own thread.
    Serving,
}

/// Ends a runner process with `code` once [`serve`] has returned, without C++ static
/// destructors.
///
/// MLX's stream threads (and a ring's socket threads) can still be running then, and the
/// `exit()` path destroys MLX's globals under them, which now and then aborts: `runner_ring`
/// saw a clean shutdown end in SIGABRT about once in 30 runs on a loaded 2-core machine.
/// Everything the runner owes its node has been written by then, so flush the standard streams
/// and leave with `_exit`.
pub fn exit_process(code: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    #[cfg(unix)]
    // SAFETY: `_exit` ends the process; nothing runs after it.
    unsafe {
        libc::_exit(code)
    }
    #[cfg(not(unix))]
    std::process::exit(code)
}

/// What the main loop reacts to.
enum Msg {
    Command(Command),
    BadFrame(String),
    /// A follower's serving loop ended: rank 0 said stop (`Ok`) or the ring broke.
    Served(Result<usize>),
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
    state(&out, RunnerStatus::Idle);
    let cancelled: Arc<Mutex<BTreeSet<u64>>> = Arc::default();
    let (tx, rx) = mpsc::channel::<Msg>();
    {
        let cancelled = cancelled.clone();
        let tx = tx.clone();
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
                    if tx.send(Msg::Command(cmd)).is_err() {
                        return;
                    }
                }
                Err(FrameError::Closed) => {
                    let _ = tx.send(Msg::Command(Command::Shutdown));
                    return;
                }
                Err(e) => {
                    // A bad body of a well-framed message can be skipped; a broken stream cannot.
                    let fatal = !matches!(e, FrameError::Malformed(ref m) if !m.contains("ended"))
                        && !matches!(e, FrameError::Version(_));
                    let _ = tx.send(Msg::BadFrame(e.to_string()));
                    if fatal {
                        let _ = tx.send(Msg::Command(Command::Shutdown));
                        return;
                    }
                }
            }
        });
    }
    let mut ring: Option<Ring> = None;
    let mut connected = false;
    let mut model: Option<Model> = None;
    while let Ok(msg) = rx.recv() {
        let cmd = match msg {
            Msg::Command(c) => c,
            Msg::BadFrame(message) => {
                error(&out, None, message);
                continue;
            }
            Msg::Served(Ok(steps)) => {
                tracing::info!(steps, "rank 0 stopped the ring");
                return 0;
            }
            Msg::Served(Err(e)) => {
                let whom = ring.as_ref().map_or(String::new(), |r| {
                    format!("rank {} of {} ({})", r.rank(), r.size(), r.neighbours())
                });
                return fail(&out, format!("{whom} lost the ring: {e}"));
            }
        };
        match cmd {
            Command::Connect {
                rank,
                hosts,
                timeout_ms,
            } => {
                if connected || model.is_some() {
                    error(
                        &out,
                        None,
                        "Connect comes once, before Load; start a new runner to join another ring",
                    );
                    continue;
                }
                connected = true;
                if hosts.len() == 1 && rank == 0 {
                    state(&out, RunnerStatus::Connected);
                    continue;
                }
                state(&out, RunnerStatus::Connecting);
                match connect(rank, hosts, Duration::from_millis(timeout_ms)) {
                    Ok(r) => {
                        tracing::info!(rank, size = r.size(), "joined the ring");
                        ring = Some(r);
                        state(&out, RunnerStatus::Connected);
                    }
                    Err(reason) => return fail(&out, reason),
                }
            }
            Command::Load {
                model: path,
                layers,
                format,
                sharding,
            } => {
                if model.is_some() {
                    error(&out, None, "a model is already loaded; start a new runner");
                    continue;
                }
                let loaded = match &ring {
                    None => load_whole(&out, Path::new(&path), layers, format, &options),
                    Some(ring) => load_rank(
                        &out,
                        ring,
                        Path::new(&path),
                        layers,
                        format,
                        sharding,
                        &options,
                    ),
                };
                match loaded {
                    Ok(m) => model = Some(m),
                    Err(reason) if reason == LOAD_TIMED_OUT => return 3,
                    Err(reason) => return fail(&out, reason),
                }
            }
            Command::WarmUp => match model.take() {
                Some(Model::Driver {
                    mut stage,
                    tokenizer,
                    ready: false,
                }) => {
                    state(&out, RunnerStatus::WarmingUp);
                    if let Err(e) = warm_up(stage.forward(), &tokenizer) {
                        return fail(&out, format!("warm-up through the ring failed: {e}"));
                    }
                    model = Some(Model::Driver {
                        stage,
                        tokenizer,
                        ready: true,
                    });
                    state(&out, RunnerStatus::Ready);
                }
                Some(Model::Follower(mut stage)) => {
                    state(&out, RunnerStatus::WarmingUp);
                    let tx = tx.clone();
                    let spawned =
                        std::thread::Builder::new()
                            .name("ring-serve".into())
                            .spawn(move || {
                                let _ = tx.send(Msg::Served(stage.serve()));
                            });
                    if let Err(e) = spawned {
                        return fail(&out, format!("cannot start the serving thread: {e}"));
                    }
                    model = Some(Model::Serving);
                    state(&out, RunnerStatus::Ready);
                }
                other => {
                    let message = match &other {
                        None => "WarmUp needs a loaded model",
                        Some(Model::Whole(_)) => {
                            "WarmUp is for ranks of a multi-rank ring; a ring of one warms up \
                             while loading"
                        }
                        Some(_) => "this rank is already warmed up",
                    };
                    model = other;
                    error(&out, None, message);
                }
            },
            Command::Generate { id, request } => {
                let on_token = |ev: engine::TokenEvent<'_>| {
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
                };
                let result = match model.as_mut() {
                    Some(Model::Whole(e)) => {
                        state(&out, RunnerStatus::Running);
                        e.generate(&request, on_token)
                    }
                    Some(Model::Driver {
                        stage,
                        tokenizer,
                        ready: true,
                    }) => {
                        state(&out, RunnerStatus::Running);
                        engine::generate(stage.forward(), tokenizer, &request, on_token)
                    }
                    other => {
                        let message = match other {
                            None => "no model is loaded yet".to_owned(),
                            Some(Model::Driver { .. }) => {
                                "the instance is not warmed up yet (send WarmUp)".to_owned()
                            }
                            Some(_) => format!(
                                "only rank 0 takes requests; this is rank {}",
                                ring.as_ref().map_or(0, Ring::rank)
                            ),
                        };
                        error(&out, Some(id), message);
                        continue;
                    }
                };
                cancelled
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&id);
                match result {
                    Ok(completion) => {
                        send(&out, &Event::Done { id, completion });
                    }
                    Err(err @ InferenceError::Ring(_)) => {
                        // The ranks are out of step or one is gone: the request ends with an
                        // error, then the whole instance (this rank first) goes down.
                        error(&out, Some(id), err.to_string());
                        let ring = ring
                            .as_ref()
                            .map_or(String::new(), |r| format!(" ({})", r.neighbours()));
                        return fail(&out, format!("rank 0 lost the ring{ring}: {err}"));
                    }
                    Err(err) => error(&out, Some(id), err.to_string()),
                }
                state(&out, RunnerStatus::Ready);
            }
            Command::Cancel { .. } => {}
            Command::Shutdown => {
                if let Some(Model::Driver { stage, .. }) = model.take() {
                    stop_ring(stage);
                }
                return 0;
            }
        }
    }
    0
}

/// Joins the ring as `rank` of `hosts` within `deadline`, or says why not.
fn connect(rank: usize, hosts: Vec<Vec<String>>, deadline: Duration) -> Result<Ring, String> {
    let size = hosts.len();
    let config = RingConfig { rank, hosts };
    let dir = hostfile_dir();
    let joined = RingGroup::join(&config, &dir, deadline);
    // MLX read the host file when it started joining.
    let _ = std::fs::remove_dir_all(&dir);
    match joined {
        Ok(group) => Ok(Ring {
            config,
            group: Arc::new(group),
        }),
        Err(e) => Err(format!("rank {rank} of {size}: {e}")),
    }
}

fn hostfile_dir() -> PathBuf {
    std::env::temp_dir().join(format!("shoal-runner-{}", std::process::id()))
}

/// Rank 0's warm-up: one token through every rank, so the first request pays for nothing.
fn warm_up(forward: &mut dyn Forward, tokenizer: &Tokenizer) -> Result<()> {
    let mut req =
        GenerateRequest::new(Prompt::Tokens(vec![tokenizer.bos_token_id.unwrap_or(0)]), 1);
    req.ignore_eos = true;
    engine::generate(forward, tokenizer, &req, |_| ControlFlow::Continue(()))?;
    Ok(())
}

/// Rank 0 stops every other rank, waiting at most [`STOP_GRACE`] (the process exits after
/// this, which ends a stop stuck in a collective).
fn stop_ring(mut stage: Stage) {
    let (tx, rx) = mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("ring-stop".into())
        .spawn(move || {
            let _ = tx.send(stage.stop());
        });
    if spawned.is_ok() {
        match rx.recv_timeout(STOP_GRACE) {
            Ok(Ok(())) => tracing::info!("stopped the other ranks"),
            Ok(Err(e)) => tracing::warn!(%e, "could not stop the other ranks"),
            Err(_) => tracing::warn!("the other ranks did not take the stop in time"),
        }
    }
}

/// A ring of one: the model (or the layers asked for) in this process, warmed up if whole.
fn load_whole(
    out: &SharedOut,
    path: &Path,
    layers: Option<(usize, usize)>,
    format: Option<WeightFormat>,
    options: &RunnerOptions,
) -> Result<Model, String> {
    let (model, tokenizer) = load(out, path, layers, format, options, &mut Ok)?;
    state(out, RunnerStatus::Loaded);
    let engine = Engine { model, tokenizer };
    if options.warm_up && engine.model.is_first() && engine.model.is_last() {
        state(out, RunnerStatus::WarmingUp);
        let mut req = GenerateRequest::new(
            Prompt::Tokens(vec![engine.tokenizer.bos_token_id.unwrap_or(0)]),
            1,
        );
        req.ignore_eos = true;
        engine
            .generate(&req, |_| ControlFlow::Continue(()))
            .map_err(|e| format!("warm-up failed: {e}"))?;
    }
    state(out, RunnerStatus::Ready);
    Ok(Model::Whole(engine))
}

/// A rank of a ring: its layers (pipeline) or its slice of every layer (tensor).
fn load_rank(
    out: &SharedOut,
    ring: &Ring,
    path: &Path,
    layers: Option<(usize, usize)>,
    format: Option<WeightFormat>,
    sharding: Sharding,
    options: &RunnerOptions,
) -> Result<Model, String> {
    let (rank, size) = (ring.rank(), ring.size());
    let (stage, tokenizer) = match sharding {
        Sharding::Pipeline => {
            let Some(range) = layers else {
                return Err(format!(
                    "rank {rank} of a {size}-rank pipeline needs its layer range in Load"
                ));
            };
            let (shard, tokenizer) = load(out, path, Some(range), format, options, &mut Ok)?;
            let stage = PipelineStage::new(shard, ring.group.clone()).map_err(|e| e.to_string())?;
            (Stage::Pipeline(stage), tokenizer)
        }
        Sharding::Tensor => {
            if format == Some(WeightFormat::Quantized) {
                return Err(
                    "tensor parallelism needs dense weights; load with f32, f16 or bf16".into(),
                );
            }
            // Checked before loading anything (the slicing checks them again).
            let config = open_model(path).map_err(|e| e.to_string())?.config;
            if let Some((start, end)) = layers {
                if (start, end) != (0, config.num_layers) {
                    return Err(format!(
                        "a tensor-parallel rank holds every layer, not {start}..{end} of {}",
                        config.num_layers
                    ));
                }
            }
            for (what, count) in [
                ("attention heads", config.num_heads),
                ("key/value heads", config.num_kv_heads),
                ("MLP units", config.intermediate_size),
            ] {
                if count % size != 0 {
                    return Err(format!(
                        "tensor parallelism over {size} ranks: the model's {count} {what} \
                         cannot be split evenly; place it on a number of nodes that divides \
                         {count}, or use pipeline parallelism"
                    ));
                }
            }
            let group = ring.group.clone();
            let (shard, tokenizer) = load(
                out,
                path,
                None,
                format.or(Some(dense_format_for_tensor_parallel(path))),
                options,
                &mut |shard| shard.into_tensor_parallel(group.clone()),
            )?;
            let stage = TensorStage::new(shard, ring.group.clone()).map_err(|e| e.to_string())?;
            (Stage::Tensor(stage), tokenizer)
        }
    };
    state(out, RunnerStatus::Loaded);
    Ok(if rank == 0 {
        Model::Driver {
            stage,
            tokenizer,
            ready: false,
        }
    } else {
        Model::Follower(stage)
    })
}

/// The backend's choice of format, made dense (tensor parallelism slices dense matrices).
fn dense_format_for_tensor_parallel(path: &Path) -> WeightFormat {
    let chosen = open_model(path)
        .map(|m| WeightFormat::choose(&m.config, &(0..m.config.num_layers), m.bytes_on_disk))
        .unwrap_or(WeightFormat::F32);
    match chosen {
        WeightFormat::Quantized if cfg!(target_vendor = "apple") => WeightFormat::F16,
        WeightFormat::Quantized => WeightFormat::Bf16,
        dense => dense,
    }
}

/// Loads `layers` of the model at `path` under the load watchdog, reporting progress, then
/// runs `prepare` on the shard (still under the watchdog).
fn load(
    out: &SharedOut,
    path: &Path,
    layers: Option<(usize, usize)>,
    format: Option<WeightFormat>,
    options: &RunnerOptions,
    prepare: &mut dyn FnMut(ModelShard) -> Result<ModelShard>,
) -> Result<(ModelShard, Tokenizer), String> {
    state(
        out,
        RunnerStatus::Loading {
            layers_loaded: 0,
            total: 1,
        },
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
                state(&out, RunnerStatus::Failed { reason });
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
            let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
            let (layers_loaded, total) = (count(d), count(t));
            state(
                out,
                RunnerStatus::Loading {
                    layers_loaded,
                    total,
                },
            )
        },
    )
    .and_then(prepare);
    let late = started.elapsed() >= timeout && time_out();
    let timed_out = late || settled.swap(true, Ordering::SeqCst);
    let _ = watchdog.join();
    if timed_out {
        return Err(LOAD_TIMED_OUT.into());
    }
    let model = result.map_err(|e| e.to_string())?;
    Ok((model, opened.tokenizer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_synch_settings_parse() {
        for on in ["1", "true", "ON", " yes "] {
            assert_eq!(parse_fast_synch(on), Some(true), "{on}");
        }
        for off in ["0", "false", "Off", "no"] {
            assert_eq!(parse_fast_synch(off), Some(false), "{off}");
        }
        assert_eq!(parse_fast_synch("maybe"), None);
        assert_eq!(parse_fast_synch(""), None);
    }

    #[test]
    fn the_load_watchdog_grows_with_the_shard() {
        let base = Duration::from_secs(60);
        assert_eq!(load_timeout(base, 0), base);
        assert_eq!(load_timeout(base, 25_000_000_000), Duration::from_secs(65));
    }
}
