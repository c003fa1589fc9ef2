//! Models a node can run: how a name resolves to a file, and what the file says about the
//! model (its card for placement, its tokenizer for prompts).
//!
//! **Names.** A model is named by a Hugging Face model id (`org/name`, `org/name@revision`,
//! `org/name:Q4_K_M`), found in this node's Hugging Face cache; by its file or folder name
//! without extension (a GGUF file `Foo.Q4_1.gguf` is `Foo.Q4_1`); or by its path, accepted only
//! inside the model folders ([`locate`]). The SmolLM2 fixture that `cargo xtask setup`
//! downloads is served as `default` and also as `SmolLM2-135M-Instruct`. An instance's intent
//! records the model as `default` (each node then uses its own fixture path), as a model id
//! (each node finds it in its own cache), or as a path, which must be the same on every node.
//!
//! The registry of this node's models and the model list are in [`registry`].
//!
//! **Why a crate of its own.** Models are the node's largest seam: name resolution, each
//! file's facts, copies of files from members ([`peer`], [`gather`], [`sources`]) and from the
//! hub ([`fetch`]), and the model list. The binary (`src/`) only wires them to the API and the
//! executor; what they need from the node is the small [`Cluster`] trait.

pub mod cluster;
pub mod delete;
pub mod fetch;
pub mod gather;
pub mod locate;
pub mod peer;
pub mod registry;
pub mod sources;

pub use cluster::Cluster;
use locate::ModelDirs;

use placement::{ComputeBackend, InstanceMemory, ModelCard};
use std::path::{Path, PathBuf};
use text::image_prompt::ImagePrompt;
use text::Tokenizer;

/// The id under which the default model (the SmolLM2 fixture) is served.
pub const DEFAULT_MODEL_ID: &str = "default";
/// The default model's own name, also accepted and listed.
pub const DEFAULT_MODEL_NAME: &str = "SmolLM2-135M-Instruct";

/// A model the node can run: where it is and what it is called.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSpec {
    /// The id clients use.
    pub id: String,
    /// Other names that reach it.
    pub aliases: Vec<String>,
    /// GGUF file or Hugging Face folder on this node.
    pub path: PathBuf,
    /// OpenAI's `owned_by`.
    pub owned_by: String,
    /// How an intent names it so that every node finds it: `default` or the path.
    pub reference: String,
}

impl ModelSpec {
    /// The default model at `path` (this node's fixture).
    pub fn default_at(path: &Path) -> ModelSpec {
        ModelSpec {
            id: DEFAULT_MODEL_ID.into(),
            aliases: vec![DEFAULT_MODEL_NAME.into()],
            path: path.to_path_buf(),
            owned_by: "HuggingFaceTB".into(),
            reference: DEFAULT_MODEL_ID.into(),
        }
    }

    /// The spec an intent's model reference names on this node (whether or not the file is
    /// here): `default` for this node's fixture, a model id's snapshot in the Hugging Face
    /// cache, else the path.
    pub fn of_reference(reference: &str, default_path: &Path, dirs: &ModelDirs) -> ModelSpec {
        let default = ModelSpec::default_at(default_path);
        if default.answers_to(reference) {
            return default;
        }
        if hub::ModelId::looks_like_id(reference) {
            if let Ok(id) = hub::ModelId::parse(reference) {
                return ModelSpec {
                    id: reference.to_string(),
                    aliases: vec![],
                    path: dirs.hf_path_or_future(&id),
                    owned_by: id.org.clone(),
                    reference: reference.to_string(),
                };
            }
        }
        let path = Path::new(reference);
        let file_name = path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_else(|| reference.to_string());
        let id = file_name
            .strip_suffix(".gguf")
            .unwrap_or(&file_name)
            .to_string();
        ModelSpec {
            id,
            aliases: vec![],
            path: path.to_path_buf(),
            owned_by: "local".into(),
            reference: reference.to_string(),
        }
    }

    /// The model a name given by a user refers to: the default model by its names, a model
    /// id downloaded into the Hugging Face cache, or a file or folder inside the model folders
    /// (by its absolute path). `None` for anything else — a path outside the model folders is
    /// not looked at, so the answer does not reveal whether it exists.
    pub fn resolve(name: &str, default_path: &Path, dirs: &ModelDirs) -> Option<ModelSpec> {
        let default = ModelSpec::default_at(default_path);
        if default.answers_to(name) {
            return Some(default);
        }
        if hub::ModelId::looks_like_id(name) {
            let id = hub::ModelId::parse(name).ok()?;
            dirs.hf_path(&id)?;
            return Some(ModelSpec::of_reference(name, default_path, dirs));
        }
        let path = dirs.confine(name)?;
        Some(ModelSpec::of_reference(
            &path.to_string_lossy(),
            default_path,
            dirs,
        ))
    }

    /// Whether `name` names this model (its id, an alias, or its path).
    pub fn answers_to(&self, name: &str) -> bool {
        self.id == name
            || self.aliases.iter().any(|a| a == name)
            || Path::new(name) == self.path
            || self.reference == name
    }

    /// Its id and aliases.
    pub fn names(&self) -> impl Iterator<Item = &String> {
        std::iter::once(&self.id).chain(self.aliases.iter())
    }
}

/// What the node reads from a model's files, once: enough to place it and to build prompts.
/// Plain data: the reader (which needs the model families, so MLX) is the node's, given to
/// [`registry::ModelRegistry::new`] as a [`registry::ReadFacts`].
pub struct ModelFacts {
    /// Its tokenizer and chat template.
    pub tokenizer: Tokenizer,
    /// The longest sequence it takes.
    pub context_length: usize,
    /// Width of its logits (token ids `0..vocab_size`), what `logit_bias` ids are checked
    /// against.
    pub vocab_size: usize,
    /// Transformer layers.
    pub num_layers: usize,
    /// Hidden size.
    pub hidden_size: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Bytes of weights on disk.
    pub bytes_on_disk: u64,
    /// Its size and experts, as `GET /v1/models` shows them.
    pub shape: gateway::ModelShape,
    /// The counts a tensor-parallel ring's size must divide besides the key/value heads
    /// (query heads, feed-forward and expert widths, quantization groups).
    pub tensor_divisors: Vec<placement::TensorDivisor>,
    /// Each layer's parameters when the layers differ (dense leading layers before
    /// Mixture-of-Experts ones), else empty: placement splits a pipeline by them.
    pub layer_weights: Vec<u64>,
    /// Layers no pipeline stage may begin at (a KV-shared layer and the layers between it and
    /// the layer whose keys it reads stay on one rank), for placement.
    pub no_cut_before: Vec<u32>,
    /// What an instance holds while it runs (weights as they run, KV budget, runner
    /// overhead): what placement counts.
    pub memory: InstanceMemory,
    /// How its prompt holds an image, for a model whose vision tower shoal runs (Gemma 3
    /// with `vision_config`): requests with images for a model without one are refused with a
    /// 400, never dropped in silence.
    pub image_prompt: Option<ImagePrompt>,
}

impl ModelFacts {
    /// The model card placement decides on: its memory is what a runner of it holds
    /// ([`ModelFacts::memory`]), not the file's size; the vision tower's part of it is rank 0's
    /// alone ([`placement::ModelCard::rank0_bytes`]), the rest is shared out by the split. Every model inference loads can be split by
    /// layers and by heads (its Llama/Qwen-family decoder), on any MLX backend.
    pub fn card(&self, id: &str) -> ModelCard {
        ModelCard {
            id: id.to_string(),
            n_layers: u32::try_from(self.num_layers).unwrap_or(u32::MAX),
            storage_bytes: (self.memory.total() - self.memory.vision)
                .max(self.bytes_on_disk.saturating_sub(self.memory.vision)),
            hidden_size: u32::try_from(self.hidden_size).unwrap_or(u32::MAX),
            num_key_value_heads: u32::try_from(self.num_kv_heads).unwrap_or(u32::MAX),
            supports_tensor: true,
            tensor_divisors: self.tensor_divisors.clone(),
            layer_weights: self.layer_weights.clone(),
            // The tower runs whole on rank 0 (see `inference::vision`), not spread over ranks.
            rank0_bytes: self.memory.vision,
            no_cut_before: self.no_cut_before.clone(),
            backends: vec![
                ComputeBackend::MlxCpu,
                ComputeBackend::MlxMetal,
                ComputeBackend::MlxCuda,
            ],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_model_answers_to_both_names_and_paths_resolve_absolutely() {
        let fixture = Path::new("/nonexistent/SmolLM2-135M-Instruct.Q4_1.gguf");
        let dir = std::env::temp_dir().join(format!("shoal-models-{}", std::process::id()));
        let dirs = ModelDirs {
            hf: hub::HfCache::at(dir.join("hf")),
            local: vec![dir.clone()],
        };
        for name in [DEFAULT_MODEL_ID, DEFAULT_MODEL_NAME] {
            let spec = ModelSpec::resolve(name, fixture, &dirs).expect(name);
            assert_eq!(spec.id, DEFAULT_MODEL_ID);
            assert_eq!(spec.reference, DEFAULT_MODEL_ID);
        }
        assert!(ModelSpec::resolve("no-such-model", fixture, &dirs).is_none());
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("Foo.Q4_1.gguf");
        std::fs::write(&file, b"x").unwrap();
        let spec = ModelSpec::resolve(&file.to_string_lossy(), fixture, &dirs).unwrap();
        assert_eq!(spec.id, "Foo.Q4_1");
        assert!(Path::new(&spec.reference).is_absolute());
        // Outside the model folders: refused whether or not it exists.
        assert!(ModelSpec::resolve("/etc/passwd", fixture, &dirs).is_none());
        assert!(ModelSpec::resolve("../../etc/passwd", fixture, &dirs).is_none());
        // A model id: found once its snapshot is in the cache, at the snapshot folder.
        assert!(ModelSpec::resolve("org/name", fixture, &dirs).is_none());
        let id = hub::ModelId::parse("org/name").unwrap();
        let commit = "0123456789abcdef0123456789abcdef01234567";
        std::fs::create_dir_all(dirs.hf.snapshot(&id, commit)).unwrap();
        dirs.hf.write_ref(&id, "main", commit).unwrap();
        let spec = ModelSpec::resolve("org/name", fixture, &dirs).unwrap();
        assert_eq!(spec.path, dirs.hf.snapshot(&id, commit));
        assert_eq!(spec.reference, "org/name");
        // Another node names it by the same reference and finds the same id.
        let theirs = ModelSpec::of_reference(&spec.reference, fixture, &dirs);
        assert_eq!(theirs, spec);
        let spec = ModelSpec::resolve(&file.to_string_lossy(), fixture, &dirs).unwrap();
        let theirs = ModelSpec::of_reference(&spec.reference, fixture, &dirs);
        assert_eq!(theirs, spec);
        assert!(theirs.answers_to("Foo.Q4_1"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
