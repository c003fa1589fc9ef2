//! The HTTP client under the hub protocol: hyper over TCP, with TLS (rustls, Mozilla's roots)
//! for `https://` endpoints such as huggingface.co and plain HTTP for a local mirror; bounded
//! waits, bounded bodies, and the origin rules the hub's redirects need.

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

/// Longest wait to connect.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for a response's headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait for the next chunk of a body before the transfer counts as stalled.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(30);

/// An HTTP(S) client.
#[derive(Clone)]
pub struct Http {
    client: Client<hyper_rustls::HttpsConnector<HttpConnector>, Empty<Bytes>>,
}

impl std::fmt::Debug for Http {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Http")
    }
}

impl Http {
    /// A client for `http://` and `https://` URLs.
    pub fn new() -> Result<Http, String> {
        let mut tcp = HttpConnector::new();
        tcp.enforce_http(false);
        tcp.set_connect_timeout(Some(CONNECT_TIMEOUT));
        tcp.set_nodelay(true);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
            .map_err(|e| format!("cannot set up TLS: {e}"))?
            .https_or_http()
            .enable_http1()
            .wrap_connector(tcp);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(https);
        Ok(Http { client })
    }

    /// Sends `method url` with `headers`; the response's headers arrive within
    /// [`HEADER_TIMEOUT`]. Redirects are not followed (the caller decides, by origin).
    pub async fn send(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, String)],
    ) -> Result<Response<Incoming>, String> {
        let uri: Uri = url.parse().map_err(|e| format!("bad URL {url}: {e}"))?;
        let mut req = Request::builder().method(method).uri(uri);
        req = req.header("user-agent", concat!("shoal/", env!("CARGO_PKG_VERSION")));
        for (k, v) in headers {
            req = req.header(*k, v);
        }
        let req = req
            .body(Empty::new())
            .map_err(|e| format!("bad request to {url}: {e}"))?;
        match tokio::time::timeout(HEADER_TIMEOUT, self.client.request(req)).await {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(e)) => Err(describe(&e)),
            Err(_) => Err(format!("no answer within {HEADER_TIMEOUT:?}")),
        }
    }
}

/// What hyper-util's connector calls a failed name lookup; [`describe`] keeps it in the text.
const DNS_FAILURE: &str = "dns error";

/// Whether a [`Http::send`] error says the host name did not resolve. On a machine without a
/// route to its DNS server (an offline box, a namespace) that answer comes back at once and
/// does not change on a retry, so the caller gives up early instead of backing off for half a
/// minute.
pub fn is_unresolved(error: &str) -> bool {
    error.contains(DNS_FAILURE)
}

/// The error and its causes on one line.
fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}

/// Reads a whole body of at most `limit` bytes.
pub async fn read_limited(mut body: Incoming, limit: usize) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let frame = match tokio::time::timeout(STALL_TIMEOUT, body.frame()).await {
            Err(_) => return Err(format!("the answer stalled for {STALL_TIMEOUT:?}")),
            Ok(None) => return Ok(out),
            Ok(Some(Err(e))) => return Err(format!("the answer broke off: {e}")),
            Ok(Some(Ok(f))) => f,
        };
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > limit {
                return Err(format!("the answer is larger than {limit} bytes"));
            }
            out.extend_from_slice(&data);
        }
    }
}

/// A header's value as text, if present and readable.
pub fn header(resp: &Response<Incoming>, name: &str) -> Option<String> {
    resp.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// `scheme://host:port` of an absolute URL (the port made explicit), if it is one.
pub fn origin(url: &str) -> Option<String> {
    let uri: Uri = url.parse().ok()?;
    let scheme = uri.scheme_str()?.to_ascii_lowercase();
    let host = uri.host()?.to_ascii_lowercase();
    let port = uri.port_u16().unwrap_or(match scheme.as_str() {
        "https" => 443,
        _ => 80,
    });
    Some(format!("{scheme}://{host}:{port}"))
}

/// `location` (absolute, or a path on the same origin) against the URL it came from.
pub fn join(base: &str, location: &str) -> Option<String> {
    if origin(location).is_some() {
        return Some(location.to_string());
    }
    if !location.starts_with('/') || location.starts_with("//") {
        return None;
    }
    let uri: Uri = base.parse().ok()?;
    let authority = uri.authority()?;
    Some(format!("{}://{authority}{location}", uri.scheme_str()?))
}

/// Percent-encodes a repo file path for a URL (keeping `/`).
pub fn encode_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn origins_include_the_port() {
        assert_eq!(
            origin("https://huggingface.co/x").unwrap(),
            "https://huggingface.co:443"
        );
        assert_eq!(
            origin("http://10.0.0.1:8080/a").unwrap(),
            "http://10.0.0.1:8080"
        );
        assert_ne!(origin("http://h:1/a"), origin("http://h:2/a"));
        assert_eq!(origin("/relative"), None);
        assert_eq!(join("http://h:1/a/b?c", "/x/y").unwrap(), "http://h:1/x/y");
        assert_eq!(
            join("http://h:1/a", "http://cdn:2/z").unwrap(),
            "http://cdn:2/z"
        );
        assert_eq!(join("http://h:1/a", "//evil/x"), None);
        assert_eq!(encode_path("a b/c%.json"), "a%20b/c%25.json");
    }

    proptest! {
        #[test]
        fn url_helpers_never_panic(a in ".{0,120}", b in ".{0,120}") {
            let _ = origin(&a);
            let _ = join(&a, &b);
            let _ = encode_path(&a);
        }
    }
}
