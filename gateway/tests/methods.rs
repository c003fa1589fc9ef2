//! HEAD on every GET route answers as GET would (status and headers), without a body; on a
//! POST route it is a 405 naming the methods, as GET is.

mod common;

use common::*;
use gateway::GatewayConfig;
use hyper::StatusCode;
use std::time::Duration;

#[tokio::test]
async fn head_answers_like_get_without_a_body() {
    let s = start(Duration::ZERO, GatewayConfig::default()).await;
    for path in [
        "/v1/models",
        "/node_id",
        "/state",
        "/api/tags",
        "/api/version",
        "/ollama/api/ps",
    ] {
        let (get_status, get_headers, get_body) = call(s.addr, "GET", path, "").await;
        let (status, headers, body) = call(s.addr, "HEAD", path, "").await;
        assert_eq!(get_status, StatusCode::OK, "{path}");
        assert_eq!(status, get_status, "{path}");
        assert_eq!(
            headers["content-type"], get_headers["content-type"],
            "{path}"
        );
        assert!(!get_body.is_empty(), "{path}");
        assert!(body.is_empty(), "{path}: HEAD sent a body");
    }
    let (status, headers, body) = call(s.addr, "HEAD", "/v1/messages", "").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(headers["allow"], "POST, OPTIONS");
    assert!(body.is_empty());
    let (status, headers, _) = call(s.addr, "GET", "/v1/models", "").await;
    assert_eq!(status, StatusCode::OK);
    // No Origin (not a browser): no CORS header is needed or sent.
    assert!(headers.get("access-control-allow-origin").is_none());
}
