//! API errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, each with
//! the HTTP status that tells a client what went wrong and whether retrying can help.

use hyper::StatusCode;
use serde_json::{json, Map, Value};
use std::borrow::Cow;
use std::fmt;

/// Most bytes of a client's own input (a model name, a path, a field's value) that an error
/// message repeats: enough to recognise it, and a 1 MB model name no longer comes back as a
/// 1 MB 404.
pub const MAX_ECHO_BYTES: usize = 200;

/// Most bytes of an error message's own text that a client is sent, whoever wrote it: the
/// bound behind [`echo`] for messages built outside the gateway (a node's "every instance
/// failed" list, the model registry's errors) that may repeat input without it.
pub const MAX_MESSAGE_BYTES: usize = 8192;

/// `text` cut to at most `max_bytes` (at a character boundary), marked with "…" and its whole
/// length, when it is longer: the one bound every repeated input and every answered message
/// goes through.
pub fn bounded(text: &str, max_bytes: usize) -> Cow<'_, str> {
    if text.len() <= max_bytes {
        return Cow::Borrowed(text);
    }
    let mut cut = max_bytes;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    Cow::Owned(format!("{}… ({} bytes in all)", &text[..cut], text.len()))
}

/// A client's own input as an error message repeats it: whole up to [`MAX_ECHO_BYTES`], else
/// its start and its length ([`bounded`]).
pub fn echo(input: &str) -> Cow<'_, str> {
    bounded(input, MAX_ECHO_BYTES)
}

/// What kind of failure an [`ApiError`] is; it decides the HTTP status and the `type` field.
///
/// Between nodes (a forwarded chat's refusal or failure) it travels in snake case; a kind
/// this node does not know reads as `internal`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The request itself is wrong (malformed JSON, a missing or bad field): 400.
    InvalidRequest,
    /// A model, instance, path or state subtree that does not exist: 404.
    NotFound,
    /// The route exists but not with this method: 405.
    MethodNotAllowed,
    /// No API key, or one this node does not accept: 401 (with `WWW-Authenticate`).
    Unauthorized,
    /// The key (or the web page's origin) is known but not allowed this: 403.
    Forbidden,
    /// The request body did not arrive in time: 408.
    RequestTimeout,
    /// The request conflicts with the cluster's state (e.g. an instance id already taken): 409.
    Conflict,
    /// The body is larger than the configured limit: 413.
    PayloadTooLarge,
    /// The cluster cannot serve this now (no instance of the model yet, instance lost, not
    /// enough memory for a placement): 503. Retrying later, or doing what the message says,
    /// can help.
    Unavailable,
    /// The instance is at its limit (its batch and its wait queue are full): 429, with a
    /// `Retry-After` header ([`ApiError::retry_after_seconds`]).
    Busy,
    /// A bug or an unexpected failure inside the node: 500.
    #[serde(other)]
    Internal,
}

impl ErrorKind {
    /// The HTTP status this kind is answered with.
    pub fn status(self) -> StatusCode {
        match self {
            ErrorKind::InvalidRequest => StatusCode::BAD_REQUEST,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorKind::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorKind::Forbidden => StatusCode::FORBIDDEN,
            ErrorKind::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            ErrorKind::Conflict => StatusCode::CONFLICT,
            ErrorKind::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::Busy => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// OpenAI's `type` field: client mistakes are `invalid_request_error`, the rest are
    /// the server's.
    pub fn type_name(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest
            | ErrorKind::NotFound
            | ErrorKind::MethodNotAllowed
            | ErrorKind::Conflict
            | ErrorKind::PayloadTooLarge
            | ErrorKind::Unauthorized
            | ErrorKind::RequestTimeout => "invalid_request_error",
            ErrorKind::Forbidden => "permission_error",
            ErrorKind::Unavailable => "service_unavailable_error",
            ErrorKind::Busy => "rate_limit_error",
            ErrorKind::Internal => "server_error",
        }
    }
}

/// An error answered to an API client. The message says what happened and what to do.
///
/// Its serde form (`{"kind", "message", "param", "code"}`) is how a forwarded chat's error
/// travels back from the node that ran it; the client's answer is [`ApiError::to_json`]'s
/// OpenAI shape.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ApiError {
    /// Decides the status and the `type` field.
    pub kind: ErrorKind,
    /// A sentence for a person: what happened and what to do about it.
    pub message: String,
    /// The request field at fault, when there is one (OpenAI's `param`).
    #[serde(default)]
    pub param: Option<String>,
    /// A stable machine-readable code (`model_not_found`, `no_instance`, ...).
    #[serde(default)]
    pub code: Option<String>,
}

impl ApiError {
    /// An error of `kind` with a message and neither param nor code.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> ApiError {
        ApiError {
            kind,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// Names the request field at fault.
    pub fn with_param(mut self, param: impl Into<String>) -> ApiError {
        self.param = Some(param.into());
        self
    }

    /// Sets the machine-readable code.
    pub fn with_code(mut self, code: impl Into<String>) -> ApiError {
        self.code = Some(code.into());
        self
    }

    /// 400 about one field of the request.
    pub fn invalid_field(param: &str, message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::InvalidRequest, message).with_param(param)
    }

    /// 400: a required field is absent.
    pub fn missing_field(param: &str) -> ApiError {
        ApiError::invalid_field(param, format!("missing required field `{param}`"))
            .with_code("missing_required_parameter")
    }

    /// 404: the model is not known to the cluster; the message lists the models that exist so
    /// the user can pick one.
    pub fn model_not_found(model: &str, available: &[String]) -> ApiError {
        let model = echo(model);
        let list = if available.is_empty() {
            "none yet: place an instance with POST /place_instance".to_string()
        } else {
            available.join(", ")
        };
        ApiError::new(
            ErrorKind::NotFound,
            format!("model `{model}` does not exist in this cluster; available models: {list}"),
        )
        .with_param("model")
        .with_code("model_not_found")
    }

    /// 503: the model is known but no instance of it is running (or ready) yet.
    pub fn no_instance(model: &str) -> ApiError {
        let model = echo(model);
        ApiError::new(
            ErrorKind::Unavailable,
            format!(
                "no running instance of model `{model}` yet; create one with POST /place_instance \
                 {{\"model_id\": \"{model}\"}} (or wait until the one being loaded is ready, \
                 see GET /state) and retry"
            ),
        )
        .with_param("model")
        .with_code("no_instance")
    }

    /// 503: the instance serving a request failed or vanished while generating.
    pub fn instance_lost(detail: impl fmt::Display) -> ApiError {
        ApiError::new(
            ErrorKind::Unavailable,
            format!("the instance serving this request was lost: {detail}; retry the request"),
        )
        .with_code("instance_lost")
    }

    /// 500 for failures that are nobody's input's fault.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::Internal, message)
    }

    /// 429: the instance serving `model` has as many requests as it takes; retry shortly.
    pub fn busy(detail: impl fmt::Display) -> ApiError {
        ApiError::new(
            ErrorKind::Busy,
            format!("{detail}; retry in a moment (see Retry-After)"),
        )
        .with_code("rate_limit_exceeded")
    }

    /// Seconds a client should wait before retrying (the `Retry-After` header), for errors
    /// that a retry cures by itself.
    pub fn retry_after_seconds(&self) -> Option<u32> {
        match self.kind {
            ErrorKind::Busy => Some(1),
            _ => None,
        }
    }

    /// The HTTP status to answer with.
    pub fn status(&self) -> StatusCode {
        self.kind.status()
    }

    /// The message as a client is sent it: at most [`MAX_MESSAGE_BYTES`] of its text
    /// ([`bounded`]), whichever crate built it. Every API's error body takes it from here.
    pub fn client_message(&self) -> Cow<'_, str> {
        bounded(&self.message, MAX_MESSAGE_BYTES)
    }

    /// The `{"error": {...}}` body; absent param and code are omitted, as clients expect
    /// no null fields.
    pub fn to_json(&self) -> Value {
        let mut inner = Map::new();
        inner.insert("message".into(), self.client_message().into());
        inner.insert("type".into(), Value::String(self.kind.type_name().into()));
        if let Some(param) = &self.param {
            inner.insert("param".into(), Value::String(param.clone()));
        }
        if let Some(code) = &self.code {
            inner.insert("code".into(), Value::String(code.clone()));
        }
        json!({ "error": inner })
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.status())
    }
}

impl std::error::Error for ApiError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_not_found_lists_models() {
        let e = ApiError::model_not_found("x", &["a".into(), "b".into()]);
        assert_eq!(e.status(), StatusCode::NOT_FOUND);
        let j = e.to_json();
        assert_eq!(j["error"]["code"], "model_not_found");
        assert_eq!(j["error"]["param"], "model");
        assert!(j["error"]["message"].as_str().unwrap().contains("a, b"));
    }

    /// Echoed input keeps its first 200 bytes (cut at a character boundary) and its length;
    /// a 1 MB model name makes a 404 of a few hundred bytes, not of 1 MB.
    #[test]
    fn echoed_input_is_bounded() {
        assert_eq!(echo("short"), "short");
        let exact = "a".repeat(MAX_ECHO_BYTES);
        assert_eq!(echo(&exact), exact.as_str());
        let long = "é".repeat(150); // 300 bytes; byte 200 is a boundary, 201 is not
        assert_eq!(
            echo(&long),
            format!("{}… (300 bytes in all)", "é".repeat(100))
        );
        let odd = format!("a{}", "é".repeat(150)); // byte 200 falls inside a character
        assert_eq!(
            echo(&odd),
            format!("a{}… (301 bytes in all)", "é".repeat(99))
        );

        let huge = "m".repeat(1 << 20);
        let body = ApiError::model_not_found(&huge, &["a".into()])
            .to_json()
            .to_string();
        assert!(body.len() < 600, "{} bytes", body.len());
        assert!(body.contains(&format!("`{}… (1048576 bytes in all)`", &huge[..200])));
        let body = ApiError::no_instance(&huge).to_json().to_string();
        assert!(body.len() < 1000, "{} bytes", body.len());
    }

    /// A message built elsewhere that repeats input whole is still bounded when answered.
    #[test]
    fn answered_messages_are_bounded() {
        let e = ApiError::internal("x".repeat(1 << 20));
        let sent = e.to_json()["error"]["message"].as_str().unwrap().to_owned();
        assert_eq!(
            sent,
            format!("{}… (1048576 bytes in all)", "x".repeat(MAX_MESSAGE_BYTES))
        );
        assert_eq!(e.client_message(), sent);
    }

    #[test]
    fn absent_param_is_omitted() {
        let j = ApiError::internal("boom").to_json();
        assert!(j["error"].get("param").is_none());
        assert!(j["error"].get("code").is_none());
        assert_eq!(j["error"]["type"], "server_error");
    }
}
