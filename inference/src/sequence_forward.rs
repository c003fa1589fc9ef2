//! The model one step at a time for one sequence, however it is split: the [`Forward`] trait
//! the generation loop runs over, and its implementation for a whole model in this process
//! ([`LocalForward`]). A distributed instance runs one sequence as a batch of one through its
//! ring's one protocol ([`crate::batch::OneSequence`] over [`crate::batch::RingBatch`]).

use crate::config::ModelConfig;
use crate::error::{InferenceError, Result};
use crate::kv_cache::KvCache;
use crate::models::shard::{ModelShard, ShardInput};
use mlx_rs::{Array, Dtype};

/// Something that runs the model one step at a time for one sequence: a whole model in this
/// process ([`LocalForward`]), or one slot of anything that runs batches
/// ([`crate::batch::OneSequence`]: rank 0 of a pipeline or tensor-parallel instance, at
/// warm-up). The generation loop ([`crate::generate::generate`]) runs over any of them, so
/// sampling, stop strings and streaming behave the same however the model is split.
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
    /// `None` when this forward hands logits to the host instead (the default; a batch of
    /// one over a ring, whose steps are synchronous).
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
            top: Vec::new(),
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
