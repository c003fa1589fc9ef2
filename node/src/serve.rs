//! Serving: the [`Node`] built from the flags, its two faces started (the HTTP gateway over
//! [`Api`], the [`Executor`]), forwarded chats served, and `--model` placed on this node at
//! start; on shutdown the answers in flight drain and the runners stop. `start.rs`
//! calls it once the mesh is up.

use crate::api::instances::NewInstance;
use crate::api::Api;
use crate::context::NodeContext;
use crate::executor::Executor;
use crate::node::Node;
use crate::NodeArgs;
use anyhow::Context;
use runners::{RunnerCommand, RunnerSettings};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The runners' settings the node's flags give: fast synchronisation, the batch limits
/// `--max-sequences`, `--kv-budget-mb`, `--max-queue`, `--prompt-cache-tokens`, and
/// `--step-timeout`.
pub fn runner_settings(args: &NodeArgs) -> RunnerSettings {
    RunnerSettings {
        fast_synch: args.fast_synch && !args.no_fast_synch,
        max_sequences: args.max_sequences.max(1),
        max_queue: args.max_queue,
        step_timeout: Duration::from_secs(args.step_timeout.max(1) as u64),
        kv_budget_mb: args.kv_budget_mb,
        prompt_cache_tokens: args.prompt_cache_tokens,
    }
}

/// The runner command for this node's settings: this binary's `runner` subcommand.
pub fn runner_command(args: &NodeArgs) -> anyhow::Result<RunnerCommand> {
    RunnerCommand::current_exe(runner_settings(args))
        .context("cannot find this executable to start runners")
}

/// Serves the gateway on `0.0.0.0:api_port`, placing `args.model` on this node at start,
/// with the node id and state supplied by `context` (the mesh), until `shutdown` fires; then
/// drains the answers in flight (`--drain-seconds`, see `gateway::drain`) and stops the
/// runners.
pub async fn serve_with(
    args: &NodeArgs,
    context: Arc<dyn NodeContext>,
    chat_connections: tokio::sync::mpsc::Receiver<iroh::endpoint::Connection>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    // Bad keys stop the node before it listens, rather than leave the API open.
    let access = args.access.policy()?;
    let listener = tokio::net::TcpListener::bind(("0.0.0.0", args.api_port))
        .await
        .with_context(|| {
            format!(
                "cannot listen on 0.0.0.0:{} (another node running? pick one with --api-port)",
                args.api_port
            )
        })?;
    let port = listener
        .local_addr()
        .map(|a| a.port())
        .unwrap_or(args.api_port);
    let node = Arc::new(Node::new(
        context,
        runner_command(args)?,
        models::locate::default_model_path(),
        models::locate::ModelDirs::from_env_trusting(&args.models_dir, args.model.as_deref()),
    ));
    let me = node.context.node_id();
    tracing::info!(port, node_id = %me, "HTTP API listening");
    if !access.has_keys() {
        tracing::info!(
            "the HTTP API is open to anyone who reaches port {port}; require a key with \
             --api-key (see `shoal --help`)"
        );
    }
    tokio::spawn(Executor::new(node.clone()).run(shutdown.clone()));
    tokio::spawn(crate::chat::forward::serve(chat_connections, node.clone()));
    let api = Arc::new(Api::new(node.clone()));
    if let Some(model) = &args.model {
        // On this node alone: `--model` is this machine's model.
        let instance = api
            .create(NewInstance {
                model: model.clone(),
                sharding: placement::Sharding::Pipeline,
                backend: placement::CollectiveBackend::Ring,
                min_nodes: 1,
                required_nodes: vec![me],
            })
            .await
            .map_err(|e| anyhow::anyhow!("cannot place --model {model}: {}", e.message))?;
        let id = instance.instance_id;
        let model = model.clone();
        let waiting = node.clone();
        tokio::spawn(async move {
            match waiting.wait_ready(&id).await {
                Ok(()) => {
                    println!(
                        "shoal: model `{model}` is ready (instance {id}). Try:\n  curl \
                         http://127.0.0.1:{port}/v1/chat/completions -H 'Content-Type: \
                         application/json' -d '{{\"model\": \"{model}\", \"messages\": \
                         [{{\"role\": \"user\", \"content\": \"What is the capital of \
                         France?\"}}]}}'"
                    );
                }
                Err(reason) => {
                    tracing::error!(%reason, "model `{model}` failed to load");
                    eprintln!("shoal: model `{model}` failed to load: {reason}");
                }
            }
        });
    }
    let served = gateway::serve_with(
        listener,
        api as Arc<dyn gateway::Backend>,
        gateway::GatewayConfig {
            drain_grace: Duration::from_secs(args.drain_seconds),
            ..gateway::GatewayConfig::default()
        },
        access,
        shutdown,
    )
    .await;
    node.runners.stop_all().await;
    served.context("the HTTP server failed")
}

/// Fires the returned token on Ctrl-C or SIGTERM.
pub fn shutdown_on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let fire = token.clone();
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot watch SIGTERM");
                    let _ = tokio::signal::ctrl_c().await;
                    fire.cancel();
                    return;
                }
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("shutting down");
        fire.cancel();
    });
    token
}
