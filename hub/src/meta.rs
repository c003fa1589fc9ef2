//! What the hub's responses say, parsed without trusting them: a file's metadata from the
//! headers of `HEAD …/resolve/…` (`X-Repo-Commit`, `ETag`, `X-Linked-Etag`, `X-Linked-Size`,
//! `Location`), `Content-Range` of a resumed download, and the JSON of the revision and tree
//! APIs (size-limited, typed).

use serde::Deserialize;
use std::path::{Component, Path};

/// Largest JSON answer read from the revision or tree API.
pub const MAX_JSON: usize = 16 << 20;
/// Most files a repository listing may hold.
pub const MAX_FILES: usize = 100_000;

/// A file's metadata, from the headers of `HEAD {endpoint}/{repo}/resolve/{rev}/{path}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileMeta {
    /// The commit the revision resolved to (`X-Repo-Commit`, required).
    pub commit: String,
    /// The content's id: the sha256 (`X-Linked-Etag`) for LFS files, else the git blob sha1
    /// (`ETag`).
    pub etag: String,
    /// The size (`X-Linked-Size`, else `Content-Length`), if given.
    pub size: Option<u64>,
    /// Where to GET the content (`Location` of a redirect), if elsewhere.
    pub location: Option<String>,
}

/// Strips an ETag's weak prefix and quotes: `W/"abc"` → `abc`.
pub fn normalize_etag(raw: &str) -> String {
    let s = raw.trim();
    let s = s.strip_prefix("W/").unwrap_or(s);
    s.trim_matches('"').to_string()
}

/// Reads a file's metadata from a header lookup (`get(name)` gives a header's value).
pub fn file_meta(get: &dyn Fn(&str) -> Option<String>) -> Result<FileMeta, String> {
    let commit = get("x-repo-commit").map(|c| c.trim().to_string()).ok_or(
        "the hub's answer has no X-Repo-Commit header (is HF_ENDPOINT a Hugging Face hub?)",
    )?;
    if !is_commit(&commit) {
        return Err(format!(
            "the hub's X-Repo-Commit `{commit:.60}` is not a commit"
        ));
    }
    let etag = get("x-linked-etag")
        .or_else(|| get("etag"))
        .map(|e| normalize_etag(&e))
        .ok_or("the hub's answer has no ETag header")?;
    if etag.is_empty()
        || etag.len() > 128
        || !etag.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return Err(format!("the hub's ETag `{etag:.60}` is not a content hash"));
    }
    let size = match get("x-linked-size").or_else(|| get("content-length")) {
        Some(s) => Some(
            s.trim()
                .parse::<u64>()
                .map_err(|_| format!("the hub's size `{s:.40}` is not a number"))?,
        ),
        None => None,
    };
    Ok(FileMeta {
        commit,
        etag,
        size,
        location: get("location"),
    })
}

/// The first byte and total of `Content-Range: bytes START-END/TOTAL` (TOTAL may be `*`).
pub fn content_range(value: &str) -> Option<(u64, Option<u64>)> {
    let rest = value.trim().strip_prefix("bytes ")?;
    let (range, total) = rest.split_once('/')?;
    let (start, end) = range.split_once('-')?;
    let start: u64 = start.trim().parse().ok()?;
    let end: u64 = end.trim().parse().ok()?;
    if end < start {
        return None;
    }
    let total = match total.trim() {
        "*" => None,
        t => Some(t.parse().ok()?),
    };
    if total.is_some_and(|t| end >= t) {
        return None;
    }
    Some((start, total))
}

/// `GET /api/models/{repo}/revision/{rev}`.
#[derive(Debug, Clone, Deserialize)]
pub struct RepoInfo {
    /// The commit.
    pub sha: String,
    /// Whether access is gated.
    #[serde(default)]
    pub gated: serde_json::Value,
}

/// An LFS pointer's facts in a tree listing.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Lfs {
    /// The content's sha256.
    pub oid: String,
    /// The content's size.
    pub size: u64,
}

/// One entry of `GET /api/models/{repo}/tree/{commit}?recursive=true`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct TreeEntry {
    /// `file` or `directory`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Path in the repository.
    pub path: String,
    /// Size in bytes (of the pointer for LFS files; see `lfs`).
    #[serde(default)]
    pub size: u64,
    /// Git blob sha1.
    #[serde(default)]
    pub oid: String,
    /// LFS facts, for LFS files.
    #[serde(default)]
    pub lfs: Option<Lfs>,
}

/// A file of a repository, as a download needs it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct RepoFile {
    /// Path in the repository.
    pub path: String,
    /// Content size.
    pub size: u64,
    /// The expected content hash: sha256 for LFS files, git blob sha1 otherwise.
    pub hash: String,
    /// Whether `hash` is a sha256 (LFS) rather than a git blob sha1.
    pub lfs: bool,
}

/// Parses a revision answer.
pub fn parse_revision(body: &[u8]) -> Result<RepoInfo, String> {
    let info: RepoInfo = serde_json::from_slice(body)
        .map_err(|e| format!("the hub's revision answer is not what huggingface_hub reads: {e}"))?;
    if !is_commit(&info.sha) {
        return Err(format!(
            "the hub's commit `{:.60}` is not a commit",
            info.sha
        ));
    }
    Ok(info)
}

/// Parses a tree listing into the repository's files, sorted by path; refuses paths that would
/// leave the snapshot folder.
pub fn parse_tree(body: &[u8]) -> Result<Vec<RepoFile>, String> {
    let entries: Vec<TreeEntry> = serde_json::from_slice(body)
        .map_err(|e| format!("the hub's tree listing is not what huggingface_hub reads: {e}"))?;
    if entries.len() > MAX_FILES {
        return Err(format!("the repository lists more than {MAX_FILES} files"));
    }
    let mut files = Vec::new();
    for e in entries {
        if e.kind != "file" {
            continue;
        }
        if !safe_relative(&e.path) {
            return Err(format!(
                "the hub lists a file path that leaves the repository: {:.100}",
                e.path
            ));
        }
        let (size, hash, lfs) = match e.lfs {
            Some(l) => (l.size, l.oid, true),
            None => (e.size, e.oid, false),
        };
        if hash.is_empty() || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("the hub lists `{}` with no usable hash", e.path));
        }
        files.push(RepoFile {
            path: e.path,
            size,
            hash: hash.to_ascii_lowercase(),
            lfs,
        });
    }
    files.sort();
    files.dedup_by(|a, b| a.path == b.path);
    Ok(files)
}

/// Whether `s` is a 40-hex-digit git commit (a name the hub gives is checked before the cache
/// uses it).
pub fn is_commit(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Whether `path` is relative and stays below its base (no `..`, no root, not empty).
pub fn safe_relative(path: &str) -> bool {
    !path.is_empty()
        && !path.contains('\0')
        && Path::new(path)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn headers<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn metadata_of_an_lfs_redirect() {
        let c = "0123456789abcdef0123456789abcdef01234567";
        let h = [
            ("x-repo-commit", c),
            ("etag", "W/\"abc\""),
            ("x-linked-etag", "\"deadbeef\""),
            ("x-linked-size", "1234"),
            ("location", "http://cdn/x"),
        ];
        let m = file_meta(&headers(&h)).unwrap();
        assert_eq!(m.etag, "deadbeef");
        assert_eq!(m.size, Some(1234));
        assert_eq!(m.location.as_deref(), Some("http://cdn/x"));
        let e = file_meta(&headers(&h[1..])).unwrap_err();
        assert!(e.contains("X-Repo-Commit"), "{e}");
        let bad = [("x-repo-commit", c), ("etag", "\"../../x\"")];
        assert!(file_meta(&headers(&bad)).is_err());
    }

    #[test]
    fn content_ranges() {
        assert_eq!(content_range("bytes 10-19/20"), Some((10, Some(20))));
        assert_eq!(content_range("bytes 10-19/*"), Some((10, None)));
        assert_eq!(content_range("bytes 10-9/20"), None);
        assert_eq!(content_range("bytes 10-20/20"), None);
        assert_eq!(content_range("items 1-2/3"), None);
    }

    #[test]
    fn tree_listing_keeps_files_and_refuses_escapes() {
        let body = br#"[{"type":"directory","path":"d","oid":"aa"},
            {"type":"file","path":"config.json","size":5,"oid":"ABCD"},
            {"type":"file","path":"m.safetensors","size":130,"oid":"ff",
             "lfs":{"oid":"1234","size":99,"pointerSize":130}}]"#;
        let files = parse_tree(body).unwrap();
        assert_eq!(files.len(), 2);
        assert_eq!(files[0].hash, "abcd");
        assert!(files[1].lfs && files[1].size == 99 && files[1].hash == "1234");
        let evil = br#"[{"type":"file","path":"../x","size":1,"oid":"aa"}]"#;
        assert!(parse_tree(evil).unwrap_err().contains("leaves"));
    }

    proptest! {
        #[test]
        fn parsers_never_panic(s in ".{0,200}", b in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = content_range(&s);
            let _ = normalize_etag(&s);
            let h = [("x-repo-commit", s.as_str()), ("etag", s.as_str()), ("x-linked-size", s.as_str())];
            let _ = file_meta(&headers(&h));
            let _ = parse_tree(&b);
            let _ = parse_tree(s.as_bytes());
            let _ = parse_revision(&b);
        }
    }
}
