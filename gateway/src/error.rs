//! API errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, each with
//! the HTTP status that tells a client what went wrong and whether retrying can help.

use hyper::StatusCode;
use serde_json::{json, Map, Value};
use std::fmt;

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

    /// The `{"error": {...}}` body; absent param and code are omitted, as clients expect
    /// no null fields.
    pub fn to_json(&self) -> Value {
        let mut inner = Map::new();
        inner.insert("message".into(), Value::String(self.message.clone()));
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

    #[test]
    fn absent_param_is_omitted() {
        let j = ApiError::internal("boom").to_json();
        assert!(j["error"].get("param").is_none());
        assert!(j["error"].get("code").is_none());
        assert_eq!(j["error"]["type"], "server_error");
    }
}
