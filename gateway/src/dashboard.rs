//! The dashboard's files, built into the binary: `GET /` is its page, `GET /dashboard/{file}`
//! its scripts and style sheet (`gateway/dashboard/`). Plain ES modules and CSS, no build
//! step and nothing fetched from elsewhere, so the page works on a cluster with no internet.
//! The page talks only to this node's own API (`/events`, `/state`, `/instance/...`,
//! `/v1/...`); the content security policy holds it to that.

use crate::body::GatewayBody;
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use hyper::{Response, StatusCode};

/// One file of the dashboard.
pub struct File {
    /// Its name under `/dashboard/` (the page itself is `index.html`, served at `/`).
    pub name: &'static str,
    /// Its `Content-Type`.
    pub content_type: &'static str,
    /// Its bytes.
    pub body: &'static str,
}

macro_rules! asset {
    ($name:literal, $type:expr) => {
        File {
            name: $name,
            content_type: $type,
            body: include_str!(concat!("../dashboard/", $name)),
        }
    };
}

const JS: &str = "text/javascript; charset=utf-8";

/// Every file of the dashboard.
pub const FILES: &[File] = &[
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("style.css", "text/css; charset=utf-8"),
    asset!("app.js", JS),
    asset!("api.js", JS),
    asset!("dom.js", JS),
    asset!("cluster.js", JS),
    asset!("topology.js", JS),
    asset!("instances.js", JS),
    asset!("place.js", JS),
    asset!("chat.js", JS),
    asset!("downloads.js", JS),
];

/// The page's policy: its own scripts, styles and API only; no frames, no plugins.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The file called `name` (`index.html` for the page), if the dashboard has it.
pub fn find(name: &str) -> Option<&'static File> {
    FILES.iter().find(|f| f.name == name)
}

/// The response for `file`.
pub fn response(file: &File) -> Response<GatewayBody> {
    let mut response = Response::new(GatewayBody::full(file.body.as_bytes()));
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(file.content_type));
    // A node upgraded in place serves new files at once.
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert("content-security-policy", HeaderValue::from_static(CSP));
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_and_its_modules_are_there_and_small() {
        let total: usize = FILES.iter().map(|f| f.body.len()).sum();
        assert!(total < 1 << 20, "the dashboard is {total} bytes");
        assert!(find("index.html")
            .unwrap()
            .body
            .contains("<title>shoal</title>"));
        assert!(find("").is_none());
        assert!(find("../Cargo.toml").is_none());
        assert!(find("nothing.js").is_none());
        // Every module the page imports is served.
        for file in FILES.iter().filter(|f| f.name.ends_with(".js")) {
            for line in file.body.lines() {
                let Some(rest) = line.trim().strip_prefix("import ") else {
                    continue;
                };
                let Some(start) = rest.find("'./") else {
                    continue;
                };
                let target = &rest[start + 3..];
                let target = &target[..target.find('\'').unwrap()];
                assert!(find(target).is_some(), "{} imports {target}", file.name);
            }
        }
    }
}
