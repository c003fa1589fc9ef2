//! Serving on one node: the HTTP gateway over [`NodeBackend`], with `--model` placed on this
//! node at start. The mesh-aware node (src/node.rs) calls into the same pieces.

use crate::backend::{NodeBackend, NodeContext};
use crate::runner::{RunnerCommand, RunnerSettings};
use crate::NodeArgs;
use anyhow::Context;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// The runner command for this node's settings: this binary's `runner` subcommand, with the
/// settings the flags give ([`RunnerSettings::from_flags`]: fast synchronisation, the batch
/// limits `--max-sequences`, `--kv-budget-mb`, `--max-queue`, `--prompt-cache-tokens`, and
/// `--step-timeout`).
pub fn runner_command(args: &NodeArgs) -> anyhow::Result<RunnerCommand> {
    RunnerCommand::current_exe(RunnerSettings::from_flags(args))
        .context("cannot find this executable to start runners")
}

/// Serves the gateway on `0.0.0.0:api_port`, placing `args.model` on this node at start,
/// with the node id and state supplied by `context` (the mesh), until `shutdown` fires; then
/// drains the answers in flight (`--drain-seconds`, see `gateway::drain`) and stops the
/// runners.
pub async fn serve_with(
    args: &NodeArgs,
    context: Arc<dyn NodeContext>,
    chat_connections: Option<tokio::sync::mpsc::Receiver<iroh::endpoint::Connection>>,
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
    let backend = Arc::new(
        NodeBackend::new(
            context,
            runner_command(args)?,
            crate::dirs::default_model_path(),
        )
        .with_model_dirs(crate::models::locate::ModelDirs::from_env_trusting(
            &args.models_dir,
            args.model.as_deref(),
        )),
    );
    tracing::info!(port, node_id = %gateway::Backend::node_id(&*backend), "HTTP API listening");
    if !access.has_keys() {
        tracing::info!(
            "the HTTP API is open to anyone who reaches port {port}; require a key with \
             --api-key (see `shoal --help`)"
        );
    }
    tokio::spawn(crate::reconcile::run(backend.clone(), shutdown.clone()));
    if let Some(connections) = chat_connections {
        tokio::spawn(crate::forward::serve(
            connections,
            backend.clone() as Arc<dyn crate::forward::LocalChat>,
        ));
    }
    if let Some(model) = &args.model {
        // On this node alone: `--model` is this machine's model.
        let me = gateway::Backend::node_id(&*backend);
        let instance = backend
            .create(crate::instances::NewInstance {
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
        let waiting = backend.clone();
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
        backend.clone() as Arc<dyn gateway::Backend>,
        gateway::GatewayConfig {
            drain_grace: std::time::Duration::from_secs(args.drain_seconds),
            ..gateway::GatewayConfig::default()
        },
        access,
        shutdown,
    )
    .await;
    backend.shutdown().await;
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
