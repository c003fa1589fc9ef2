//! One file into the cache: metadata from `HEAD …/resolve/…` (following same-origin redirects,
//! reading a cross-origin one as the CDN's address), the content from the hub or its CDN into
//! `blobs/<etag>.incomplete`, resumed with `Range: bytes=N-`, hashed as it arrives, moved to
//! `blobs/<etag>` only when the hash matches, then linked from the snapshot. Transient failures
//! (the hub down, a cut transfer, corrupt bytes) are retried with back-off.

use crate::client::Hub;
use crate::error::HubError;
use crate::http;
use crate::id::ModelId;
use crate::meta::{self, FileMeta, RepoFile};
use crate::progress::Progress;
use crate::verify::ContentHash;
use http_body_util::BodyExt;
use hyper::Method;
use std::io::{Read, Write};

/// Same-origin redirects followed on a HEAD.
const MAX_REDIRECTS: usize = 5;

/// Fetches `file` of `id` at `commit` into the cache and links it from the snapshot.
pub async fn fetch_file(
    hub: &Hub,
    id: &ModelId,
    commit: &str,
    file: &RepoFile,
    progress: &Progress,
) -> Result<(), HubError> {
    let cache = &hub.config.cache;
    let blob = cache.blob(id, &file.hash);
    let link = |cache: &crate::cache::HfCache| {
        cache
            .link(id, commit, &file.path, &file.hash)
            .map_err(|e| HubError::io(&cache.snapshot(id, commit), e))
    };
    if std::fs::metadata(&blob).is_ok_and(|m| m.len() == file.size) {
        progress.complete(&file.path);
        return link(cache);
    }
    let url = format!(
        "{}/{}/resolve/{commit}/{}",
        hub.config.endpoint,
        id.repo(),
        http::encode_path(&file.path)
    );
    let mut last = String::new();
    for attempt in 1..=hub.config.attempts {
        if attempt > 1 {
            tokio::time::sleep(hub.backoff(attempt - 1)).await;
        }
        match try_once(hub, id, file, &url, progress).await {
            Ok(Step::Fetched(meta)) => {
                tracing::debug!(file = %file.path, commit = %meta.commit, "fetched");
                progress.complete(&file.path);
                return link(cache);
            }
            Ok(Step::Retry(why)) => {
                tracing::warn!(file = %file.path, attempt, "{why}; trying again");
                last = why;
            }
            Err(e) => return Err(e),
        }
        let held = std::fs::metadata(cache.incomplete(id, &file.hash)).map_or(0, |m| m.len());
        progress.set_done(&file.path, held);
    }
    Err(HubError::Unreachable {
        what: format!("`{}` of {id}", file.path),
        url,
        attempts: hub.config.attempts,
        last,
    })
}

/// What one try came to, short of a definite error.
enum Step {
    /// The blob is in place.
    Fetched(FileMeta),
    /// A transient failure: try again.
    Retry(String),
}

/// The metadata of `url`, from its HEAD (following same-origin redirects only).
async fn head(
    hub: &Hub,
    id: &ModelId,
    file: &RepoFile,
    url: &str,
) -> Result<Result<FileMeta, String>, HubError> {
    let mut url = url.to_string();
    for _ in 0..=MAX_REDIRECTS {
        let resp = match hub.http_send(Method::HEAD, &url, &hub.auth_for(&url)).await {
            Ok(r) => r,
            Err(e) => return Ok(Err(e)),
        };
        let status = resp.status().as_u16();
        let code = http::header(&resp, "x-error-code");
        if let Some(e) = HubError::from_status(
            status,
            code.as_deref(),
            id,
            &hub.config.endpoint,
            Some(&file.path),
        ) {
            return Err(e);
        }
        if status == 429 || status >= 500 {
            return Ok(Err(format!("HTTP {status} to HEAD {url}")));
        }
        let get = |k: &str| http::header(&resp, k);
        let location = get("location").and_then(|l| http::join(&url, &l));
        if (300..400).contains(&status) {
            let Some(next) = location.clone() else {
                return Ok(Err(format!(
                    "a redirect with no usable Location from {url}"
                )));
            };
            if http::origin(&next) != http::origin(&url) {
                // Another origin (the CDN): the metadata is this answer's.
                return Ok(meta::file_meta(&|k| {
                    if k == "location" {
                        location.clone()
                    } else {
                        get(k)
                    }
                })
                .map_err(|e| format!("{e} (HEAD {url})")));
            }
            url = next;
            continue;
        }
        if status != 200 {
            return Ok(Err(format!("HTTP {status} to HEAD {url}")));
        }
        let mut m = meta::file_meta(&get).map_err(|e| format!("{e} (HEAD {url})"));
        if let Ok(m) = &mut m {
            m.location = Some(url.clone());
        }
        return Ok(m);
    }
    Ok(Err(format!(
        "more than {MAX_REDIRECTS} redirects from {url}"
    )))
}

async fn try_once(
    hub: &Hub,
    id: &ModelId,
    file: &RepoFile,
    url: &str,
    progress: &Progress,
) -> Result<Step, HubError> {
    let meta = match head(hub, id, file, url).await? {
        Ok(m) => m,
        Err(why) => return Ok(Step::Retry(why)),
    };
    if meta.etag != file.hash {
        return Err(HubError::BadAnswer {
            url: url.into(),
            what: format!(
                "`{}` is listed with hash {} but its ETag is {}: the hub's listing and files disagree",
                file.path, file.hash, meta.etag
            ),
        });
    }
    let source = meta.location.clone().unwrap_or_else(|| url.to_string());
    let cache = &hub.config.cache;
    let part = cache.incomplete(id, &file.hash);
    if let Some(dir) = part.parent() {
        std::fs::create_dir_all(dir).map_err(|e| HubError::io(dir, e))?;
    }
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .read(true)
        .open(&part)
        .map_err(|e| HubError::io(&part, e))?;
    let mut held = out.metadata().map_err(|e| HubError::io(&part, e))?.len();
    if held > file.size {
        out.set_len(0).map_err(|e| HubError::io(&part, e))?;
        held = 0;
    }
    let mut hash = ContentHash::new(file.lfs, file.size);
    if held > 0 {
        hash_existing(&part, held, &mut hash).map_err(|e| HubError::io(&part, e))?;
    }
    let mut headers = hub.auth_for(&source);
    if held > 0 && held < file.size {
        headers.push(("range", format!("bytes={held}-")));
    }
    progress.set_done(&file.path, held);
    let result = if held < file.size {
        let resp = match hub.http_send(Method::GET, &source, &headers).await {
            Ok(r) => r,
            Err(e) => return Ok(Step::Retry(e)),
        };
        let status = resp.status().as_u16();
        if status == 429 || status >= 500 {
            return Ok(Step::Retry(format!("HTTP {status} to GET {source}")));
        }
        match status {
            206 => {
                let start =
                    http::header(&resp, "content-range").and_then(|v| meta::content_range(&v));
                if start.map(|s| s.0) != Some(held) {
                    out.set_len(0).map_err(|e| HubError::io(&part, e))?;
                    return Ok(Step::Retry(format!(
                        "{source} answered a range that is not bytes={held}-"
                    )));
                }
            }
            200 => {
                if held > 0 {
                    // The server ignored the range: start over.
                    out.set_len(0).map_err(|e| HubError::io(&part, e))?;
                    hash = ContentHash::new(file.lfs, file.size);
                    held = 0;
                    progress.set_done(&file.path, 0);
                }
            }
            s => {
                return Ok(Step::Retry(format!("HTTP {s} to GET {source}")));
            }
        }
        let sink = Sink {
            out: &mut out,
            hash: &mut hash,
            part: &part,
            progress,
            path: &file.path,
            room: file.size - held,
        };
        stream(resp.into_body(), sink).await?
    } else {
        None
    };
    if let Some(why) = result {
        return Ok(Step::Retry(why));
    }
    out.flush().map_err(|e| HubError::io(&part, e))?;
    let len = out.metadata().map_err(|e| HubError::io(&part, e))?.len();
    drop(out);
    let got = hash.hex();
    if len != file.size || got != file.hash {
        // Never kept: the partial file goes, and the next try starts from zero.
        let _ = std::fs::remove_file(&part);
        return Ok(Step::Retry(format!(
            "`{}` arrived corrupt ({len} bytes, hash {got}; expected {} bytes, {}); discarded",
            file.path, file.size, file.hash
        )));
    }
    let blob = cache.blob(id, &file.hash);
    std::fs::rename(&part, &blob).map_err(|e| HubError::io(&blob, e))?;
    Ok(Step::Fetched(meta))
}

/// Feeds the first `len` bytes of `path` into `hash` (resuming a partial file).
pub fn hash_existing(
    path: &std::path::Path,
    len: u64,
    hash: &mut ContentHash,
) -> std::io::Result<()> {
    let mut f = std::fs::File::open(path)?.take(len);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        hash.update(&buf[..n]);
    }
}

/// Where a body's bytes go.
struct Sink<'a> {
    out: &'a mut std::fs::File,
    hash: &'a mut ContentHash,
    part: &'a std::path::Path,
    progress: &'a Progress,
    path: &'a str,
    /// Bytes still expected: more is refused (bounded disk, and a sign of a bad answer).
    room: u64,
}

/// Writes a body to the sink's file, hashing it; `Some(why)` when it broke off (the bytes so
/// far stay, to resume from).
async fn stream(
    mut body: hyper::body::Incoming,
    mut sink: Sink<'_>,
) -> Result<Option<String>, HubError> {
    loop {
        let frame = match tokio::time::timeout(http::STALL_TIMEOUT, body.frame()).await {
            Err(_) => {
                return Ok(Some(format!(
                    "the transfer stalled for {:?}",
                    http::STALL_TIMEOUT
                )))
            }
            Ok(None) => return Ok(None),
            Ok(Some(Err(e))) => return Ok(Some(format!("the transfer broke off: {e}"))),
            Ok(Some(Ok(f))) => f,
        };
        if let Ok(data) = frame.into_data() {
            if data.len() as u64 > sink.room {
                let _ = sink.out.set_len(0);
                return Ok(Some(format!(
                    "`{}` came longer than its size; discarded",
                    sink.path
                )));
            }
            sink.room -= data.len() as u64;
            sink.out
                .write_all(&data)
                .map_err(|e| HubError::io(sink.part, e))?;
            sink.hash.update(&data);
            sink.progress.received(sink.path, data.len() as u64);
        }
    }
}
