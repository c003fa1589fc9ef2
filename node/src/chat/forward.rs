//! Chat forwarding between nodes, both halves: a node that receives a chat for an instance
//! whose rank 0 is elsewhere sends it ([`forward`], the client half) over an iroh stream on
//! its own ALPN ([`chat_alpn`]) to that node, which runs it on its runner ([`serve`], the
//! server half, straight into [`super::local::chat_here`]) and streams the events back.
//!
//! # Wire format
//! One bidirectional QUIC stream per request. Frames are the shared codec's
//! ([`wire::frame`]): a 4-byte little-endian length and that many bytes of JSON
//! `{"v": 1, "msg": ...}`; frames over [`MAX_FRAME`] or of another version are refused, and
//! decoding never panics. The messages are the gateway's own types ([`ChatRequest`],
//! [`ChatEvent`], [`ApiError`]) in their serde forms.
//! - client → server: one [`Request`], then nothing; the client finishing or dropping its
//!   side means "cancel" (the client disconnected).
//! - server → client: [`Reply::Accepted`] (or [`Reply::Refused`] and the end), then
//!   token events and one `done` event ([`Reply::Event`]) or [`Reply::Failed`].
//!
//! The client watches the server node's liveness while it waits, so a server node that dies
//! mid-stream ends the request with an error within the mesh's detection time.

use crate::node::Node;
use control::short;
use gateway::{
    AnswerForm, ApiError, CancellationToken, ChatEvent, ChatRequest, ChatStream, ErrorKind,
};
use iroh::endpoint::{Connection, RecvStream, SendStream};
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use wire::Codec;

/// ALPN prefix of chat forwarding; [`chat_alpn`] scopes it by namespace.
/// (`2`: frames moved to the shared little-endian codec; version-1 nodes framed big-endian.)
pub const CHAT_ALPN: &[u8] = b"shoal/chat/2/";
/// Version of the frames.
pub const VERSION: u32 = 1;
/// Largest frame (a request with a long conversation fits).
pub const MAX_FRAME: usize = 16 << 20;
/// How long the server may take to accept a request (it tokenizes the prompt first).
pub const ACCEPT_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a waiting client checks that the server node is still alive.
pub const LIVENESS_PERIOD: Duration = Duration::from_millis(250);

/// The chat ALPN of a cluster namespace.
pub fn chat_alpn(namespace: &str) -> Vec<u8> {
    mesh::net::namespaced_alpn(CHAT_ALPN, namespace)
}

/// A chat request for one instance, as it travels.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Request {
    /// The instance whose rank 0 the server holds.
    pub instance_id: String,
    /// The request, in the gateway's own type.
    pub chat: ChatRequest,
}

/// What the server sends back: `accepted` (or `refused` and the end), then the gateway's
/// own [`ChatEvent`]s (`token`s, perhaps one `cached`, and one `done`) or `failed`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Reply {
    /// The request is queued on the instance.
    Accepted {
        /// Prompt tokens after the chat template.
        prompt_tokens: u32,
        /// How to read the answer, known where the prompt was rendered (absent: plain; an
        /// older node sends none).
        #[serde(default, skip_serializing_if = "AnswerForm::is_plain")]
        form: AnswerForm,
    },
    /// The request cannot run there (the last frame).
    Refused {
        /// Why.
        error: ApiError,
    },
    /// Generation failed (the last frame).
    Failed {
        /// Why.
        error: ApiError,
    },
    /// A token, or the end of generation (`done`, the last frame), spelled as the gateway's
    /// event is (`{"type": "token", ...}`, `{"type": "done", ...}`).
    #[serde(untagged)]
    Event(ChatEvent),
}

/// The frames of chat forwarding: version [`VERSION`], at most [`MAX_FRAME`] bytes, in the
/// shared codec.
pub const CODEC: Codec = Codec::new(VERSION, MAX_FRAME);

async fn write<T: Serialize>(send: &mut SendStream, msg: &T) -> anyhow::Result<()> {
    let frame = CODEC.encode(msg)?;
    send.write_all(&frame).await?;
    Ok(())
}

/// Reads one frame; `Ok(None)` at a clean end of the stream between frames.
async fn read<T: serde::de::DeserializeOwned>(recv: &mut RecvStream) -> anyhow::Result<Option<T>> {
    let mut header = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match recv.read(&mut header[got..]).await? {
            None if got == 0 => return Ok(None),
            None => anyhow::bail!("the stream ended inside a frame header"),
            Some(n) => got += n,
        }
    }
    let len = CODEC.body_len(header)?;
    let mut body = vec![0u8; len];
    recv.read_exact(&mut body).await?;
    Ok(Some(CODEC.decode_body(&body)?))
}

/// The client half: sends `request` for instance `instance_id` to `rank0` (the node that
/// holds its rank 0) over the node's chat connection to it, and streams the events back
/// ([`send`]); the stream ends with "instance lost" once the node takes `rank0` for dead.
pub async fn forward(
    node: &Node,
    rank0: String,
    instance_id: String,
    request: ChatRequest,
    cancel: CancellationToken,
) -> Result<ChatStream, ApiError> {
    let connection = node.context.open_chat(rank0.clone()).await.map_err(|e| {
        ApiError::new(
            ErrorKind::Unavailable,
            format!(
                "cannot reach node {} which serves instance {instance_id}: {e}; retry",
                short(&rank0)
            ),
        )
    })?;
    let context = node.context.clone();
    let alive = move || !context.is_dead(&rank0);
    send(&connection, &instance_id, &request, cancel, alive).await
}

/// Sends `request` for `instance_id` over `connection` and relays the server's events into a
/// [`ChatStream`]. `alive` is polled while waiting: once it says the server node is dead,
/// the stream ends with "instance lost". Firing `cancel` (or the gateway dropping the
/// stream) closes the request stream, which cancels the request on the server.
async fn send<A>(
    connection: &Connection,
    instance_id: &str,
    request: &ChatRequest,
    cancel: CancellationToken,
    alive: A,
) -> Result<ChatStream, ApiError>
where
    A: Fn() -> bool + Send + Sync + 'static,
{
    let lost = |what: String| ApiError::instance_lost(what);
    let (mut send, mut recv) = connection
        .open_bi()
        .await
        .map_err(|e| lost(format!("cannot open a stream to the instance's node: {e}")))?;
    let frame = Request {
        instance_id: instance_id.to_string(),
        chat: request.clone(),
    };
    write(&mut send, &frame).await.map_err(|e| {
        ApiError::new(
            ErrorKind::Unavailable,
            format!("cannot send the request to the instance's node: {e:#}"),
        )
    })?;
    let alive = Arc::new(alive);
    let first = watch_liveness(alive.clone(), read::<Reply>(&mut recv));
    let first = match tokio::time::timeout(ACCEPT_TIMEOUT, first).await {
        Ok(Some(Ok(Some(reply)))) => reply,
        Ok(Some(Ok(None))) => return Err(lost("the instance's node closed the stream".into())),
        Ok(Some(Err(e))) => return Err(lost(format!("the instance's node: {e:#}"))),
        Ok(None) => return Err(lost("the instance's node died".into())),
        Err(_) => {
            return Err(lost(format!(
                "the instance's node did not accept the request within {ACCEPT_TIMEOUT:?}"
            )))
        }
    };
    let (prompt_tokens, form) = match first {
        Reply::Accepted {
            prompt_tokens,
            form,
        } => (prompt_tokens, form),
        Reply::Refused { error } => return Err(error),
        other => {
            return Err(lost(format!(
                "the instance's node answered {other:?} before accepting"
            )))
        }
    };
    let want_logprobs = request.sampling.logprobs.is_some();
    let (tx, stream) = ChatStream::channel(prompt_tokens, 64);
    let stream = stream.with_form(form);
    tokio::spawn(async move {
        // `send` stays open until the end: closing it tells the server to cancel.
        let _send = send;
        loop {
            let next = tokio::select! {
                () = cancel.cancelled() => return,
                () = tx.closed() => return,
                next = watch_liveness(alive.clone(), read::<Reply>(&mut recv)) => next,
            };
            let item = match next {
                Some(Ok(Some(Reply::Event(ChatEvent::Token { text, logprob })))) => {
                    Ok(ChatEvent::Token {
                        logprob: logprob.filter(|_| want_logprobs),
                        text,
                    })
                }
                Some(Ok(Some(Reply::Event(done @ ChatEvent::Done { .. })))) => Ok(done),
                Some(Ok(Some(Reply::Event(cached @ ChatEvent::Cached { .. })))) => Ok(cached),
                Some(Ok(Some(Reply::Failed { error }))) => Err(error),
                Some(Ok(Some(other))) => Err(lost(format!(
                    "the instance's node sent {other:?} mid-stream"
                ))),
                Some(Ok(None)) => Err(lost("the instance's node closed the stream".into())),
                Some(Err(e)) => Err(lost(format!(
                    "the connection to the instance's node broke: {e:#}"
                ))),
                None => Err(lost("the instance's node died".into())),
            };
            let last = !matches!(item, Ok(ChatEvent::Token { .. } | ChatEvent::Cached { .. }));
            if tx.send(item).await.is_err() || last {
                return;
            }
        }
    });
    Ok(stream)
}

/// Runs `work` while `alive()` holds; `None` once it does not.
async fn watch_liveness<T>(
    alive: Arc<impl Fn() -> bool + Send + Sync>,
    work: impl Future<Output = T>,
) -> Option<T> {
    tokio::pin!(work);
    let mut ticker = tokio::time::interval(LIVENESS_PERIOD);
    loop {
        tokio::select! {
            out = &mut work => return Some(out),
            _ = ticker.tick() => {
                if !alive() {
                    return None;
                }
            }
        }
    }
}

/// The server half: serves forwarded chats on every connection received, each on this
/// node's rank-0 runner of its instance, until the channel closes.
pub async fn serve(mut connections: tokio::sync::mpsc::Receiver<Connection>, node: Arc<Node>) {
    while let Some(connection) = connections.recv().await {
        let node = node.clone();
        tokio::spawn(async move {
            while let Ok((send, recv)) = connection.accept_bi().await {
                let node = node.clone();
                tokio::spawn(async move {
                    if let Err(e) = serve_stream(node, send, recv).await {
                        tracing::debug!("forwarded chat ended early: {e:#}");
                    }
                });
            }
        });
    }
}

async fn serve_stream(
    node: Arc<Node>,
    mut send: SendStream,
    mut recv: RecvStream,
) -> anyhow::Result<()> {
    let request = match tokio::time::timeout(ACCEPT_TIMEOUT, read::<Request>(&mut recv)).await {
        Ok(Ok(Some(request))) => request,
        Ok(Ok(None)) => return Ok(()),
        Ok(Err(e)) => {
            let error = ApiError::new(ErrorKind::InvalidRequest, format!("{e:#}"));
            write(&mut send, &Reply::Refused { error }).await?;
            let _ = send.finish();
            return Ok(());
        }
        Err(_) => anyhow::bail!("no request within {ACCEPT_TIMEOUT:?}"),
    };
    let cancel = CancellationToken::new();
    // The client closing its side (done, or gone) cancels the request.
    let watcher = tokio::spawn({
        let cancel = cancel.clone();
        async move {
            let mut buf = [0u8; 64];
            while let Ok(Some(_)) = recv.read(&mut buf).await {}
            cancel.cancel();
        }
    });
    let _guard = cancel.clone().drop_guard();
    let started =
        super::local::chat_here(&node, &request.instance_id, request.chat, cancel.clone()).await;
    let mut stream = match started {
        Ok(stream) => stream,
        Err(error) => {
            write(&mut send, &Reply::Refused { error }).await?;
            let _ = send.finish();
            watcher.abort();
            return Ok(());
        }
    };
    write(
        &mut send,
        &Reply::Accepted {
            prompt_tokens: stream.prompt_tokens,
            form: stream.form,
        },
    )
    .await?;
    loop {
        let event = tokio::select! {
            () = cancel.cancelled() => break,
            event = stream.events.recv() => event,
        };
        let (reply, last) = match event {
            Some(Ok(event)) => {
                let last = matches!(event, ChatEvent::Done { .. });
                (Reply::Event(event), last)
            }
            Some(Err(error)) => (Reply::Failed { error }, true),
            None => (
                Reply::Failed {
                    error: ApiError::instance_lost("the runner's events ended"),
                },
                true,
            ),
        };
        write(&mut send, &reply).await?;
        if last {
            break;
        }
    }
    let _ = send.finish();
    let _ = send.stopped().await;
    watcher.abort();
    Ok(())
}

#[cfg(test)]
mod tests;
