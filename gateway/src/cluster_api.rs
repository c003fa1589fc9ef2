//! The cluster API: `GET /node_id` (this node's id as a JSON string; other nodes probe it to
//! verify edges) and `GET /state` (the whole replicated state as JSON, keys in order).

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use std::sync::Arc;
use tokio::net::TcpListener;

/// Where the cluster API reads from (the running mesh; a fake in tests).
pub trait ClusterSource: Send + Sync + 'static {
    /// This node's id, 64 hex digits.
    fn node_id(&self) -> String;
    /// The replicated state as JSON.
    fn state(&self) -> serde_json::Value;
}

impl ClusterSource for mesh::Mesh {
    fn node_id(&self) -> String {
        self.id().to_string()
    }

    fn state(&self) -> serde_json::Value {
        self.state_json()
    }
}

fn json(status: StatusCode, value: &serde_json::Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(value.to_string())));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    headers.insert(
        hyper::header::ACCESS_CONTROL_ALLOW_ORIGIN,
        hyper::header::HeaderValue::from_static("*"),
    );
    response
}

fn error(status: StatusCode, message: &str, kind: &str) -> Response<Full<Bytes>> {
    json(
        status,
        &serde_json::json!({"error": {"message": message, "type": kind, "param": null, "code": null}}),
    )
}

/// Answers one request.
pub fn handle(source: &dyn ClusterSource, method: &Method, path: &str) -> Response<Full<Bytes>> {
    match (method, path) {
        (&Method::GET, "/node_id") => json(StatusCode::OK, &serde_json::json!(source.node_id())),
        (&Method::GET, "/state") => json(StatusCode::OK, &source.state()),
        (_, "/node_id" | "/state") => error(
            StatusCode::METHOD_NOT_ALLOWED,
            &format!("{method} {path} is not supported; use GET"),
            "invalid_request_error",
        ),
        _ => error(
            StatusCode::NOT_FOUND,
            &format!("no route for {method} {path}; try GET /node_id or GET /state"),
            "not_found_error",
        ),
    }
}

/// Serves the cluster API on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, source: Arc<dyn ClusterSource>) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let source = source.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let response = handle(source.as_ref(), request.method(), request.uri().path());
                async move { Ok::<_, std::convert::Infallible>(response) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await
            {
                tracing::debug!("HTTP connection ended: {e}");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    struct Fake;

    impl ClusterSource for Fake {
        fn node_id(&self) -> String {
            "ab".repeat(32)
        }

        fn state(&self) -> serde_json::Value {
            serde_json::json!({"nodes": {"b": 1, "a": 2}})
        }
    }

    async fn body(response: Response<Full<Bytes>>) -> String {
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn routes() {
        let r = handle(&Fake, &Method::GET, "/node_id");
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(body(r).await, format!("\"{}\"", "ab".repeat(32)));
        let r = handle(&Fake, &Method::GET, "/state");
        assert_eq!(body(r).await, "{\"nodes\":{\"a\":2,\"b\":1}}");
        let r = handle(&Fake, &Method::POST, "/state");
        assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
        let r = handle(&Fake, &Method::GET, "/nope");
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
        assert!(body(r).await.contains("\"error\""));
    }

    #[tokio::test]
    async fn serves_over_tcp_and_the_probe_client_reads_it() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve(listener, Arc::new(Fake)));
        let (status, body) =
            mesh::probe::http_get(addr, "/node_id", std::time::Duration::from_secs(2))
                .await
                .unwrap();
        assert_eq!(status, 200);
        assert_eq!(
            String::from_utf8(body).unwrap(),
            format!("\"{}\"", "ab".repeat(32))
        );
        server.abort();
    }
}
