//! The Hugging Face cache layout, as `huggingface_hub` writes it, so that a model fetched with
//! `huggingface-cli download` is used as it is and what shoal fetches is visible to other tools:
//!
//! ```text
//! $HF_HUB_CACHE (else $HF_HOME/hub, else ~/.cache/huggingface/hub)
//!   models--org--name/
//!     blobs/<etag>                 file contents, named by sha256 (LFS) or git blob sha1
//!     blobs/<etag>.incomplete      while downloading (resumed from its length)
//!     snapshots/<commit>/<path>    relative symlinks into blobs/
//!     refs/<revision>              a file holding the commit the revision pointed to
//! ```

use crate::id::ModelId;
use crate::meta::{is_commit, safe_relative, RepoFile};
use std::path::{Path, PathBuf};

/// A Hugging Face hub cache directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HfCache {
    /// The cache root (`HF_HUB_CACHE`).
    pub root: PathBuf,
}

/// Reads an environment variable; empty counts as unset.
fn var(get: &dyn Fn(&str) -> Option<String>, name: &str) -> Option<String> {
    get(name).filter(|v| !v.is_empty())
}

impl HfCache {
    /// The cache at `root`.
    pub fn at(root: impl Into<PathBuf>) -> HfCache {
        HfCache { root: root.into() }
    }

    /// The cache the environment names, as `huggingface_hub` resolves it.
    pub fn from_env() -> HfCache {
        HfCache::from_vars(&|k| std::env::var(k).ok())
    }

    /// [`HfCache::from_env`] over an injectable environment.
    pub fn from_vars(get: &dyn Fn(&str) -> Option<String>) -> HfCache {
        if let Some(dir) = var(get, "HF_HUB_CACHE") {
            return HfCache::at(dir);
        }
        if let Some(home) = var(get, "HF_HOME") {
            return HfCache::at(Path::new(&home).join("hub"));
        }
        let base = var(get, "XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| var(get, "HOME").map(|h| Path::new(&h).join(".cache")))
            .unwrap_or_else(|| PathBuf::from("/tmp"));
        HfCache::at(base.join("huggingface").join("hub"))
    }

    /// `models--org--name`.
    pub fn repo_dir(&self, id: &ModelId) -> PathBuf {
        self.root.join(id.cache_folder())
    }

    /// Where a blob with this etag lives.
    pub fn blob(&self, id: &ModelId, etag: &str) -> PathBuf {
        self.repo_dir(id).join("blobs").join(etag)
    }

    /// Where a blob is written while it downloads.
    pub fn incomplete(&self, id: &ModelId, etag: &str) -> PathBuf {
        self.repo_dir(id)
            .join("blobs")
            .join(format!("{etag}.incomplete"))
    }

    /// The snapshot folder of `commit`.
    pub fn snapshot(&self, id: &ModelId, commit: &str) -> PathBuf {
        self.repo_dir(id).join("snapshots").join(commit)
    }

    /// The commit `revision` pointed to when last fetched, if recorded (or `revision` itself
    /// when it is a commit whose snapshot exists).
    pub fn read_ref(&self, id: &ModelId, revision: &str) -> Option<String> {
        if !safe_relative(revision) {
            return None;
        }
        let file = self.repo_dir(id).join("refs").join(revision);
        if let Ok(text) = std::fs::read_to_string(file) {
            let commit = text.trim().to_string();
            if is_commit(&commit) {
                return Some(commit);
            }
        }
        (is_commit(revision) && self.snapshot(id, revision).is_dir()).then(|| revision.into())
    }

    /// Records that `revision` points to `commit`.
    pub fn write_ref(&self, id: &ModelId, revision: &str, commit: &str) -> std::io::Result<()> {
        if !safe_relative(revision) || !is_commit(commit) {
            return Err(std::io::Error::other(format!(
                "refusing ref {revision} → {commit}"
            )));
        }
        if revision == commit {
            return Ok(());
        }
        let file = self.repo_dir(id).join("refs").join(revision);
        if let Some(dir) = file.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(file, commit)
    }

    /// Points `snapshots/<commit>/<path>` at `blobs/<etag>` with a relative symlink, as
    /// `huggingface_hub` does (replacing an older link).
    pub fn link(&self, id: &ModelId, commit: &str, path: &str, etag: &str) -> std::io::Result<()> {
        if !safe_relative(path) {
            return Err(std::io::Error::other(format!(
                "refusing a repo file path that leaves the snapshot: {path}"
            )));
        }
        let link = self.snapshot(id, commit).join(path);
        let depth = Path::new(path).components().count();
        // From snapshots/<commit>/<dirs…>/file up to the repo folder, then into blobs/.
        let mut target = PathBuf::new();
        for _ in 0..depth + 1 {
            target.push("..");
        }
        target.push("blobs");
        target.push(etag);
        if let Some(dir) = link.parent() {
            std::fs::create_dir_all(dir)?;
        }
        match std::fs::symlink_metadata(&link) {
            Ok(_) => std::fs::remove_file(&link)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        std::os::unix::fs::symlink(target, link)
    }

    /// Every model in the cache with the snapshots it holds: (id, commits), sorted.
    pub fn models(&self) -> Vec<(ModelId, Vec<String>)> {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(rest) = name.strip_prefix("models--") else {
                continue;
            };
            let Some((org, repo)) = rest.split_once("--") else {
                continue;
            };
            let Ok(id) = ModelId::parse(&format!("{org}/{repo}")) else {
                continue;
            };
            let mut commits: Vec<String> = std::fs::read_dir(entry.path().join("snapshots"))
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|c| is_commit(c))
                .collect();
            commits.sort();
            out.push((id, commits));
        }
        out.sort();
        out
    }
}

impl HfCache {
    /// Bytes still to be written for `files` of `id`: their sizes (each content once) less
    /// what their blobs, or the `.incomplete` files of a cut download, already hold.
    pub fn bytes_missing(&self, id: &ModelId, files: &[RepoFile]) -> u64 {
        let mut seen = std::collections::BTreeSet::new();
        files
            .iter()
            .filter(|f| seen.insert(f.hash.as_str()))
            .map(|f| {
                let len = |p: PathBuf| std::fs::metadata(p).map_or(0, |m| m.len());
                let held = len(self.blob(id, &f.hash)).max(len(self.incomplete(id, &f.hash)));
                f.size.saturating_sub(held)
            })
            .sum()
    }

    /// Checks that the cache's filesystem has room for what `files` of `id` still need
    /// ([`HfCache::bytes_missing`]) before a download starts, so a full disk is said up front
    /// rather than as a failed write halfway through.
    pub fn check_free_space(
        &self,
        id: &ModelId,
        files: &[RepoFile],
    ) -> Result<(), crate::HubError> {
        let need = self.bytes_missing(id, files);
        match free_space(&self.root) {
            Some(free) if need > free => Err(crate::HubError::NoSpace {
                id: id.to_string(),
                path: self.root.display().to_string(),
                need,
                free,
            }),
            _ => Ok(()),
        }
    }

    /// Removes `id`'s folder (every revision, as `huggingface-cli delete-cache` removes a
    /// repository): the bytes of the regular files it held, or `None` if there was none.
    /// Symbolic links are removed, never followed, so nothing outside the folder is touched.
    pub fn delete_repo(&self, id: &ModelId) -> std::io::Result<Option<u64>> {
        let dir = self.repo_dir(id);
        if std::fs::symlink_metadata(&dir).is_err() {
            return Ok(None);
        }
        let bytes = file_bytes_under(&dir);
        std::fs::remove_dir_all(&dir)?;
        Ok(Some(bytes))
    }
}

/// Bytes of the regular files under `dir`, links not followed.
fn file_bytes_under(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => file_bytes_under(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

/// Bytes available to this user on the filesystem of `path` (or of its nearest existing
/// ancestor: the cache may not exist yet); `None` if it cannot be asked.
pub fn free_space(path: &Path) -> Option<u64> {
    let existing = path.ancestors().find(|p| p.exists())?;
    let c = std::ffi::CString::new(existing.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statvfs is a plain C struct; all zeroes is a valid value of it.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a valid, writable statvfs.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    // The field types differ by platform (u64 on Linux; u32 and c_ulong on macOS), so the
    // conversions are needed somewhere even where they are no-ops.
    #[allow(clippy::useless_conversion)]
    let bytes = u64::from(st.f_bavail).saturating_mul(u64::from(st.f_frsize));
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deleting_a_repo_counts_file_bytes_and_never_follows_links() {
        let root = std::env::temp_dir().join(format!("shoal-delete-{}", std::process::id()));
        let cache = HfCache::at(root.join("hub"));
        let id = ModelId::parse("org/name").unwrap();
        let repo = cache.repo_dir(&id);
        let outside = root.join("outside");
        std::fs::create_dir_all(repo.join("blobs")).unwrap();
        std::fs::create_dir_all(repo.join("snapshots/c")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(repo.join("blobs/aa"), vec![0u8; 1000]).unwrap();
        std::fs::write(outside.join("keep"), b"keep").unwrap();
        std::os::unix::fs::symlink("../../blobs/aa", repo.join("snapshots/c/model.bin")).unwrap();
        std::os::unix::fs::symlink(&outside, repo.join("snapshots/c/elsewhere")).unwrap();
        assert_eq!(cache.delete_repo(&id).unwrap(), Some(1000));
        assert!(!repo.exists());
        assert!(
            outside.join("keep").is_file(),
            "a link's target is not deleted"
        );
        assert_eq!(cache.delete_repo(&id).unwrap(), None);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn cache_root_follows_huggingface_hub() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let c = HfCache::from_vars(&env(&[("HF_HUB_CACHE", "/a"), ("HF_HOME", "/b")]));
        assert_eq!(c.root, Path::new("/a"));
        let c = HfCache::from_vars(&env(&[("HF_HUB_CACHE", ""), ("HF_HOME", "/b")]));
        assert_eq!(c.root, Path::new("/b/hub"));
        let c = HfCache::from_vars(&env(&[("HOME", "/home/u")]));
        assert_eq!(c.root, Path::new("/home/u/.cache/huggingface/hub"));
    }

    #[test]
    fn links_are_relative_into_blobs_and_refs_round_trip() {
        let root = std::env::temp_dir().join(format!("shoal-hfcache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let cache = HfCache::at(&root);
        let id = ModelId::parse("org/name").unwrap();
        let commit = "0123456789abcdef0123456789abcdef01234567";
        std::fs::create_dir_all(cache.repo_dir(&id).join("blobs")).unwrap();
        std::fs::write(cache.blob(&id, "e1"), b"hello").unwrap();
        cache.link(&id, commit, "sub/dir/f.txt", "e1").unwrap();
        let link = cache.snapshot(&id, commit).join("sub/dir/f.txt");
        assert_eq!(
            std::fs::read_link(&link).unwrap(),
            Path::new("../../../../blobs/e1")
        );
        assert_eq!(std::fs::read(&link).unwrap(), b"hello");
        assert!(cache.link(&id, commit, "../x", "e1").is_err());
        cache.write_ref(&id, "main", commit).unwrap();
        assert_eq!(cache.read_ref(&id, "main").as_deref(), Some(commit));
        assert_eq!(cache.read_ref(&id, commit).as_deref(), Some(commit));
        assert_eq!(cache.read_ref(&id, "../../x"), None);
        assert_eq!(cache.models(), vec![(id.clone(), vec![commit.to_string()])]);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn free_space_is_checked_against_what_is_still_missing() {
        let root = std::env::temp_dir().join(format!("shoal-hfspace-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let cache = HfCache::at(root.join("not/yet/made"));
        assert!(free_space(&cache.root).is_some_and(|f| f > 0));
        let id = ModelId::parse("org/name").unwrap();
        let file = |hash: &str, size: u64| RepoFile {
            path: format!("{hash}.bin"),
            size,
            lfs: true,
            hash: hash.into(),
        };
        std::fs::create_dir_all(cache.repo_dir(&id).join("blobs")).unwrap();
        std::fs::write(cache.blob(&id, "aa"), b"12345").unwrap();
        std::fs::write(cache.incomplete(&id, "bb"), b"12").unwrap();
        let files = [file("aa", 5), file("bb", 10), file("cc", 7), file("cc", 7)];
        assert_eq!(cache.bytes_missing(&id, &files), 8 + 7);
        assert!(cache.check_free_space(&id, &files).is_ok());
        let huge = [file("dd", u64::MAX / 2)];
        let err = cache.check_free_space(&id, &huge).unwrap_err().to_string();
        assert!(err.contains("not enough disk space"), "{err}");
        assert!(err.contains("HF_HUB_CACHE"), "{err}");
        let _ = std::fs::remove_dir_all(&root);
    }
}
