//! `POST /v1/chat/completions`: runs a chat through the backend and answers it whole or as
//! SSE chunks.
//!
//! Both answers go through [`Generation`], which applies what the gateway guarantees whatever
//! the backend does: stop strings cut the text (and end generation), `max_tokens` is never
//! exceeded, and a stream that ends without `Done` is a lost instance, never a hang.

use crate::backend::{Backend, ChatEvent, ChatStream, FinishReason, TokenLogprob};
use crate::body::{json_response, GatewayBody, SseBody};
use crate::config::GatewayConfig;
use crate::error::{ApiError, ErrorKind};
use crate::openai::request::{parse_chat_request, ParsedChat};
use crate::openai::response::{
    chunk_json, completion_json, usage_chunk_json, ChunkDelta, CompletionMeta, Usage,
};
use crate::openai::stop::StopMatcher;
use bytes::Bytes;
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use hyper::{Response, StatusCode};
use serde_json::Value;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Handles one chat completion request body.
pub async fn chat_completions(
    backend: &dyn Backend,
    body: &[u8],
    config: &GatewayConfig,
) -> Result<Response<GatewayBody>, ApiError> {
    let ParsedChat {
        request,
        stream,
        include_usage,
    } = parse_chat_request(body)?;
    let meta = CompletionMeta::new(&request.model);
    let generation = Generation::new(
        &request.sampling.stop,
        request.sampling.max_tokens,
        request.sampling.logprobs.is_some(),
    );
    let cancel = CancellationToken::new();
    // Cancels the generation if this future is dropped (client gone before the answer).
    let guard = cancel.clone().drop_guard();
    let limit = config.backend_silence_limit;
    let accepted = tokio::time::timeout(limit, backend.chat(request, cancel.clone()))
        .await
        .map_err(|_| {
            ApiError::new(
                ErrorKind::Unavailable,
                format!(
                    "the cluster did not accept the request within {} s; check GET /state for \
                     the model's instances and retry",
                    limit.as_secs()
                ),
            )
            .with_code("backend_timeout")
        })??;
    if stream {
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(stream_chat(
            tx,
            accepted,
            generation,
            meta,
            include_usage,
            *config,
            cancel,
        ));
        let mut response = Response::new(GatewayBody::Sse(SseBody::new(rx, guard)));
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
        Ok(response)
    } else {
        let answer = complete_chat(
            accepted,
            generation,
            &meta,
            config.backend_silence_limit,
            &cancel,
        )
        .await;
        guard.disarm();
        let value = answer?;
        Ok(json_response(StatusCode::OK, &value))
    }
}

/// Runs a chat to the end and builds the `chat.completion`.
async fn complete_chat(
    mut accepted: ChatStream,
    mut generation: Generation,
    meta: &CompletionMeta,
    silence_limit: Duration,
    cancel: &CancellationToken,
) -> Result<Value, ApiError> {
    let mut text = String::new();
    let mut logprobs = Vec::new();
    loop {
        let event = next_event(&mut accepted, Instant::now() + silence_limit, silence_limit).await;
        match generation.step(event) {
            Step::Delta { text: t, logprob } => {
                text.push_str(&t);
                logprobs.extend(logprob);
            }
            Step::Finished {
                text: t,
                logprob,
                finish_reason,
                completion_tokens,
            } => {
                text.push_str(&t);
                logprobs.extend(logprob);
                cancel.cancel();
                let usage = Usage {
                    prompt_tokens: accepted.prompt_tokens,
                    completion_tokens,
                };
                let lp = generation.want_logprobs.then_some(logprobs.as_slice());
                return Ok(completion_json(meta, &text, finish_reason, lp, usage));
            }
            Step::Failed(e) => {
                cancel.cancel();
                return Err(e);
            }
        }
    }
}

/// Produces the SSE frames of a streamed chat into `tx`, with keep-alive comments whenever
/// nothing was written for `config.keep_alive_interval`. Ends with `data: [DONE]` in every
/// case but a gone client.
async fn stream_chat(
    tx: mpsc::Sender<Bytes>,
    mut accepted: ChatStream,
    mut generation: Generation,
    meta: CompletionMeta,
    include_usage: bool,
    config: GatewayConfig,
    cancel: CancellationToken,
) {
    let keep_alive = config.keep_alive_interval;
    let silence_limit = config.backend_silence_limit;
    let first = chunk_json(
        &meta,
        ChunkDelta {
            role: true,
            content: Some(""),
            ..ChunkDelta::default()
        },
    );
    if tx.send(sse_data(&first)).await.is_err() {
        cancel.cancel();
        return;
    }
    let mut last_write = Instant::now();
    let mut last_event = Instant::now();
    loop {
        let event = tokio::select! {
            event = next_event(&mut accepted, last_event + silence_limit, silence_limit) => event,
            () = tokio::time::sleep_until(last_write + keep_alive) => {
                if tx.send(Bytes::from_static(b": keep-alive\n\n")).await.is_err() {
                    cancel.cancel();
                    return;
                }
                last_write = Instant::now();
                continue;
            }
            () = tx.closed() => {
                cancel.cancel();
                return;
            }
        };
        let mut frames = Vec::with_capacity(3);
        let done = match generation.step(event) {
            Step::Delta { text, logprob } => {
                if !text.is_empty() || logprob.is_some() {
                    frames.push(sse_data(&delta_chunk(&meta, &text, logprob.as_ref())));
                }
                false
            }
            Step::Finished {
                text,
                logprob,
                finish_reason,
                completion_tokens,
            } => {
                cancel.cancel();
                if !text.is_empty() || logprob.is_some() {
                    frames.push(sse_data(&delta_chunk(&meta, &text, logprob.as_ref())));
                }
                frames.push(sse_data(&chunk_json(
                    &meta,
                    ChunkDelta {
                        finish_reason: Some(finish_reason),
                        ..ChunkDelta::default()
                    },
                )));
                if include_usage {
                    let usage = Usage {
                        prompt_tokens: accepted.prompt_tokens,
                        completion_tokens,
                    };
                    frames.push(sse_data(&usage_chunk_json(&meta, usage)));
                }
                frames.push(Bytes::from_static(b"data: [DONE]\n\n"));
                true
            }
            Step::Failed(e) => {
                cancel.cancel();
                tracing::warn!(id = %meta.id, error = %e, "chat stream failed");
                frames.push(sse_data(&e.to_json()));
                frames.push(Bytes::from_static(b"data: [DONE]\n\n"));
                true
            }
        };
        for frame in frames {
            if tx.send(frame).await.is_err() {
                cancel.cancel();
                return;
            }
        }
        if done {
            return;
        }
        last_write = Instant::now();
        last_event = last_write;
    }
}

/// The backend's next event, or a lost instance once it has been silent past `deadline`.
async fn next_event(
    accepted: &mut ChatStream,
    deadline: Instant,
    silence_limit: Duration,
) -> Option<Result<ChatEvent, ApiError>> {
    match tokio::time::timeout_at(deadline, accepted.events.recv()).await {
        Ok(event) => event,
        Err(_) => Some(Err(ApiError::instance_lost(format_args!(
            "no event from the instance for {} s",
            silence_limit.as_secs()
        )))),
    }
}

fn delta_chunk(meta: &CompletionMeta, text: &str, logprob: Option<&TokenLogprob>) -> Value {
    chunk_json(
        meta,
        ChunkDelta {
            content: Some(text),
            logprobs: logprob.map(std::slice::from_ref),
            ..ChunkDelta::default()
        },
    )
}

/// One `data:` event. JSON never contains a raw newline, so one line suffices.
fn sse_data(value: &Value) -> Bytes {
    let mut out = Vec::with_capacity(128);
    out.extend_from_slice(b"data: ");
    // Serialising a Value cannot fail.
    serde_json::to_writer(&mut out, value).unwrap_or_default();
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// What the gateway makes of one backend event.
#[derive(Debug, PartialEq)]
enum Step {
    /// Text (possibly empty while a stop string may be starting) to send.
    Delta {
        text: String,
        logprob: Option<TokenLogprob>,
    },
    /// Generation is over; `text` is the last of it.
    Finished {
        text: String,
        logprob: Option<TokenLogprob>,
        finish_reason: FinishReason,
        completion_tokens: u32,
    },
    /// The instance failed; the error says why.
    Failed(ApiError),
}

/// The gateway's own guarantees over a backend's events: stop strings, `max_tokens`, and an
/// end to every stream.
#[derive(Debug)]
struct Generation {
    stop: StopMatcher,
    max_tokens: Option<u32>,
    tokens: u32,
    want_logprobs: bool,
}

impl Generation {
    fn new(stop: &[String], max_tokens: Option<u32>, want_logprobs: bool) -> Generation {
        Generation {
            stop: StopMatcher::new(stop),
            max_tokens,
            tokens: 0,
            want_logprobs,
        }
    }

    fn step(&mut self, event: Option<Result<ChatEvent, ApiError>>) -> Step {
        match event {
            Some(Ok(ChatEvent::Token { text, logprob })) => {
                self.tokens = self.tokens.saturating_add(1);
                let logprob = logprob.filter(|_| self.want_logprobs);
                let scan = self.stop.push(&text);
                if scan.stopped {
                    return Step::Finished {
                        text: scan.emit,
                        logprob,
                        finish_reason: FinishReason::Stop,
                        completion_tokens: self.tokens,
                    };
                }
                if self.max_tokens.is_some_and(|max| self.tokens >= max) {
                    let mut text = scan.emit;
                    text.push_str(&self.stop.finish());
                    return Step::Finished {
                        text,
                        logprob,
                        finish_reason: FinishReason::Length,
                        completion_tokens: self.tokens,
                    };
                }
                Step::Delta {
                    text: scan.emit,
                    logprob,
                }
            }
            Some(Ok(ChatEvent::Done {
                finish_reason,
                completion_tokens,
            })) => Step::Finished {
                text: self.stop.finish(),
                logprob: None,
                finish_reason,
                completion_tokens: completion_tokens.max(self.tokens),
            },
            Some(Err(e)) => Step::Failed(e),
            None => Step::Failed(ApiError::instance_lost(
                "the generation ended without finishing",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(t: &str) -> Option<Result<ChatEvent, ApiError>> {
        Some(Ok(ChatEvent::Token {
            text: t.into(),
            logprob: None,
        }))
    }

    #[test]
    fn max_tokens_ends_with_length() {
        let mut g = Generation::new(&[], Some(2), false);
        assert!(matches!(g.step(token("a")), Step::Delta { .. }));
        match g.step(token("b")) {
            Step::Finished {
                text,
                finish_reason,
                completion_tokens,
                ..
            } => {
                assert_eq!(text, "b");
                assert_eq!(finish_reason, FinishReason::Length);
                assert_eq!(completion_tokens, 2);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn stop_string_ends_with_stop_and_cut_text() {
        let mut g = Generation::new(&["##".into()], None, false);
        assert_eq!(
            g.step(token("ab#")),
            Step::Delta {
                text: "ab".into(),
                logprob: None
            }
        );
        match g.step(token("#cd")) {
            Step::Finished {
                text,
                finish_reason,
                ..
            } => {
                assert_eq!(text, "");
                assert_eq!(finish_reason, FinishReason::Stop);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn closed_stream_is_a_lost_instance() {
        let mut g = Generation::new(&[], None, false);
        match g.step(None) {
            Step::Failed(e) => assert_eq!(e.code.as_deref(), Some("instance_lost")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn done_flushes_held_text() {
        let mut g = Generation::new(&["xyz".into()], None, false);
        assert_eq!(
            g.step(token("ax")),
            Step::Delta {
                text: "a".into(),
                logprob: None
            }
        );
        let done = Some(Ok(ChatEvent::Done {
            finish_reason: FinishReason::Stop,
            completion_tokens: 1,
        }));
        match g.step(done) {
            Step::Finished { text, .. } => assert_eq!(text, "x"),
            other => panic!("{other:?}"),
        }
    }
}
