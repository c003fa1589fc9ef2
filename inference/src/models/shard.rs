//! A layer range of a decoder of any family.
//!
//! A [`ModelShard`] holds layers `[start, end)`. The first shard also holds the token
//! embedding, the last the final norm and the output head. A shard's forward pass takes
//! tokens (first shard) or hidden states (others) and gives hidden states (inner shards) or
//! logits (last shard), so pipeline stages can pass activations rank to rank.

use super::base::{check_shape, DecoderLayer};
use super::per_layer_inputs::PerLayerEmbedding;
use crate::config::ModelConfig;
use crate::error::{InferenceError, Result};
use crate::kv_cache::KvCache;
use crate::kv_rows::{LayerKv, StepKv};
use crate::linear::Matrix;
use crate::weights::FormatOnMlx;
use crate::weights::{TensorSource, WeightFormat};
use mlx_rs::{Array, Dtype};
use std::ops::Range;

/// What a shard's forward pass takes.
pub enum ShardInput<'a> {
    /// Token ids (first shard only).
    Tokens(&'a [u32]),
    /// Hidden states `[1, seq, hidden]` from the previous shard.
    Hidden(Array),
}

/// Layers `[start, end)` of a decoder, with embeddings on the first and the head on the last.
#[derive(Debug, Clone)]
pub struct ModelShard {
    /// The model's configuration.
    pub config: ModelConfig,
    /// The layers this shard holds.
    pub range: Range<usize>,
    /// Dtype of activations.
    pub dtype: Dtype,
    pub(super) embed: Option<Matrix>,
    pub(super) layers: Vec<DecoderLayer>,
    pub(super) norm: Option<Array>,
    pub(super) head: Option<Matrix>,
    /// The factor on token embeddings, where the family has one (Gemma).
    pub(crate) embed_scale: Option<f32>,
    /// The first shard's half of the per-layer inputs (Gemma 4 E2B/E4B).
    pub(crate) per_layer: Option<Box<PerLayerEmbedding>>,
    /// Columns carried after the hidden state between layers and ranks (the per-layer
    /// inputs; 0 for none).
    pub(crate) carried: usize,
    /// Per layer of the shard, the earlier layer of the shard (its index here) whose keys and
    /// values it reads (Gemma 4's KV-shared layers).
    pub(crate) kv_sources: Vec<Option<usize>>,
}

impl ModelShard {
    /// Loads layers `range` from `source`, evaluating each layer as it is read (so memory
    /// holds only this shard) and calling `progress(done, total)` after each step.
    pub fn load(
        config: &ModelConfig,
        range: Range<usize>,
        source: &mut dyn TensorSource,
        format: WeightFormat,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<ModelShard> {
        if range.start >= range.end || range.end > config.num_layers {
            return Err(InferenceError::BadLayerRange {
                start: range.start,
                end: range.end,
                layers: config.num_layers,
            });
        }
        let first = range.start == 0;
        let last = range.end == config.num_layers;
        let dtype = format.compute_dtype();
        let family = super::family(config.architecture);
        let mut kv_sources = Vec::with_capacity(range.len());
        for layer in range.clone() {
            kv_sources.push(match family.kv_source(config, layer) {
                Some(s) if s >= range.start && s < layer => Some(s - range.start),
                Some(s) => {
                    return Err(InferenceError::BadConfig(format!(
                        "layers {}..{} cannot be a pipeline stage: layer {layer} reads the keys \
                         and values of layer {s}, which another stage holds (a cut must keep a \
                         KV-shared layer with its source)",
                        range.start, range.end
                    )))
                }
                None => None,
            });
        }
        let total = range.len() + 2;
        let embed = if first || (last && config.tie_word_embeddings) {
            Some(source.matrix("model.embed_tokens", format)?)
        } else {
            None
        };
        if let Some(e) = &embed {
            check_shape(e, "model.embed_tokens", config.vocab_size)?;
            mlx_rs::transforms::eval(e.arrays())?;
        }
        let per_layer = if first {
            family.per_layer_embedding(config, source, format)?
        } else {
            None
        };
        if let Some(p) = &per_layer {
            mlx_rs::transforms::eval(p.arrays())?;
        }
        progress(1, total);
        let mut layers = Vec::with_capacity(range.len());
        for (done, i) in range.clone().enumerate() {
            let layer = family.block(config, source, i, format)?;
            mlx_rs::transforms::eval(layer.arrays())?;
            if let Some(w) = layer.ffn.calibration_matrix() {
                crate::linear::calibrate_row_product(w)?;
            }
            layers.push(layer);
            progress(done + 2, total);
        }
        let (norm, head) = if last {
            let norm = family.final_norm(config, source, dtype)?;
            let head_name = family.head_tensor();
            let head =
                if config.tie_word_embeddings || !source.contains(&format!("{head_name}.weight")) {
                    embed.clone().ok_or_else(|| {
                        InferenceError::MissingTensor("model.embed_tokens.weight".into())
                    })?
                } else {
                    let h = source.matrix(head_name, format)?;
                    check_shape(&h, head_name, config.vocab_size)?;
                    h
                };
            let mut arrays = head.arrays();
            arrays.push(&norm);
            mlx_rs::transforms::eval(arrays)?;
            (Some(norm), Some(head))
        } else {
            (None, None)
        };
        let shard = ModelShard {
            config: config.clone(),
            range: range.clone(),
            dtype,
            embed: if first { embed } else { None },
            layers,
            norm,
            head,
            embed_scale: family.embedding_scale(config),
            per_layer: per_layer.map(Box::new),
            carried: family.carried_columns(config),
            kv_sources,
        };
        shard.prefer_huge_pages();
        progress(total, total);
        Ok(shard)
    }

    /// True when this shard holds the embedding.
    pub fn is_first(&self) -> bool {
        self.range.start == 0
    }

    /// True when this shard holds the final norm and head.
    pub fn is_last(&self) -> bool {
        self.range.end == self.config.num_layers
    }

    /// A fresh cache for this shard's layers.
    pub fn new_cache(&self) -> KvCache {
        KvCache::new(self.layers.len())
    }

    fn embedding(&self) -> Result<&Matrix> {
        self.embed.as_ref().ok_or_else(|| {
            InferenceError::InvalidRequest("this shard does not hold the embedding".into())
        })
    }

    /// Embeds tokens: `[1, seq, hidden]`.
    pub fn embed(&self, tokens: &[u32]) -> Result<Array> {
        self.embedding()?;
        if let Some(&bad) = tokens
            .iter()
            .find(|&&t| t as usize >= self.config.vocab_size)
        {
            return Err(InferenceError::InvalidRequest(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.config.vocab_size
            )));
        }
        self.embed_device(&Array::from_slice(tokens, &[tokens.len() as i32]))
    }

    /// Embeds token ids already on the device (`[n]` uint32, e.g. the previous step's greedy
    /// choice, which is within the vocabulary by construction): `[1, n, hidden]`.
    pub fn embed_device(&self, ids: &Array) -> Result<Array> {
        let h = self.embedding()?.rows(ids)?.reshape(&[
            1,
            ids.size() as i32,
            self.config.hidden_size as i32,
        ])?;
        let h = match self.embed_scale {
            Some(scale) => mlx_rs::ops::multiply(&h, Array::from_f32(scale).as_dtype(h.dtype())?)?,
            None => h,
        };
        match &self.per_layer {
            Some(p) => p.append(&h, ids),
            // Carried columns the layers fill (Kimi K3's attention-residual blocks) start
            // empty.
            None if self.carried > 0 => {
                let n = ids.size() as i32;
                let empty = mlx_rs::ops::zeros_dtype(&[1, n, self.carried as i32], h.dtype())?;
                Ok(mlx_rs::ops::concatenate(&[h, empty], -1)?)
            }
            None => Ok(h),
        }
    }

    /// Values per position passed from rank to rank: the hidden state and the columns carried
    /// after it (the per-layer inputs).
    pub fn activation_width(&self) -> usize {
        self.config.hidden_size + self.carried
    }

    /// Backs the weights with huge pages where the platform allows (see
    /// [`crate::platform::prefer_huge_pages`]): decoding reads all of them at every token.
    pub(super) fn prefer_huge_pages(&self) {
        let mut arrays: Vec<&Array> = self.layers.iter().flat_map(DecoderLayer::arrays).collect();
        arrays.extend(
            self.embed
                .iter()
                .chain(self.head.iter())
                .flat_map(Matrix::arrays),
        );
        arrays.extend(self.norm.iter());
        let advised = crate::platform::prefer_huge_pages(&arrays);
        tracing::debug!(
            advised_mb = advised / (1 << 20),
            "weights advised to huge pages"
        );
    }

    /// Runs this shard's layers over hidden states, appending to `cache`.
    pub fn forward_layers(&self, mut h: Array, cache: &mut KvCache) -> Result<Array> {
        if cache.layers.len() != self.layers.len() {
            return Err(InferenceError::InvalidRequest(
                "the cache belongs to a different shard".into(),
            ));
        }
        for (j, layer) in self.layers.iter().enumerate() {
            if let Some(s) = self.kv_sources[j] {
                let (before, from) = cache.layers.split_at_mut(j);
                from[0].follow(&before[s]);
            }
            h = layer.forward(&h, &mut cache.layers[j])?;
        }
        for c in cache.layers.iter_mut() {
            c.end_lending();
        }
        Ok(h)
    }

    /// This shard's layers over several sequences' positions at once: `h` is `[1, total,
    /// hidden]`, the new positions of each sequence one after another, and `segments` says,
    /// in the same order, how many each has and which cache they continue (see
    /// [`crate::models::base::Attention::forward_segments`]). A pipeline stage runs its
    /// layer range this way for every sequence of a batched step.
    pub fn forward_layers_batch(&self, mut h: Array, segments: &mut [StepKv<'_>]) -> Result<Array> {
        if segments.iter().any(|s| s.layers() != self.layers.len()) {
            return Err(InferenceError::InvalidRequest(
                "the cache belongs to a different shard".into(),
            ));
        }
        for (j, layer) in self.layers.iter().enumerate() {
            if let Some(s) = self.kv_sources[j] {
                for segment in segments.iter_mut() {
                    segment.follow(j, s)?;
                }
            }
            let mut per_layer: Vec<LayerKv<'_>> = segments.iter_mut().map(|s| s.layer(j)).collect();
            h = layer.forward_segments(&h, &mut per_layer)?;
        }
        if self.kv_sources.iter().any(Option::is_some) {
            for segment in segments.iter_mut() {
                for j in 0..self.layers.len() {
                    segment.end_lending(j);
                }
            }
        }
        Ok(h)
    }

    /// Float32 logits `[rows.len(), vocab]` of positions `rows` of `h` (`[1, total,
    /// hidden]`): the last shard's head over the positions whose logits are wanted.
    pub fn logits_of_rows(&self, h: &Array, rows: &[i32]) -> Result<Array> {
        let n = rows.len() as i32;
        let h = h.take_axis(Array::from_slice(rows, &[n]), 1)?;
        let logits = self.logits(&h, false)?;
        let vocab = *logits.shape().last().unwrap_or(&0);
        let logits = logits.reshape(&[n, vocab])?;
        Ok(if logits.dtype() == Dtype::Float32 {
            logits
        } else {
            logits.as_dtype(Dtype::Float32)?
        })
    }

    /// Final norm and head: logits `[1, seq, vocab]` (of the last position only if `last_only`).
    pub fn logits(&self, h: &Array, last_only: bool) -> Result<Array> {
        let (norm, head) = match (&self.norm, &self.head) {
            (Some(n), Some(h)) => (n, h),
            _ => {
                return Err(InferenceError::InvalidRequest(
                    "this shard does not hold the output head".into(),
                ))
            }
        };
        let seq = h.shape()[1];
        // The head reads the hidden state, not the columns carried after it.
        let stripped;
        let h = if self.carried > 0 {
            let hidden = self.config.hidden_size as i32;
            stripped = mlx_rs::ops::indexing::IndexOp::index(h, (.., .., ..hidden));
            &stripped
        } else {
            h
        };
        let h = if last_only && seq > 1 {
            h.take_axis(Array::from_slice(&[seq - 1], &[1]), 1)?
        } else {
            h.clone()
        };
        let h = crate::cpu_layer_ops::rms_norm(&h, Some(norm), self.config.rms_norm_eps)?;
        let logits = head.apply_to_hidden_state(&h)?;
        match super::family(self.config.architecture).logit_softcap(&self.config) {
            Some(cap) => {
                let cap = Array::from_f32(cap).as_dtype(logits.dtype())?;
                let capped = mlx_rs::ops::tanh(&mlx_rs::ops::divide(&logits, &cap)?)?;
                Ok(mlx_rs::ops::multiply(&capped, &cap)?)
            }
            None => Ok(logits),
        }
    }

    /// The whole shard: embedding if first, layers, head if last. Returns hidden states for
    /// inner shards and logits (all positions, or the last if `last_only`) for the last.
    pub fn forward(
        &self,
        input: ShardInput<'_>,
        cache: &mut KvCache,
        last_only: bool,
    ) -> Result<Array> {
        let h = match input {
            ShardInput::Tokens(t) => self.embed(t)?,
            ShardInput::Hidden(h) => h,
        };
        let h = self.forward_layers(h, cache)?;
        if self.is_last() {
            self.logits(&h, last_only)
        } else {
            Ok(h)
        }
    }
}

/// The positions, in a step's concatenated `[1, total, hidden]`, of the last new token of each
/// part (`(new tokens, wants logits)`) that wants logits.
pub fn wanted_rows(parts: impl IntoIterator<Item = (usize, bool)>) -> Vec<i32> {
    let mut rows = Vec::new();
    let mut end = 0i32;
    for (len, wants) in parts {
        end += len as i32;
        if wants {
            rows.push(end - 1);
        }
    }
    rows
}
