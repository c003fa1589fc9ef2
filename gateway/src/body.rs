//! The response body type: a whole buffer, or an SSE stream fed by a generation task.

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Response, StatusCode};
use serde_json::Value;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::mpsc;
use tokio_util::sync::DropGuard;

/// Every response the gateway sends has this body.
#[derive(Debug)]
pub enum GatewayBody {
    /// A complete body (JSON, or empty).
    Full(Option<Bytes>),
    /// Server-sent events produced by a task, see [`SseBody`].
    Sse(SseBody),
}

impl GatewayBody {
    /// A complete body.
    pub fn full(bytes: impl Into<Bytes>) -> GatewayBody {
        GatewayBody::Full(Some(bytes.into()))
    }

    /// No body.
    pub fn empty() -> GatewayBody {
        GatewayBody::Full(None)
    }
}

/// An event stream. Its producer task sends ready-framed SSE bytes; when the client goes away,
/// hyper drops this body and the drop guard cancels the generation behind it. When the
/// producer finishes normally (the channel closes), the guard is disarmed first, so a complete
/// answer is not reported as cancelled.
#[derive(Debug)]
pub struct SseBody {
    events: mpsc::Receiver<Bytes>,
    cancel_on_drop: Option<DropGuard>,
}

impl SseBody {
    /// A body reading `events`; `cancel_on_drop` fires if the body is dropped before the end.
    pub fn new(events: mpsc::Receiver<Bytes>, cancel_on_drop: DropGuard) -> SseBody {
        SseBody {
            events,
            cancel_on_drop: Some(cancel_on_drop),
        }
    }
}

impl Body for GatewayBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            GatewayBody::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            GatewayBody::Sse(sse) => match sse.events.poll_recv(cx) {
                Poll::Ready(Some(bytes)) => Poll::Ready(Some(Ok(Frame::data(bytes)))),
                Poll::Ready(None) => {
                    if let Some(guard) = sse.cancel_on_drop.take() {
                        guard.disarm();
                    }
                    Poll::Ready(None)
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, GatewayBody::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            GatewayBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            GatewayBody::Full(None) => SizeHint::with_exact(0),
            GatewayBody::Sse(_) => SizeHint::default(),
        }
    }
}

/// A JSON response with this status.
pub fn json_response(status: StatusCode, value: &Value) -> Response<GatewayBody> {
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    let mut response = Response::new(GatewayBody::full(bytes));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}
