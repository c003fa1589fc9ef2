//! The HTTP server: accepts connections on a listener and serves each on its own task with
//! hyper's HTTP/1.1, at most [`GatewayConfig::max_connections`] at once. Nothing here
//! serialises requests; concurrency is the backend's to manage.

use crate::access::AccessPolicy;
use crate::backend::Backend;
use crate::config::GatewayConfig;
use crate::router::Router;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// The port every node serves on (exo's).
pub const DEFAULT_API_PORT: u16 = 52415;

/// The whole answer to a connection over the cap.
const TOO_MANY_CONNECTIONS: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
content-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: 155\r\n\r\n\
{\"error\":{\"message\":\"this node has as many connections open as it serves; retry shortly\",\
\"type\":\"service_unavailable_error\",\"code\":\"too_many_connections\"}}";

/// Serves the gateway on `listener` until `shutdown` fires, open to every client (no API
/// keys). Connections already open when it fires are left to finish on their own tasks.
pub async fn serve(
    listener: TcpListener,
    backend: Arc<dyn Backend>,
    config: GatewayConfig,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    serve_with(listener, backend, config, AccessPolicy::default(), shutdown).await
}

/// [`serve`], enforcing `access` (API keys and browser origins). When `shutdown` fires the
/// listener is closed and the answers in flight get [`GatewayConfig::drain_grace`] to finish
/// (see [`crate::drain`]); this returns once they ended or were cut.
pub async fn serve_with(
    listener: TcpListener,
    backend: Arc<dyn Backend>,
    config: GatewayConfig,
    access: AccessPolicy,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let router = Router::with_access(backend, config, access);
    let slots = Arc::new(Semaphore::new(config.max_connections));
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.cancelled() => break,
        };
        let (mut stream, peer) = match accepted {
            Ok(conn) => conn,
            Err(e) => {
                // Out of file descriptors and the like: wait a little rather than spin.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "connection refused: at the connection cap");
            tokio::spawn(async move {
                let write = stream.write_all(TOO_MANY_CONNECTIONS);
                let _ = tokio::time::timeout(Duration::from_secs(1), write).await;
                let _ = stream.shutdown().await;
            });
            continue;
        };
        let router = router.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let router = router.clone();
                async move { Ok::<_, Infallible>(router.handle(request).await) }
            });
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(config.header_read_timeout)
                .serve_connection(TokioIo::new(stream), service);
            if let Err(e) = connection.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
            drop(slot);
        });
    }
    // New connections are refused from here on; requests on open ones get 503.
    drop(listener);
    let drain = router.drain();
    let in_flight = drain.in_flight();
    if in_flight > 0 {
        tracing::info!(
            in_flight,
            grace_s = config.drain_grace.as_secs_f64(),
            "stopping: letting the answers in flight finish"
        );
    }
    let cut = drain.drain(config.drain_grace).await;
    if cut > 0 {
        tracing::warn!(
            cut,
            grace_s = config.drain_grace.as_secs_f64(),
            "stopping: answers still running at the end of the drain period were ended with a \
             node_stopping error"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn refusal_announces_its_length() {
        let text = std::str::from_utf8(super::TOO_MANY_CONNECTIONS).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{}",
            body.len()
        );
        serde_json::from_str::<serde_json::Value>(body).unwrap();
    }
}
