//! The flags of a running node (`shoal` with no subcommand), as one clap struct the binary
//! flattens into its command line and the library reads when it starts the node
//! ([`crate::start::run`]) and builds its runners' settings ([`crate::serve::runner_settings`]).

use clap::Args;
use std::path::PathBuf;

/// Flags of a running node (the default command).
#[derive(Args, Debug, Clone)]
pub struct NodeArgs {
    /// HTTP API port (OpenAI-compatible API, cluster API, /node_id).
    #[arg(long, env = "SHOAL_API_PORT", default_value_t = 52415)]
    pub api_port: u16,

    /// UDP port of the mesh endpoint (iroh: discovery, gossip, state sync).
    #[arg(long, env = "SHOAL_MESH_PORT", default_value_t = crate::start::default_mesh_port())]
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
    pub access: crate::access::AccessArgs,

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
