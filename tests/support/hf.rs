//! The SmolLM2 fixture in Hugging Face form, served by the test hub inside a namespace.
//!
//! [`fixture_repo`] exports the GGUF fixture once as a bf16 safetensors folder and splits it
//! into three weight files with an index (cached under shoal's cache directory, never in git).
//! [`HubInNetns`] runs a [`TestHub`] on a thread that entered a node's namespace, so its sockets
//! live there; [`in_netns`] runs any closure the same way (a download client).

use hub::testhub::{split::split, Faults, Served, ServedRepo, TestHub};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::OnceLock;

/// The repo id the fixture is served as.
pub const REPO: &str = "HuggingFaceTB/SmolLM2-135M-Instruct";
/// Weight files of the split.
pub const PARTS: usize = 3;
/// API and CDN ports of the test hub.
pub const API_PORT: u16 = 8080;
/// The CDN: the same host on another port, so another origin.
pub const CDN_PORT: u16 = 8081;

/// The fixture as a Hugging Face repo folder (three safetensors files and an index); made on
/// first use from the GGUF fixture, or `Err` saying what to run.
pub fn fixture_repo() -> Result<PathBuf, String> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| {
        let gguf = kit::dirs::default_model_path();
        if !gguf.is_file() {
            return Err(format!("the model fixture {} is missing", gguf.display()));
        }
        let out = kit::dirs::cache_dir()
            .join("hf-fixture")
            .join(format!("SmolLM2-135M-Instruct-bf16-{PARTS}"));
        if out.join(hub::select::INDEX).is_file() {
            return Ok(out);
        }
        let work = out.with_extension(format!("tmp{}", std::process::id()));
        let dense = work.join("dense");
        let repo = work.join("repo");
        inference::export::export_hf_folder(&gguf, &dense, mlx_rs::Dtype::Bfloat16)
            .map_err(|e| format!("exporting the fixture: {e}"))?;
        split(&dense, &repo, PARTS).map_err(|e| format!("splitting the fixture: {e}"))?;
        let _ = std::fs::rename(&repo, &out);
        let _ = std::fs::remove_dir_all(&work);
        Ok(out)
    })
    .clone()
}

/// Runs `f` on a thread inside namespace `netns` (its sockets, and those of threads it starts,
/// live there).
pub fn in_netns<T: Send + 'static>(
    netns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    let netns = netns.to_string();
    std::thread::spawn(move || {
        kit::netns::enter(&netns).unwrap_or_else(|e| panic!("enter {netns}: {e}"));
        f()
    })
}

/// A current-thread runtime (all its sockets on the calling thread's namespace).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

enum Command {
    Restart(Faults, std::sync::mpsc::Sender<()>),
    Report(std::sync::mpsc::Sender<(Vec<Served>, bool, bool)>),
}

/// A test hub serving the fixture (and `extra` repos), in namespace `netns` at `ip`.
pub struct HubInNetns {
    /// `HF_ENDPOINT`.
    pub endpoint: String,
    commands: tokio::sync::mpsc::UnboundedSender<Command>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HubInNetns {
    /// Starts it; `gated` repos need `token`.
    pub fn start(
        netns: &str,
        ip: std::net::Ipv4Addr,
        repos: BTreeMap<String, ServedRepo>,
        token: Option<String>,
        faults: Faults,
    ) -> HubInNetns {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = in_netns(netns, move || {
            runtime().block_on(async move {
                let api = SocketAddr::from((ip, API_PORT));
                let cdn = SocketAddr::from((ip, CDN_PORT));
                let mut hub = TestHub::start(repos, token, faults, api, cdn)
                    .await
                    .expect("test hub listens");
                let _ = ready_tx.send(());
                while let Some(cmd) = rx.recv().await {
                    match cmd {
                        Command::Restart(f, done) => {
                            hub.restart(f).await.expect("test hub listens again");
                            let _ = done.send(());
                        }
                        Command::Report(reply) => {
                            let _ = reply.send((hub.served(), hub.is_dead(), hub.cdn_saw_token()));
                        }
                    }
                }
                hub.stop().await;
            })
        });
        ready_rx.recv().expect("test hub started");
        HubInNetns {
            endpoint: format!("http://{ip}:{API_PORT}"),
            commands: tx,
            thread: Some(thread),
        }
    }

    /// (content responses so far, whether a fault stopped it, whether the CDN saw a token).
    pub fn report(&self) -> (Vec<Served>, bool, bool) {
        let (tx, rx) = std::sync::mpsc::channel();
        self.commands.send(Command::Report(tx)).expect("hub thread");
        rx.recv().expect("hub report")
    }

    /// Serves again (after a fault stopped it) with `faults`.
    pub fn restart(&self, faults: Faults) {
        let (tx, rx) = std::sync::mpsc::channel();
        self.commands
            .send(Command::Restart(faults, tx))
            .expect("hub thread");
        rx.recv().expect("hub restarted");
    }
}

/// Serves the fixture as [`REPO`] from the namespace `netns` at `ip` (a namespace where no
/// shoal runs) and points every node whose environment is in `envs` at it, each with an empty
/// cache of its own under `dir` (`hf0`, `hf1`, ...). Answers the hub and those caches.
pub fn serve_fixture<'a>(
    netns: &str,
    ip: std::net::Ipv4Addr,
    dir: &std::path::Path,
    envs: impl IntoIterator<Item = &'a mut Vec<(String, String)>>,
) -> (HubInNetns, Vec<PathBuf>) {
    let fixture = fixture_repo().expect("the fixture (checked by the test first)");
    let repos = BTreeMap::from([(
        REPO.to_string(),
        ServedRepo::from_dir(&fixture, false).expect("the fixture as a repo"),
    )]);
    let server = HubInNetns::start(netns, ip, repos, None, Faults::default());
    let mut caches = Vec::new();
    for (i, env) in envs.into_iter().enumerate() {
        let cache = dir.join(format!("hf{i}"));
        env.push(("HF_HUB_CACHE".into(), cache.display().to_string()));
        env.push(("HF_ENDPOINT".into(), server.endpoint.clone()));
        caches.push(cache);
    }
    (server, caches)
}

impl Drop for HubInNetns {
    fn drop(&mut self) {
        let (tx, _) = tokio::sync::mpsc::unbounded_channel();
        drop(std::mem::replace(&mut self.commands, tx));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Bytes of `path` served over all responses.
pub fn bytes_of(served: &[Served], path: &str) -> u64 {
    served
        .iter()
        .filter(|s| s.path == path)
        .map(|s| s.sent)
        .sum()
}

/// The safetensors files in `cache`'s snapshots of `repo` (what a node downloaded of it).
pub fn weight_files_held(
    cache: &std::path::Path,
    repo: &str,
) -> std::collections::BTreeSet<String> {
    let snapshots = cache
        .join(format!("models--{}", repo.replace('/', "--")))
        .join("snapshots");
    std::fs::read_dir(snapshots)
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|commit| {
            std::fs::read_dir(commit.path())
                .into_iter()
                .flatten()
                .flatten()
        })
        .map(|f| f.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".safetensors"))
        .collect()
}
