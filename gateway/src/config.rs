//! The gateway's settings: body limit, keep-alive and silence limits, header and body timeouts,
//! the body budget and connection cap, and the limits of the dashboard's event streams.

use std::time::Duration;

/// Settings of the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatewayConfig {
    /// Largest request body accepted; larger ones get 413. Default 32 MiB, room for prompts
    /// of a few hundred thousand tokens.
    pub body_limit: usize,
    /// How long a stream may stay silent before a `: keep-alive` comment is sent (default
    /// 10 s, as exo), so proxies and clients do not time out while a request waits in a
    /// queue or a long prompt is processed.
    pub keep_alive_interval: Duration,
    /// How long a chat may go without any event from the backend (no first token while
    /// queued or prefilling, or no next token) before it is answered as a lost instance.
    /// A safety net so that a client never waits forever on a backend that lost track of a
    /// request; the backend should report lost instances itself, long before this. Default
    /// 10 minutes, above exo's longest model-side timeouts.
    pub backend_silence_limit: Duration,
    /// How long a client may take to send its request headers.
    pub header_read_timeout: Duration,
    /// How long a client may take to send a request body once its headers are in (default
    /// 60 s); a body still unfinished then is answered 408 and its connection closed, so
    /// half-sent bodies cannot pile up.
    pub body_timeout: Duration,
    /// Request-body bytes held at once, all connections together (default 64 MiB: two bodies
    /// of the largest size). A body that does not fit now is answered 429 with `Retry-After`
    /// instead of growing the node's memory; chats are a few KiB, so this only bites a flood
    /// of huge bodies.
    pub body_budget: usize,
    /// Connections open at once (default 512). One more is answered 503 with `Retry-After`
    /// and closed, so a flood of connections cannot exhaust tasks or file descriptors.
    pub max_connections: usize,
    /// The dashboard's state streams (`GET /events`), see [`crate::events`].
    pub events: EventsConfig,
    /// When the node stops, how long the answers in flight may take to finish before they
    /// are ended with a `node_stopping` error (default 10 s, `shoal --drain-seconds`): long
    /// enough for most chats to end, short enough for an init system's stop timeout.
    pub drain_grace: Duration,
}

/// Limits and timings of `GET /events`: a node must stay responsive however many dashboards
/// are open and however slowly they read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventsConfig {
    /// Streams open at once; one more is refused with 429 (default 32: a few dashboards per
    /// person on a small cluster, far below what hurts a node).
    pub max_streams: usize,
    /// How often the state is read while a stream is open (default 250 ms), so a node that
    /// dies shows so within about a second of this node noticing.
    pub poll_interval: Duration,
    /// A `: heartbeat` comment after this much silence (default 15 s), so proxies keep the
    /// stream open and the page can tell a quiet cluster from a lost connection.
    pub heartbeat: Duration,
    /// A client that leaves its events unread this long (its buffer full) is disconnected
    /// (default 30 s); the page reconnects and gets the whole state again.
    pub send_timeout: Duration,
}

impl Default for EventsConfig {
    fn default() -> EventsConfig {
        EventsConfig {
            max_streams: 32,
            poll_interval: Duration::from_millis(250),
            heartbeat: Duration::from_secs(15),
            send_timeout: Duration::from_secs(30),
        }
    }
}

impl Default for GatewayConfig {
    fn default() -> GatewayConfig {
        GatewayConfig {
            body_limit: 32 * 1024 * 1024,
            keep_alive_interval: Duration::from_secs(10),
            backend_silence_limit: Duration::from_secs(600),
            header_read_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(60),
            body_budget: 64 * 1024 * 1024,
            max_connections: 512,
            events: EventsConfig::default(),
            drain_grace: Duration::from_secs(10),
        }
    }
}
