//! The model registry: which models this node knows (its default model and every model an
//! instance names), the facts of each model file (read once), and the model list
//! (`GET /v1/models`).

use super::locate::ModelDirs;
use super::{ModelFacts, ModelSpec};
use control::{short, PlacementCache, Snapshot};
use gateway::{ApiError, ErrorKind, ModelInfo};
use placement::RunnerStatus;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

/// How long reading one model's facts (header, config, tokenizer) may take.
pub const FACTS_READ_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// How the node reads a model file's facts (its configuration and tokenizer, not its weights):
/// given by the node, because reading needs the model families (`inference`, so MLX), which
/// this crate does not link.
pub type ReadFacts = fn(&std::path::Path) -> Result<ModelFacts, String>;

/// One file's facts, read at most once at a time and kept once read.
type FactsCell = tokio::sync::OnceCell<Arc<ModelFacts>>;

/// This node's models: names to files, and each file's facts.
pub struct ModelRegistry {
    /// This node's file served as `default`.
    default_model: PathBuf,
    /// Where models are looked for.
    dirs: ModelDirs,
    /// Model facts by file, read once. The map's lock is held only to find a file's cell,
    /// never while a file is read: a file that blocks (a FIFO, a stalled network disk) must
    /// not hold up requests for other models.
    facts: std::sync::Mutex<BTreeMap<PathBuf, Arc<FactsCell>>>,
    /// The file each model id's facts were last read from: a model id's path changes once its
    /// snapshot is downloaded, and the model list finds its facts by id.
    read_from: std::sync::Mutex<BTreeMap<String, PathBuf>>,
    /// The node's reader of a file's facts.
    read: ReadFacts,
}

impl ModelRegistry {
    /// A registry whose `default` model is the file at `default_model`, with models looked
    /// for in `dirs` and their facts read by `read`.
    pub fn new(default_model: PathBuf, dirs: ModelDirs, read: ReadFacts) -> ModelRegistry {
        ModelRegistry {
            default_model,
            dirs,
            facts: std::sync::Mutex::default(),
            read_from: std::sync::Mutex::default(),
            read,
        }
    }

    /// The file served as `default`.
    pub fn default_model(&self) -> &std::path::Path {
        &self.default_model
    }

    /// This node's Hugging Face cache.
    pub fn hf_cache(&self) -> &hub::HfCache {
        &self.dirs.hf
    }

    /// The model a user's name refers to on this node.
    pub fn resolve(&self, name: &str) -> Option<ModelSpec> {
        ModelSpec::resolve(name, &self.default_model, &self.dirs)
    }

    /// The model an intent names, as this node finds it.
    pub fn spec_of(&self, reference: &str) -> ModelSpec {
        ModelSpec::of_reference(reference, &self.default_model, &self.dirs)
    }

    /// The facts of `spec`'s model if they were read already, at its path or where its id
    /// was last read from (never reads).
    fn known_facts(&self, spec: &ModelSpec) -> Option<Arc<ModelFacts>> {
        let last = self.read_from.lock().ok()?.get(&spec.id).cloned();
        let cells = self.facts.lock().ok()?;
        std::iter::once(&spec.path)
            .chain(last.as_ref())
            .find_map(|p| cells.get(p)?.get().cloned())
    }

    /// The facts of the model at `spec.path`, read once per file; `node` names this node in
    /// the error. Only regular files and folders are opened, and a read that takes longer
    /// than [`FACTS_READ_LIMIT`] is answered as unreadable (a later request tries again).
    pub async fn facts(&self, spec: &ModelSpec, node: &str) -> Result<Arc<ModelFacts>, ApiError> {
        let cell = {
            let mut cells = self
                .facts
                .lock()
                .map_err(|_| ApiError::internal("the model registry's lock is poisoned"))?;
            cells.entry(spec.path.clone()).or_default().clone()
        };
        if let Ok(mut read_from) = self.read_from.lock() {
            read_from.insert(spec.id.clone(), spec.path.clone());
        }
        // Only the default model is made by setup; a user's own folder gets no such hint.
        let hint = if spec.id == crate::DEFAULT_MODEL_ID {
            " (for the default model, run `cargo xtask setup`)"
        } else {
            ""
        };
        let unreadable = |e: String| {
            ApiError::new(
                ErrorKind::Unavailable,
                format!(
                    "cannot read model `{}` at {} on node {}: {e}{hint}",
                    gateway::echo(&spec.id),
                    spec.path.display(),
                    short(node)
                ),
            )
            .with_code("model_unreadable")
        };
        let path = spec.path.clone();
        let read_facts = self.read;
        let read = cell.get_or_try_init(|| async move {
            // stat never blocks on a FIFO or device, opening may: look before opening.
            let meta = tokio::fs::metadata(&path)
                .await
                .map_err(|e| e.to_string())?;
            if !meta.is_file() && !meta.is_dir() {
                return Err("it is not a regular file or a folder".to_string());
            }
            let reading = tokio::task::spawn_blocking(move || read_facts(&path));
            match tokio::time::timeout(FACTS_READ_LIMIT, reading).await {
                Ok(Ok(Ok(facts))) => Ok(Arc::new(facts)),
                Ok(Ok(Err(e))) => Err(e.to_string()),
                Ok(Err(e)) => Err(format!("reading the model failed: {e}")),
                Err(_) => Err(format!(
                    "reading it took longer than {} s",
                    FACTS_READ_LIMIT.as_secs()
                )),
            }
        });
        read.await.cloned().map_err(unreadable)
    }

    /// The model list: the default model's names, and every name of every instance's model,
    /// `ready` when one of its instances is (`mine`: this node's runner status by instance id); sorted
    /// by name.
    pub fn list(
        &self,
        snapshot: &Snapshot,
        placements: &PlacementCache,
        mine: &dyn Fn(&str) -> Option<RunnerStatus>,
    ) -> Vec<ModelInfo> {
        let mut models: BTreeMap<String, ModelInfo> = BTreeMap::new();
        let mut add = |spec: &ModelSpec, ready: bool| {
            let shape = self.known_facts(spec).map(|f| f.shape.clone());
            for name in spec.names() {
                let entry = models.entry(name.clone()).or_insert_with(|| ModelInfo {
                    id: name.clone(),
                    created: 0,
                    owned_by: spec.owned_by.clone(),
                    ready: false,
                    shape: None,
                });
                entry.ready |= ready;
                if entry.shape.is_none() {
                    entry.shape = shape.clone();
                }
            }
        };
        add(&ModelSpec::default_at(&self.default_model), false);
        // Every model downloaded into the Hugging Face cache can run here.
        for (id, _) in self.dirs.hf.models() {
            if self.dirs.hf_path(&id).is_some() {
                add(&self.spec_of(&id.to_string()), false);
            }
        }
        for view in snapshot.instances(placements).values() {
            let mine = mine(view.record.id());
            add(
                &self.spec_of(&view.record.intent.model),
                view.is_ready(snapshot, mine.as_ref()),
            );
        }
        models.into_values().collect()
    }

    /// The "unknown model" error for `name`: the models there are, and for a Hugging Face
    /// model id that is not downloaded here, the command that fetches it.
    pub fn not_found(
        &self,
        name: &str,
        snapshot: &Snapshot,
        placements: &PlacementCache,
        mine: &dyn Fn(&str) -> Option<RunnerStatus>,
    ) -> ApiError {
        let available = self.ids(snapshot, placements, mine);
        if !hub::ModelId::looks_like_id(name) {
            return ApiError::model_not_found(name, &available);
        }
        ApiError::new(
            ErrorKind::NotFound,
            format!(
                "model `{name}` is not downloaded on node {}: run `shoal download {name}` on \
                 every node that should run it (the Hugging Face cache is {}); available \
                 models: {}",
                short(&snapshot.me),
                self.dirs.hf.root.display(),
                available.join(", ")
            ),
        )
        .with_param("model")
        .with_code("model_not_found")
    }

    /// The names of [`ModelRegistry::list`], for "unknown model" errors.
    pub fn ids(
        &self,
        snapshot: &Snapshot,
        placements: &PlacementCache,
        mine: &dyn Fn(&str) -> Option<RunnerStatus>,
    ) -> Vec<String> {
        self.list(snapshot, placements, mine)
            .into_iter()
            .map(|m| m.id)
            .collect()
    }
}
