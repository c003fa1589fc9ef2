//! Where a node looks for models, and the only places it looks: the Hugging Face cache (for
//! model ids, `org/name`) and the model directories (shoal's own `<cache>/models` and every
//! `--models-dir`). A local path is accepted only when it lies inside one of them, so a
//! request can never make the node open, or learn the existence of, any other file.

use hub::{HfCache, ModelId};
use std::path::{Component, Path, PathBuf};

/// The folders models come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelDirs {
    /// The Hugging Face cache (`HF_HUB_CACHE`, else `$HF_HOME/hub`, else
    /// `~/.cache/huggingface/hub`).
    pub hf: HfCache,
    /// Folders local paths may point into.
    pub local: Vec<PathBuf>,
}

/// The folder holding `model` when it names an existing file or folder (absolute, or
/// relative to the working directory), made absolute.
fn owner_given_folder(model: &str) -> Option<PathBuf> {
    let path = Path::new(model);
    if model == "default" || !path.exists() {
        return None;
    }
    let absolute = std::fs::canonicalize(path).ok()?;
    absolute.parent().map(Path::to_path_buf)
}

/// File name of the SmolLM2 fixture that `cargo xtask setup` downloads (`--model default`).
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// shoal's own model folder: `<cache>/models`, the cache as the `paths` crate resolves it.
pub fn models_dir() -> PathBuf {
    paths::cache_dir().join("models")
}

/// The SmolLM2 fixture (`--model default`), once setup has fetched it.
pub fn default_model_path() -> PathBuf {
    models_dir().join(DEFAULT_MODEL_FILE)
}

/// Folder name of a snapshot that is not downloaded yet (never a commit, so never present).
const NOT_DOWNLOADED: &str = "not-downloaded";

impl ModelDirs {
    /// The environment's Hugging Face cache, shoal's model folder and `extra` folders.
    pub fn from_env(extra: &[PathBuf]) -> ModelDirs {
        let mut local = vec![models_dir()];
        local.extend(extra.iter().cloned());
        ModelDirs {
            hf: HfCache::from_env(),
            local,
        }
    }

    /// The same, trusting also the folder of `model` when it is a path that exists: the
    /// machine's owner named it on the command line (`shoal --model /data/llm/model.gguf`),
    /// which a request from the network cannot do.
    pub fn from_env_trusting(extra: &[PathBuf], model: Option<&str>) -> ModelDirs {
        let mut dirs = ModelDirs::from_env(extra);
        if let Some(parent) = model.and_then(owner_given_folder) {
            if !dirs.local.contains(&parent) {
                dirs.local.push(parent);
            }
        }
        dirs
    }

    /// The path `given` names, if it lies inside a model folder (or the HF cache) once made
    /// absolute and normalised, symlinks included; `None` for anything else, existing or not.
    pub fn confine(&self, given: &str) -> Option<PathBuf> {
        let path = Path::new(given);
        let absolute = if path.is_absolute() {
            path.to_path_buf()
        } else {
            std::env::current_dir().ok()?.join(path)
        };
        let lexical = normalize(&absolute)?;
        let roots: Vec<PathBuf> = self
            .local
            .iter()
            .chain(std::iter::once(&self.hf.root))
            .filter_map(|r| normalize(r))
            .collect();
        // First lexically, so a path outside is refused without touching the filesystem.
        if !roots.iter().any(|r| lexical.starts_with(r)) {
            return None;
        }
        let real = std::fs::canonicalize(&lexical).ok()?;
        let inside = roots
            .iter()
            .filter_map(|r| std::fs::canonicalize(r).ok())
            .any(|r| real.starts_with(r));
        inside.then_some(lexical)
    }

    /// Where model `id` is on this node: its cached snapshot folder (or, for `:QUANT`, the
    /// GGUF file of that quantization in it), if downloaded.
    pub fn hf_path(&self, id: &ModelId) -> Option<PathBuf> {
        let commit = self.hf.read_ref(id, id.revision())?;
        let dir = self.hf.snapshot(id, &commit);
        if !dir.is_dir() {
            return None;
        }
        match &id.quant {
            None => Some(dir),
            Some(q) => {
                let mut files = Vec::new();
                hub::local::list_files(&dir, &dir, &mut files);
                let first = hub::select::gguf_files(&files, q)
                    .first()
                    .map(|f| f.path.clone());
                first.map(|p| dir.join(p))
            }
        }
    }

    /// Where model `id` is, or would be once downloaded (a path that does not exist yet).
    pub fn hf_path_or_future(&self, id: &ModelId) -> PathBuf {
        self.hf_path(id)
            .unwrap_or_else(|| self.hf.repo_dir(id).join("snapshots").join(NOT_DOWNLOADED))
    }
}

/// `path` with `.` and `..` resolved lexically; `None` when `..` climbs above the root.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                if !out.pop() || out.as_os_str().is_empty() {
                    return None;
                }
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_paths_inside_the_model_folders_are_accepted() {
        let root = std::env::temp_dir().join(format!("shoal-confine-{}", std::process::id()));
        let models = root.join("models");
        let outside = root.join("outside");
        std::fs::create_dir_all(&models).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(models.join("m.gguf"), b"x").unwrap();
        std::fs::write(outside.join("secret.gguf"), b"x").unwrap();
        std::os::unix::fs::symlink(outside.join("secret.gguf"), models.join("link.gguf")).unwrap();
        let dirs = ModelDirs {
            hf: HfCache::at(root.join("hf")),
            local: vec![models.clone()],
        };
        let inside = models.join("m.gguf");
        assert_eq!(dirs.confine(&inside.to_string_lossy()), Some(inside));
        for bad in [
            "/etc/passwd".to_string(),
            "../../etc/passwd".into(),
            format!("{}/../outside/secret.gguf", models.display()),
            outside.join("secret.gguf").display().to_string(),
            models.join("link.gguf").display().to_string(),
            models.join("absent.gguf").display().to_string(),
        ] {
            assert_eq!(dirs.confine(&bad), None, "{bad}");
        }
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn the_owners_model_path_is_trusted_and_nothing_else() {
        let root = std::env::temp_dir().join(format!("shoal-trust-{}", std::process::id()));
        let own = root.join("llm");
        let other = root.join("other");
        std::fs::create_dir_all(&own).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        let file = own.join("model.gguf");
        std::fs::write(&file, b"x").unwrap();
        std::fs::write(other.join("secret.gguf"), b"x").unwrap();
        let given = file.to_string_lossy().to_string();
        let dirs = ModelDirs::from_env_trusting(&[], Some(&given));
        assert_eq!(dirs.confine(&given), Some(file.clone()));
        // Its folder, not the machine: a sibling folder stays outside.
        assert_eq!(
            dirs.confine(&other.join("secret.gguf").to_string_lossy()),
            None
        );
        // Ids, `default` and paths that do not exist add nothing.
        for model in ["default", "org/name", "/nonexistent/model.gguf"] {
            let plain = ModelDirs::from_env(&[]);
            assert_eq!(
                ModelDirs::from_env_trusting(&[], Some(model)),
                plain,
                "{model}"
            );
        }
        let _ = std::fs::remove_dir_all(&root);
    }
}
