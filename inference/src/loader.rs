//! Loading a model: the one loader, for a whole model in this process ([`load_shard`], which
//! [`crate::Engine::load`] and `shoal generate` use) and for one rank of a runner ([`load`],
//! with the load watchdog). The model is opened once: its configuration, tokenizer and tensor
//! source serve the checks, the choice of format and the weights alike.

use crate::config::{ModelConfig, RopeScaling};
use crate::error::{InferenceError, Result};
use crate::gguf::GgufFile;
use crate::models::shard::ModelShard;
use crate::ring::RingGroup;
use crate::tokenizer::Tokenizer;
use crate::weights::FormatOnMlx;
use crate::weights::{GgufSource, SafetensorsSource, TensorSource, WeightFormat};
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// An opened model: its configuration, a source of its tensors, and its tokenizer.
pub struct OpenedModel {
    /// The model's configuration.
    pub config: ModelConfig,
    /// Where its tensors come from.
    pub source: Box<dyn TensorSource>,
    /// Its tokenizer.
    pub tokenizer: Tokenizer,
    /// Bytes of weights on disk (for the load watchdog).
    pub bytes_on_disk: u64,
}

fn io_error(path: &Path, source: std::io::Error) -> InferenceError {
    InferenceError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Opens a GGUF file or a Hugging Face folder without loading weights yet.
pub fn open_model(path: &Path) -> Result<OpenedModel> {
    let meta = std::fs::metadata(path).map_err(|e| io_error(path, e))?;
    if meta.is_dir() {
        let (json, config) = folder_config(path)?;
        let tokenizer = Tokenizer::from_hf_dir(path, &json)?;
        let source = SafetensorsSource::open(path, &config)?;
        let bytes_on_disk = crate::weights::weight_bytes_of_folder(path)?;
        return Ok(OpenedModel {
            config,
            source: Box::new(source),
            tokenizer,
            bytes_on_disk,
        });
    }
    let file = GgufFile::open(path)?;
    let mut config = ModelConfig::from_gguf(&file)?;
    if file.tensors.contains_key("rope_freqs.weight") {
        let (info, bytes) = file.read_tensor_bytes("rope_freqs.weight")?;
        let ty = info.ggml_type.expect("checked by read_tensor_bytes");
        config.rope_scaling = RopeScaling::FreqFactors(crate::quant::dequantize(ty, &bytes));
    }
    let tokenizer = Tokenizer::from_gguf(&file)?;
    let source = GgufSource::new(file, &config, crate::models::family(config.architecture));
    Ok(OpenedModel {
        config,
        source: Box::new(source),
        tokenizer,
        bytes_on_disk: meta.len(),
    })
}

/// A Hugging Face folder's `config.json`, as JSON and as the configuration read from it.
fn folder_config(path: &Path) -> Result<(serde_json::Value, ModelConfig)> {
    let config_path = path.join("config.json");
    let text = std::fs::read_to_string(&config_path).map_err(|e| io_error(&config_path, e))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| InferenceError::BadModel {
            path: config_path.clone(),
            reason: format!("config.json is not valid JSON: {e}"),
        })?;
    let config = ModelConfig::from_hf_json(&json)?;
    Ok((json, config))
}

/// What placement needs of a model, read without touching its weights.
pub struct ModelDescription {
    /// The model's configuration.
    pub config: ModelConfig,
    /// Its tokenizer.
    pub tokenizer: Tokenizer,
    /// Bytes of its weights on disk: the files' sizes, the index's `total_size` while they are
    /// not all here, or an estimate from the configuration while neither is.
    pub bytes_on_disk: u64,
}

/// Describes the GGUF file or Hugging Face folder at `path`. A node places a model from the hub
/// after fetching only its support files: a repository with one `model.safetensors` and no
/// index (most models under 5 GB, SmolLM2 or Qwen3-0.6B) has nothing that gives its size
/// then, so the size is estimated from its parameters and how they are stored
/// ([`crate::memory::stored_bytes_estimate`]).
pub fn describe_model(path: &Path) -> Result<ModelDescription> {
    let weights_missing = path.is_dir()
        && !path.join("model.safetensors").exists()
        && !path.join("model.safetensors.index.json").exists();
    if !weights_missing {
        let opened = open_model(path)?;
        return Ok(ModelDescription {
            config: opened.config,
            tokenizer: opened.tokenizer,
            bytes_on_disk: opened.bytes_on_disk,
        });
    }
    let (json, config) = folder_config(path)?;
    let tokenizer = Tokenizer::from_hf_dir(path, &json)?;
    let bytes_on_disk = crate::memory::stored_bytes_estimate(&config, &json);
    Ok(ModelDescription {
        config,
        tokenizer,
        bytes_on_disk,
    })
}

/// How to load a model in this process.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Layers to hold (default: all).
    pub layers: Option<Range<usize>>,
    /// Weight representation (default: [`WeightFormat::choose`]).
    pub format: Option<WeightFormat>,
}

/// Loads a shard of the model at `path`, reporting `progress(done, total)`.
pub fn load_shard(
    path: &Path,
    options: &LoadOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<(ModelShard, Tokenizer)> {
    load(
        path,
        Split::Layers(options.layers.clone()),
        options.format,
        progress,
        None,
    )
}

/// Environment variable with the base load timeout in seconds.
pub const LOAD_TIMEOUT_ENV: &str = "SHOAL_MODEL_LOAD_TIMEOUT";

/// How long loading a shard whose weights take `running_bytes` in memory (in the form they
/// run, not as stored) may take: `base` plus one second per 100 MB. Measured: the 1.9 B
/// Qwen3-MoE bench model (1.0 GB at 4 bits) expands to 7.6 GB of f32 in 19.8 s on 2 idle
/// cores (`shoal generate`), about 400 MB/s; a busy machine or a slow disk reads a quarter of
/// that. Sized by the file instead, that load had 60 s and missed it beside `mlx_lm.server`.
pub fn load_timeout(base: Duration, running_bytes: u64) -> Duration {
    base + Duration::from_secs(running_bytes / 100_000_000)
}

/// The base timeout: `SHOAL_MODEL_LOAD_TIMEOUT` seconds, else 60.
pub fn base_load_timeout() -> Duration {
    let secs = std::env::var(LOAD_TIMEOUT_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .unwrap_or(60.0);
    Duration::from_secs_f64(secs)
}

/// The load watchdog of a runner: a load stuck inside MLX cannot be interrupted, so a thread
/// watches the clock ([`load_timeout`] of the shard's bytes) and reports the timeout itself.
#[derive(Clone)]
pub struct Watchdog {
    /// Base of the timeout.
    pub base: Duration,
    /// Called once, with the timeout, when it passes: from the watchdog's thread while the
    /// load is still running, or from the loader if the load finished too late. The runner
    /// reports `failed` here and exits (the load never returns otherwise).
    pub on_timeout: Arc<dyn Fn(Duration) + Send + Sync>,
}

/// A started watchdog.
struct Watch {
    settled: Arc<AtomicBool>,
    fire: Arc<dyn Fn() -> bool + Send + Sync>,
    started: Instant,
    timeout: Duration,
    thread: std::thread::JoinHandle<()>,
}

impl Watchdog {
    fn start(&self, timeout: Duration) -> Watch {
        // Whoever settles first wins: the loader (finished in time) or the timeout (reported
        // by the watchdog while the load is stuck, or by the loader if it finished too late).
        let started = Instant::now();
        let settled = Arc::new(AtomicBool::new(false));
        let fire: Arc<dyn Fn() -> bool + Send + Sync> = {
            let settled = settled.clone();
            let on_timeout = self.on_timeout.clone();
            Arc::new(move || {
                let first = !settled.swap(true, Ordering::SeqCst);
                if first {
                    on_timeout(timeout);
                }
                first
            })
        };
        let thread = {
            let (settled, fire) = (settled.clone(), fire.clone());
            std::thread::spawn(move || {
                while !settled.load(Ordering::SeqCst) {
                    if started.elapsed() >= timeout {
                        fire();
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        };
        Watch {
            settled,
            fire,
            started,
            timeout,
            thread,
        }
    }
}

impl Watch {
    /// Stops the watchdog; `Err(LoadTimedOut)` if the timeout won.
    fn finish(self) -> Result<()> {
        let late = self.started.elapsed() >= self.timeout && (self.fire)();
        let timed_out = late || self.settled.swap(true, Ordering::SeqCst);
        let _ = self.thread.join();
        if timed_out {
            return Err(InferenceError::LoadTimedOut {
                seconds: self.timeout.as_secs(),
            });
        }
        Ok(())
    }
}

/// Which part of the model a load keeps.
pub enum Split {
    /// Layers `[start, end)` (all when `None`): a whole model, or a pipeline stage.
    Layers(Option<Range<usize>>),
    /// Every layer, cut to this rank's slice of a tensor-parallel instance over `group`
    /// (`layers`, if given, must be all of them).
    Tensor {
        /// The instance's ring.
        group: Arc<RingGroup>,
        /// The layers the node asked for.
        layers: Option<Range<usize>>,
    },
}

/// Loads the part `split` of the model at `path`, under `watchdog` when given. Progress
/// starts with `(0, 1)` once the request is known to fit the model (for tensor parallelism
/// after its checks, which need the configuration), then counts the shard's steps.
pub fn load(
    path: &Path,
    split: Split,
    format: Option<WeightFormat>,
    progress: &mut dyn FnMut(usize, usize),
    watchdog: Option<&Watchdog>,
) -> Result<(ModelShard, Tokenizer)> {
    let (mut opened, range, format, group) = match split {
        Split::Layers(layers) => {
            progress(0, 1);
            let opened = open_model(path)?;
            let range = layers.unwrap_or(0..opened.config.num_layers);
            let format = format.unwrap_or_else(|| {
                WeightFormat::choose(&opened.config, &range, opened.bytes_on_disk)
            });
            (opened, range, format, None)
        }
        Split::Tensor { group, layers } => {
            let opened = open_model(path)?;
            check_tensor_split(&opened.config, layers, group.size())?;
            progress(0, 1);
            let range = 0..opened.config.num_layers;
            let format = format.unwrap_or_else(|| {
                WeightFormat::choose(&opened.config, &range, opened.bytes_on_disk)
            });
            (opened, range, format, Some(group))
        }
    };
    let layers = opened.config.num_layers;
    let running = crate::memory::weight_bytes(&opened.config, format, opened.bytes_on_disk);
    let shard_bytes = running * range.len().min(layers) as u64 / layers.max(1) as u64;
    let watch = watchdog.map(|w| w.start(load_timeout(w.base, shard_bytes)));
    let result = ModelShard::load(
        &opened.config,
        range,
        opened.source.as_mut(),
        format,
        progress,
    )
    .and_then(|shard| match group {
        Some(group) => shard.into_tensor_parallel(group),
        None => Ok(shard),
    });
    if let Some(watch) = watch {
        watch.finish()?;
    }
    Ok((result?, opened.tokenizer))
}

/// Refuses a tensor-parallel split the model cannot take, before any weight is read (the
/// slicing checks the heads again).
fn check_tensor_split(
    config: &ModelConfig,
    layers: Option<Range<usize>>,
    size: usize,
) -> Result<()> {
    if let Some(range) = layers {
        if range != (0..config.num_layers) {
            return Err(InferenceError::BadSplit(format!(
                "a tensor-parallel rank holds every layer, not {}..{} of {}",
                range.start, range.end, config.num_layers
            )));
        }
    }
    if let Some(refusal) = crate::tensor_split::tensor_refusal(config, size) {
        return Err(InferenceError::BadSplit(format!(
            "tensor parallelism over {size} ranks: {refusal}; place it on a number of nodes \
             that divides it, or use pipeline parallelism"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_load_watchdog_grows_with_the_shard() {
        let base = Duration::from_secs(60);
        assert_eq!(load_timeout(base, 0), base);
        assert_eq!(load_timeout(base, 7_600_000_000), Duration::from_secs(136));
    }

    #[test]
    fn a_watchdog_reports_once_and_the_loader_sees_the_timeout() {
        let fired = Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = fired.clone();
        let dog = Watchdog {
            base: Duration::ZERO,
            on_timeout: Arc::new(move |t| log.lock().unwrap().push(t)),
        };
        let watch = dog.start(Duration::ZERO);
        std::thread::sleep(Duration::from_millis(120));
        let err = watch.finish().unwrap_err();
        assert_eq!(err.to_string(), "model loading timed out after 0 s");
        assert_eq!(*fired.lock().unwrap(), vec![Duration::ZERO]);
        // In time: no report.
        let watch = dog.start(Duration::from_secs(60));
        assert!(watch.finish().is_ok());
        assert_eq!(fired.lock().unwrap().len(), 1);
    }
}
