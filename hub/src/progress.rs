//! Download progress, shared between the downloading tasks and whoever shows it (the CLI's
//! progress bar, the node's replicated download record).

use std::collections::BTreeMap;
use std::sync::Mutex;

/// One file's progress.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileProgress {
    /// Bytes held (verified or being written).
    pub done: u64,
    /// The file's size.
    pub total: u64,
    /// Whether it is complete and verified.
    pub complete: bool,
    /// Where its bytes come from now (a hub endpoint, a peer's node id), once known.
    pub source: Option<String>,
}

/// A download's progress: per file, plus the bytes that came over the network.
#[derive(Debug, Default)]
pub struct Progress {
    files: Mutex<BTreeMap<String, FileProgress>>,
    fetched: std::sync::atomic::AtomicU64,
}

/// A moment's totals.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Totals {
    /// Bytes held over all files.
    pub done: u64,
    /// Bytes of all files.
    pub total: u64,
    /// Bytes received over the network so far (not counting what was already held).
    pub fetched: u64,
    /// Files complete.
    pub files_complete: usize,
    /// Files in all.
    pub files: usize,
    /// A file being fetched now (the first by path), if any.
    pub current: Option<String>,
    /// Where [`Totals::current`] comes from, if known.
    pub current_source: Option<String>,
}

impl Progress {
    fn files(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, FileProgress>> {
        self.files.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a file of `total` bytes.
    pub fn add_file(&self, path: &str, total: u64) {
        self.files().entry(path.to_string()).or_default().total = total;
    }

    /// Sets the bytes held of `path` (resumed from, or reset to zero after a bad copy).
    pub fn set_done(&self, path: &str, done: u64) {
        self.files().entry(path.to_string()).or_default().done = done;
    }

    /// Says where the bytes of `path` come from from now on.
    pub fn set_source(&self, path: &str, source: &str) {
        self.files().entry(path.to_string()).or_default().source = Some(source.to_string());
    }

    /// Adds `n` bytes received of `path`.
    pub fn received(&self, path: &str, n: u64) {
        self.files().entry(path.to_string()).or_default().done += n;
        self.fetched
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// Marks `path` complete and verified.
    pub fn complete(&self, path: &str) {
        let mut files = self.files();
        let f = files.entry(path.to_string()).or_default();
        f.done = f.total;
        f.complete = true;
    }

    /// Per-file progress, by path.
    pub fn per_file(&self) -> BTreeMap<String, FileProgress> {
        self.files().clone()
    }

    /// The totals now.
    pub fn totals(&self) -> Totals {
        let files = self.files();
        let current = files.iter().find(|(_, f)| !f.complete && f.done > 0);
        Totals {
            done: files.values().map(|f| f.done.min(f.total)).sum(),
            total: files.values().map(|f| f.total).sum(),
            fetched: self.fetched.load(std::sync::atomic::Ordering::Relaxed),
            files_complete: files.values().filter(|f| f.complete).count(),
            files: files.len(),
            current: current.map(|(p, _)| p.clone()),
            current_source: current.and_then(|(_, f)| f.source.clone()),
        }
    }
}
