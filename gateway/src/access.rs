//! Who may use a node's API: API keys, and which web pages may call it from a browser.
//!
//! **Keys.** With no key configured every route is open, as exo's API is, so a fresh node
//! works with nothing typed. With keys, every route but `GET /node_id` and the dashboard's
//! static files needs one, sent as `Authorization: Bearer KEY` (OpenAI, Ollama and most
//! clients) or `x-api-key: KEY` (Anthropic's clients); the dashboard's state stream, which a
//! browser's `EventSource` opens without headers, also takes `?access_token=KEY`. Two kinds:
//! an **admin** key may do everything; a **chat** key may only chat (the chat, Messages,
//! Responses and Ollama routes, the model lists, cancel) and is refused with 403 on what
//! changes or reveals the cluster (state, events, placing, creating and deleting instances,
//! previews) — hand chat keys to users, admin keys to whoever runs the cluster. Keys are kept
//! only as SHA-256 digests and compared in constant time.
//!
//! **Browsers.** A web page on another site must not drive the API of a node it can reach
//! (any page open on a member machine reaches `127.0.0.1:52415`). A request that carries an
//! `Origin` (browsers add it to every cross-origin request and to every POST) is served only
//! when that origin is the node's own (the dashboard) or one given with `--cors-origin`;
//! others get 403 before anything runs, so a `text/plain` POST from a page can no longer place
//! or delete instances. "The node's own" means the `Host` the request was sent to, and only
//! when that host is an IP address or a local name (no dot, or `.local`, `.lan`,
//! `.home.arpa`, `.internal`): a page whose domain an attacker re-points at the node (DNS
//! rebinding) sends its own domain as `Host`, which is refused. `--cors-origin '*'` restores
//! the old open behaviour.

use crate::error::{echo, ApiError, ErrorKind};
use hyper::header::{HeaderValue, AUTHORIZATION, HOST, ORIGIN};
use hyper::HeaderMap;
use sha2::{Digest, Sha256};

/// What a route needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Open to anyone (`GET /node_id`, the dashboard's files).
    Public,
    /// Chatting: a chat or admin key.
    Chat,
    /// Changing or reading the cluster: an admin key.
    Admin,
}

/// What a presented key grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Grant {
    Chat,
    Admin,
}

/// A key's SHA-256 digest.
type Digest32 = [u8; 32];

/// Who sent a request, as far as the node can tell: the digest of the API key it presented,
/// or nobody in particular on a node without keys (or on a public route). A generation
/// remembers its caller so that only the same key may cancel it (`POST /v1/cancel/{id}`):
/// otherwise any holder of a chat key could stop another's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Caller(Option<Digest32>);

impl Caller {
    /// Whether a request from `self` may act on what `owner` started: always on a node
    /// without keys, else only with the same key.
    pub fn may_act_for(&self, owner: &Caller) -> bool {
        match (&owner.0, &self.0) {
            (None, _) => true,
            (Some(a), Some(b)) => equal(a, b),
            (Some(_), None) => false,
        }
    }
}

/// The node's access rules: its keys and the browser origins it serves besides its own.
#[derive(Debug, Clone, Default)]
pub struct AccessPolicy {
    admin: Vec<Digest32>,
    chat: Vec<Digest32>,
    /// Origins served from a browser besides the node's own, as `scheme://host[:port]`.
    origins: Vec<String>,
    /// `--cors-origin '*'`: any origin.
    any_origin: bool,
}

/// Why a key list could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError(pub String);

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for KeyError {}

impl AccessPolicy {
    /// A policy with these admin and chat keys and extra browser origins. Keys must be 16 to
    /// 512 printable ASCII characters without spaces (what a header carries intact); an
    /// origin is `*` or `scheme://host[:port]`.
    pub fn new(admin: &[String], chat: &[String], origins: &[String]) -> Result<Self, KeyError> {
        let digest = |key: &String| -> Result<Digest32, KeyError> {
            check_key(key)?;
            Ok(Sha256::digest(key.as_bytes()).into())
        };
        let mut policy = AccessPolicy {
            admin: admin.iter().map(digest).collect::<Result<_, _>>()?,
            chat: chat.iter().map(digest).collect::<Result<_, _>>()?,
            ..AccessPolicy::default()
        };
        for origin in origins {
            let origin = origin.trim().trim_end_matches('/');
            if origin == "*" {
                policy.any_origin = true;
            } else if origin.starts_with("http://") || origin.starts_with("https://") {
                policy.origins.push(origin.to_ascii_lowercase());
            } else {
                return Err(KeyError(format!(
                    "`{origin}` is not an origin; give `*` or scheme://host[:port], such as \
                     http://192.168.1.20:3000"
                )));
            }
        }
        Ok(policy)
    }

    /// Whether any key is set (when none is, every route is open).
    pub fn has_keys(&self) -> bool {
        !self.admin.is_empty() || !self.chat.is_empty()
    }

    /// Refuses a request from a browser page of a foreign origin (403), see the module docs.
    /// Returns the value for `Access-Control-Allow-Origin`, if the answer should carry one.
    pub fn check_origin(&self, headers: &HeaderMap) -> Result<Option<HeaderValue>, ApiError> {
        let Some(origin) = headers.get(ORIGIN) else {
            // No Origin: not a browser, or a same-origin navigation. A browser that sends
            // Sec-Fetch-Site still tells a cross-site form post apart.
            let cross = headers
                .get("sec-fetch-site")
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v == "cross-site");
            if cross && !self.any_origin {
                return Err(foreign_origin("(none; the browser says cross-site)"));
            }
            return Ok(None);
        };
        if self.any_origin {
            return Ok(Some(HeaderValue::from_static("*")));
        }
        let text = origin.to_str().unwrap_or("").trim_end_matches('/');
        let lower = text.to_ascii_lowercase();
        let host = headers.get(HOST).and_then(|h| h.to_str().ok());
        let same = host.is_some_and(|host| {
            let host = host.to_ascii_lowercase();
            (lower == format!("http://{host}") || lower == format!("https://{host}"))
                && is_local_host(&host)
        });
        if same || self.origins.contains(&lower) {
            return Ok(Some(origin.clone()));
        }
        Err(foreign_origin(text))
    }

    /// Checks the request's key against what `scope` needs: 401 without a valid key, 403
    /// with a chat key on an admin route. Answers who the caller is (its key's digest).
    pub fn authorize(
        &self,
        scope: Scope,
        headers: &HeaderMap,
        query: Option<&str>,
    ) -> Result<Caller, ApiError> {
        if scope == Scope::Public || !self.has_keys() {
            return Ok(Caller::default());
        }
        let Some(key) = presented_key(headers, query) else {
            return Err(ApiError::new(
                ErrorKind::Unauthorized,
                "this node needs an API key: send `Authorization: Bearer KEY` (or `x-api-key: \
                 KEY`); whoever runs the cluster has it (`shoal --api-key`)",
            )
            .with_code("missing_api_key"));
        };
        let digest: Digest32 = Sha256::digest(key.as_bytes()).into();
        let grant = if self.admin.iter().any(|d| equal(d, &digest)) {
            Some(Grant::Admin)
        } else if self.chat.iter().any(|d| equal(d, &digest)) {
            Some(Grant::Chat)
        } else {
            None
        };
        match (grant, scope) {
            (None, _) => Err(ApiError::new(
                ErrorKind::Unauthorized,
                "the API key is not one this node accepts; check the key you were given",
            )
            .with_code("invalid_api_key")),
            (Some(Grant::Chat), Scope::Admin) => Err(ApiError::new(
                ErrorKind::Forbidden,
                "a chat key may only chat; this route (the cluster's state, instances, \
                 placement) needs an admin key",
            )
            .with_code("admin_key_required")),
            _ => Ok(Caller(Some(digest))),
        }
    }
}

/// Reads a key list file: one key per line, `chat KEY` for a chat-only key, `#` comments and
/// blank lines ignored. Returns (admin keys, chat keys).
pub fn parse_key_file(text: &str) -> Result<(Vec<String>, Vec<String>), KeyError> {
    let (mut admin, mut chat) = (Vec::new(), Vec::new());
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut words = line.split_whitespace();
        let (kind, key) = match (words.next(), words.next(), words.next()) {
            (Some(key), None, _) => ("admin", key),
            (Some(kind @ ("admin" | "chat")), Some(key), None) => (kind, key),
            _ => {
                return Err(KeyError(format!(
                    "line {}: expected `KEY`, `admin KEY` or `chat KEY`",
                    n + 1
                )))
            }
        };
        check_key(key).map_err(|e| KeyError(format!("line {}: {e}", n + 1)))?;
        if kind == "chat" {
            chat.push(key.to_string());
        } else {
            admin.push(key.to_string());
        }
    }
    Ok((admin, chat))
}

fn check_key(key: &str) -> Result<(), KeyError> {
    if !(16..=512).contains(&key.len()) || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(KeyError(
            "an API key must be 16 to 512 printable characters without spaces (`shoal secret` \
             prints a good one)"
                .into(),
        ));
    }
    Ok(())
}

/// The key a request carries: `Authorization: Bearer`, else `x-api-key`, else (for the
/// event stream) `access_token=` in the query.
fn presented_key(headers: &HeaderMap, query: Option<&str>) -> Option<String> {
    if let Some(value) = headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok()) {
        let value = value.trim();
        if value.len() > 7 && value[..7].eq_ignore_ascii_case("bearer ") {
            return Some(value[7..].trim().to_string());
        }
    }
    if let Some(value) = headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        return Some(value.trim().to_string());
    }
    query?
        .split('&')
        .find_map(|pair| pair.strip_prefix("access_token="))
        .and_then(crate::cluster::percent_decode)
}

/// Constant-time equality of two digests.
fn equal(a: &Digest32, b: &Digest32) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether `host` (`name[:port]`) names the node as a local network does: an IP address or a
/// local name, never a public domain that could be re-pointed at it.
fn is_local_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        // [v6]:port
        return rest
            .split(']')
            .next()
            .is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok());
    } else {
        host.rsplit_once(':').map_or(host, |(name, port)| {
            if port.bytes().all(|b| b.is_ascii_digit()) {
                name
            } else {
                host
            }
        })
    };
    if name.parse::<std::net::IpAddr>().is_ok() || !name.contains('.') {
        return true;
    }
    [".local", ".lan", ".home.arpa", ".internal"]
        .iter()
        .any(|suffix| name.ends_with(suffix))
}

fn foreign_origin(origin: &str) -> ApiError {
    let origin = echo(origin);
    ApiError::new(
        ErrorKind::Forbidden,
        format!(
            "requests from the web page at origin {origin} are refused: a page of another site \
             may not drive this node; to allow it, start the node with --cors-origin {origin}"
        ),
    )
    .with_code("origin_not_allowed")
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADMIN: &str = "admin-key-0123456789";
    const CHAT: &str = "chat-key-0123456789ab";

    fn policy() -> AccessPolicy {
        AccessPolicy::new(&[ADMIN.into()], &[CHAT.into()], &[]).unwrap()
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn status<T>(r: Result<T, ApiError>) -> u16 {
        r.map_or_else(|e| e.status().as_u16(), |_| 200)
    }

    #[test]
    fn only_the_same_key_acts_for_a_caller() {
        let p = policy();
        let bearer = |k: &str| headers(&[("authorization", &format!("Bearer {k}"))]);
        let admin = p.authorize(Scope::Chat, &bearer(ADMIN), None).unwrap();
        let chat = p.authorize(Scope::Chat, &bearer(CHAT), None).unwrap();
        let x = p
            .authorize(Scope::Chat, &headers(&[("x-api-key", CHAT)]), None)
            .unwrap();
        assert!(chat.may_act_for(&chat) && x.may_act_for(&chat), "same key");
        assert!(!admin.may_act_for(&chat) && !chat.may_act_for(&admin));
        assert!(
            !Caller::default().may_act_for(&chat),
            "no key for a keyed owner"
        );
        // Without keys nobody is told apart.
        let open = AccessPolicy::default()
            .authorize(Scope::Chat, &HeaderMap::new(), None)
            .unwrap();
        assert_eq!(open, Caller::default());
        assert!(open.may_act_for(&Caller::default()) && chat.may_act_for(&open));
    }

    #[test]
    fn keys_grant_by_kind() {
        let p = policy();
        let bearer = |k: &str| headers(&[("authorization", &format!("Bearer {k}"))]);
        assert_eq!(status(p.authorize(Scope::Chat, &bearer(ADMIN), None)), 200);
        assert_eq!(status(p.authorize(Scope::Admin, &bearer(ADMIN), None)), 200);
        assert_eq!(status(p.authorize(Scope::Chat, &bearer(CHAT), None)), 200);
        assert_eq!(status(p.authorize(Scope::Admin, &bearer(CHAT), None)), 403);
        assert_eq!(
            status(p.authorize(Scope::Chat, &bearer("wrong-key-0123456789"), None)),
            401
        );
        assert_eq!(
            status(p.authorize(Scope::Chat, &HeaderMap::new(), None)),
            401
        );
        assert_eq!(
            status(p.authorize(Scope::Public, &HeaderMap::new(), None)),
            200
        );
        let x = headers(&[("x-api-key", CHAT)]);
        assert_eq!(status(p.authorize(Scope::Chat, &x, None)), 200);
        let q = format!("access_token={ADMIN}");
        assert_eq!(
            status(p.authorize(Scope::Admin, &HeaderMap::new(), Some(&q))),
            200
        );
        // A prefix of a key is not the key.
        let short = &ADMIN[..ADMIN.len() - 1];
        assert_eq!(status(p.authorize(Scope::Chat, &bearer(short), None)), 401);
    }

    #[test]
    fn no_keys_means_open() {
        let p = AccessPolicy::default();
        assert_eq!(
            status(p.authorize(Scope::Admin, &HeaderMap::new(), None)),
            200
        );
    }

    #[test]
    fn short_or_spaced_keys_are_refused() {
        assert!(AccessPolicy::new(&["short".into()], &[], &[]).is_err());
        assert!(AccessPolicy::new(&["has a space in it 1234".into()], &[], &[]).is_err());
        assert!(AccessPolicy::new(&[], &[], &["example.com".into()]).is_err());
    }

    #[test]
    fn key_files_read_kinds_and_comments() {
        let (admin, chat) =
            parse_key_file(&format!("# keys\n{ADMIN}\n\nchat {CHAT}\nadmin {CHAT}x\n")).unwrap();
        assert_eq!(admin, vec![ADMIN.to_string(), format!("{CHAT}x")]);
        assert_eq!(chat, vec![CHAT.to_string()]);
        assert!(parse_key_file("chat a b c").is_err());
        assert!(parse_key_file("tiny").is_err());
    }

    #[test]
    fn only_own_or_listed_origins_are_served() {
        let p = AccessPolicy::new(&[], &[], &["http://tools.example:3000".into()]).unwrap();
        let ok = |pairs: &[(&'static str, &str)]| p.check_origin(&headers(pairs)).is_ok();
        assert!(ok(&[]));
        assert!(ok(&[
            ("host", "127.0.0.1:52415"),
            ("origin", "http://127.0.0.1:52415")
        ]));
        assert!(ok(&[
            ("host", "mac-mini.local:52415"),
            ("origin", "http://mac-mini.local:52415")
        ]));
        assert!(ok(&[
            ("host", "[::1]:52415"),
            ("origin", "http://[::1]:52415")
        ]));
        assert!(ok(&[
            ("host", "studio:52415"),
            ("origin", "http://studio:52415")
        ]));
        assert!(ok(&[
            ("host", "127.0.0.1:52415"),
            ("origin", "http://tools.example:3000")
        ]));
        // Another site, a rebinding domain, a sandboxed page, a cross-site form post.
        assert!(!ok(&[
            ("host", "127.0.0.1:52415"),
            ("origin", "https://evil.example")
        ]));
        assert!(!ok(&[
            ("host", "evil.example:52415"),
            ("origin", "http://evil.example:52415")
        ]));
        assert!(!ok(&[("host", "127.0.0.1:52415"), ("origin", "null")]));
        assert!(!ok(&[("sec-fetch-site", "cross-site")]));
        let any = AccessPolicy::new(&[], &[], &["*".into()]).unwrap();
        let h = headers(&[
            ("host", "127.0.0.1:52415"),
            ("origin", "https://evil.example"),
        ]);
        assert_eq!(any.check_origin(&h).unwrap().unwrap(), "*");
    }
}
