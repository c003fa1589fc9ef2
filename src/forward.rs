//! Chat forwarding between nodes: a node that receives a chat for an instance whose rank 0 is
//! elsewhere sends it over an iroh stream on its own ALPN ([`chat_alpn`]) to that node, which
//! runs it on its runner and streams the events back.
//!
//! # Wire format
//! One bidirectional QUIC stream per request. Frames are a 4-byte big-endian length and that
//! many bytes of JSON `{"v": 1, "msg": ...}`; frames over [`MAX_FRAME`] or of another version
//! are refused, and decoding never panics.
//! - client → server: one [`Request`], then nothing; the client finishing or dropping its
//!   side means "cancel" (the client disconnected).
//! - server → client: [`Reply::Accepted`] (or [`Reply::Refused`] and the end), then
//!   [`Reply::Token`]s and one [`Reply::Done`] or [`Reply::Failed`].
//!
//! The client watches the server node's liveness while it waits, so a server node that dies
//! mid-stream ends the request with an error within the mesh's detection time.

use gateway::{
    ApiError, CancellationToken, ChatEvent, ChatMessage, ChatRequest, ChatStream, ErrorKind,
    FinishReason, SamplingParams, TokenLogprob,
};
use iroh::endpoint::{Connection, RecvStream, SendStream};
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// ALPN prefix of chat forwarding; [`chat_alpn`] scopes it by namespace.
pub const CHAT_ALPN: &[u8] = b"shoal/chat/1/";
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
    /// The request.
    pub chat: WireChat,
}

/// [`ChatRequest`] on the wire.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct WireChat {
    model: String,
    messages: Vec<WireMessage>,
    #[serde(default)]
    sampling: WireSampling,
    #[serde(default)]
    user: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
struct WireMessage {
    role: String,
    content: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(default)]
struct WireSampling {
    max_tokens: Option<u32>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<u32>,
    min_p: Option<f32>,
    seed: Option<u64>,
    stop: Vec<String>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    logprobs: Option<u32>,
    /// Absent from older peers: `false`.
    ignore_eos: bool,
}

impl From<&ChatRequest> for WireChat {
    fn from(r: &ChatRequest) -> WireChat {
        let s = &r.sampling;
        WireChat {
            model: r.model.clone(),
            messages: r
                .messages
                .iter()
                .map(|m| WireMessage {
                    role: m.role.clone(),
                    content: m.content.clone(),
                })
                .collect(),
            sampling: WireSampling {
                max_tokens: s.max_tokens,
                temperature: s.temperature,
                top_p: s.top_p,
                top_k: s.top_k,
                min_p: s.min_p,
                seed: s.seed,
                stop: s.stop.clone(),
                presence_penalty: s.presence_penalty,
                frequency_penalty: s.frequency_penalty,
                logprobs: s.logprobs,
                ignore_eos: s.ignore_eos,
            },
            user: r.user.clone(),
        }
    }
}

impl From<WireChat> for ChatRequest {
    fn from(w: WireChat) -> ChatRequest {
        let s = w.sampling;
        ChatRequest {
            model: w.model,
            messages: w
                .messages
                .into_iter()
                .map(|m| ChatMessage {
                    role: m.role,
                    content: m.content,
                })
                .collect(),
            sampling: SamplingParams {
                max_tokens: s.max_tokens,
                temperature: s.temperature,
                top_p: s.top_p,
                top_k: s.top_k,
                min_p: s.min_p,
                seed: s.seed,
                stop: s.stop,
                presence_penalty: s.presence_penalty,
                frequency_penalty: s.frequency_penalty,
                logprobs: s.logprobs,
                ignore_eos: s.ignore_eos,
            },
            user: w.user,
        }
    }
}

/// An [`ApiError`] on the wire.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct WireError {
    kind: String,
    message: String,
    #[serde(default)]
    param: Option<String>,
    #[serde(default)]
    code: Option<String>,
}

impl From<&ApiError> for WireError {
    fn from(e: &ApiError) -> WireError {
        let kind = match e.kind {
            ErrorKind::InvalidRequest => "invalid_request",
            ErrorKind::NotFound => "not_found",
            ErrorKind::MethodNotAllowed => "method_not_allowed",
            ErrorKind::Conflict => "conflict",
            ErrorKind::PayloadTooLarge => "payload_too_large",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Internal => "internal",
        };
        WireError {
            kind: kind.into(),
            message: e.message.clone(),
            param: e.param.clone(),
            code: e.code.clone(),
        }
    }
}

impl From<WireError> for ApiError {
    fn from(w: WireError) -> ApiError {
        let kind = match w.kind.as_str() {
            "invalid_request" => ErrorKind::InvalidRequest,
            "not_found" => ErrorKind::NotFound,
            "method_not_allowed" => ErrorKind::MethodNotAllowed,
            "conflict" => ErrorKind::Conflict,
            "payload_too_large" => ErrorKind::PayloadTooLarge,
            "unavailable" => ErrorKind::Unavailable,
            _ => ErrorKind::Internal,
        };
        let mut e = ApiError::new(kind, w.message);
        e.param = w.param;
        e.code = w.code;
        e
    }
}

/// What the server sends back.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Reply {
    /// The request is queued on the instance.
    Accepted {
        /// Prompt tokens after the chat template.
        prompt_tokens: u32,
    },
    /// The request cannot run there (the last frame).
    Refused {
        /// Why.
        error: WireError,
    },
    /// A generated token.
    Token {
        /// Its text.
        text: String,
        /// Its log-probability, when asked.
        #[serde(default)]
        logprob: Option<f32>,
    },
    /// Generation ended (the last frame).
    Done {
        /// `stop` or `length`.
        finish_reason: String,
        /// Tokens generated.
        completion_tokens: u32,
    },
    /// Generation failed (the last frame).
    Failed {
        /// Why.
        error: WireError,
    },
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    /// Too large.
    #[error("a frame of {0} bytes is over the limit of {MAX_FRAME}")]
    TooLarge(usize),
    /// Another version.
    #[error("frame version {0} is not supported (this node speaks {VERSION})")]
    Version(u32),
    /// Not a valid message.
    #[error("malformed frame: {0}")]
    Malformed(String),
}

#[derive(Serialize)]
struct OutFrame<'a, T> {
    v: u32,
    msg: &'a T,
}

#[derive(Deserialize)]
struct InFrame {
    v: u32,
    msg: serde_json::Value,
}

/// A frame: length prefix and body.
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, FrameError> {
    let body = serde_json::to_vec(&OutFrame { v: VERSION, msg })
        .map_err(|e| FrameError::Malformed(e.to_string()))?;
    if body.len() > MAX_FRAME {
        return Err(FrameError::TooLarge(body.len()));
    }
    let mut out = Vec::with_capacity(body.len() + 4);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// Checks a frame's announced length.
pub fn check_length(header: [u8; 4]) -> Result<usize, FrameError> {
    let len = u32::from_be_bytes(header) as usize;
    if len > MAX_FRAME {
        return Err(FrameError::TooLarge(len));
    }
    Ok(len)
}

/// Decodes a frame's body.
pub fn decode_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, FrameError> {
    let frame: InFrame =
        serde_json::from_slice(body).map_err(|e| FrameError::Malformed(e.to_string()))?;
    if frame.v != VERSION {
        return Err(FrameError::Version(frame.v));
    }
    serde_json::from_value(frame.msg).map_err(|e| FrameError::Malformed(e.to_string()))
}

/// Decodes a whole frame (header and body) from `bytes` (what [`read`] does on a stream): the message and the bytes used, or
/// `Ok(None)` if `bytes` holds less than one frame.
#[cfg(test)]
pub fn decode<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
) -> Result<Option<(T, usize)>, FrameError> {
    let Some(header) = bytes.get(..4) else {
        return Ok(None);
    };
    let len = check_length(header.try_into().unwrap_or([0xff; 4]))?;
    let Some(body) = bytes.get(4..4 + len) else {
        return Ok(None);
    };
    Ok(Some((decode_body(body)?, 4 + len)))
}

async fn write<T: Serialize>(send: &mut SendStream, msg: &T) -> anyhow::Result<()> {
    let frame = encode(msg)?;
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
    let len = check_length(header)?;
    let mut body = vec![0u8; len];
    recv.read_exact(&mut body).await?;
    Ok(Some(decode_body(&body)?))
}

fn finish_reason(text: &str) -> FinishReason {
    if text == "length" {
        FinishReason::Length
    } else {
        FinishReason::Stop
    }
}

/// Sends `request` for `instance_id` over `connection` and relays the server's events into a
/// [`ChatStream`]. `alive` is polled while waiting: once it says the server node is dead,
/// the stream ends with "instance lost". Firing `cancel` (or the gateway dropping the
/// stream) closes the request stream, which cancels the request on the server.
pub async fn forward<A>(
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
        chat: WireChat::from(request),
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
    let prompt_tokens = match first {
        Reply::Accepted { prompt_tokens } => prompt_tokens,
        Reply::Refused { error } => return Err(error.into()),
        other => {
            return Err(lost(format!(
                "the instance's node answered {other:?} before accepting"
            )))
        }
    };
    let want_logprobs = request.sampling.logprobs.is_some();
    let (tx, stream) = ChatStream::channel(prompt_tokens, 64);
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
                Some(Ok(Some(Reply::Token { text, logprob }))) => Ok(ChatEvent::Token {
                    logprob: logprob
                        .filter(|_| want_logprobs)
                        .map(|logprob| TokenLogprob {
                            token: text.clone(),
                            logprob,
                            top: vec![],
                        }),
                    text,
                }),
                Some(Ok(Some(Reply::Done {
                    finish_reason: reason,
                    completion_tokens,
                }))) => Ok(ChatEvent::Done {
                    finish_reason: finish_reason(&reason),
                    completion_tokens,
                }),
                Some(Ok(Some(Reply::Failed { error }))) => Err(error.into()),
                Some(Ok(Some(other))) => Err(lost(format!(
                    "the instance's node sent {other:?} mid-stream"
                ))),
                Some(Ok(None)) => Err(lost("the instance's node closed the stream".into())),
                Some(Err(e)) => Err(lost(format!(
                    "the connection to the instance's node broke: {e:#}"
                ))),
                None => Err(lost("the instance's node died".into())),
            };
            let last = !matches!(item, Ok(ChatEvent::Token { .. }));
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

/// What the server side needs from the node: run a chat on a local instance's rank 0.
pub trait LocalChat: Send + Sync + 'static {
    /// Starts `request` on instance `instance_id`'s runner on this node.
    fn chat_local(
        &self,
        instance_id: String,
        request: ChatRequest,
        cancel: CancellationToken,
    ) -> gateway::BoxFuture<'_, Result<ChatStream, ApiError>>;
}

/// Serves forwarded chats on every connection received, until the channel closes.
pub async fn serve(
    mut connections: tokio::sync::mpsc::Receiver<Connection>,
    node: Arc<dyn LocalChat>,
) {
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
    node: Arc<dyn LocalChat>,
    mut send: SendStream,
    mut recv: RecvStream,
) -> anyhow::Result<()> {
    let request = match tokio::time::timeout(ACCEPT_TIMEOUT, read::<Request>(&mut recv)).await {
        Ok(Ok(Some(request))) => request,
        Ok(Ok(None)) => return Ok(()),
        Ok(Err(e)) => {
            let error = ApiError::new(ErrorKind::InvalidRequest, format!("{e:#}"));
            write(
                &mut send,
                &Reply::Refused {
                    error: (&error).into(),
                },
            )
            .await?;
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
    let started = node
        .chat_local(request.instance_id, request.chat.into(), cancel.clone())
        .await;
    let mut stream = match started {
        Ok(stream) => stream,
        Err(error) => {
            write(
                &mut send,
                &Reply::Refused {
                    error: (&error).into(),
                },
            )
            .await?;
            let _ = send.finish();
            watcher.abort();
            return Ok(());
        }
    };
    write(
        &mut send,
        &Reply::Accepted {
            prompt_tokens: stream.prompt_tokens,
        },
    )
    .await?;
    loop {
        let event = tokio::select! {
            () = cancel.cancelled() => break,
            event = stream.events.recv() => event,
        };
        let (reply, last) = match event {
            Some(Ok(ChatEvent::Token { text, logprob })) => (
                Reply::Token {
                    text,
                    logprob: logprob.map(|l| l.logprob),
                },
                false,
            ),
            Some(Ok(ChatEvent::Done {
                finish_reason,
                completion_tokens,
            })) => (
                Reply::Done {
                    finish_reason: finish_reason.as_str().into(),
                    completion_tokens,
                },
                true,
            ),
            Some(Err(error)) => (
                Reply::Failed {
                    error: (&error).into(),
                },
                true,
            ),
            None => (
                Reply::Failed {
                    error: (&ApiError::instance_lost("the runner's events ended")).into(),
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
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn chat() -> ChatRequest {
        ChatRequest {
            model: "default".into(),
            messages: vec![ChatMessage {
                role: "user".into(),
                content: "What is the capital of France?".into(),
            }],
            sampling: SamplingParams {
                max_tokens: Some(16),
                temperature: Some(0.0),
                seed: Some(7),
                stop: vec!["\n\n".into()],
                logprobs: Some(0),
                ignore_eos: true,
                ..SamplingParams::default()
            },
            user: Some("u".into()),
        }
    }

    #[test]
    fn requests_and_replies_round_trip() {
        let request = Request {
            instance_id: "default-1".into(),
            chat: WireChat::from(&chat()),
        };
        let frame = encode(&request).unwrap();
        let (back, used) = decode::<Request>(&frame).unwrap().unwrap();
        assert_eq!(used, frame.len());
        assert_eq!(ChatRequest::from(back.chat), chat());
        let error = ApiError::no_instance("default");
        let replies = vec![
            Reply::Accepted { prompt_tokens: 12 },
            Reply::Token {
                text: "Paris".into(),
                logprob: Some(-0.25),
            },
            Reply::Done {
                finish_reason: "length".into(),
                completion_tokens: 16,
            },
            Reply::Failed {
                error: (&error).into(),
            },
        ];
        let mut bytes = Vec::new();
        for r in &replies {
            bytes.extend(encode(r).unwrap());
        }
        let mut at = 0;
        for r in &replies {
            let (back, used) = decode::<Reply>(&bytes[at..]).unwrap().unwrap();
            assert_eq!(&back, r);
            at += used;
        }
        let Reply::Failed { error: wire } = &replies[3] else {
            unreachable!()
        };
        assert_eq!(ApiError::from(wire.clone()), error);
    }

    #[test]
    fn bad_frames_are_refused() {
        assert_eq!(
            decode::<Reply>(&u32::MAX.to_be_bytes()),
            Err(FrameError::TooLarge(u32::MAX as usize))
        );
        let body = br#"{"v":9,"msg":{"type":"done"}}"#;
        let mut frame = (body.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(body);
        assert_eq!(decode::<Reply>(&frame), Err(FrameError::Version(9)));
        let body = br#"{"v":1,"msg":{"type":"explode"}}"#;
        let mut frame = (body.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(body);
        assert!(matches!(
            decode::<Reply>(&frame),
            Err(FrameError::Malformed(_))
        ));
        // Incomplete input is "not yet", not an error.
        let full = encode(&Reply::Accepted { prompt_tokens: 1 }).unwrap();
        assert_eq!(decode::<Reply>(&full[..full.len() - 1]), Ok(None));
        assert_eq!(decode::<Reply>(&full[..3]), Ok(None));
    }

    #[test]
    fn alpns_are_scoped_by_namespace() {
        assert!(chat_alpn("shoal").starts_with(CHAT_ALPN));
        assert_ne!(chat_alpn("shoal"), chat_alpn("lab"));
        assert_ne!(chat_alpn("shoal"), mesh::net::sync_alpn("shoal"));
    }

    proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode::<Request>(&bytes);
            let _ = decode::<Reply>(&bytes);
        }

        #[test]
        fn decoding_arbitrary_json_bodies_never_panics(
            v in 0u32..3,
            text in "\\PC{0,200}",
            kind in prop::sample::select(vec!["accepted", "refused", "token", "done", "failed", "x"]),
        ) {
            let body = format!(r#"{{"v":{v},"msg":{{"type":"{kind}","text":{text:?},"prompt_tokens":{}}}}}"#, text.len());
            let mut frame = (body.len() as u32).to_be_bytes().to_vec();
            frame.extend_from_slice(body.as_bytes());
            let _ = decode::<Reply>(&frame);
            let _ = decode::<Request>(&frame);
        }

        #[test]
        fn any_token_text_round_trips(text in "\\PC{0,64}", logprob in -100.0f32..0.0) {
            let reply = Reply::Token { text: text.clone(), logprob: Some(logprob) };
            let frame = encode(&reply).unwrap();
            prop_assert_eq!(decode::<Reply>(&frame).unwrap().unwrap().0, reply);
        }
    }
}
