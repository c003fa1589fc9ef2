//! The bench's HTTP client: a node's API at `http://HOST:PORT`, one hyper connection per
//! request (the bench sends one request at a time, so pooling would buy nothing), JSON
//! answers with the API's error message surfaced, and timed chat streams.

use super::report::Sample;
use super::sse::{parse_chunk, SseEvent, SseReader};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use std::time::{Duration, Instant};

/// Largest non-streamed answer read (a `/state` of a big cluster is well below).
const MAX_JSON_BODY: usize = 64 << 20;

/// Where a node's API is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Api {
    /// `host:port`, for connecting and for the `Host` header.
    authority: String,
}

/// A request that got an answer other than 2xx, or none.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiFailure {
    /// The HTTP status, when an answer came.
    pub status: Option<StatusCode>,
    /// The API's `error.message`, or what went wrong.
    pub message: String,
}

impl std::fmt::Display for ApiFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.status {
            Some(status) => write!(f, "{status}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl ApiFailure {
    fn transport(message: String) -> ApiFailure {
        ApiFailure {
            status: None,
            message,
        }
    }
}

impl Api {
    /// Reads `http://HOST:PORT` (a trailing `/` allowed; `http://` optional; port 52415 when
    /// absent). Only plain HTTP: nodes serve nothing else.
    pub fn parse(url: &str) -> Result<Api, String> {
        let url = url.trim();
        if url.starts_with("https://") {
            return Err(format!(
                "--api {url}: shoal nodes speak plain HTTP; use http://HOST:PORT"
            ));
        }
        let rest = url.strip_prefix("http://").unwrap_or(url);
        let authority = rest.trim_end_matches('/');
        if authority.is_empty()
            || authority.contains('/')
            || authority.contains(char::is_whitespace)
        {
            return Err(format!(
                "--api {url}: expected http://HOST:PORT, for example http://127.0.0.1:52415"
            ));
        }
        let has_port = match authority.rsplit_once(':') {
            // An IPv6 literal in brackets has colons of its own.
            Some((host, port)) if !port.contains(']') => {
                if port.parse::<u16>().is_err() {
                    return Err(format!("--api {url}: `{port}` is not a port number"));
                }
                !host.is_empty()
            }
            _ => false,
        };
        let authority = if has_port {
            authority.to_string()
        } else {
            format!("{authority}:{}", gateway::DEFAULT_API_PORT)
        };
        Ok(Api { authority })
    }

    /// `http://host:port`, for messages.
    pub fn url(&self) -> String {
        format!("http://{}", self.authority)
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, ApiFailure> {
        let stream = tokio::net::TcpStream::connect(&self.authority)
            .await
            .map_err(|e| {
                ApiFailure::transport(format!(
                    "cannot connect to {}: {e}; is `shoal` running there?",
                    self.url()
                ))
            })?;
        let _ = stream.set_nodelay(true);
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| {
                ApiFailure::transport(format!("HTTP handshake with {}: {e}", self.url()))
            })?;
        tokio::spawn(connection);
        let bytes = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
        let request = Request::builder()
            .method(method.clone())
            .uri(path)
            .header(hyper::header::HOST, &self.authority)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(bytes))
            .map_err(|e| ApiFailure::transport(format!("cannot build {method} {path}: {e}")))?;
        sender
            .send_request(request)
            .await
            .map_err(|e| ApiFailure::transport(format!("{method} {path} on {}: {e}", self.url())))
    }

    /// Sends a request and reads a JSON answer; a non-2xx answer is a failure carrying the
    /// API's error message.
    pub async fn json(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, ApiFailure> {
        let response = self.send(method.clone(), path, body).await?;
        let status = response.status();
        let bytes = Limited::new(response.into_body(), MAX_JSON_BODY)
            .collect()
            .await
            .map_err(|e| ApiFailure {
                status: Some(status),
                message: format!("reading the answer to {method} {path}: {e}"),
            })?
            .to_bytes();
        let value: Result<Value, _> = serde_json::from_slice(&bytes);
        if !status.is_success() {
            let message = value
                .ok()
                .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
                .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
            return Err(ApiFailure {
                status: Some(status),
                message: format!("{method} {path}: {message}"),
            });
        }
        value.map_err(|e| ApiFailure {
            status: Some(status),
            message: format!("{method} {path} answered something that is not JSON: {e}"),
        })
    }

    /// Sends a streaming chat request and times it: the first generated text, the last, and
    /// the usage the server counted. The stream must end with `[DONE]` after a finish reason;
    /// an error event, a cut-off stream or silence past `timeout` is an error.
    pub async fn timed_chat(&self, body: &Value, timeout: Duration) -> Result<Sample, String> {
        tokio::time::timeout(timeout, self.timed_chat_inner(body))
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "the chat request did not finish within {} s (--timeout)",
                    timeout.as_secs()
                ))
            })
    }

    async fn timed_chat_inner(&self, body: &Value) -> Result<Sample, String> {
        let started = Instant::now();
        let path = "/v1/chat/completions";
        let response = self
            .send(Method::POST, path, Some(body))
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        if !status.is_success() {
            let bytes = Limited::new(response.into_body(), MAX_JSON_BODY)
                .collect()
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
            let message = serde_json::from_slice::<Value>(&bytes)
                .ok()
                .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
                .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
            return Err(format!("POST {path}: {status}: {message}"));
        }
        let mut timing = StreamTiming::default();
        let mut reader = SseReader::new();
        let mut body = response.into_body();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| format!("the chat stream broke: {e}"))?;
            let Some(data) = frame.data_ref() else {
                continue;
            };
            for event in reader.push(data)? {
                let at = started.elapsed();
                if timing.on_event(event, at)? {
                    return timing.finish();
                }
            }
        }
        Err(if reader.has_partial_event() {
            "the chat stream was cut off in the middle of an event".into()
        } else {
            "the chat stream ended without `data: [DONE]`".into()
        })
    }
}

/// What a chat stream told so far.
#[derive(Debug, Default)]
struct StreamTiming {
    first_text: Option<Duration>,
    last_text: Option<Duration>,
    finish_reason: Option<String>,
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    text_chunks: u64,
}

impl StreamTiming {
    /// Takes one event arriving at `at`; `Ok(true)` at `[DONE]`.
    fn on_event(&mut self, event: SseEvent, at: Duration) -> Result<bool, String> {
        let data = match event {
            SseEvent::Done => return Ok(true),
            SseEvent::Data(data) => data,
        };
        let chunk = parse_chunk(&data)?;
        if !chunk.content.is_empty() {
            self.first_text.get_or_insert(at);
            self.last_text = Some(at);
            self.text_chunks += 1;
        }
        if chunk.finish_reason.is_some() {
            self.finish_reason = chunk.finish_reason;
            // The finish chunk follows the last token at once; it bounds the decode time
            // even when the last token decoded to no text.
            if self.first_text.is_some() {
                self.last_text = Some(at);
            }
        }
        self.prompt_tokens = chunk.prompt_tokens.or(self.prompt_tokens);
        self.completion_tokens = chunk.completion_tokens.or(self.completion_tokens);
        Ok(false)
    }

    fn finish(self) -> Result<Sample, String> {
        if self.finish_reason.is_none() {
            return Err("the chat stream ended without a finish_reason".into());
        }
        let (Some(first), Some(last)) = (self.first_text, self.last_text) else {
            return Err("the chat stream carried no text".into());
        };
        let prompt_tokens = self.prompt_tokens.ok_or(
            "the chat stream carried no usage (the server ignored stream_options.include_usage)",
        )?;
        Ok(Sample {
            prompt_tokens,
            completion_tokens: self.completion_tokens.unwrap_or(self.text_chunks),
            ttft_s: first.as_secs_f64(),
            decode_s: (last - first).as_secs_f64(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_urls() {
        let authority = |u: &str| Api::parse(u).map(|a| a.authority);
        assert_eq!(
            authority("http://10.99.0.1:52415/").unwrap(),
            "10.99.0.1:52415"
        );
        assert_eq!(authority("127.0.0.1:8000").unwrap(), "127.0.0.1:8000");
        assert_eq!(authority("http://localhost").unwrap(), "localhost:52415");
        assert_eq!(authority("http://[::1]:9000").unwrap(), "[::1]:9000");
        assert_eq!(authority("http://[::1]").unwrap(), "[::1]:52415");
        for bad in [
            "https://x:1",
            "http://x:1/v1",
            "",
            "http://x:port",
            "http://a b:1",
        ] {
            assert!(Api::parse(bad).is_err(), "{bad}");
        }
    }

    fn data(v: &str) -> SseEvent {
        SseEvent::Data(v.into())
    }

    #[test]
    fn a_stream_is_timed_from_first_to_last_text() {
        let ms = Duration::from_millis;
        let mut t = StreamTiming::default();
        let events = [
            (
                data(r#"{"choices":[{"delta":{"role":"assistant"}}]}"#),
                ms(5),
            ),
            (data(r#"{"choices":[{"delta":{"content":"A"}}]}"#), ms(100)),
            (data(r#"{"choices":[{"delta":{"content":"B"}}]}"#), ms(150)),
            (data(r#"{"choices":[{"delta":{"content":"C"}}]}"#), ms(200)),
            (
                data(r#"{"choices":[{"delta":{},"finish_reason":"length"}]}"#),
                ms(201),
            ),
            (
                data(r#"{"choices":[],"usage":{"prompt_tokens":128,"completion_tokens":3}}"#),
                ms(202),
            ),
        ];
        for (event, at) in events {
            assert!(!t.on_event(event, at).unwrap());
        }
        assert!(t.on_event(SseEvent::Done, ms(203)).unwrap());
        let s = t.finish().unwrap();
        assert_eq!((s.prompt_tokens, s.completion_tokens), (128, 3));
        assert!((s.ttft_s - 0.1).abs() < 1e-9);
        assert!((s.decode_s - 0.101).abs() < 1e-9);
    }

    #[test]
    fn streams_without_the_needed_parts_are_errors() {
        let mut t = StreamTiming::default();
        t.on_event(
            data(r#"{"choices":[{"delta":{"content":"A"}}]}"#),
            Duration::ZERO,
        )
        .unwrap();
        assert!(t.finish().unwrap_err().contains("finish_reason"));
        let mut t = StreamTiming::default();
        t.on_event(
            data(r#"{"choices":[{"delta":{"content":"A"}, "finish_reason":"stop"}]}"#),
            Duration::ZERO,
        )
        .unwrap();
        assert!(t.finish().unwrap_err().contains("usage"));
        let mut t = StreamTiming::default();
        let e = t
            .on_event(
                data(r#"{"error":{"message":"instance lost"}}"#),
                Duration::ZERO,
            )
            .unwrap_err();
        assert!(e.contains("instance lost"), "{e}");
    }
}
