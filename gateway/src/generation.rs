//! One generation, whatever API asked for it: the request is handed to the backend, and its
//! events are either collected into a whole answer or streamed through an API's [`Encoder`].
//!
//! Every API's events go through the gateway's guarantees (`steps.rs`: stop strings,
//! `max_tokens`, cancellation, an end to every stream) and the reasoning split
//! ([`dialects::reasoning`]). The APIs differ only in how they spell requests and events, so
//! routing and forwarding (the backend's) are the same for all of them.

use crate::access::Caller;
use crate::backend::{Backend, ChatEvent, ChatRequest, ChatStream, FinishReason, TokenLogprob};
use crate::body::{GatewayBody, SseBody};
use crate::cancel::{Registration, Running};
use crate::config::GatewayConfig;
use crate::drain::{cut_error, Drain, InFlight};
use crate::error::{ApiError, ErrorKind};
use crate::steps::{Generation, Step};
use crate::tools::ToolCall;
use bytes::Bytes;
use dialects::answer::AnswerSplitter;
use dialects::answer_part::AnswerPart;
use dialects::tools::stream::CallDelta;
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use hyper::Response;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

/// How a generation ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Ending {
    pub finish_reason: FinishReason,
    /// The stop string that ended it, when one did (Anthropic's `stop_sequence`).
    pub stop_sequence: Option<String>,
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    /// Prompt tokens the engine took from its prompt cache (each API's `cached_tokens`; 0
    /// when none or when the engine has no cache).
    pub cached_tokens: u32,
    /// How many tool calls the answer made (each API then ends it as a tool call:
    /// `tool_calls`, `tool_use`, ...).
    pub tool_calls: usize,
}

/// When the phases of a request happened, for APIs that report durations (Ollama's
/// `*_duration` fields): measured on this node's monotonic clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    /// The request arrived.
    pub received: Instant,
    /// The backend accepted it (the prompt was tokenized and queued).
    pub accepted: Instant,
    /// The first token arrived (prompt processed), if any did.
    pub first_token: Option<Instant>,
    /// The generation ended.
    pub ended: Instant,
}

/// A whole answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Collected {
    pub text: String,
    /// What the model thought before answering (`<think>…</think>`, see
    /// [`dialects::reasoning`]); empty for models that do not think.
    pub reasoning: String,
    /// Per token, when asked for.
    pub logprobs: Vec<TokenLogprob>,
    /// The calls parsed out of the answer (only when the request offered tools).
    pub tool_calls: Vec<ToolCall>,
    pub ending: Ending,
    pub timings: Timings,
}

/// How an API writes a streamed answer. Each method returns the bytes to send (framed: SSE
/// events or NDJSON lines).
pub trait Encoder: Send + 'static {
    /// The response's content type.
    fn content_type(&self) -> &'static str;
    /// Before the first token.
    fn start(&mut self, prompt_tokens: u32) -> Vec<Bytes>;
    /// Text to send (never empty unless a logprob comes with it).
    fn delta(&mut self, text: &str, logprob: Option<&TokenLogprob>) -> Vec<Bytes>;
    /// Reasoning to send (never empty); it always comes before the answer's text.
    fn reasoning(&mut self, text: &str) -> Vec<Bytes>;
    /// A complete tool call, the `index`th of the answer, sent whole (text may come before
    /// and after it): by default its start, its arguments in one delta, and its end.
    fn tool_call(&mut self, index: usize, call: &ToolCall) -> Vec<Bytes> {
        let mut frames = self.tool_call_start(index, &call.id, &call.name);
        if !call.arguments.is_empty() {
            frames.extend(self.tool_call_arguments(index, &call.arguments));
        }
        frames.extend(self.tool_call_end(index, call));
        frames
    }
    /// The `index`th call of the answer begins (its name is an offered tool); its arguments
    /// follow ([`dialects::tools::stream`]).
    fn tool_call_start(&mut self, index: usize, id: &str, name: &str) -> Vec<Bytes>;
    /// More of the open call's arguments (never empty).
    fn tool_call_arguments(&mut self, index: usize, fragment: &str) -> Vec<Bytes>;
    /// The open call ended; `call.arguments` is all its argument deltas joined.
    fn tool_call_end(&mut self, index: usize, call: &ToolCall) -> Vec<Bytes>;
    /// Whether this API shows a call's arguments as they grow (else calls come whole and a
    /// call that does not fit its schema stays text).
    fn streams_arguments(&self) -> bool {
        true
    }
    /// The end of the answer.
    fn finish(&mut self, ending: &Ending, timings: &Timings) -> Vec<Bytes>;
    /// The instance failed mid-stream.
    fn fail(&mut self, error: &ApiError) -> Vec<Bytes>;
    /// What to send after a silence, so that proxies and clients keep the connection open
    /// (`None`: nothing, for formats without comments).
    fn keep_alive(&self) -> Option<Bytes>;
}

/// A request the backend accepted, its events still to come.
pub struct Accepted {
    stream: ChatStream,
    splitter: AnswerSplitter,
    generation: Generation,
    cancel: CancellationToken,
    guard: DropGuard,
    received: Instant,
    accepted: Instant,
    config: GatewayConfig,
    registration: Option<Registration>,
    drain: Drain,
    _in_flight: InFlight,
}

/// What every API handler needs besides the backend: the settings, the table of running
/// generations, the node's stop and who asked.
#[derive(Debug, Clone, Default)]
pub struct Ctx {
    pub config: GatewayConfig,
    pub running: Running,
    /// The server's stop (see [`crate::drain`]).
    pub drain: Drain,
    /// Who sent the request being handled (its API key), who alone may cancel it.
    pub caller: Caller,
}

/// Hands `request` to the backend, within the configured silence limit. `received` is when
/// the HTTP request arrived; `id`, the answer's id, registers it for `POST /v1/cancel/{id}`.
pub async fn accept(
    backend: &dyn Backend,
    request: ChatRequest,
    ctx: &Ctx,
    received: Instant,
    id: Option<&str>,
) -> Result<Accepted, ApiError> {
    let config = &ctx.config;
    let in_flight = ctx.drain.enter()?;
    let generation = Generation::new(
        &request.sampling.stop,
        request.sampling.max_tokens,
        request.sampling.logprobs.is_some(),
    );
    let offered: Vec<_> = request
        .tool_choice
        .offered(&request.tools)
        .into_iter()
        .cloned()
        .collect();
    let named = matches!(request.tool_choice, crate::tools::ToolChoice::Function(_));
    let cancel = CancellationToken::new();
    // Cancels the generation if this is dropped (client gone before the answer).
    let guard = cancel.clone().drop_guard();
    let limit = config.backend_silence_limit;
    let stream = tokio::time::timeout(limit, backend.chat(request, cancel.clone()))
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
    // Where the prompt was rendered tells how to read the output.
    let mut splitter = AnswerSplitter::new(&offered, stream.form.clone());
    // A named function is called once: the answer ends with the call.
    splitter.end_after_call(named);
    let registration = id.map(|id| ctx.running.register(id, cancel.clone(), ctx.caller));
    Ok(Accepted {
        stream,
        splitter,
        generation,
        cancel,
        guard,
        received,
        accepted: Instant::now(),
        config: *config,
        registration,
        drain: ctx.drain.clone(),
        _in_flight: in_flight,
    })
}

impl Accepted {
    /// Tokens in the rendered prompt.
    pub fn prompt_tokens(&self) -> u32 {
        self.stream.prompt_tokens
    }

    /// Stops the generation before it produced anything (a token count was all that was
    /// wanted).
    pub fn abandon(self) {
        self.cancel.cancel();
    }

    /// Runs the generation to its end.
    pub async fn collect(mut self) -> Result<Collected, ApiError> {
        let silence = self.config.backend_silence_limit;
        let mut text = String::new();
        let mut reasoning = String::new();
        let mut logprobs = Vec::new();
        let mut tool_calls = Vec::new();
        let mut first_token = None;
        let mut splitter = std::mem::take(&mut self.splitter);
        let mut keep = |parts: Vec<AnswerPart>| {
            for part in parts {
                match part {
                    AnswerPart::Reasoning(r) => reasoning.push_str(&r),
                    AnswerPart::Text(t) => text.push_str(&t),
                    AnswerPart::Call(c) | AnswerPart::Stream(CallDelta::End(c)) => {
                        tool_calls.push(c)
                    }
                    // Only a stream asks for argument deltas.
                    AnswerPart::Stream(_) => {}
                }
            }
        };
        let result = loop {
            let event = if splitter.closed() {
                // The call that ends the answer came.
                Some(Ok(self.generation.cancelled()))
            } else {
                tokio::select! {
                    event = next_event(&mut self.stream, Instant::now() + silence, silence) => event,
                    () = self.cancel.cancelled() => None,
                    () = self.drain.cut() => Some(Err(cut_error())),
                }
            };
            let event = match event {
                None if self.cancel.is_cancelled() => Some(Ok(self.generation.cancelled())),
                other => other,
            };
            if first_token.is_none() && matches!(event, Some(Ok(ChatEvent::Token { .. }))) {
                first_token = Some(Instant::now());
            }
            match self.generation.step(event) {
                Step::Delta { text: t, logprob } => {
                    keep(splitter.push(&t));
                    logprobs.extend(logprob);
                }
                Step::Finished {
                    text: t,
                    logprob,
                    finish_reason,
                    stop_sequence,
                    completion_tokens,
                    cached_tokens,
                } => {
                    keep(splitter.push(&t));
                    keep(splitter.finish());
                    logprobs.extend(logprob);
                    let (ending, timings) = close(
                        (finish_reason, stop_sequence, completion_tokens),
                        cached_tokens,
                        self.stream.prompt_tokens,
                        (self.received, self.accepted, first_token),
                    );
                    break Ok((logprobs, ending, timings));
                }
                Step::Failed(e) => break Err(e),
            }
        };
        self.cancel.cancel();
        self.guard.disarm();
        let (logprobs, mut ending, timings) = result?;
        ending.tool_calls = tool_calls.len();
        Ok(Collected {
            text,
            reasoning,
            logprobs,
            tool_calls,
            ending,
            timings,
        })
    }

    /// Streams the generation through `encoder` as the response body.
    pub fn stream<E: Encoder>(mut self, encoder: E) -> Response<GatewayBody> {
        let content_type = encoder.content_type();
        self.splitter.stream_arguments(encoder.streams_arguments());
        let (tx, rx) = mpsc::channel(64);
        let Accepted {
            stream,
            splitter,
            generation,
            cancel,
            guard,
            received,
            accepted,
            config,
            registration,
            drain,
            _in_flight,
        } = self;
        let run = Run {
            stream,
            splitter,
            calls: 0,
            generation,
            cancel,
            received,
            accepted,
            config,
            _registration: registration,
            drain,
            _in_flight,
        };
        tokio::spawn(run.drive(tx, encoder));
        let mut response = Response::new(GatewayBody::Sse(SseBody::new(rx, guard)));
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
        response
    }
}

/// A streamed generation's task state.
struct Run {
    stream: ChatStream,
    splitter: AnswerSplitter,
    /// Tool calls sent so far.
    calls: usize,
    generation: Generation,
    cancel: CancellationToken,
    received: Instant,
    accepted: Instant,
    config: GatewayConfig,
    /// Keeps the generation cancellable by id while it streams.
    _registration: Option<Registration>,
    /// The node's stop: the answer is cut when its grace period ends.
    drain: Drain,
    /// Counts the answer as in flight while it streams.
    _in_flight: InFlight,
}

impl Run {
    /// Produces the frames into `tx`, with the encoder's keep-alive whenever nothing was
    /// written for `config.keep_alive_interval`. Ends with the encoder's end in every case
    /// but a gone client.
    async fn drive<E: Encoder>(mut self, tx: mpsc::Sender<Bytes>, mut encoder: E) {
        let keep_alive = self.config.keep_alive_interval;
        let silence = self.config.backend_silence_limit;
        if !send_all(&tx, encoder.start(self.stream.prompt_tokens)).await {
            self.cancel.cancel();
            return;
        }
        let mut last_write = Instant::now();
        let mut last_event = Instant::now();
        let mut first_token = None;
        loop {
            // The call that ends the answer came: it ends here, normally.
            let event = if self.splitter.closed() {
                Some(Ok(self.generation.cancelled()))
            } else {
                tokio::select! {
                    event = next_event(&mut self.stream, last_event + silence, silence) => event,
                    // `POST /v1/cancel/{id}`: the answer ends here, normally.
                    () = self.cancel.cancelled() => Some(Ok(self.generation.cancelled())),
                    // The node stops and the answer outlived the drain period.
                    () = self.drain.cut() => Some(Err(cut_error())),
                    () = tokio::time::sleep_until(last_write + keep_alive) => {
                        if let Some(ping) = encoder.keep_alive() {
                            if tx.send(ping).await.is_err() {
                                self.cancel.cancel();
                                return;
                            }
                        }
                        last_write = Instant::now();
                        continue;
                    }
                    () = tx.closed() => {
                        self.cancel.cancel();
                        return;
                    }
                }
            };
            // A backend that stopped because the generation was cancelled ends its stream.
            let event = match event {
                None if self.cancel.is_cancelled() => Some(Ok(self.generation.cancelled())),
                other => other,
            };
            if first_token.is_none() && matches!(event, Some(Ok(ChatEvent::Token { .. }))) {
                first_token = Some(Instant::now());
            }
            let mut frames = Vec::new();
            let done = match self.generation.step(event) {
                Step::Delta { text, logprob } => {
                    let parts = self.splitter.push(&text);
                    frames.extend(encode(
                        &mut encoder,
                        parts,
                        logprob.as_ref(),
                        &mut self.calls,
                    ));
                    false
                }
                Step::Finished {
                    text,
                    logprob,
                    finish_reason,
                    stop_sequence,
                    completion_tokens,
                    cached_tokens,
                } => {
                    self.cancel.cancel();
                    let mut parts = self.splitter.push(&text);
                    parts.extend(self.splitter.finish());
                    frames.extend(encode(
                        &mut encoder,
                        parts,
                        logprob.as_ref(),
                        &mut self.calls,
                    ));
                    let (mut ending, timings) = close(
                        (finish_reason, stop_sequence, completion_tokens),
                        cached_tokens,
                        self.stream.prompt_tokens,
                        (self.received, self.accepted, first_token),
                    );
                    ending.tool_calls = self.calls;
                    frames.extend(encoder.finish(&ending, &timings));
                    true
                }
                Step::Failed(e) => {
                    self.cancel.cancel();
                    tracing::warn!(error = %e, "stream failed");
                    frames.extend(encoder.fail(&e));
                    true
                }
            };
            if !send_all(&tx, frames).await {
                self.cancel.cancel();
                return;
            }
            if done {
                return;
            }
            last_write = Instant::now();
            last_event = last_write;
        }
    }
}

/// One step's parts through the encoder. A logprob goes with the step's first text (or
/// alone, after its reasoning or calls, when the token was not text); `calls` counts the
/// tool calls sent (a streamed one from its start).
fn encode<E: Encoder>(
    encoder: &mut E,
    parts: Vec<AnswerPart>,
    logprob: Option<&TokenLogprob>,
    calls: &mut usize,
) -> Vec<Bytes> {
    let mut frames = Vec::new();
    let mut logprob = logprob;
    for part in parts {
        match part {
            AnswerPart::Reasoning(r) => frames.extend(encoder.reasoning(&r)),
            AnswerPart::Text(t) => frames.extend(encoder.delta(&t, logprob.take())),
            AnswerPart::Call(c) => {
                frames.extend(encoder.tool_call(*calls, &c));
                *calls += 1;
            }
            AnswerPart::Stream(CallDelta::Start { id, name }) => {
                frames.extend(encoder.tool_call_start(*calls, &id, &name));
                *calls += 1;
            }
            AnswerPart::Stream(CallDelta::Arguments(a)) => {
                frames.extend(encoder.tool_call_arguments(calls.saturating_sub(1), &a));
            }
            AnswerPart::Stream(CallDelta::End(c)) => {
                frames.extend(encoder.tool_call_end(calls.saturating_sub(1), &c));
            }
        }
    }
    if let Some(lp) = logprob {
        frames.extend(encoder.delta("", Some(lp)));
    }
    frames
}

/// The ending and timings of a finished generation: `(finish_reason, stop_sequence,
/// completion_tokens)` and the cached prompt tokens from its last step, `(received,
/// accepted, first_token)` as recorded.
fn close(
    (finish_reason, stop_sequence, completion_tokens): (FinishReason, Option<String>, u32),
    cached_tokens: u32,
    prompt_tokens: u32,
    (received, accepted, first_token): (Instant, Instant, Option<Instant>),
) -> (Ending, Timings) {
    let ending = Ending {
        finish_reason,
        stop_sequence,
        prompt_tokens,
        completion_tokens,
        cached_tokens,
        tool_calls: 0,
    };
    let timings = Timings {
        received,
        accepted,
        first_token,
        ended: Instant::now(),
    };
    (ending, timings)
}

async fn send_all(tx: &mpsc::Sender<Bytes>, frames: Vec<Bytes>) -> bool {
    for frame in frames {
        if tx.send(frame).await.is_err() {
            return false;
        }
    }
    true
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

/// One SSE event with a name (`event: NAME`), as Anthropic's and the Responses API's
/// streams frame them. JSON never contains a raw newline, so one data line suffices.
pub fn sse_named(name: &str, value: &serde_json::Value) -> Bytes {
    let mut out = Vec::with_capacity(160);
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    serde_json::to_writer(&mut out, value).unwrap_or_default();
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// One `data:` event without a name (OpenAI's chat chunks).
pub fn sse_data(value: &serde_json::Value) -> Bytes {
    let mut out = Vec::with_capacity(128);
    out.extend_from_slice(b"data: ");
    serde_json::to_writer(&mut out, value).unwrap_or_default();
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}
