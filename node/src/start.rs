//! The default command: run a node (wiring). It reads the cluster secret, joins the mesh
//! (identity, discovery, replicated state) with the binary's own protocols (chat forwarding,
//! file copies), publishes this machine's profile, serves model files to members, starts the
//! node itself (`serve.rs`: the API and the executor), probes the other nodes' addresses to
//! record verified edges, and runs until Ctrl-C or SIGTERM.

use crate::context::NodeContext;
use crate::mesh_state::MeshContext;
use crate::NodeArgs;
use anyhow::{anyhow, Context};
use mesh::net::admission::{ClusterSecret, SECRET_FILE};
use mesh::net::DEFAULT_MESH_PORT;
use mesh::profile::{HostProfile, PROFILE_KEY};
use mesh::{Config, Event, Mesh, MeshOptions, StaticPeer};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// How often the profile (available memory, interfaces) is refreshed.
const PROFILE_PERIOD: Duration = Duration::from_secs(5);

/// How often every advertised address of every other node is probed.
const PROBE_PERIOD: Duration = Duration::from_secs(2);

/// Exit status when another live process already uses this node's identity.
const EXIT_DUPLICATE_ID: u8 = 3;

/// Runs a node until it is stopped; returns the process exit status.
pub fn run(args: &NodeArgs, data_dir: PathBuf) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run_node(args, data_dir)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The cluster secret a node starts with: the flag or variable, else the data directory's
/// file (which `shoal secret` writes), else none (the cluster is open to its namespace).
pub fn resolve_secret(
    flag: Option<&str>,
    data_dir: &Path,
) -> anyhow::Result<Option<ClusterSecret>> {
    if let Some(text) = flag.filter(|t| !t.trim().is_empty()) {
        return ClusterSecret::from_text(text)
            .map(Some)
            .map_err(|e| anyhow!("--cluster-secret / SHOAL_CLUSTER_SECRET: {e}"));
    }
    let path = data_dir.join(SECRET_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => ClusterSecret::from_text(&text)
            .map(Some)
            .map_err(|e| anyhow!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

fn parse_peers(peers: &[String]) -> anyhow::Result<Vec<StaticPeer>> {
    peers
        .iter()
        .map(|p| p.trim())
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<StaticPeer>().map_err(|e| anyhow!(e)))
        .collect()
}

async fn run_node(args: &NodeArgs, data_dir: PathBuf) -> anyhow::Result<ExitCode> {
    // Bad keys stop the node before it joins the mesh (the API checks them again).
    args.access.policy()?;
    let peers = parse_peers(&args.peers)?;
    let cluster_secret = resolve_secret(args.cluster_secret.as_deref(), &data_dir)?;
    let mut options = MeshOptions {
        data_dir,
        namespace: args.namespace.clone(),
        peers,
        port: args.mesh_port,
        config: Config::default(),
        extra_protocols: Vec::new(),
        cluster_secret,
        release: crate::release::this_release(),
    };
    // The binary's protocols are scoped like the mesh's own: by namespace and secret.
    let scoped = options.scoped_namespace();
    let (chats, chat_connections) = tokio::sync::mpsc::channel(64);
    let chat_alpn = crate::chat::forward::chat_alpn(&scoped);
    let (files, file_connections) = tokio::sync::mpsc::channel(64);
    let files_alpn = models::peer::files_alpn(&scoped);
    options.extra_protocols = vec![(chat_alpn.clone(), chats), (files_alpn.clone(), files)];
    let release = options.release.clone();
    tracing::info!(release = %release.describe(), "this node's release");
    let mesh = Arc::new(Mesh::start(options).await?);
    let mut events = mesh.subscribe();
    mesh.set(
        PROFILE_KEY,
        &HostProfile::gather(args.api_port, mlx_build()).with_release(&release),
    )?;
    let api_port = args.api_port;
    tokio::spawn({
        let mesh = mesh.clone();
        async move {
            let mut ticker = tokio::time::interval(PROFILE_PERIOD);
            loop {
                ticker.tick().await;
                let release = release.clone();
                let profile = tokio::task::spawn_blocking(move || {
                    HostProfile::gather(api_port, mlx_build()).with_release(&release)
                })
                .await;
                if let Ok(profile) = profile {
                    if let Err(e) = mesh.set(PROFILE_KEY, &profile) {
                        tracing::warn!("cannot publish the profile: {e:#}");
                    }
                }
            }
        }
    });
    let shutdown = crate::serve::shutdown_on_signals();
    let context: Arc<dyn NodeContext> = Arc::new(MeshContext {
        mesh: mesh.clone(),
        chat_alpn,
        files_alpn,
        connections: tokio::sync::Mutex::default(),
        late_removals: crate::late_removals::LateRemovals::from_env(),
    });
    // Model files: served to members, and what this node's cache holds announced to them.
    let cache = hub::HfCache::from_env();
    models::gather::advertise_cache(&*context, &cache);
    tokio::spawn(models::peer::serve(
        file_connections,
        context.clone(),
        cache,
    ));
    let serving = crate::serve::serve_with(args, context, chat_connections, shutdown.clone());
    tokio::pin!(serving);
    tokio::spawn(mesh::probe::run(mesh.clone(), PROBE_PERIOD));
    tracing::info!(
        node_id = %mesh.id(),
        api = %format!("http://0.0.0.0:{}", args.api_port),
        "node running"
    );
    loop {
        tokio::select! {
            // Returns once `shutdown` fired (SIGINT/SIGTERM) and the runners stopped, or when
            // the API cannot be served at all.
            served = &mut serving => {
                if let Err(e) = served {
                    // Close the endpoint before failing (a dropped one logs an error of its
                    // own that hides this one: "Endpoint dropped without calling close").
                    mesh.shutdown().await;
                    return Err(e);
                }
                break;
            }
            event = events.recv() => match event {
                Ok(Event::DuplicateId { ours, other }) if other < ours => {
                    eprintln!(
                        "error: another running node already uses this identity (node id {}). \
                         This happens when a data directory is copied to a second machine. \
                         Give this machine its own identity: stop it, delete {} in its data \
                         directory (--data-dir / SHOAL_DATA_DIR), and start it again.",
                        mesh.id(),
                        mesh::net::identity::KEY_FILE
                    );
                    shutdown.cancel();
                    let _ = serving.await;
                    mesh.shutdown().await;
                    return Ok(ExitCode::from(EXIT_DUPLICATE_ID));
                }
                Ok(Event::DuplicateId { .. }) => {
                    tracing::error!(
                        "a newer process started with this node's identity (a copied data \
                         directory); it has been told to exit"
                    );
                }
                _ => {}
            }
        }
    }
    tracing::info!("stopping");
    mesh.shutdown().await;
    Ok(ExitCode::SUCCESS)
}

/// The default mesh port, for the CLI's help text.
pub const fn default_mesh_port() -> u16 {
    DEFAULT_MESH_PORT
}

/// The MLX build this binary linked (`cargo xtask setup` chose it; see build.rs), so the node
/// offers a GPU backend only when its MLX can drive that GPU.
pub fn mlx_build() -> mesh::gpu::MlxBuild {
    mesh::gpu::MlxBuild::parse(env!("SHOAL_MLX_BUILD")).unwrap_or(mesh::gpu::MlxBuild::Cpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_parse_and_bad_ones_explain() {
        let id = "ab".repeat(32);
        let ok = parse_peers(&[format!("{id}@10.0.0.2:52416"), String::new()]).unwrap();
        assert_eq!(ok.len(), 1);
        let err = parse_peers(&["10.0.0.2:52416".to_string()]).unwrap_err();
        assert!(err.to_string().contains("NODE_ID@IP:PORT"), "{err}");
    }
}
