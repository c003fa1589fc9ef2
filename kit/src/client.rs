//! A typed client of a node's cluster API at `http://HOST:PORT`, for `shoal bench`, the xtask
//! and the integration tests: one method per endpoint they use (place and create instances,
//! read one, delete it, placement previews, the state, the model list, chat whole or
//! streamed), one hyper connection per request (they send one request at a time, so pooling
//! would buy nothing), the API's error message surfaced, and timed chat streams.
//!
//! Nodes in network namespaces are reached from the host through [`Api::in_netns`]: the
//! connection is opened inside the namespace ([`crate::netns::connect_in`]).
//! [`Blocking`](crate::blocking::Blocking) wraps it for synchronous callers.

use crate::sse::{SseEvent, SseReader};
use crate::timing::{Sample, StreamTiming};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::Request;
/// The request methods and answer statuses of the API, for callers without hyper of their own.
pub use hyper::{Method, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Largest non-streamed answer read (a `/state` of a big cluster is well below).
const MAX_JSON_BODY: usize = 64 << 20;

/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a node's API is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Api {
    /// `host:port`, for connecting and for the `Host` header.
    authority: String,
    /// The network namespace to connect from, if not this process's own.
    netns: Option<String>,
    /// The API key sent as `Authorization: Bearer KEY`, if any.
    key: Option<String>,
}

/// A request that got an answer other than 2xx, or none.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiFailure {
    /// The HTTP status, when an answer came.
    pub status: Option<StatusCode>,
    /// The API's `error.message`, or what went wrong.
    pub message: String,
    /// The answer's body, when one came (its JSON, else its text as a string).
    pub body: Option<Value>,
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
            body: None,
        }
    }
}

/// A whole answer: its status and body.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The HTTP status.
    pub status: StatusCode,
    /// The body.
    pub body: Bytes,
}

impl Answer {
    /// The body as JSON, else its text as a JSON string.
    pub fn value(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|_| Value::String(self.text()))
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters (for ids in paths and
/// queries).
pub fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Api {
    /// Reads `http://HOST:PORT` (a trailing `/` allowed; `http://` optional; `default_port`
    /// when absent). Only plain HTTP: nodes serve nothing else.
    pub fn parse(url: &str, default_port: u16) -> Result<Api, String> {
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
            format!("{authority}:{default_port}")
        };
        Ok(Api {
            authority,
            netns: None,
            key: None,
        })
    }

    /// The API at `addr`.
    pub fn at(addr: std::net::SocketAddr) -> Api {
        Api {
            authority: addr.to_string(),
            netns: None,
            key: None,
        }
    }

    /// The same API, reached from inside network namespace `netns` (needs root).
    pub fn in_netns(mut self, netns: &str) -> Api {
        self.netns = Some(netns.to_string());
        self
    }

    /// The same API, each request carrying `key` (`Authorization: Bearer KEY`): for a node
    /// started with API keys.
    pub fn with_key(mut self, key: &str) -> Api {
        self.key = Some(key.to_string());
        self
    }

    /// `http://host:port`, for messages.
    pub fn url(&self) -> String {
        format!("http://{}", self.authority)
    }

    async fn connect(&self) -> Result<tokio::net::TcpStream, String> {
        let Some(netns) = &self.netns else {
            let connect = tokio::net::TcpStream::connect(&self.authority);
            return match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
                Ok(result) => result.map_err(|e| e.to_string()),
                Err(_) => Err("timed out".into()),
            };
        };
        let addr: std::net::SocketAddr = self
            .authority
            .parse()
            .map_err(|_| format!("{} is not IP:PORT", self.authority))?;
        let netns = netns.clone();
        let stream = tokio::task::spawn_blocking(move || {
            crate::netns::connect_in(&netns, addr, CONNECT_TIMEOUT)
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
        stream.set_nonblocking(true).map_err(|e| e.to_string())?;
        tokio::net::TcpStream::from_std(stream).map_err(|e| e.to_string())
    }

    /// Sends one request; the answer's body is left unread.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<hyper::Response<Incoming>, ApiFailure> {
        let stream = self.connect().await.map_err(|e| {
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
        let mut request = Request::builder()
            .method(method.clone())
            .uri(path)
            .header(hyper::header::HOST, &self.authority)
            .header(hyper::header::CONTENT_TYPE, "application/json");
        if let Some(key) = &self.key {
            request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {key}"));
        }
        let request = request
            .body(Full::new(bytes))
            .map_err(|e| ApiFailure::transport(format!("cannot build {method} {path}: {e}")))?;
        sender
            .send_request(request)
            .await
            .map_err(|e| ApiFailure::transport(format!("{method} {path} on {}: {e}", self.url())))
    }

    /// Sends a request and reads the whole answer, whatever its status.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Answer, ApiFailure> {
        let response = self.send(method.clone(), path, body).await?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_JSON_BODY)
            .collect()
            .await
            .map_err(|e| ApiFailure {
                status: Some(status),
                message: format!("reading the answer to {method} {path}: {e}"),
                body: None,
            })?
            .to_bytes();
        Ok(Answer { status, body })
    }

    /// Sends a request and reads a JSON answer; a non-2xx answer is a failure carrying the
    /// API's error message.
    pub async fn json(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, ApiFailure> {
        let answer = self.call(method.clone(), path, body).await?;
        let value: Result<Value, _> = serde_json::from_slice(&answer.body);
        if !answer.status.is_success() {
            let message = value
                .as_ref()
                .ok()
                .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
                .unwrap_or_else(|| answer.text());
            return Err(ApiFailure {
                status: Some(answer.status),
                message: format!("{method} {path}: {message}"),
                body: Some(answer.value()),
            });
        }
        value.map_err(|e| ApiFailure {
            status: Some(answer.status),
            message: format!("{method} {path} answered something that is not JSON: {e}"),
            body: Some(answer.value()),
        })
    }

    /// `POST /place_instance`: place `request` (`model_id`, `sharding`, `min_nodes`, ...).
    pub async fn place_instance(&self, request: &Value) -> Result<Value, ApiFailure> {
        self.json(Method::POST, "/place_instance", Some(request))
            .await
    }

    /// `POST /instance {"instance": ...}`: create an instance as given (a preview's).
    pub async fn create_instance(&self, instance: &Value) -> Result<Value, ApiFailure> {
        self.json(
            Method::POST,
            "/instance",
            Some(&json!({ "instance": instance })),
        )
        .await
    }

    /// `GET /instance/{id}`.
    pub async fn instance(&self, id: &str) -> Result<Value, ApiFailure> {
        let path = format!("/instance/{}", percent_encode(id));
        self.json(Method::GET, &path, None).await
    }

    /// `DELETE /instance/{id}`.
    pub async fn delete_instance(&self, id: &str) -> Result<Value, ApiFailure> {
        let path = format!("/instance/{}", percent_encode(id));
        self.json(Method::DELETE, &path, None).await
    }

    /// `GET /instance/previews?model_id=`: every placement of `model` and why others fail.
    pub async fn previews(&self, model: &str) -> Result<Value, ApiFailure> {
        let path = format!("/instance/previews?model_id={}", percent_encode(model));
        self.json(Method::GET, &path, None).await
    }

    /// `GET /state`: the node's view of the cluster.
    pub async fn state(&self) -> Result<Value, ApiFailure> {
        self.json(Method::GET, "/state", None).await
    }

    /// `GET /node_id`.
    pub async fn node_id(&self) -> Result<Value, ApiFailure> {
        self.json(Method::GET, "/node_id", None).await
    }

    /// `GET /v1/models`.
    pub async fn models(&self) -> Result<Value, ApiFailure> {
        self.json(Method::GET, "/v1/models", None).await
    }

    /// Whether `/v1/models` lists `model` as ready (`false` while the node does not answer).
    pub async fn model_ready(&self, model: &str) -> bool {
        self.models().await.is_ok_and(|models| {
            models["data"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|m| m["id"] == model && m["ready"] == true)
        })
    }

    /// `POST /v1/chat/completions` without streaming.
    pub async fn chat(&self, body: &Value) -> Result<Value, ApiFailure> {
        self.json(Method::POST, "/v1/chat/completions", Some(body))
            .await
    }

    /// `POST /v1/chat/completions` with `"stream": true` in `body`: the stream of events, once
    /// the answer is 2xx.
    pub async fn chat_stream(&self, body: &Value) -> Result<ChatStream, ApiFailure> {
        let path = "/v1/chat/completions";
        let response = self.send(Method::POST, path, Some(body)).await?;
        let status = response.status();
        if !status.is_success() {
            let bytes = Limited::new(response.into_body(), MAX_JSON_BODY)
                .collect()
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
            let answer = Answer {
                status,
                body: bytes,
            };
            let message = answer.value()["error"]["message"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| answer.text());
            return Err(ApiFailure {
                status: Some(status),
                message: format!("POST {path}: {message}"),
                body: Some(answer.value()),
            });
        }
        Ok(ChatStream {
            body: response.into_body(),
            reader: SseReader::new(),
            pending: std::collections::VecDeque::new(),
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
        let mut stream = self.chat_stream(body).await.map_err(|e| e.to_string())?;
        let mut timing = StreamTiming::default();
        while let Some(event) = stream.next().await? {
            if timing.on_event(event, started.elapsed())? {
                return timing.finish();
            }
        }
        Err(if stream.cut_off() {
            "the chat stream was cut off in the middle of an event".into()
        } else {
            "the chat stream ended without `data: [DONE]`".into()
        })
    }
}

/// The events of a chat stream as they come.
pub struct ChatStream {
    body: Incoming,
    reader: SseReader,
    pending: std::collections::VecDeque<SseEvent>,
}

impl ChatStream {
    /// The next event; `None` when the body ended (see [`ChatStream::cut_off`]).
    pub async fn next(&mut self) -> Result<Option<SseEvent>, String> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Ok(Some(event));
            }
            let Some(frame) = self.body.frame().await else {
                return Ok(None);
            };
            let frame = frame.map_err(|e| format!("the chat stream broke: {e}"))?;
            if let Some(data) = frame.data_ref() {
                self.pending.extend(self.reader.push(data)?);
            }
        }
    }

    /// Whether the body ended in the middle of an event.
    pub fn cut_off(&self) -> bool {
        self.reader.has_partial_event()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_urls() {
        let authority = |u: &str| Api::parse(u, 52415).map(|a| a.authority);
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
            assert!(Api::parse(bad, 52415).is_err(), "{bad}");
        }
    }

    #[test]
    fn percent_encoding_keeps_unreserved() {
        assert_eq!(percent_encode("org/Model-1.5_b~"), "org%2FModel-1.5_b~");
        assert_eq!(percent_encode("a b#"), "a%20b%23");
    }
}
