//! What can go wrong fetching a model, each error saying what to do about it.

use crate::id::ModelId;

/// A failed hub operation.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// The repository does not exist (or is private and no token was sent).
    #[error("model `{id}` was not found on {endpoint}: check the id (org/name) on the hub; if the repository is private, set HF_TOKEN to a token that can read it")]
    RepoNotFound {
        /// The model.
        id: String,
        /// The hub asked.
        endpoint: String,
    },
    /// The repository is gated and the token (if any) has not been granted access.
    #[error("model `{id}` is gated on {endpoint}: accept its licence on the model's page, then set HF_TOKEN to a token of that account (`huggingface-cli login` writes one)")]
    Gated {
        /// The model.
        id: String,
        /// The hub asked.
        endpoint: String,
    },
    /// The revision does not exist.
    #[error("model `{id}` has no revision `{revision}` on {endpoint}: name a branch, tag or commit that exists (`org/name@main`)")]
    RevisionNotFound {
        /// The model.
        id: String,
        /// The revision asked.
        revision: String,
        /// The hub asked.
        endpoint: String,
    },
    /// A file the model needs is not in the repository.
    #[error("model `{id}` has no file `{path}`: {what}")]
    EntryNotFound {
        /// The model.
        id: String,
        /// The file.
        path: String,
        /// What that means here.
        what: String,
    },
    /// Offline, and the cache does not hold what is needed.
    #[error("offline (HF_HUB_OFFLINE=1, or `shoal download --offline`) and model `{id}` is not in the cache at {cache}: {what}")]
    Offline {
        /// The model.
        id: String,
        /// The cache looked in.
        cache: String,
        /// What is missing and what to do.
        what: String,
    },
    /// The hub could not be reached, or kept failing, after every retry.
    #[error("cannot fetch {what} from {url} after {attempts} attempts: {last} (check HF_ENDPOINT and the network; with a cache that holds the model, HF_HUB_OFFLINE=1 uses only the cache)")]
    Unreachable {
        /// What was being fetched.
        what: String,
        /// The URL.
        url: String,
        /// How many tries.
        attempts: u32,
        /// The last failure.
        last: String,
    },
    /// The hub's host name does not resolve here (no network or no DNS): retrying with
    /// back-off would only delay the answer.
    #[error("cannot reach the hub at {endpoint}: its host name does not resolve on this machine ({last}); check the network and HF_ENDPOINT, or set HF_HUB_OFFLINE=1 to use only the models already in the cache")]
    Unresolved {
        /// The hub's endpoint.
        endpoint: String,
        /// The lookup's failure.
        last: String,
    },
    /// The hub answered something this client cannot use.
    #[error("the hub at {url} answered something unusable: {what}")]
    BadAnswer {
        /// The URL.
        url: String,
        /// What was wrong.
        what: String,
    },
    /// The cache's disk has less free space than the files still need.
    #[error("not enough disk space for `{id}`: its files need {need} more bytes at {path}, where {free} are free; free some space, or set HF_HUB_CACHE to a larger disk")]
    NoSpace {
        /// The model.
        id: String,
        /// The cache root.
        path: String,
        /// Bytes still needed.
        need: u64,
        /// Bytes free.
        free: u64,
    },
    /// The disk filled up while a file was written (after the up-front check passed: another
    /// writer took the space). What was written stays, so the next try resumes from it.
    #[error("the disk holding the Hugging Face cache is full: writing {path} stopped after {held} bytes, which are kept (the next download resumes from them); free some space, or set HF_HUB_CACHE to a larger disk, and download again")]
    DiskFull {
        /// The file being written.
        path: String,
        /// Bytes of it on disk.
        held: u64,
    },
    /// Local files could not be written.
    #[error("cannot write the cache at {path}: {source} (check free disk space and permissions, or set HF_HUB_CACHE)")]
    Io {
        /// The path.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
}

impl HubError {
    /// An I/O error at `path`.
    pub fn io(path: &std::path::Path, source: std::io::Error) -> HubError {
        if source.kind() == std::io::ErrorKind::StorageFull {
            return HubError::DiskFull {
                path: path.display().to_string(),
                held: std::fs::metadata(path).map_or(0, |m| m.len()),
            };
        }
        HubError::Io {
            path: path.display().to_string(),
            source,
        }
    }

    /// The error for a 401/403/404 answer with the hub's `X-Error-Code`.
    pub fn from_status(
        status: u16,
        code: Option<&str>,
        id: &ModelId,
        endpoint: &str,
        path: Option<&str>,
    ) -> Option<HubError> {
        let id_s = id.to_string();
        let endpoint = endpoint.to_string();
        match (status, code) {
            (_, Some("GatedRepo")) | (403, None) => Some(HubError::Gated { id: id_s, endpoint }),
            (_, Some("RepoNotFound")) | (401, None) => {
                Some(HubError::RepoNotFound { id: id_s, endpoint })
            }
            (_, Some("RevisionNotFound")) => Some(HubError::RevisionNotFound {
                id: id_s,
                revision: id.revision().to_string(),
                endpoint,
            }),
            (404, _) => match path {
                Some(p) => Some(HubError::EntryNotFound {
                    id: id_s,
                    path: p.to_string(),
                    what: "the repository does not hold it at this revision".into(),
                }),
                None => Some(HubError::RepoNotFound { id: id_s, endpoint }),
            },
            _ => None,
        }
    }

    /// Whether trying again may help (the network or the hub's side), as opposed to a
    /// definite answer (missing, gated, offline).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            HubError::Unreachable { .. } | HubError::Unresolved { .. } | HubError::BadAnswer { .. }
        )
    }
}
