//! `GET /events`: the cluster's state as server-sent events, so the dashboard sees a change
//! (a node dying, a runner becoming ready, a download advancing) within a moment, without
//! polling every endpoint itself.
//!
//! Each event is the whole state, as `GET /state` answers it, less what changes on every read
//! (the `stats` counters and each node's `phi` suspicion level), so a quiet cluster sends
//! nothing but heartbeats:
//!
//! ```text
//! retry: 2000
//!
//! id: 1
//! event: state
//! data: {"node_id": "...", "nodes": {...}, "liveness": {...}, "instances": {...}}
//!
//! : heartbeat
//! ```
//!
//! One reader task per [`Events`] reads the state every `poll_interval` while at least one
//! stream is open, into a watch channel that keeps only the latest state: a slow client skips
//! the states it had no time for instead of queueing them. Each stream has a small buffer of
//! framed events; a client that leaves it full for `send_timeout` is disconnected. At most
//! `max_streams` streams are open at once (more get 429 with `Retry-After`). When the client
//! goes away its stream task ends and frees its slot.

use crate::backend::Backend;
use crate::body::{GatewayBody, SseBody};
use crate::config::EventsConfig;
use crate::error::{ApiError, ErrorKind};
use bytes::Bytes;
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use hyper::Response;
use serde_json::Value;
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// Framed events a stream may hold unsent before its client counts as not reading.
pub const STREAM_BUFFER: usize = 4;

/// The state streams of one gateway: cheap to clone.
#[derive(Clone)]
pub struct Events {
    shared: Arc<Shared>,
}

struct Shared {
    backend: Arc<dyn Backend>,
    config: EventsConfig,
    /// The latest state's text, as the reader last saw it.
    latest: watch::Sender<Option<Arc<str>>>,
    counts: Mutex<Counts>,
}

#[derive(Default)]
struct Counts {
    /// Streams open now.
    streams: usize,
    /// Whether the reader task runs.
    reading: bool,
}

/// A stream's place among the open ones; freed on drop.
struct Slot(Arc<Shared>);

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.0.counts.lock().unwrap_or_else(|e| e.into_inner());
        counts.streams = counts.streams.saturating_sub(1);
    }
}

impl Events {
    /// The streams over `backend`'s state.
    pub fn new(backend: Arc<dyn Backend>, config: EventsConfig) -> Events {
        Events {
            shared: Arc::new(Shared {
                backend,
                config,
                latest: watch::channel(None).0,
                counts: Mutex::default(),
            }),
        }
    }

    /// Streams open now.
    pub fn open_streams(&self) -> usize {
        self.shared
            .counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .streams
    }

    /// Opens one stream: its response, or 429 when `max_streams` are open.
    pub fn open(&self) -> Result<Response<GatewayBody>, ApiError> {
        let slot = {
            let mut counts = self.shared.counts.lock().unwrap_or_else(|e| e.into_inner());
            if counts.streams >= self.shared.config.max_streams {
                return Err(ApiError::new(
                    ErrorKind::Busy,
                    format!(
                        "this node already serves {} event streams, its limit; close a \
                         dashboard tab or retry in a moment (see Retry-After)",
                        counts.streams
                    ),
                )
                .with_code("too_many_streams"));
            }
            counts.streams += 1;
            if !counts.reading {
                counts.reading = true;
                tokio::spawn(read_state(self.shared.clone()));
            }
            Slot(self.shared.clone())
        };
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let cancel = CancellationToken::new();
        let body = SseBody::new(rx, cancel.clone().drop_guard());
        tokio::spawn(stream(slot, tx, cancel));
        let mut response = Response::new(GatewayBody::Sse(body));
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        Ok(response)
    }
}

/// The state as the events carry it: `/state` less `stats` and the liveness `phi` values.
pub fn event_state(mut state: Value) -> Value {
    if let Some(map) = state.as_object_mut() {
        map.remove("stats");
        if let Some(liveness) = map.get_mut("liveness").and_then(Value::as_object_mut) {
            for entry in liveness.values_mut() {
                if let Some(entry) = entry.as_object_mut() {
                    entry.remove("phi");
                }
            }
        }
    }
    state
}

async fn current(backend: &dyn Backend) -> Arc<str> {
    Arc::from(event_state(backend.state().await).to_string())
}

/// The reader: the latest state into the watch channel while any stream is open.
async fn read_state(shared: Arc<Shared>) {
    loop {
        let text = current(&*shared.backend).await;
        shared.latest.send_if_modified(|latest| {
            if latest.as_deref() == Some(&*text) {
                false
            } else {
                *latest = Some(text);
                true
            }
        });
        tokio::time::sleep(shared.config.poll_interval).await;
        let mut counts = shared.counts.lock().unwrap_or_else(|e| e.into_inner());
        if counts.streams == 0 {
            counts.reading = false;
            return;
        }
    }
}

/// One event, framed.
fn frame(id: u64, state: &str) -> Bytes {
    Bytes::from(format!("id: {id}\nevent: state\ndata: {state}\n\n"))
}

/// One client's stream: the state now, then each change, heartbeats in the silences; ends
/// when the client goes away (`cancel`) or stops reading.
async fn stream(slot: Slot, tx: mpsc::Sender<Bytes>, cancel: CancellationToken) {
    let shared = slot.0.clone();
    let config = shared.config;
    let mut changes = shared.latest.subscribe();
    let send = |bytes: Bytes| {
        let tx = tx.clone();
        async move {
            matches!(
                tokio::time::timeout(config.send_timeout, tx.send(bytes)).await,
                Ok(Ok(()))
            )
        }
    };
    // The client's first event is the state now, whatever the reader last saw (a new
    // receiver counts the channel's value as seen).
    let mut last = current(&*shared.backend).await;
    let mut id = 1;
    if !send(Bytes::from_static(b"retry: 2000\n\n")).await || !send(frame(id, &last)).await {
        return;
    }
    let mut heartbeat = tokio::time::interval_at(
        tokio::time::Instant::now() + config.heartbeat,
        config.heartbeat,
    );
    loop {
        let bytes = tokio::select! {
            () = cancel.cancelled() => return,
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
                let Some(text) = changes.borrow_and_update().clone() else { continue };
                if text == last {
                    continue;
                }
                last = text;
                id += 1;
                heartbeat.reset();
                frame(id, &last)
            }
            _ = heartbeat.tick() => Bytes::from_static(b": heartbeat\n\n"),
        };
        let sent = tokio::select! {
            () = cancel.cancelled() => return,
            sent = send(bytes) => sent,
        };
        if !sent {
            tracing::debug!("an event stream's client stopped reading; closing it");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_leave_out_what_changes_on_every_read() {
        let state = json!({
            "node_id": "a",
            "stats": {"sent": 12},
            "liveness": {"a": {"alive": true, "phi": 0.3}, "b": {"alive": false, "phi": 9.1}},
            "nodes": {"a": {"records": {}}},
        });
        assert_eq!(
            event_state(state),
            json!({
                "node_id": "a",
                "liveness": {"a": {"alive": true}, "b": {"alive": false}},
                "nodes": {"a": {"records": {}}},
            })
        );
        assert_eq!(event_state(json!([1])), json!([1]));
    }

    #[test]
    fn frames_are_one_sse_event() {
        assert_eq!(
            frame(3, r#"{"a":1}"#),
            Bytes::from("id: 3\nevent: state\ndata: {\"a\":1}\n\n")
        );
    }
}
