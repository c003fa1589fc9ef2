//! A test hub: a local server of shoal's own that speaks the Hugging Face Hub protocol as
//! `huggingface_hub` uses it — the revision and tree APIs, `resolve` with `X-Repo-Commit`,
//! `ETag`, and for LFS files a 302 to a CDN on **another origin** (another port) carrying
//! `X-Linked-Etag` / `X-Linked-Size`, ranges (206 + `Content-Range`), gated and missing repos
//! with `X-Error-Code` — serving folders as repositories. For the tests and the download
//! benchmark only (feature `test-hub`): it counts the content bytes it serves per file and
//! request, and can misbehave on purpose (cut off after N bytes, corrupt a file once).
//!
//! [`split`] turns a one-file safetensors folder into a sharded one with an index.

mod routes;
pub mod split;

use crate::verify::hash_of;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Files above this size (and every weight file) are served as LFS files.
pub const LFS_THRESHOLD: u64 = 1 << 20;

/// A file of a served repository.
#[derive(Debug, Clone)]
pub struct ServedFile {
    /// Where it is on disk.
    pub disk: PathBuf,
    /// Its size.
    pub size: u64,
    /// Git blob sha1.
    pub git_oid: String,
    /// sha256, for LFS files.
    pub sha256: Option<String>,
}

/// A served repository: its files by path, and its commit.
#[derive(Debug, Clone)]
pub struct ServedRepo {
    /// The commit (a hash of the listing).
    pub commit: String,
    /// Files by repo path.
    pub files: BTreeMap<String, ServedFile>,
    /// Whether access needs the token.
    pub gated: bool,
}

impl ServedRepo {
    /// The folder `dir` as a repository (every regular file below it, hashed).
    pub fn from_dir(dir: &Path, gated: bool) -> std::io::Result<ServedRepo> {
        let mut listed = Vec::new();
        crate::local::list_files(dir, dir, &mut listed);
        let mut files = BTreeMap::new();
        let mut listing = String::new();
        for f in listed {
            let disk = dir.join(&f.path);
            let data = std::fs::read(&disk)?;
            let lfs = f.size > LFS_THRESHOLD
                || [".safetensors", ".gguf", ".bin"]
                    .iter()
                    .any(|e| f.path.ends_with(e));
            let git_oid = hash_of(false, &data);
            let sha256 = lfs.then(|| hash_of(true, &data));
            listing.push_str(&format!("{} {git_oid}\n", f.path));
            files.insert(
                f.path,
                ServedFile {
                    disk,
                    size: data.len() as u64,
                    git_oid,
                    sha256,
                },
            );
        }
        Ok(ServedRepo {
            commit: hash_of(false, listing.as_bytes()),
            files,
            gated,
        })
    }
}

/// How the test hub misbehaves, on purpose.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Cut every connection after serving this many content bytes in total (the hub "dies");
    /// [`TestHub::restart`] brings it back.
    pub die_after: Option<u64>,
    /// Flip a byte in the first full response of this repo file.
    pub corrupt_once: Option<String>,
}

/// One content response: which file, from which byte, how many bytes went out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// Repo path.
    pub path: String,
    /// First byte (the range's start).
    pub start: u64,
    /// Bytes handed to the connection.
    pub sent: u64,
}

/// What the hub and its CDN share.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    pub repos: BTreeMap<String, ServedRepo>,
    pub token: Option<String>,
    pub faults: Mutex<Faults>,
    pub log: Mutex<Vec<Served>>,
    pub total_sent: std::sync::atomic::AtomicU64,
    pub cdn: Mutex<Option<SocketAddr>>,
    /// Whether any request to the CDN carried an `Authorization` header (it must not).
    pub cdn_saw_token: std::sync::atomic::AtomicBool,
    /// Set to stop serving (by [`TestHub::stop`], or by a fault).
    pub stop: Mutex<Option<tokio::sync::watch::Sender<bool>>>,
}

impl Shared {
    /// Stops both listeners and cuts every connection.
    pub fn kill(&self) {
        if let Some(stop) = self.stop.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = stop.send(true);
        }
    }
}

/// A running test hub (API origin and CDN origin).
pub struct TestHub {
    shared: Arc<Shared>,
    /// The hub's address (`HF_ENDPOINT = http://{api}`).
    pub api: SocketAddr,
    /// The CDN's address (another origin).
    pub cdn: SocketAddr,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl TestHub {
    /// Serves `repos` (`org/name` → folder) on `api` and its CDN on `cdn` (port 0 picks one),
    /// with `token` guarding gated repos.
    pub async fn start(
        repos: BTreeMap<String, ServedRepo>,
        token: Option<String>,
        faults: Faults,
        api: SocketAddr,
        cdn: SocketAddr,
    ) -> std::io::Result<TestHub> {
        let shared = Arc::new(Shared {
            repos,
            token,
            faults: Mutex::new(faults),
            ..Shared::default()
        });
        let mut hub = TestHub {
            shared,
            api,
            cdn,
            tasks: Vec::new(),
        };
        hub.bind().await?;
        Ok(hub)
    }

    async fn bind(&mut self) -> std::io::Result<()> {
        let api = tokio::net::TcpListener::bind(self.api).await?;
        let cdn = tokio::net::TcpListener::bind(self.cdn).await?;
        self.api = api.local_addr()?;
        self.cdn = cdn.local_addr()?;
        *self.shared.cdn.lock().unwrap_or_else(|p| p.into_inner()) = Some(self.cdn);
        let (stop, watch) = tokio::sync::watch::channel(false);
        self.tasks = vec![
            tokio::spawn(routes::accept(
                api,
                self.shared.clone(),
                false,
                watch.clone(),
            )),
            tokio::spawn(routes::accept(cdn, self.shared.clone(), true, watch)),
        ];
        *self.shared.stop.lock().unwrap_or_else(|p| p.into_inner()) = Some(stop);
        Ok(())
    }

    /// Stops serving: listeners closed, open transfers cut.
    pub async fn stop(&mut self) {
        self.shared.kill();
        for t in self.tasks.drain(..) {
            t.abort();
            let _ = t.await;
        }
    }

    /// Whether a fault stopped it (the hub "died").
    pub fn is_dead(&self) -> bool {
        self.shared
            .stop
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }

    /// Serves again on the same addresses with `faults`.
    pub async fn restart(&mut self, faults: Faults) -> std::io::Result<()> {
        self.stop().await;
        *self.shared.faults.lock().unwrap_or_else(|p| p.into_inner()) = faults;
        self.bind().await
    }

    /// Every content response so far, in order.
    pub fn served(&self) -> Vec<Served> {
        self.shared
            .log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Whether the CDN origin was ever sent the token.
    pub fn cdn_saw_token(&self) -> bool {
        self.shared
            .cdn_saw_token
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Content bytes served of `path`, over all responses.
    pub fn bytes_of(&self, path: &str) -> u64 {
        self.served()
            .iter()
            .filter(|s| s.path == path)
            .map(|s| s.sent)
            .sum()
    }
}
