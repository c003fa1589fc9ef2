//! Model ids as users write them: a Hugging Face repo id `org/name`, optionally pinned to a
//! revision (`org/name@v1.0`, a branch, tag or commit) and, for repos of GGUF files, one
//! quantization (`org/name:Q4_K_M`, as llama.cpp's `-hf` and Ollama take it).
//!
//! Parsing is strict (the characters the hub allows, no `..`), so an id can never name a path
//! outside the cache when it becomes a folder name.

use std::fmt;

/// Longest id part the hub allows (its repo names are at most 96 characters).
const MAX_PART: usize = 96;
/// Longest revision accepted.
const MAX_REVISION: usize = 255;

/// A Hugging Face model id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ModelId {
    /// The owner (user or organisation).
    pub org: String,
    /// The repository's name.
    pub name: String,
    /// Branch, tag or commit; `None` means `main`.
    pub revision: Option<String>,
    /// The GGUF quantization to pick (`Q4_K_M`), for repos of GGUF files.
    pub quant: Option<String>,
}

/// Why a string is not a model id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{given}` is not a Hugging Face model id ({why}); write it as `org/name`, optionally `org/name@revision` or `org/name:Q4_K_M`")]
pub struct IdError {
    /// What was given (cut to 120 characters).
    pub given: String,
    /// What is wrong with it.
    pub why: String,
}

fn err(given: &str, why: impl Into<String>) -> IdError {
    IdError {
        given: given.chars().take(120).collect(),
        why: why.into(),
    }
}

/// Whether `part` is a valid org or repo name: letters, digits, `-`, `_`, `.`, not starting or
/// ending with `-` or `.`, no `..`, at most 96 characters.
fn valid_part(part: &str) -> bool {
    !part.is_empty()
        && part.len() <= MAX_PART
        && part
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && !part.starts_with(['-', '.'])
        && !part.ends_with(['-', '.'])
        && !part.contains("..")
}

/// Whether `rev` is a valid revision: a branch, tag or commit (may contain `/`, never `..` or
/// an empty segment).
fn valid_revision(rev: &str) -> bool {
    !rev.is_empty()
        && rev.len() <= MAX_REVISION
        && rev
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'))
        && rev
            .split('/')
            .all(|s| !s.is_empty() && s != "." && s != "..")
}

/// Whether `quant` is a valid quantization name (`Q4_K_M`, `f16`, `IQ2_XS`).
fn valid_quant(quant: &str) -> bool {
    !quant.is_empty()
        && quant.len() <= 32
        && quant
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

impl ModelId {
    /// Parses `org/name[@revision][:QUANT]`.
    pub fn parse(given: &str) -> Result<ModelId, IdError> {
        let (rest, quant) = match given.rsplit_once(':') {
            Some((rest, q)) => {
                if !valid_quant(q) {
                    return Err(err(given, format!("`{q}` is not a quantization name")));
                }
                (rest, Some(q.to_string()))
            }
            None => (given, None),
        };
        let (repo, revision) = match rest.split_once('@') {
            Some((repo, rev)) => {
                if !valid_revision(rev) {
                    return Err(err(given, format!("`{rev}` is not a revision")));
                }
                (repo, Some(rev.to_string()))
            }
            None => (rest, None),
        };
        let Some((org, name)) = repo.split_once('/') else {
            return Err(err(given, "it has no `/` between owner and name"));
        };
        if !valid_part(org) || !valid_part(name) {
            return Err(err(
                given,
                "owner and name take letters, digits, `-`, `_` and `.` only",
            ));
        }
        Ok(ModelId {
            org: org.to_string(),
            name: name.to_string(),
            revision,
            quant,
        })
    }

    /// Whether `given` reads as a model id rather than a local path: it parses, and it is
    /// not written as a path (`/abs`, `./rel`, `~/x`).
    pub fn looks_like_id(given: &str) -> bool {
        !given.starts_with(['/', '.', '~']) && ModelId::parse(given).is_ok()
    }

    /// `org/name`, as the hub's URLs take it.
    pub fn repo(&self) -> String {
        format!("{}/{}", self.org, self.name)
    }

    /// The revision to fetch: the one given, else `main`.
    pub fn revision(&self) -> &str {
        self.revision.as_deref().unwrap_or("main")
    }

    /// The cache folder's name: `models--org--name`.
    pub fn cache_folder(&self) -> String {
        format!("models--{}--{}", self.org, self.name)
    }
}

impl fmt::Display for ModelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.org, self.name)?;
        if let Some(rev) = &self.revision {
            write!(f, "@{rev}")?;
        }
        if let Some(q) = &self.quant {
            write!(f, ":{q}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ids_parse_with_revision_and_quant() {
        let id = ModelId::parse("HuggingFaceTB/SmolLM2-135M-Instruct").unwrap();
        assert_eq!(id.repo(), "HuggingFaceTB/SmolLM2-135M-Instruct");
        assert_eq!(id.revision(), "main");
        assert_eq!(
            id.cache_folder(),
            "models--HuggingFaceTB--SmolLM2-135M-Instruct"
        );
        let id = ModelId::parse("org/name@v1.0:Q4_K_M").unwrap();
        assert_eq!(id.revision.as_deref(), Some("v1.0"));
        assert_eq!(id.quant.as_deref(), Some("Q4_K_M"));
        assert_eq!(id.to_string(), "org/name@v1.0:Q4_K_M");
        let id = ModelId::parse("org/name@refs/pr/1").unwrap();
        assert_eq!(id.revision(), "refs/pr/1");
    }

    #[test]
    fn paths_and_bad_ids_are_refused() {
        for bad in [
            "default",
            "/abs/path",
            "../../etc/passwd",
            "org/..",
            "org/na/me",
            "org/name@../x",
            "org/name:Q4 K",
            "org/",
            "/name",
            ".hidden/x",
        ] {
            assert!(!ModelId::looks_like_id(bad), "{bad}");
        }
        assert!(ModelId::looks_like_id("org/name"));
        let e = ModelId::parse("nothing").unwrap_err();
        assert!(e.to_string().contains("org/name"), "{e}");
    }

    proptest! {
        #[test]
        fn parsing_never_panics_and_round_trips(s in ".{0,300}") {
            if let Ok(id) = ModelId::parse(&s) {
                prop_assert!(!id.cache_folder().contains('/'));
                prop_assert!(!id.org.contains(".."));
                prop_assert_eq!(ModelId::parse(&id.to_string()).unwrap(), id);
            }
        }
    }
}
