//! `shoal`: run it on every machine you own; they find each other and serve models together.
//!
//! `src/` is the command line only: this file (the flags, the subcommands, `main`) and [`cmd`]
//! (one file per subcommand). The node itself (its flags as [`NodeArgs`], the wiring, the API
//! adapter, the executor, chat routing and forwarding) is the `node` library crate (`node/`),
//! so it can be used and tested without this binary.
//!
//! The work itself lives in the crates: `control` decides, `placement` places, `models` finds
//! and fetches model files, `runners` supervises runner processes, `prompt` renders prompts,
//! `mesh` replicates the state, `gateway` speaks HTTP, `inference` runs models.

mod cmd;

use clap::{Parser, Subcommand};
use node::{logging, release, start, NodeArgs};
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
