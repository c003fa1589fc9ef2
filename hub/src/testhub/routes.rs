//! The test hub's HTTP side: the API origin (revision, tree, resolve) and the CDN origin
//! (content by sha256, with ranges, byte counts and the faults asked for).

use super::{Served, ServedFile, ServedRepo, Shared};
use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::json;
use std::convert::Infallible;
use std::io::{Read, Seek, SeekFrom};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

/// Bytes per body chunk.
const CHUNK: usize = 256 << 10;

/// A body fed from a channel (content streamed by a task as it is read from disk).
pub struct ChanBody(tokio::sync::mpsc::Receiver<Bytes>);

impl Body for ChanBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|c| c.map(|b| Ok(Frame::data(b))))
    }
}

fn body(data: impl Into<Bytes>) -> ChanBody {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let _ = tx.try_send(data.into());
    ChanBody(rx)
}

fn empty() -> ChanBody {
    ChanBody(tokio::sync::mpsc::channel(1).1)
}

type Resp = Response<ChanBody>;

fn answer(status: StatusCode, headers: &[(&str, String)], content: ChanBody) -> Resp {
    let mut r = Response::builder().status(status);
    for (k, v) in headers {
        r = r.header(*k, v);
    }
    r.body(content)
        .unwrap_or_else(|_| Response::new(body("bad header")))
}

fn error(status: u16, code: &str, message: &str) -> Resp {
    answer(
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        &[
            ("x-error-code", code.to_string()),
            ("content-type", "application/json".into()),
        ],
        body(json!({ "error": message }).to_string()),
    )
}

/// Accepts connections until told to stop; then every connection is cut.
pub async fn accept(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    cdn: bool,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let stream = tokio::select! {
            _ = stop.changed() => return,
            s = listener.accept() => match s { Ok((s, _)) => s, Err(_) => continue },
        };
        let shared = shared.clone();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(handle(req, &shared, cdn)) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = conn => {}
                _ = stop.changed() => {}
            }
        });
    }
}

/// Decodes `%XX` escapes.
fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push(h * 16 + l);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn handle(req: Request<Incoming>, shared: &Arc<Shared>, cdn: bool) -> Resp {
    let path = req.uri().path().to_string();
    if cdn {
        if req.headers().contains_key("authorization") {
            shared.cdn_saw_token.store(true, Ordering::Relaxed);
        }
        return content_by_hash(&req, shared, &path);
    }
    let parts: Vec<String> = path
        .trim_start_matches('/')
        .split('/')
        .map(decode)
        .collect();
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    match parts.as_slice() {
        ["api", "models", org, name, "revision", rev @ ..] => {
            with_repo(&req, shared, org, name, |repo| {
                revision(repo, org, name, &rev.join("/"))
            })
        }
        ["api", "models", org, name, "tree", rev, ..] => {
            with_repo(&req, shared, org, name, |repo| tree(repo, rev))
        }
        [org, name, "resolve", rev, file @ ..] if !file.is_empty() => {
            let file = file.join("/");
            with_repo(&req, shared, org, name, |repo| {
                resolve(&req, shared, repo, rev, &file)
            })
        }
        _ => error(404, "NotFound", "no such route on the test hub"),
    }
}

fn with_repo(
    req: &Request<Incoming>,
    shared: &Shared,
    org: &str,
    name: &str,
    then: impl FnOnce(&ServedRepo) -> Resp,
) -> Resp {
    let Some(repo) = shared.repos.get(&format!("{org}/{name}")) else {
        return error(401, "RepoNotFound", "Repository Not Found");
    };
    if repo.gated {
        let sent = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if sent.is_none() || sent != shared.token.as_deref() {
            return error(401, "GatedRepo", "Access to this model is restricted");
        }
    }
    then(repo)
}

fn commit_of<'a>(repo: &'a ServedRepo, rev: &str) -> Option<&'a str> {
    (rev == "main" || rev == repo.commit).then_some(repo.commit.as_str())
}

fn revision(repo: &ServedRepo, org: &str, name: &str, rev: &str) -> Resp {
    let Some(commit) = commit_of(repo, rev) else {
        return error(404, "RevisionNotFound", "Invalid rev id");
    };
    let siblings: Vec<_> = repo
        .files
        .keys()
        .map(|p| json!({ "rfilename": p }))
        .collect();
    let info = json!({"id": format!("{org}/{name}"), "sha": commit, "siblings": siblings,
                      "gated": if repo.gated { json!("auto") } else { json!(false) }});
    answer(
        StatusCode::OK,
        &[("content-type", "application/json".into())],
        body(info.to_string()),
    )
}

fn tree(repo: &ServedRepo, rev: &str) -> Resp {
    if commit_of(repo, rev).is_none() {
        return error(404, "RevisionNotFound", "Invalid rev id");
    }
    let list: Vec<_> = repo
        .files
        .iter()
        .map(|(p, f)| match &f.sha256 {
            Some(sha) => json!({"type": "file", "path": p, "size": f.size, "oid": f.git_oid,
                                "lfs": {"oid": sha, "size": f.size, "pointerSize": 134}}),
            None => json!({"type": "file", "path": p, "size": f.size, "oid": f.git_oid}),
        })
        .collect();
    answer(
        StatusCode::OK,
        &[("content-type", "application/json".into())],
        body(json!(list).to_string()),
    )
}

fn resolve(
    req: &Request<Incoming>,
    shared: &Arc<Shared>,
    repo: &ServedRepo,
    rev: &str,
    path: &str,
) -> Resp {
    let Some(commit) = commit_of(repo, rev) else {
        return error(404, "RevisionNotFound", "Invalid rev id");
    };
    let Some(file) = repo.files.get(path) else {
        return error(404, "EntryNotFound", "Entry not found");
    };
    let mut headers = vec![("x-repo-commit", commit.to_string())];
    match &file.sha256 {
        Some(sha) => {
            let cdn = shared
                .cdn
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .unwrap_or_else(|| ([127, 0, 0, 1], 0).into());
            headers.extend([
                ("etag", format!("\"{sha}\"")),
                ("x-linked-etag", format!("\"{sha}\"")),
                ("x-linked-size", file.size.to_string()),
                ("location", format!("http://{cdn}/lfs/{sha}")),
            ]);
            answer(StatusCode::FOUND, &headers, empty())
        }
        None => {
            headers.push(("etag", format!("\"{}\"", file.git_oid)));
            serve_content(req, shared, path, file, headers)
        }
    }
}

fn content_by_hash(req: &Request<Incoming>, shared: &Arc<Shared>, path: &str) -> Resp {
    let Some(sha) = path.strip_prefix("/lfs/") else {
        return error(404, "NotFound", "no such object");
    };
    for repo in shared.repos.values() {
        for (p, f) in &repo.files {
            if f.sha256.as_deref() == Some(sha) {
                return serve_content(req, shared, p, f, vec![("etag", format!("\"{sha}\""))]);
            }
        }
    }
    error(404, "NotFound", "no such object")
}

/// `Range: bytes=N-` or `bytes=N-M` → (start, end exclusive), within `size`.
fn range(req: &Request<Incoming>, size: u64) -> Option<Result<(u64, u64), ()>> {
    let v = req.headers().get("range")?.to_str().ok()?;
    let spec = v.strip_prefix("bytes=")?;
    let (a, b) = spec.split_once('-')?;
    let start: u64 = a.trim().parse().ok()?;
    let end = match b.trim() {
        "" => size,
        e => e.parse::<u64>().ok()?.saturating_add(1).min(size),
    };
    Some(if start < end {
        Ok((start, end))
    } else {
        Err(())
    })
}

fn serve_content(
    req: &Request<Incoming>,
    shared: &Arc<Shared>,
    path: &str,
    file: &ServedFile,
    mut headers: Vec<(&'static str, String)>,
) -> Resp {
    let (status, start, end) = match range(req, file.size) {
        None => (StatusCode::OK, 0, file.size),
        Some(Ok((s, e))) => {
            headers.push((
                "content-range",
                format!("bytes {s}-{}/{}", e - 1, file.size),
            ));
            (StatusCode::PARTIAL_CONTENT, s, e)
        }
        Some(Err(())) => {
            headers.push(("content-range", format!("bytes */{}", file.size)));
            return answer(StatusCode::RANGE_NOT_SATISFIABLE, &headers, empty());
        }
    };
    headers.push(("content-length", (end - start).to_string()));
    headers.push(("accept-ranges", "bytes".into()));
    if req.method() == Method::HEAD {
        return answer(status, &headers, empty());
    }
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(stream_file(
        shared.clone(),
        path.to_string(),
        file.clone(),
        start,
        end,
        tx,
    ));
    answer(status, &headers, ChanBody(rx))
}

/// Streams `start..end` of `file`, logging the bytes handed out and applying the faults.
async fn stream_file(
    shared: Arc<Shared>,
    path: String,
    file: ServedFile,
    start: u64,
    end: u64,
    tx: tokio::sync::mpsc::Sender<Bytes>,
) {
    let entry = {
        let mut log = shared.log.lock().unwrap_or_else(|p| p.into_inner());
        log.push(Served {
            path: path.clone(),
            start,
            sent: 0,
        });
        log.len() - 1
    };
    let (die_after, corrupt) = {
        let mut faults = shared.faults.lock().unwrap_or_else(|p| p.into_inner());
        let corrupt =
            start == 0 && end == file.size && faults.corrupt_once.as_deref() == Some(path.as_str());
        if corrupt {
            faults.corrupt_once = None;
        }
        (faults.die_after, corrupt.then_some(file.size / 2))
    };
    let Ok(mut disk) = std::fs::File::open(&file.disk) else {
        return;
    };
    if disk.seek(SeekFrom::Start(start)).is_err() {
        return;
    }
    let mut pos = start;
    while pos < end {
        let mut n = CHUNK.min((end - pos) as usize);
        let mut buf = vec![0u8; n];
        if disk.read_exact(&mut buf).is_err() {
            return;
        }
        if let Some(at) = corrupt.filter(|at| (pos..pos + n as u64).contains(at)) {
            buf[(at - pos) as usize] ^= 0xff;
        }
        let before = shared.total_sent.fetch_add(n as u64, Ordering::SeqCst);
        let dying = die_after.is_some_and(|limit| before + n as u64 > limit);
        if dying {
            n = die_after.unwrap_or(0).saturating_sub(before) as usize;
            buf.truncate(n);
        }
        if n > 0 && tx.send(Bytes::from(buf)).await.is_err() {
            return;
        }
        pos += n as u64;
        shared.log.lock().unwrap_or_else(|p| p.into_inner())[entry].sent += n as u64;
        if dying {
            // Let the last bytes reach the socket, then "die": every connection is cut.
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            shared.kill();
            return;
        }
    }
}
