//! The gateway's settings: body limit, keep-alive and silence limits, header timeout.

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
}

impl Default for GatewayConfig {
    fn default() -> GatewayConfig {
        GatewayConfig {
            body_limit: 32 * 1024 * 1024,
            keep_alive_interval: Duration::from_secs(10),
            backend_silence_limit: Duration::from_secs(600),
            header_read_timeout: Duration::from_secs(30),
        }
    }
}
