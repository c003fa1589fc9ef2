//! The thin IO loop around [`RunnerCore`]: frames in from the node (on a reader thread),
//! events out, and the work the core asks for done with the real ring, loader and models.
//!
//! Long work (loading, a batch of generations) runs on this loop's thread, as MLX wants;
//! while a batch runs, the commands that arrived are fed to the core between two steps, so
//! new requests join and cancels reach their sequence within one step. The load watchdog's
//! timeout reaches the core from the watchdog's thread, which is why the core sits behind a
//! mutex.

use super::core::{
    GenerateFailure, LoadFailure, Output, RunnerAction, RunnerCore, RunnerInput, Seat,
};
use super::process::install_mlx_error_handler;
use super::protocol::{
    read_frame, write_frame, Event, FrameError, NodeCommand, RunnerStatus, Sharding,
};
use crate::batch::{
    batch_limits_of, prompt_cache_tokens, BatchEvent, BatchForward, BatchLimits, Batcher,
    LocalBatch, OneSequence, PromptCache, RingBatch,
};
use crate::engine::Engine;
use crate::error::InferenceError;
use crate::kv_cache::KvCache;
use crate::loader::{base_load_timeout, load, Split, Watchdog};
use crate::pipeline::PipelineStage;
use crate::request::{GenerateRequest, Prompt};
use crate::ring::{RingConfig, RingGroup};
use crate::sequence_forward::Forward;
use crate::stage::Stage;
use crate::tensor_stage::TensorStage;
use crate::tokenizer::Tokenizer;
use crate::vision::VisionTower;
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

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

/// How long rank 0's shutdown waits for the stop to go around the ring (a tensor-parallel stop
/// is a collective that ranks which are not serving yet would hold up).
const STOP_GRACE: Duration = Duration::from_secs(3);

/// The core and the node's end of the stream, shared by the loop and the load watchdog.
struct Shared {
    core: Mutex<RunnerCore>,
    out: Mutex<Box<dyn Write + Send>>,
}

impl Shared {
    /// Feeds `input` to the core, writes the events it gives (in order, under the core's lock)
    /// and returns the work it asks for.
    fn feed(&self, input: RunnerInput) -> Vec<RunnerAction> {
        let mut core = self.core.lock().unwrap_or_else(|e| e.into_inner());
        let mut actions = Vec::new();
        for output in core.handle(input) {
            match output {
                Output::Event(event) => {
                    if let Event::State(RunnerStatus::Failed { reason }) = &event {
                        tracing::error!(%reason, "runner failed");
                    }
                    let mut w = self.out.lock().unwrap_or_else(|e| e.into_inner());
                    let _ = write_frame(&mut *w, &event);
                }
                Output::Action(action) => actions.push(action),
            }
        }
        actions
    }
}

/// This process's place in a ring of several ranks.
struct Ring {
    config: RingConfig,
    group: Arc<RingGroup>,
}

impl Ring {
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

/// What this process holds of the model.
enum Held {
    Nothing,
    /// A ring of one.
    Whole(Box<Engine>),
    /// A rank of a ring (rank 0 drives it, the others serve it).
    Stage {
        stage: Box<dyn Stage>,
        tokenizer: Box<Tokenizer>,
    },
    /// A rank above 0 whose stage serves the ring on its own thread.
    Serving,
}

/// Serves one runner over `input`/`output` until `Shutdown`, the end of input, or a fatal
/// error. Returns the process exit code (0 on a clean shutdown).
pub fn serve(
    input: impl Read + Send + 'static,
    output: impl Write + Send + 'static,
    options: RunnerOptions,
) -> i32 {
    let shared = Arc::new(Shared {
        core: Mutex::new(RunnerCore::new(options.warm_up)),
        out: Mutex::new(Box::new(output)),
    });
    let (tx, rx) = mpsc::channel::<RunnerInput>();
    let started = install_mlx_error_handler().map_err(|e| e.to_string());
    let mut pending: VecDeque<RunnerAction> = shared.feed(RunnerInput::Started(started)).into();
    if !matches!(pending.front(), Some(RunnerAction::Exit(_))) {
        spawn_reader(input, tx.clone());
    }
    let mut io = Io {
        shared,
        options,
        rx,
        tx,
        ring: None,
        held: Held::Nothing,
        prompt_cache: None,
        vision: None,
    };
    loop {
        while let Some(action) = pending.pop_front() {
            if let RunnerAction::Exit(code) = action {
                return code;
            }
            pending.extend(io.run(action));
        }
        match io.rx.recv() {
            Ok(input) => pending.extend(io.shared.feed(input)),
            Err(_) => return 0,
        }
    }
}

/// Reads frames until the stream ends; the end (or a broken stream) is a `Shutdown`.
fn spawn_reader(mut input: impl Read + Send + 'static, tx: mpsc::Sender<RunnerInput>) {
    std::thread::spawn(move || loop {
        let msg = match read_frame::<NodeCommand>(&mut input) {
            Ok(cmd) => RunnerInput::Command(cmd),
            Err(FrameError::Closed) => {
                let _ = tx.send(RunnerInput::Command(NodeCommand::Shutdown));
                return;
            }
            Err(FrameError::Refused { id, reason }) => {
                // A request the node is waiting for: answer it, so it does not wait in vain.
                let _ = tx.send(RunnerInput::BadRequest { id, reason });
                continue;
            }
            Err(e) => {
                // A bad body of a well-framed message can be skipped; a broken stream cannot.
                let fatal = !matches!(e, FrameError::Malformed(ref m) if !m.contains("ended"))
                    && !matches!(e, FrameError::Version(_));
                let _ = tx.send(RunnerInput::BadFrame(e.to_string()));
                if fatal {
                    let _ = tx.send(RunnerInput::Command(NodeCommand::Shutdown));
                    return;
                }
                continue;
            }
        };
        if tx.send(msg).is_err() {
            return;
        }
    });
}

/// The loop's handles: what the core's actions are done with.
struct Io {
    shared: Arc<Shared>,
    options: RunnerOptions,
    rx: mpsc::Receiver<RunnerInput>,
    tx: mpsc::Sender<RunnerInput>,
    ring: Option<Ring>,
    held: Held,
    /// Ended requests' KV states, kept across batches (made with the first batch, sized by
    /// [`prompt_cache_tokens`]).
    prompt_cache: Option<PromptCache<KvCache>>,
    /// The model's vision tower, held by rank 0 (a ring of one, a pipeline's or a tensor
    /// ring's rank 0) when the model has one.
    vision: Option<VisionTower>,
}

impl Io {
    /// Does `action`, feeding its outcomes to the core; returns the work the core asks next.
    fn run(&mut self, action: RunnerAction) -> Vec<RunnerAction> {
        let outcome = match action {
            RunnerAction::Connect {
                rank,
                hosts,
                timeout_ms,
            } => self.connect(rank, hosts, Duration::from_millis(timeout_ms)),
            RunnerAction::Load {
                model,
                layers,
                format,
                sharding,
            } => RunnerInput::Loaded(self.load(Path::new(&model), layers, format, sharding)),
            RunnerAction::WarmUp => RunnerInput::WarmedUp(self.warm_up()),
            RunnerAction::Serve => RunnerInput::WarmedUp(self.start_serving()),
            RunnerAction::Generate { id, request } => return self.batch(id, request),
            RunnerAction::StopRing => {
                if let Held::Stage { stage, .. } = std::mem::replace(&mut self.held, Held::Nothing)
                {
                    stop_ring(stage);
                }
                return Vec::new();
            }
            // Only meaningful while a batch runs (see `batch`): the request already ended.
            RunnerAction::Cancel { .. } => return Vec::new(),
            RunnerAction::Exit(code) => return vec![RunnerAction::Exit(code)],
        };
        self.shared.feed(outcome)
    }

    /// Joins the ring as `rank` of `hosts` within `deadline`.
    fn connect(&mut self, rank: usize, hosts: Vec<Vec<String>>, deadline: Duration) -> RunnerInput {
        let size = hosts.len();
        let config = RingConfig { rank, hosts };
        let dir = hostfile_dir();
        let joined = RingGroup::join(&config, &dir, deadline);
        // MLX read the host file when it started joining.
        let _ = std::fs::remove_dir_all(&dir);
        match joined {
            Ok(group) => {
                tracing::info!(rank, size, "joined the ring");
                let ring = Ring {
                    config,
                    group: Arc::new(group),
                };
                let seat = Seat {
                    rank,
                    size,
                    neighbours: ring.neighbours(),
                };
                self.ring = Some(ring);
                RunnerInput::Connected(Ok(seat))
            }
            Err(e) => RunnerInput::Connected(Err(format!("rank {rank} of {size}: {e}"))),
        }
    }

    /// Loads this process's part of the model under the watchdog; `Ok(whole)`.
    fn load(
        &mut self,
        path: &Path,
        layers: Option<(usize, usize)>,
        format: Option<crate::weights::WeightFormat>,
        sharding: Option<Sharding>,
    ) -> Result<bool, LoadFailure> {
        let layers = layers.map(|(a, b)| a..b);
        let group = self.ring.as_ref().map(|r| r.group.clone());
        let split = match (sharding, &group) {
            (Some(Sharding::Tensor), Some(group)) => Split::Tensor {
                group: group.clone(),
                layers,
            },
            _ => Split::Layers(layers),
        };
        let watchdog = Watchdog {
            base: self.options.load_timeout_base,
            on_timeout: {
                let (shared, hook) = (self.shared.clone(), self.options.on_load_timeout.clone());
                Arc::new(move |timeout: Duration| {
                    shared.feed(RunnerInput::LoadTimedOut {
                        seconds: timeout.as_secs(),
                    });
                    hook();
                })
            },
        };
        let shared = self.shared.clone();
        let mut progress = |done, total| {
            shared.feed(RunnerInput::LoadProgress { done, total });
        };
        let (shard, tokenizer) = match load(path, split, format, &mut progress, Some(&watchdog)) {
            Ok(loaded) => loaded,
            Err(InferenceError::LoadTimedOut { .. }) => return Err(LoadFailure::TimedOut),
            Err(e) => return Err(LoadFailure::Failed(e.to_string())),
        };
        let whole = shard.is_first() && shard.is_last();
        // The tower sits on the rank that holds the requests: one process, a pipeline's rank 0
        // (the only one that embeds), or a tensor ring's rank 0, which shares its image rows
        // with the other ranks at each step (see `tensor_stage`).
        let rank = self.ring.as_ref().map_or(0, |r| r.config.rank);
        if rank == 0 {
            self.vision = VisionTower::load(path, &shard).unwrap_or_else(|e| {
                tracing::error!(%e, "the vision tower did not load: requests with images fail");
                None
            });
            if self.vision.is_some() {
                tracing::info!("vision tower loaded");
            }
        }
        self.held = match (sharding, group) {
            (Some(sharding), Some(group)) => {
                let stage = new_stage(sharding, shard, group);
                Held::Stage {
                    stage: stage.map_err(|e| LoadFailure::Failed(e.to_string()))?,
                    tokenizer: Box::new(tokenizer),
                }
            }
            _ => Held::Whole(Box::new(Engine {
                model: shard,
                tokenizer,
            })),
        };
        Ok(whole)
    }

    /// One token through the whole model, or (rank 0) through every rank, so the first
    /// request pays for nothing.
    fn warm_up(&mut self) -> Result<(), String> {
        match &mut self.held {
            Held::Whole(engine) => {
                let mut local = crate::sequence_forward::LocalForward::new(&engine.model)
                    .map_err(|e| e.to_string())?;
                one_token(&mut local, &engine.tokenizer)
            }
            Held::Stage { stage, tokenizer } => {
                // The ring's one protocol: a batch of one.
                let mut one = OneSequence::new(RingBatch::new(stage.as_mut(), 1))
                    .map_err(|e| e.to_string())?;
                one_token(&mut one, tokenizer)
            }
            _ => Err("no model is loaded".into()),
        }
    }

    /// A rank above 0: its stage serves the ring on its own thread until rank 0 stops it.
    fn start_serving(&mut self) -> Result<(), String> {
        let Held::Stage { mut stage, .. } = std::mem::replace(&mut self.held, Held::Serving) else {
            return Err("no stage is loaded".into());
        };
        let tx = self.tx.clone();
        std::thread::Builder::new()
            .name("ring-serve".into())
            .spawn(move || {
                let served = stage.serve();
                if let Ok(steps) = &served {
                    tracing::info!(steps, "rank 0 stopped the ring");
                }
                let _ = tx.send(RunnerInput::Served(served.map_err(|e| e.to_string())));
            })
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// Runs request `id` and every request that joins while it runs, batched (see
    /// [`crate::batch`]), until none is left: between two steps the commands that came are fed
    /// to the core, which adds requests to the batch or cancels them; events go out as each
    /// step produces them. A multi-rank instance's rank 0 batches across its ranks
    /// ([`RingBatch`]). A whole model keeps ended requests' states in the prompt cache across batches.
    fn batch(&mut self, id: u64, request: GenerateRequest) -> Vec<RunnerAction> {
        let (shared, rx) = (self.shared.clone(), &self.rx);
        let (forward, tokenizer): (Box<dyn BatchForward + '_>, &Tokenizer) = match &mut self.held {
            Held::Whole(engine) => {
                let limits = batch_limits(&engine.model);
                match LocalBatch::new(&engine.model, limits.max_sequences) {
                    Ok(local) => (Box::new(local), &engine.tokenizer),
                    Err(e) => return shared.feed(failed(id, &e)),
                }
            }
            Held::Stage { stage, tokenizer } => {
                let limits = batch_limits_of(stage.config());
                (
                    Box::new(RingBatch::new(stage.as_mut(), limits.max_sequences)),
                    tokenizer,
                )
            }
            _ => {
                let e = InferenceError::InvalidRequest("no model is loaded yet".into());
                return shared.feed(failed(id, &e));
            }
        };
        let limits = batch_limits_of(forward.config());
        let cache = self.prompt_cache.get_or_insert_with(|| {
            let tokens = prompt_cache_tokens(limits.kv_tokens);
            tracing::info!(tokens, "prompt cache");
            PromptCache::new(tokens)
        });
        let mut batcher = Batcher::new(forward, tokenizer, limits)
            .with_prompt_cache(cache)
            .with_vision(self.vision.as_ref());
        let mut later = Vec::new();
        let mut todo: VecDeque<RunnerAction> =
            VecDeque::from([RunnerAction::Generate { id, request }]);
        loop {
            // Requests join or leave the batch; other work waits for the main loop.
            while let Some(action) = todo.pop_front() {
                match action {
                    RunnerAction::Generate { id, request } => {
                        if let Err(e) = batcher.submit(id, &request) {
                            todo.extend(shared.feed(failed(id, &e)));
                        }
                    }
                    RunnerAction::Cancel { id } => {
                        batcher.cancel(id);
                    }
                    other => later.push(other),
                }
            }
            if batcher.is_idle() || later.iter().any(|a| matches!(a, RunnerAction::Exit(_))) {
                // The runner's own count of how the batch shared its steps: with n sequences
                // decoding together, tokens is about n times decode_steps (tests/batching_signal.rs).
                let stats = batcher.stats();
                tracing::info!(
                    steps = stats.steps,
                    decode_steps = stats.decode_steps,
                    tokens = stats.tokens,
                    "batch ended"
                );
                return later;
            }
            while let Ok(input) = rx.try_recv() {
                todo.extend(shared.feed(input));
            }
            if !todo.is_empty() {
                continue;
            }
            let events = match batcher.step() {
                Ok(events) => events,
                Err(e) => batcher.fail_all(&e.to_string(), matches!(e, InferenceError::Ring(_))),
            };
            if events.is_empty() {
                todo.extend(shared.feed(RunnerInput::Stepped));
            }
            for (id, event) in events {
                let input = match event {
                    BatchEvent::Cached { tokens } => RunnerInput::Cached { id, tokens },
                    BatchEvent::Token {
                        token,
                        text,
                        logprob,
                        top_logprobs,
                    } => RunnerInput::Token {
                        id,
                        token,
                        text,
                        logprob,
                        top_logprobs,
                    },
                    BatchEvent::Done(completion) => RunnerInput::Generated {
                        id,
                        result: Ok(completion),
                    },
                    BatchEvent::Failed { message, ring_lost } => RunnerInput::Generated {
                        id,
                        result: Err(GenerateFailure { message, ring_lost }),
                    },
                };
                todo.extend(shared.feed(input));
            }
        }
    }
}

/// The outcome of a request that could not start.
fn failed(id: u64, e: &InferenceError) -> RunnerInput {
    RunnerInput::Generated {
        id,
        result: Err(GenerateFailure {
            ring_lost: matches!(e, InferenceError::Ring(_)),
            message: e.to_string(),
        }),
    }
}

/// The batch limits of a whole model in this process (see [`batch_limits_of`]).
fn batch_limits(model: &crate::models::shard::ModelShard) -> BatchLimits {
    batch_limits_of(&model.config)
}
fn hostfile_dir() -> PathBuf {
    std::env::temp_dir().join(format!("shoal-runner-{}", std::process::id()))
}

/// A one-token generation (end tokens ignored).
fn one_token(forward: &mut dyn Forward, tokenizer: &Tokenizer) -> Result<(), String> {
    let mut req =
        GenerateRequest::new(Prompt::Tokens(vec![tokenizer.bos_token_id.unwrap_or(0)]), 1);
    req.ignore_eos = true;
    crate::generate::generate(forward, tokenizer, &req, |_| ControlFlow::Continue(()))
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Rank 0 stops every other rank, waiting at most [`STOP_GRACE`] (the process exits after
/// this, which ends a stop stuck in a collective).
fn stop_ring(mut stage: Box<dyn Stage>) {
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

/// The stage of `sharding` for `shard` (already cut for it) on `group`.
fn new_stage(
    sharding: Sharding,
    shard: crate::models::shard::ModelShard,
    group: Arc<RingGroup>,
) -> crate::error::Result<Box<dyn Stage>> {
    Ok(match sharding {
        Sharding::Pipeline => Box::new(PipelineStage::new(shard, group)?),
        Sharding::Tensor => Box::new(TensorStage::new(shard, group)?),
    })
}
