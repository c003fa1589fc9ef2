//! The hub client: configuration from the environment as `huggingface_hub` reads it
//! (`HF_ENDPOINT`, `HF_TOKEN`, `HF_HUB_OFFLINE`, the cache variables) and the revision and
//! tree APIs. Fetching files is [`crate::download`]'s (one file) and [`crate::snapshot`]'s
//! (the files a caller selects), over this client.

use crate::cache::HfCache;
use crate::error::HubError;
use crate::http::{self, Http};
use crate::id::ModelId;
use crate::meta::{self, RepoFile};
use hyper::Method;
use std::time::Duration;

/// The public hub.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// How to reach the hub and where files go.
#[derive(Debug, Clone)]
pub struct HubConfig {
    /// The hub's base URL (`HF_ENDPOINT`), without a trailing `/`.
    pub endpoint: String,
    /// Bearer token (`HF_TOKEN`), sent to the endpoint's origin only.
    pub token: Option<String>,
    /// Use only the cache (`HF_HUB_OFFLINE=1`, `--offline`).
    pub offline: bool,
    /// The cache.
    pub cache: HfCache,
    /// Files fetched at once.
    pub parallel: usize,
    /// Tries per request before giving up.
    pub attempts: u32,
    /// The first back-off; doubled per failed try up to [`MAX_BACKOFF`].
    pub backoff: Duration,
}

/// Longest wait between two tries.
pub const MAX_BACKOFF: Duration = Duration::from_secs(8);
/// Tries before a host name that does not resolve counts as a definite answer: a second one
/// rides out a resolver's momentary hiccup, more only delay the error (8 tries took 31.5 s).
pub const UNRESOLVED_ATTEMPTS: u32 = 2;

impl HubConfig {
    /// The configuration the environment gives.
    pub fn from_env() -> HubConfig {
        HubConfig::from_vars(&|k| std::env::var(k).ok())
    }

    /// [`HubConfig::from_env`] over an injectable environment.
    pub fn from_vars(get: &dyn Fn(&str) -> Option<String>) -> HubConfig {
        let set = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        let truthy = |k: &str| {
            set(k).is_some_and(|v| {
                matches!(
                    v.trim().to_ascii_lowercase().as_str(),
                    "1" | "true" | "yes" | "on"
                )
            })
        };
        HubConfig {
            endpoint: set("HF_ENDPOINT")
                .map(|e| e.trim().trim_end_matches('/').to_string())
                .unwrap_or_else(|| DEFAULT_ENDPOINT.into()),
            token: set("HF_TOKEN").map(|t| t.trim().to_string()),
            offline: truthy("HF_HUB_OFFLINE"),
            cache: HfCache::from_vars(get),
            parallel: 4,
            attempts: 8,
            backoff: Duration::from_millis(500),
        }
    }
}

/// A hub client.
#[derive(Debug, Clone)]
pub struct Hub {
    /// Its configuration.
    pub config: HubConfig,
    http: Http,
}

impl Hub {
    /// A client for `config`.
    pub fn new(config: HubConfig) -> Result<Hub, HubError> {
        let http = Http::new().map_err(|what| HubError::BadAnswer {
            url: config.endpoint.clone(),
            what,
        })?;
        Ok(Hub { config, http })
    }

    /// The headers for a request to `url`: the token only on the endpoint's own origin.
    pub(crate) fn auth_for(&self, url: &str) -> Vec<(&'static str, String)> {
        match (
            &self.config.token,
            http::origin(url),
            http::origin(&self.config.endpoint),
        ) {
            (Some(t), Some(a), Some(b)) if a == b => vec![("authorization", format!("Bearer {t}"))],
            _ => vec![],
        }
    }

    /// Sends one request (no redirects followed).
    pub(crate) async fn http_send(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, String)],
    ) -> Result<hyper::Response<hyper::body::Incoming>, String> {
        self.http.send(method, url, headers).await
    }

    /// The wait before try `attempt` (1-based): the back-off doubled per failure, capped.
    pub(crate) fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u32 << attempt.saturating_sub(1).min(10);
        self.config.backoff.saturating_mul(factor).min(MAX_BACKOFF)
    }

    /// GETs a JSON API answer, retrying transient failures; `what` names it in errors.
    async fn api_get(&self, id: &ModelId, url: &str, what: &str) -> Result<Vec<u8>, HubError> {
        let mut last = String::new();
        for attempt in 1..=self.config.attempts {
            if attempt > 1 {
                tokio::time::sleep(self.backoff(attempt - 1)).await;
            }
            let resp = match self.http_send(Method::GET, url, &self.auth_for(url)).await {
                Ok(r) => r,
                Err(e) if http::is_unresolved(&e) && attempt >= UNRESOLVED_ATTEMPTS => {
                    return Err(HubError::Unresolved {
                        endpoint: self.config.endpoint.clone(),
                        last: e,
                    });
                }
                Err(e) => {
                    last = e;
                    continue;
                }
            };
            let status = resp.status().as_u16();
            let code = http::header(&resp, "x-error-code");
            if let Some(e) =
                HubError::from_status(status, code.as_deref(), id, &self.config.endpoint, None)
            {
                return Err(e);
            }
            if status == 429 || status >= 500 {
                last = format!("HTTP {status}");
                continue;
            }
            if status != 200 {
                return Err(HubError::BadAnswer {
                    url: url.into(),
                    what: format!("HTTP {status} to the {what}"),
                });
            }
            match http::read_limited(resp.into_body(), meta::MAX_JSON).await {
                Ok(body) => return Ok(body),
                Err(e) => last = e,
            }
        }
        Err(HubError::Unreachable {
            what: what.into(),
            url: url.into(),
            attempts: self.config.attempts,
            last,
        })
    }

    /// The commit `id`'s revision points to now (the revision API).
    pub async fn commit_of(&self, id: &ModelId) -> Result<String, HubError> {
        let url = format!(
            "{}/api/models/{}/revision/{}",
            self.config.endpoint,
            id.repo(),
            http::encode_path(id.revision())
        );
        let body = self.api_get(id, &url, "revision API").await?;
        let info = meta::parse_revision(&body).map_err(|what| HubError::BadAnswer { url, what })?;
        Ok(info.sha)
    }

    /// Every file of `id` at `commit` (the tree API, recursive).
    pub async fn files(&self, id: &ModelId, commit: &str) -> Result<Vec<RepoFile>, HubError> {
        let url = format!(
            "{}/api/models/{}/tree/{commit}?recursive=true",
            self.config.endpoint,
            id.repo()
        );
        let body = self.api_get(id, &url, "tree API").await?;
        meta::parse_tree(&body).map_err(|what| HubError::BadAnswer { url, what })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn config_from_the_environment() {
        let vars = |k: &str| match k {
            "HF_ENDPOINT" => Some("http://10.0.0.1:8080/".to_string()),
            "HF_TOKEN" => Some("hf_x".to_string()),
            "HF_HUB_OFFLINE" => Some("1".to_string()),
            "HF_HOME" => Some("/h".to_string()),
            _ => None,
        };
        let c = HubConfig::from_vars(&vars);
        assert_eq!(c.endpoint, "http://10.0.0.1:8080");
        assert_eq!(c.token.as_deref(), Some("hf_x"));
        assert!(c.offline);
        assert_eq!(c.cache.root, PathBuf::from("/h/hub"));
        let c = HubConfig::from_vars(&|_| None);
        assert_eq!(c.endpoint, DEFAULT_ENDPOINT);
        assert!(!c.offline);
        let hub = Hub::new(HubConfig {
            token: Some("t".into()),
            ..HubConfig::from_vars(&vars)
        })
        .unwrap();
        assert_eq!(hub.auth_for("http://10.0.0.1:8080/api").len(), 1);
        assert!(hub.auth_for("http://10.0.0.1:8081/cdn").is_empty());
        assert_eq!(hub.backoff(1), Duration::from_millis(500));
        assert_eq!(hub.backoff(30), MAX_BACKOFF);
    }
}
