//! A gateway over the scripted fake backend, for trying clients by hand:
//!
//! ```sh
//! cargo run -p gateway --example fake_server -- 52415
//! curl -N http://127.0.0.1:52415/v1/chat/completions -H 'content-type: application/json' \
//!   -d '{"model": "fake/model", "stream": true, "messages": [{"role": "user", "content": "echo: hi"}]}'
//! ```
//!
//! Binds 127.0.0.1 only. The optional second argument is the per-token delay in milliseconds.

use gateway::fake::FakeBackend;
use gateway::{CancellationToken, GatewayConfig};
use std::sync::Arc;
use std::time::Duration;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let port: u16 = args.next().and_then(|p| p.parse().ok()).unwrap_or(52415);
    let delay_ms: u64 = args.next().and_then(|d| d.parse().ok()).unwrap_or(30);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    eprintln!("fake gateway on http://{}", listener.local_addr()?);
    let backend = Arc::new(FakeBackend::new(Duration::from_millis(delay_ms)));
    gateway::serve(
        listener,
        backend,
        GatewayConfig::default(),
        CancellationToken::new(),
    )
    .await
}
