//! The HTTP server: accepts connections on a listener and serves each on its own task with
//! hyper's HTTP/1.1. Nothing here serialises requests; concurrency is the backend's to manage.

use crate::backend::Backend;
use crate::config::GatewayConfig;
use crate::router::Router;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The port every node serves on (exo's).
pub const DEFAULT_API_PORT: u16 = 52415;

/// Serves the gateway on `listener` until `shutdown` fires. Connections already open when it
/// fires are left to finish on their own tasks.
pub async fn serve(
    listener: TcpListener,
    backend: Arc<dyn Backend>,
    config: GatewayConfig,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let router = Router::new(backend, config);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.cancelled() => return Ok(()),
        };
        let (stream, peer) = match accepted {
            Ok(conn) => conn,
            Err(e) => {
                // Out of file descriptors and the like: wait a little rather than spin.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
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
        });
    }
}
