//! Files already on disk: a snapshot folder's files as [`RepoFile`]s (their hash read from the
//! blob each link points to), for offline use and for models fetched by other tools.

use crate::meta::RepoFile;
use std::path::Path;

/// Deepest folder nesting walked.
const MAX_DEPTH: usize = 16;

/// Appends every file under `dir` to `out`, with paths relative to `base`, sorted.
pub fn list_files(dir: &Path, base: &Path, out: &mut Vec<RepoFile>) {
    walk(dir, base, out, 0);
    out.sort();
}

fn walk(dir: &Path, base: &Path, out: &mut Vec<RepoFile>, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            walk(&path, base, out, depth + 1);
            continue;
        }
        let Ok(rel) = path.strip_prefix(base) else {
            continue;
        };
        let hash = std::fs::read_link(&path)
            .ok()
            .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_default();
        out.push(RepoFile {
            path: rel.to_string_lossy().into_owned(),
            size: meta.len(),
            lfs: hash.len() == 64,
            hash,
        });
    }
}
