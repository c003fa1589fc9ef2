//! Copies of model files between cluster members, over the node's iroh endpoint on its own
//! ALPN ([`files_alpn`]). A node that holds a verified file of a model (a blob of its Hugging
//! Face cache, named by the hub's content hash) says so in its `files/<model>` record; a node
//! that needs the file asks a holder for `(model, hash, offset)` and receives the bytes from
//! `offset` on, hashing them as they arrive against the hub's hash (sha256 for LFS files, the
//! git blob sha1 for small ones) before the blob is kept — the same check as a hub download,
//! so a file copied from a peer is exactly the hub's. A cut copy resumes from the bytes held,
//! from the same or another holder.
//!
//! Why not iroh-blobs: its BLAKE3 trees would need a second hash of every file (and a second
//! store beside the Hugging Face cache) when the hub's sha256 already names and checks the
//! content; a stream with a range start over QUIC is all a LAN copy needs. The cost: a peer
//! sending bad bytes is caught at the end of the file, not at the first bad chunk.
//!
//! **Members only.** The server answers only nodes that are live authors of the replicated
//! state with a profile (members of this cluster namespace); anyone else is refused before a
//! byte of a file is read.

use crate::cluster::Cluster;
use hub::{HfCache, ModelId, Progress, RepoFile};
use iroh::endpoint::{Connection, RecvStream, SendStream};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

/// ALPN prefix of file copies; [`files_alpn`] scopes it by namespace.
pub const FILES_ALPN: &[u8] = b"shoal/files/1/";
/// Largest request or header frame.
const MAX_FRAME: usize = 64 << 10;
/// How long a copy may go without a byte before it is given up (and another source tried).
const STALL: Duration = Duration::from_secs(20);
/// Bytes per read.
const CHUNK: usize = 1 << 20;

/// The file-copy ALPN of a cluster namespace.
pub fn files_alpn(namespace: &str) -> Vec<u8> {
    mesh::net::namespaced_alpn(FILES_ALPN, namespace)
}

/// What a client asks for.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    /// The model (`org/name`).
    pub model: String,
    /// The content hash (the blob's name).
    pub hash: String,
    /// First byte wanted.
    pub offset: u64,
}

/// The server's answer before the bytes.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    /// The blob's size; bytes `offset..size` follow.
    Sending {
        /// Its size.
        size: u64,
    },
    /// Refused, and why.
    Refused {
        /// Why.
        reason: String,
    },
}

async fn write_frame<T: Serialize>(send: &mut SendStream, v: &T) -> anyhow::Result<()> {
    let bytes = serde_json::to_vec(v)?;
    send.write_all(&(bytes.len() as u32).to_le_bytes()).await?;
    send.write_all(&bytes).await?;
    Ok(())
}

async fn read_frame<T: for<'de> Deserialize<'de>>(recv: &mut RecvStream) -> anyhow::Result<T> {
    let mut len = [0u8; 4];
    recv.read_exact(&mut len).await?;
    let len = u32::from_le_bytes(len) as usize;
    anyhow::ensure!(
        len <= MAX_FRAME,
        "a frame of {len} bytes is over {MAX_FRAME}"
    );
    let mut buf = vec![0u8; len];
    recv.read_exact(&mut buf).await?;
    Ok(serde_json::from_slice(&buf)?)
}

/// Whether `node` is a member: a live author of the state with a profile.
pub fn is_member(context: &dyn Cluster, node: &str) -> bool {
    let snapshot = context.snapshot();
    snapshot.authors.get(node).is_some_and(|a| {
        a.alive && a.records.contains_key(mesh::profile::PROFILE_KEY) && node != snapshot.me
    })
}

/// Serves file copies to members on the connections the mesh hands over.
pub async fn serve(
    mut connections: tokio::sync::mpsc::Receiver<Connection>,
    context: Arc<dyn Cluster>,
    cache: HfCache,
) {
    while let Some(connection) = connections.recv().await {
        let (context, cache) = (context.clone(), cache.clone());
        tokio::spawn(async move {
            let peer = connection.remote_id().to_string();
            while let Ok((send, recv)) = connection.accept_bi().await {
                let (context, cache, peer) = (context.clone(), cache.clone(), peer.clone());
                tokio::spawn(async move {
                    if let Err(e) = answer(&*context, &cache, &peer, send, recv).await {
                        tracing::debug!(peer = %control::short(&peer), "file copy ended: {e:#}");
                    }
                });
            }
        });
    }
}

async fn answer(
    context: &dyn Cluster,
    cache: &HfCache,
    peer: &str,
    mut send: SendStream,
    mut recv: RecvStream,
) -> anyhow::Result<()> {
    let ask: Ask = read_frame(&mut recv).await?;
    let refuse = |reason: String| Answer::Refused { reason };
    let blob = if !is_member(context, peer) {
        tracing::warn!(peer = %control::short(peer), "refusing a file copy: not a member of this cluster");
        Err(refuse("not a member of this cluster".into()))
    } else {
        match ModelId::parse(&ask.model) {
            Err(e) => Err(refuse(format!("bad model id: {e}"))),
            Ok(_) if !valid_hash(&ask.hash) => Err(refuse("bad content hash".into())),
            Ok(id) => Ok(cache.blob(&id, &ask.hash)),
        }
    };
    let (path, size) = match blob {
        Err(no) => {
            write_frame(&mut send, &no).await?;
            send.finish()?;
            return Ok(());
        }
        Ok(path) => match std::fs::metadata(&path) {
            Ok(m) if m.is_file() && ask.offset <= m.len() => (path, m.len()),
            _ => {
                write_frame(&mut send, &refuse("this node does not hold it".into())).await?;
                send.finish()?;
                return Ok(());
            }
        },
    };
    write_frame(&mut send, &Answer::Sending { size }).await?;
    let mut file = tokio::fs::File::open(&path).await?;
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    file.seek(std::io::SeekFrom::Start(ask.offset)).await?;
    tracing::info!(
        peer = %control::short(peer), hash = %ask.hash, offset = ask.offset, size,
        "sending a file copy"
    );
    let mut buf = vec![0u8; CHUNK];
    let mut sent = 0u64;
    loop {
        let n = file.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        send.write_all(&buf[..n]).await?;
        sent += n as u64;
    }
    send.finish()?;
    tracing::info!(
        peer = %control::short(peer), hash = %ask.hash, offset = ask.offset, sent,
        "sent a file copy"
    );
    // Keep the stream until the client has read everything.
    let _ = recv.read_to_end(0).await;
    Ok(())
}

/// Whether `h` looks like a content hash (hex, 40 or 64 digits).
fn valid_hash(h: &str) -> bool {
    (h.len() == 40 || h.len() == 64) && h.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Why a copy from a member did not finish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyFailed {
    /// The bytes came whole but their hash is not the hub's: what the member holds is not the
    /// file (it would send the same bytes again). They were discarded.
    Corrupt(String),
    /// Anything else (refused, stalled, cut off): the bytes so far stay, and another try may
    /// finish the file.
    Other(String),
}

impl std::fmt::Display for CopyFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CopyFailed::Corrupt(why) | CopyFailed::Other(why) => f.write_str(why),
        }
    }
}

impl From<String> for CopyFailed {
    fn from(why: String) -> CopyFailed {
        CopyFailed::Other(why)
    }
}

/// Copies `file` of `id` from the member at the other end of `connection` into `cache`
/// (resuming from what `.incomplete` holds), checks it against its hash and links it from
/// snapshot `commit`. `Err` says why this source did not finish it.
/// `progress` names the source (the member's node id) while it copies.
pub async fn copy(
    connection: &Connection,
    cache: &HfCache,
    id: &ModelId,
    commit: &str,
    file: &RepoFile,
    progress: &Progress,
) -> Result<(), CopyFailed> {
    let part = cache.incomplete(id, &file.hash);
    if let Some(dir) = part.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&part)
        .map_err(|e| format!("{}: {e}", part.display()))?;
    let mut held = out.metadata().map(|m| m.len()).unwrap_or(0);
    if held > file.size {
        out.set_len(0).map_err(|e| e.to_string())?;
        held = 0;
    }
    let mut hash = hub::verify::ContentHash::new(file.lfs, file.size);
    if held > 0 {
        hub::download::hash_existing(&part, held, &mut hash).map_err(|e| e.to_string())?;
    }
    progress.set_done(&file.path, held);
    progress.set_source(&file.path, &connection.remote_id().to_string());
    let (mut send, mut recv) = connection.open_bi().await.map_err(|e| e.to_string())?;
    let ask = Ask {
        model: id.to_string(),
        hash: file.hash.clone(),
        offset: held,
    };
    write_frame(&mut send, &ask)
        .await
        .map_err(|e| e.to_string())?;
    let answer: Answer = tokio::time::timeout(STALL, read_frame(&mut recv))
        .await
        .map_err(|_| "no answer".to_string())?
        .map_err(|e| e.to_string())?;
    match answer {
        Answer::Refused { reason } => return Err(format!("refused: {reason}").into()),
        Answer::Sending { size } if size != file.size => {
            return Err(format!("it holds {size} bytes, the hub lists {}", file.size).into())
        }
        Answer::Sending { .. } => {}
    }
    let mut room = file.size - held;
    let mut buf = vec![0u8; CHUNK];
    while room > 0 {
        let want = CHUNK.min(room as usize);
        let n = tokio::time::timeout(STALL, recv.read(&mut buf[..want]))
            .await
            .map_err(|_| format!("the copy stalled for {STALL:?}"))?
            .map_err(|e| format!("the copy broke off: {e}"))?;
        let Some(n) = n else {
            return Err(format!("the copy ended {room} bytes short").into());
        };
        out.write_all(&buf[..n])
            .map_err(|e| format!("{}: {e}", part.display()))?;
        hash.update(&buf[..n]);
        progress.received(&file.path, n as u64);
        room -= n as u64;
    }
    let _ = send.finish();
    out.flush().map_err(|e| e.to_string())?;
    drop(out);
    let got = hash.hex();
    if got != file.hash {
        let _ = std::fs::remove_file(&part);
        return Err(CopyFailed::Corrupt(format!(
            "`{}` arrived corrupt (hash {got}, expected {}); discarded",
            file.path, file.hash
        )));
    }
    let blob = cache.blob(id, &file.hash);
    std::fs::rename(&part, &blob).map_err(|e| format!("{}: {e}", blob.display()))?;
    cache
        .link(id, commit, &file.path, &file.hash)
        .map_err(|e| e.to_string())?;
    progress.complete(&file.path);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_and_alpn() {
        assert!(files_alpn("shoal").starts_with(FILES_ALPN));
        assert_ne!(files_alpn("shoal"), files_alpn("lab"));
        let a: Answer = serde_json::from_str(r#"{"sending":{"size":5}}"#).unwrap();
        assert_eq!(a, Answer::Sending { size: 5 });
        assert!(valid_hash(&"a".repeat(64)) && !valid_hash("../x"));
    }
}
