//! Loading a model from a path and generating text with it: the API the gateway and the
//! runner call.

use crate::config::{ModelConfig, RopeScaling};
use crate::detokenizer::{StopCheck, StopMatcher, StreamDecoder};
use crate::error::{InferenceError, Result};
use crate::gguf::GgufFile;
use crate::kv_cache::KvCache;
use crate::model::{ModelShard, ShardInput};
use crate::sampling::{Sampler, SamplingParams};
use crate::tokenizer::{ChatMessage, Tokenizer};
use crate::weights::{GgufSource, SafetensorsSource, TensorSource, WeightFormat};
use mlx_rs::{Array, Dtype};
use std::ops::{ControlFlow, Range};
use std::path::Path;
use std::time::Instant;

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
        let config_path = path.join("config.json");
        let text = std::fs::read_to_string(&config_path).map_err(|e| io_error(&config_path, e))?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| InferenceError::BadModel {
                path: config_path.clone(),
                reason: format!("config.json is not valid JSON: {e}"),
            })?;
        let config = ModelConfig::from_hf_json(&json)?;
        let tokenizer = Tokenizer::from_hf_dir(path, &json)?;
        let source = SafetensorsSource::open(path, &config)?;
        let bytes_on_disk = crate::weights::safetensors_files(path)?
            .iter()
            .filter_map(|f| std::fs::metadata(f).ok())
            .map(|m| m.len())
            .sum();
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
    let source = GgufSource::new(file, &config);
    Ok(OpenedModel {
        config,
        source: Box::new(source),
        tokenizer,
        bytes_on_disk: meta.len(),
    })
}

/// How to load a model.
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
    let mut opened = open_model(path)?;
    let range = options
        .layers
        .clone()
        .unwrap_or(0..opened.config.num_layers);
    let format = options
        .format
        .unwrap_or_else(|| WeightFormat::choose(&opened.config, &range, opened.bytes_on_disk));
    let shard = ModelShard::load(
        &opened.config,
        range,
        opened.source.as_mut(),
        format,
        progress,
    )?;
    Ok((shard, opened.tokenizer))
}

/// What to generate from.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Prompt {
    /// Plain text, tokenized as is (BOS added if the model wants it).
    Text(String),
    /// Chat messages, rendered with the model's chat template.
    Chat(Vec<ChatMessage>),
    /// Token ids, used as they are.
    Tokens(Vec<u32>),
}

/// A generation request.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GenerateRequest {
    /// The prompt.
    pub prompt: Prompt,
    /// How to choose tokens.
    #[serde(default)]
    pub sampling: SamplingParams,
    /// At most this many new tokens (also bounded by the context).
    pub max_tokens: usize,
    /// Generation stops before any of these strings (which are not returned).
    #[serde(default)]
    pub stop: Vec<String>,
    /// Generation stops at these tokens, in addition to the model's end tokens.
    #[serde(default)]
    pub stop_token_ids: Vec<u32>,
    /// Keep going past the model's end tokens (for benchmarks).
    #[serde(default)]
    pub ignore_eos: bool,
}

impl GenerateRequest {
    /// A greedy request for `prompt` with at most `max_tokens` new tokens.
    pub fn new(prompt: Prompt, max_tokens: usize) -> GenerateRequest {
        GenerateRequest {
            prompt,
            sampling: SamplingParams::default(),
            max_tokens,
            stop: vec![],
            stop_token_ids: vec![],
            ignore_eos: false,
        }
    }
}

/// One generated token as it streams out.
#[derive(Debug, Clone, Copy)]
pub struct TokenEvent<'a> {
    /// Token id.
    pub token: u32,
    /// New text it completes (may be empty while a character or a possible stop string is
    /// incomplete).
    pub text: &'a str,
    /// Its log-probability under the model.
    pub logprob: f32,
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An end token or stop string.
    Stop,
    /// `max_tokens` or the context was reached.
    Length,
    /// The caller cancelled.
    Cancelled,
}

/// The result of a generation.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Completion {
    /// The generated text (without stop strings or end tokens).
    pub text: String,
    /// The generated tokens (an end token that stopped generation included).
    pub tokens: Vec<u32>,
    /// Log-probability of each generated token.
    pub logprobs: Vec<f32>,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Seconds to process the prompt (time to the first token's logits).
    pub prompt_seconds: f64,
    /// Seconds of decoding after the first token.
    pub generation_seconds: f64,
}

impl Completion {
    /// Tokens generated.
    pub fn completion_tokens(&self) -> usize {
        self.tokens.len()
    }
    /// Prompt tokens per second.
    pub fn prompt_tps(&self) -> f64 {
        self.prompt_tokens as f64 / self.prompt_seconds.max(1e-9)
    }
    /// Generated tokens per second (tokens after the first, over the decode time).
    pub fn generation_tps(&self) -> f64 {
        self.tokens.len().saturating_sub(1) as f64 / self.generation_seconds.max(1e-9)
    }
}

/// A whole model in this process, ready to generate.
pub struct Engine {
    /// The model (all layers).
    pub model: ModelShard,
    /// Its tokenizer.
    pub tokenizer: Tokenizer,
}

/// Something that runs the model one step at a time for one sequence: a whole model in this
/// process ([`LocalForward`]), rank 0 of a pipeline ([`crate::pipeline::PipelineStage`]) or of a
/// tensor-parallel instance ([`crate::tensor_stage::TensorStage`]). The generation loop
/// ([`generate`]) runs over any of them, so sampling, stop strings and streaming behave the
/// same however the model is split.
pub trait Forward {
    /// The model's configuration (context length, vocabulary).
    fn config(&self) -> &ModelConfig;

    /// Runs `tokens` (the next positions of the sequence, appended to its cache) and returns
    /// the logits of the last one (`vocab` floats).
    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>>;

    /// Forgets the sequence: the next `forward` starts at position 0.
    fn reset(&mut self) -> Result<()>;

    /// The most tokens one `forward` takes; longer prompts are prefilled in chunks of this
    /// size (bounding the activations that cross the ring per step).
    fn max_chunk(&self) -> usize {
        usize::MAX
    }

    /// Runs `input` and picks the most likely next token on the device, returning without
    /// waiting for the result, so the caller can queue the following step before it reads this
    /// one and building a step's graph overlaps computing the previous one (as mlx-lm does).
    /// `None` when this forward hands logits to the host instead (the default; the
    /// distributed stages, whose ring steps are synchronous).
    fn greedy_on_device(&mut self, input: StepInput<'_>) -> Result<Option<DeviceChoice>> {
        let _ = input;
        Ok(None)
    }
}

/// The tokens of one step of [`Forward::greedy_on_device`].
pub enum StepInput<'a> {
    /// Token ids known on the host (the prompt).
    Host(&'a [u32]),
    /// A token the previous step chose, still on the device (`[1]`, uint32).
    Device(&'a Array),
}

/// A token chosen on the device, possibly not computed yet.
pub struct DeviceChoice {
    /// The token id, `[1]` uint32.
    pub token: Array,
    /// Its log-probability, a float32 scalar.
    pub logprob: Array,
}

impl DeviceChoice {
    /// Greedy choice from logits `[.., vocab]` (the last position), queued for evaluation.
    pub fn greedy(logits: &Array) -> Result<DeviceChoice> {
        let last = last_logits(logits)?;
        let token = mlx_rs::ops::indexing::argmax_axis(&last, 0, None)?.reshape(&[1])?;
        let logprob = mlx_rs::ops::subtract(
            &last.take_axis(&token, 0)?.reshape(&[])?,
            &last.logsumexp(None)?,
        )?;
        mlx_rs::transforms::async_eval([&token, &logprob])?;
        Ok(DeviceChoice { token, logprob })
    }

    /// Waits until the choice is computed.
    pub fn wait(&self) -> Result<()> {
        Ok(mlx_rs::transforms::eval([&self.token, &self.logprob])?)
    }

    /// Waits for the choice and reads it.
    pub fn read(&self) -> Result<crate::sampling::Sampled> {
        self.wait()?;
        Ok(crate::sampling::Sampled {
            token: self.token.as_slice::<u32>()[0],
            logprob: self.logprob.as_slice::<f32>()[0],
        })
    }
}

/// Prompt chunk of the distributed forwards: 256 positions of SmolLM2 activations are 590 KB
/// per hop.
pub const DISTRIBUTED_PREFILL_CHUNK: usize = 256;

/// A whole model in this process with the KV cache of one sequence.
pub struct LocalForward<'a> {
    model: &'a ModelShard,
    cache: KvCache,
}

impl<'a> LocalForward<'a> {
    /// A fresh sequence on `model`, which must hold every layer.
    pub fn new(model: &'a ModelShard) -> Result<LocalForward<'a>> {
        if !(model.is_first() && model.is_last()) {
            return Err(InferenceError::InvalidRequest(format!(
                "layers {:?} of {} are not a whole model; generate through the pipeline",
                model.range, model.config.num_layers
            )));
        }
        Ok(LocalForward {
            model,
            cache: model.new_cache(),
        })
    }
}

impl Forward for LocalForward<'_> {
    fn config(&self) -> &ModelConfig {
        &self.model.config
    }

    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        last_logits_to_host(&self.model.forward(
            ShardInput::Tokens(tokens),
            &mut self.cache,
            true,
        )?)
    }

    fn reset(&mut self) -> Result<()> {
        self.cache = self.model.new_cache();
        Ok(())
    }

    fn greedy_on_device(&mut self, input: StepInput<'_>) -> Result<Option<DeviceChoice>> {
        let h = match input {
            StepInput::Host(tokens) => self.model.embed(tokens)?,
            StepInput::Device(token) => self.model.embed_device(token)?,
        };
        let h = self.model.forward_layers(h, &mut self.cache)?;
        Ok(Some(DeviceChoice::greedy(&self.model.logits(&h, true)?)?))
    }
}

/// The prompt as token ids.
pub fn prompt_ids(tokenizer: &Tokenizer, prompt: &Prompt) -> Result<Vec<u32>> {
    match prompt {
        Prompt::Text(t) => tokenizer.encode_prompt(t),
        Prompt::Chat(messages) => {
            let text = tokenizer.apply_chat_template(messages, true)?;
            tokenizer.encode(&text)
        }
        Prompt::Tokens(ids) => Ok(ids.clone()),
    }
}

/// Checks a request before any work starts (so a distributed forward never begins a step it
/// cannot finish): sampling parameters, an empty or too long prompt, token ids outside the
/// vocabulary. Returns the prompt's token ids.
pub fn check_request(
    config: &ModelConfig,
    tokenizer: &Tokenizer,
    request: &GenerateRequest,
) -> Result<Vec<u32>> {
    request.sampling.validate()?;
    let prompt = prompt_ids(tokenizer, &request.prompt)?;
    if prompt.is_empty() {
        return Err(InferenceError::InvalidRequest("the prompt is empty".into()));
    }
    let context_length = config.max_position_embeddings;
    if prompt.len() >= context_length {
        return Err(InferenceError::PromptTooLong {
            prompt_tokens: prompt.len(),
            context_length,
        });
    }
    if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= config.vocab_size) {
        return Err(InferenceError::InvalidRequest(format!(
            "token id {bad} is outside the vocabulary of {}",
            config.vocab_size
        )));
    }
    Ok(prompt)
}

/// Generates a completion of `request` over `forward` (see [`Engine::generate`]): the one
/// generation loop, whatever runs the model. The sequence is reset first; the prompt is
/// prefilled in chunks of `forward.max_chunk()` tokens.
pub fn generate(
    forward: &mut dyn Forward,
    tokenizer: &Tokenizer,
    request: &GenerateRequest,
    mut on_token: impl FnMut(TokenEvent<'_>) -> ControlFlow<()>,
) -> Result<Completion> {
    let prompt = check_request(forward.config(), tokenizer, request)?;
    let context_length = forward.config().max_position_embeddings;
    let max_tokens = request.max_tokens.min(context_length - prompt.len());
    let mut sampler = Sampler::new(request.sampling.clone());
    let mut context = prompt.clone();
    let mut out = Completion {
        text: String::new(),
        tokens: vec![],
        logprobs: vec![],
        finish_reason: FinishReason::Length,
        prompt_tokens: prompt.len(),
        prompt_seconds: 0.0,
        generation_seconds: 0.0,
    };
    if max_tokens == 0 {
        return Ok(out);
    }
    let start = Instant::now();
    forward.reset()?;
    let chunks: Vec<&[u32]> = prompt.chunks(forward.max_chunk().max(1)).collect();
    let (last_chunk, earlier) = chunks.split_last().expect("the prompt is not empty");
    let mut logits = Vec::new();
    for chunk in earlier {
        logits = forward.forward(chunk)?;
    }
    // Greedy requests choose on the device and run one step ahead (see
    // `Forward::greedy_on_device`); others bring the logits to the host sampler.
    let mut pending = if sampler.is_greedy() {
        forward.greedy_on_device(StepInput::Host(last_chunk))?
    } else {
        None
    };
    match &pending {
        Some(choice) => choice.wait()?,
        None => logits = forward.forward(last_chunk)?,
    }
    out.prompt_seconds = start.elapsed().as_secs_f64();
    let decode_start = Instant::now();
    let mut decoder = StreamDecoder::new();
    let mut stops = StopMatcher::new(&request.stop);
    let mut stopped_by_string = false;
    loop {
        let s = match pending.take() {
            Some(choice) => {
                if out.tokens.len() + 1 < max_tokens {
                    pending = forward.greedy_on_device(StepInput::Device(&choice.token))?;
                }
                choice.read()?
            }
            None => sampler.sample(&logits, &context, out.tokens.len()),
        };
        context.push(s.token);
        out.tokens.push(s.token);
        out.logprobs.push(s.logprob);
        let is_end = (!request.ignore_eos && tokenizer.eos_token_ids.contains(&s.token))
            || request.stop_token_ids.contains(&s.token);
        if is_end {
            out.finish_reason = FinishReason::Stop;
            break;
        }
        let piece = decoder.push(tokenizer, s.token)?;
        let (emit, stopped) = match stops.push(&piece) {
            StopCheck::Continue(t) => (t, false),
            StopCheck::Stop(t) => (t, true),
        };
        if on_token(TokenEvent {
            token: s.token,
            text: &emit,
            logprob: s.logprob,
        })
        .is_break()
        {
            out.finish_reason = FinishReason::Cancelled;
            break;
        }
        if stopped {
            stopped_by_string = true;
            out.finish_reason = FinishReason::Stop;
            break;
        }
        if out.tokens.len() >= max_tokens {
            break;
        }
        if pending.is_none() {
            logits = forward.forward(&[s.token])?;
        }
    }
    out.generation_seconds = decode_start.elapsed().as_secs_f64();
    if !stopped_by_string && out.finish_reason != FinishReason::Cancelled {
        // Flush an incomplete character and any text held back for a possible stop string.
        let tail = decoder.finish(tokenizer)?;
        let rest = match stops.push(&tail) {
            StopCheck::Stop(t) => t,
            StopCheck::Continue(t) => t + &stops.finish(),
        };
        if !rest.is_empty() {
            let _ = on_token(TokenEvent {
                token: *out.tokens.last().unwrap_or(&0),
                text: &rest,
                logprob: 0.0,
            });
        }
    }
    out.text = stops.text().to_owned();
    Ok(out)
}

/// The last position's logits of `[.., vocab]` as float32 `[vocab]` (lazy).
fn last_logits(logits: &Array) -> Result<Array> {
    let vocab = *logits.shape().last().unwrap_or(&0);
    let seq = logits.size() as i32 / vocab.max(1);
    let last = logits
        .reshape(&[seq, vocab])?
        .take_axis(Array::from_slice(&[seq - 1], &[1]), 0)?
        .reshape(&[vocab])?;
    Ok(if last.dtype() == Dtype::Float32 {
        last
    } else {
        last.as_dtype(Dtype::Float32)?
    })
}

/// Logits `[.., vocab]` of the last position, on the host.
pub fn last_logits_to_host(logits: &Array) -> Result<Vec<f32>> {
    let last = last_logits(logits)?;
    last.eval()?;
    Ok(last.as_slice::<f32>().to_vec())
}

impl Engine {
    /// Loads the whole model at `path`.
    pub fn load(path: impl AsRef<Path>, format: Option<WeightFormat>) -> Result<Engine> {
        let (model, tokenizer) = load_shard(
            path.as_ref(),
            &LoadOptions {
                layers: None,
                format,
            },
            &mut |_, _| {},
        )?;
        Ok(Engine { model, tokenizer })
    }

    /// The prompt as token ids.
    pub fn prompt_ids(&self, prompt: &Prompt) -> Result<Vec<u32>> {
        prompt_ids(&self.tokenizer, prompt)
    }

    /// Generates a completion, calling `on_token` for every token as it is produced; the
    /// callback returns `ControlFlow::Break(())` to cancel (checked between tokens).
    pub fn generate(
        &self,
        request: &GenerateRequest,
        on_token: impl FnMut(TokenEvent<'_>) -> ControlFlow<()>,
    ) -> Result<Completion> {
        let mut local = LocalForward::new(&self.model)?;
        generate(&mut local, &self.tokenizer, request, on_token)
    }
}
