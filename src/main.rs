//! `shoal`: run it on every machine you own; they find each other and serve models together.

//!
//! `src/` is flags, wiring, and the node's two faces over its state ([`node::Node`]):
//! - flags: this file (the node's), [`access`] (API keys), [`logging`];
//! - wiring: [`start`] (the mesh, the profile, the probes), [`mesh_state`] (the mesh as the
//!   node's [`context::NodeContext`]), [`serve`] (the HTTP API, the executor, `--model`);
//! - the adapter: [`api`] (the gateway's `Backend`: instances, models, chat);
//! - the executor: [`executor`] (applies the control plane's effects);
//! - chat routing: [`chat`] (pick an instance, run it here or forward it);
//! - subcommands: [`cmd`].
//!
//! The work itself lives in the crates: `control` decides, `placement` places, `models` finds
//! and fetches model files, `runners` supervises runner processes, `prompt` renders prompts,
//! `mesh` replicates the state, `gateway` speaks HTTP, `inference` runs models.

mod access;
mod api;
mod chat;
mod cmd;
mod context;
mod executor;
mod late_removals;
mod logging;
mod mesh_state;
mod node;
mod release;
mod serve;
mod start;

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

const AFTER_HELP: &str = "\
Files:
  data    $SHOAL_DATA_DIR, else $XDG_DATA_HOME/shoal (~/.local/share/shoal): node identity, state
  config  $XDG_CONFIG_HOME/shoal (~/.config/shoal)
  cache   $SHOAL_CACHE_DIR, else $XDG_CACHE_HOME/shoal (~/.cache/shoal): MLX, models

Logs go to stderr; RUST_LOG (e.g. RUST_LOG=mesh=debug) overrides -v/-vv.

Examples:
  shoal --model default                 run a node that serves SmolLM2 on :52415
  shoal --peer ID@10.0.0.2:4455         also dial a known peer (when multicast is blocked)
  shoal secret                          make a cluster secret; prints how to start the others
  shoal place --input cluster.json      compute a placement offline";

/// One binary per machine: a node of a leaderless cluster that splits language models
/// across machines and serves an OpenAI-compatible API on every node.
#[derive(Parser, Debug)]
#[command(name = "shoal", version = release::version_text(), after_help = AFTER_HELP)]
struct Cli {
    /// More log output (-v: debug for shoal, -vv: trace).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,

    #[command(subcommand)]
    command: Option<CliCommand>,

    #[command(flatten)]
    node: NodeArgs,
}

/// Flags of a running node (the default command).
#[derive(Args, Debug, Clone)]
pub struct NodeArgs {
    /// HTTP API port (OpenAI-compatible API, cluster API, /node_id).
    #[arg(long, env = "SHOAL_API_PORT", default_value_t = 52415)]
    pub api_port: u16,

    /// UDP port of the mesh endpoint (iroh: discovery, gossip, state sync).
    #[arg(long, env = "SHOAL_MESH_PORT", default_value_t = start::default_mesh_port())]
    pub mesh_port: u16,

    /// Cluster namespace: nodes only join others with the same namespace.
    #[arg(long, env = "SHOAL_NAMESPACE", default_value = "shoal")]
    pub namespace: String,

    /// A peer to dial as NODE_ID@IP:PORT, for networks that block multicast (repeatable).
    #[arg(long = "peer", env = "SHOAL_PEERS", value_delimiter = ',')]
    pub peers: Vec<String>,

    /// Model to place on this node at start: a Hugging Face model id (`org/name`, downloaded
    /// with `shoal download`), a file or folder on this machine (its folder then counts as a
    /// model folder: you named it here, a request from the network cannot), or `default` for
    /// the SmolLM2 fixture.
    #[arg(long, env = "SHOAL_MODEL")]
    pub model: Option<String>,

    /// A folder whose models (and only whose models, besides the Hugging Face cache and
    /// shoal's own model folder) may be named by path (repeatable).
    #[arg(long = "models-dir", env = "SHOAL_MODELS_DIR", value_delimiter = ',')]
    pub models_dir: Vec<PathBuf>,

    /// Where the node keeps its identity and state.
    #[arg(long, env = "SHOAL_DATA_DIR")]
    pub data_dir: Option<PathBuf>,

    /// Ask runners for MLX's fast synchronisation (JACCL on macOS; on Linux it only reaches
    /// the runner's environment).
    #[arg(long, env = "SHOAL_FAST_SYNCH", overrides_with = "no_fast_synch")]
    pub fast_synch: bool,

    /// Do not ask runners for fast synchronisation.
    #[arg(long, overrides_with = "fast_synch")]
    pub no_fast_synch: bool,

    /// Requests one instance decodes together at most (continuous batching).
    #[arg(long, env = "SHOAL_MAX_SEQUENCES", default_value_t = inference::batch::DEFAULT_MAX_SEQUENCES)]
    pub max_sequences: usize,

    /// KV-cache budget of one instance, in MiB (default: 8192 positions, at most a quarter
    /// of the memory free when its runner loads; never less than one full context).
    #[arg(long, env = "SHOAL_KV_BUDGET_MB")]
    pub kv_budget_mb: Option<u64>,

    /// Requests that may wait for room in one instance's batch; past that a request is
    /// answered 429 with `Retry-After`.
    #[arg(long, env = "SHOAL_MAX_QUEUE", default_value_t = runners::DEFAULT_MAX_QUEUE)]
    pub max_queue: usize,

    /// Seconds a runner may go without finishing a step (a token or a prompt chunk) while
    /// it has requests before it is taken for hung (a rank of its ring frozen or cut off):
    /// it is then ended, its requests get an error, and the instance is placed again.
    #[arg(long, env = "SHOAL_STEP_TIMEOUT", default_value_t = runners::DEFAULT_STEP_TIMEOUT_S)]
    pub step_timeout: usize,

    /// Seconds the answers in flight may take to finish when the node is told to stop
    /// (SIGTERM, Ctrl-C): it takes no new request meanwhile (503 `node_stopping`), ends
    /// those still running then with a `node_stopping` error, and only then stops its
    /// runners.
    #[arg(long, env = "SHOAL_DRAIN_SECONDS", default_value_t = 10)]
    pub drain_seconds: u64,

    #[command(flatten)]
    pub access: access::AccessArgs,

    /// Cluster secret: only nodes started with the same one see each other or talk to this
    /// node (proven both ways on every connection, never sent). Default: the data
    /// directory's cluster.secret file if `shoal secret` made one, else none (open to the
    /// namespace).
    #[arg(long, env = "SHOAL_CLUSTER_SECRET", hide_env_values = true)]
    pub cluster_secret: Option<String>,

    /// Positions of earlier requests' KV state one instance keeps to reuse for prompts that
    /// start the same way (the next turn of a chat, a shared system prompt); 0 disables it
    /// (default: half the KV budget, within it).
    #[arg(long, env = "SHOAL_PROMPT_CACHE_TOKENS")]
    pub prompt_cache_tokens: Option<usize>,
}

#[derive(Subcommand, Debug)]
enum CliCommand {
    /// Compute a placement from a JSON description of a cluster (no network).
    Place(cmd::place::PlaceArgs),
    /// Show the cluster as a node sees it: nodes, liveness, edges (asks GET /state).
    Status(cmd::status::StatusArgs),
    /// Generate text with a model in this process, streaming it to the terminal.
    Generate(cmd::generate::GenerateArgs),
    /// Download a Hugging Face model into the Hugging Face cache, with a progress bar.
    Download(cmd::download::DownloadArgs),
    /// Make this node's cluster secret (or show it) and print how to start the other machines.
    Secret(cmd::secret::SecretArgs),
    /// Measure prompt and generation speed of a model on every placement (like exo_bench).
    Bench(bench::BenchArgs),
    /// Run this node as a service of your user (systemd; launchd on macOS): `shoal service
    /// install -- NODE FLAGS`, `shoal service uninstall`.
    Service(cmd::service::ServiceArgs),
    /// Run one model instance, driven over stdin/stdout by its node (internal).
    #[command(hide = true)]
    Runner(cmd::runner::RunnerArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.verbose);
    match cli.command {
        Some(CliCommand::Place(args)) => cmd::place::run(&args),
        Some(CliCommand::Status(args)) => cmd::status::run(&args),
        Some(CliCommand::Bench(args)) => bench::run(&args),
        Some(CliCommand::Download(args)) => cmd::exit(cmd::download::run(&args)),
        Some(CliCommand::Secret(args)) => cmd::exit(cmd::secret::run(&args)),
        Some(CliCommand::Service(args)) => cmd::exit(cmd::service::run(&args)),
        Some(CliCommand::Generate(args)) => cmd::exit(cmd::generate::run(args)),
        Some(CliCommand::Runner(args)) => {
            inference::runner::exit_process(cmd::runner::run(args).clamp(0, 255))
        }
        None => {
            let data_dir = cli.node.data_dir.clone().unwrap_or_else(paths::data_dir);
            tracing::info!(data_dir = %data_dir.display(), config_dir = %paths::config_dir().display(), "starting node");
            start::run(&cli.node, data_dir)
        }
    }
}
