//! The decoder: Llama-family transformer blocks (Llama, Qwen2, Qwen3) over a layer range.
//!
//! A [`ModelShard`] holds layers `[start, end)`. The first shard also holds the token
//! embedding, the last the final norm and the output head. A shard's forward pass takes
//! tokens (first shard) or hidden states (others) and gives hidden states (inner shards) or
//! logits (last shard), so pipeline stages can pass activations rank to rank.

use crate::config::ModelConfig;
use crate::error::{InferenceError, Result};
use crate::kv_cache::{KvCache, LayerCache};
use crate::linear::{Linear, Matrix};
use crate::ring::RingGroup;
use crate::rope::Rope;
use crate::weights::{TensorSource, WeightFormat};
use mlx_rs::fast::{self, ScaledDotProductAttentionMask};
use mlx_rs::{nn, ops, Array, Dtype};
use std::ops::Range;
use std::sync::Arc;

mod tensor_parallel;

/// Adds up a row-parallel projection's partial results over the tensor-parallel ring.
fn all_sum(partial: Array, reduce: &Option<Arc<RingGroup>>) -> Result<Array> {
    match reduce {
        Some(group) => Ok(group.all_sum(&partial)?),
        None => Ok(partial),
    }
}

/// Multi-head attention with grouped keys/values, RoPE and optional per-head Q/K norms.
#[derive(Debug, Clone)]
pub struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: Option<Array>,
    k_norm: Option<Array>,
    num_heads: i32,
    num_kv_heads: i32,
    head_dim: i32,
    eps: f32,
    rope: Rope,
    /// Tensor parallel: the ring whose ranks each hold a slice of the heads; the output
    /// projection's partial sums are added up over it.
    reduce: Option<Arc<RingGroup>>,
}

impl Attention {
    /// `x`: `[batch, seq, hidden]`.
    pub fn forward(&self, x: &Array, cache: &mut LayerCache) -> Result<Array> {
        let (b, l) = (x.shape()[0], x.shape()[1]);
        let heads = |t: Array, n: i32, norm: &Option<Array>| -> Result<Array> {
            let t = t.reshape(&[b, l, n, self.head_dim])?;
            let t = match norm {
                Some(w) => fast::rms_norm(&t, Some(w), self.eps)?,
                None => t,
            };
            Ok(t.transpose_axes(&[0, 2, 1, 3])?)
        };
        let q = heads(self.q_proj.forward(x)?, self.num_heads, &self.q_norm)?;
        let k = heads(self.k_proj.forward(x)?, self.num_kv_heads, &self.k_norm)?;
        let v = heads(self.v_proj.forward(x)?, self.num_kv_heads, &None)?;
        let offset = cache.len();
        let q = self.rope.apply(&q, offset)?;
        let k = self.rope.apply(&k, offset)?;
        let (k, v) = cache.append(k, v)?;
        let scale = 1.0 / (self.head_dim as f32).sqrt();
        let mask = if l > 1 {
            Some(ScaledDotProductAttentionMask::Causal)
        } else {
            None
        };
        let o = fast::scaled_dot_product_attention(&q, &k, &v, scale, mask, None)?;
        let o =
            o.transpose_axes(&[0, 2, 1, 3])?
                .reshape(&[b, l, self.num_heads * self.head_dim])?;
        all_sum(self.o_proj.forward(&o)?, &self.reduce)
    }
}

/// The SwiGLU feed-forward: `down(silu(gate(x)) * up(x))`.
#[derive(Debug, Clone)]
pub struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
    /// Tensor parallel: see [`Attention`].
    reduce: Option<Arc<RingGroup>>,
}

impl Mlp {
    /// Applies the block.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let gate = nn::silu(self.gate_proj.forward(x)?)?;
        let h = ops::multiply(&gate, &self.up_proj.forward(x)?)?;
        all_sum(self.down_proj.forward(&h)?, &self.reduce)
    }
}

/// One pre-norm transformer block.
#[derive(Debug, Clone)]
pub struct DecoderLayer {
    input_norm: Array,
    attention: Attention,
    post_attention_norm: Array,
    mlp: Mlp,
    eps: f32,
}

impl DecoderLayer {
    /// `h = x + attn(norm(x)); h + mlp(norm(h))`.
    pub fn forward(&self, x: &Array, cache: &mut LayerCache) -> Result<Array> {
        let a = self
            .attention
            .forward(&fast::rms_norm(x, Some(&self.input_norm), self.eps)?, cache)?;
        let h = ops::add(x, &a)?;
        let m = self.mlp.forward(&fast::rms_norm(
            &h,
            Some(&self.post_attention_norm),
            self.eps,
        )?)?;
        Ok(ops::add(&h, &m)?)
    }

    fn arrays(&self) -> Vec<&Array> {
        let a = &self.attention;
        let mut v = vec![&self.input_norm, &self.post_attention_norm];
        for l in [
            &a.q_proj,
            &a.k_proj,
            &a.v_proj,
            &a.o_proj,
            &self.mlp.gate_proj,
            &self.mlp.up_proj,
            &self.mlp.down_proj,
        ] {
            v.extend(l.arrays());
        }
        v.extend(a.q_norm.iter().chain(a.k_norm.iter()));
        v
    }
}

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
    embed: Option<Matrix>,
    layers: Vec<DecoderLayer>,
    norm: Option<Array>,
    head: Option<Matrix>,
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
        progress(1, total);
        let mut layers = Vec::with_capacity(range.len());
        for (done, i) in range.clone().enumerate() {
            let p = |name: &str| format!("model.layers.{i}.{name}");
            let attention = Attention {
                q_proj: source.linear(&p("self_attn.q_proj"), format)?,
                k_proj: source.linear(&p("self_attn.k_proj"), format)?,
                v_proj: source.linear(&p("self_attn.v_proj"), format)?,
                o_proj: source.linear(&p("self_attn.o_proj"), format)?,
                q_norm: if config.qk_norm {
                    Some(source.dense(&p("self_attn.q_norm.weight"), dtype)?)
                } else {
                    None
                },
                k_norm: if config.qk_norm {
                    Some(source.dense(&p("self_attn.k_norm.weight"), dtype)?)
                } else {
                    None
                },
                num_heads: config.num_heads as i32,
                num_kv_heads: config.num_kv_heads as i32,
                head_dim: config.head_dim as i32,
                eps: config.rms_norm_eps,
                rope: Rope::new(config.head_dim, config.rope_theta, &config.rope_scaling),
                reduce: None,
            };
            check_shape(
                &attention.q_proj.weight,
                &p("self_attn.q_proj"),
                config.num_heads * config.head_dim,
            )?;
            check_shape(
                &attention.k_proj.weight,
                &p("self_attn.k_proj"),
                config.num_kv_heads * config.head_dim,
            )?;
            check_shape(
                &attention.v_proj.weight,
                &p("self_attn.v_proj"),
                config.num_kv_heads * config.head_dim,
            )?;
            check_shape(
                &attention.o_proj.weight,
                &p("self_attn.o_proj"),
                config.hidden_size,
            )?;
            let mlp = Mlp {
                gate_proj: source.linear(&p("mlp.gate_proj"), format)?,
                up_proj: source.linear(&p("mlp.up_proj"), format)?,
                down_proj: source.linear(&p("mlp.down_proj"), format)?,
                reduce: None,
            };
            check_shape(
                &mlp.gate_proj.weight,
                &p("mlp.gate_proj"),
                config.intermediate_size,
            )?;
            check_shape(
                &mlp.down_proj.weight,
                &p("mlp.down_proj"),
                config.hidden_size,
            )?;
            let layer = DecoderLayer {
                input_norm: source.dense(&p("input_layernorm.weight"), dtype)?,
                attention,
                post_attention_norm: source.dense(&p("post_attention_layernorm.weight"), dtype)?,
                mlp,
                eps: config.rms_norm_eps,
            };
            mlx_rs::transforms::eval(layer.arrays())?;
            layers.push(layer);
            progress(done + 2, total);
        }
        let (norm, head) = if last {
            let norm = source.dense("model.norm.weight", dtype)?;
            let head = if config.tie_word_embeddings || !source.contains("lm_head.weight") {
                embed.clone().ok_or_else(|| {
                    InferenceError::MissingTensor("model.embed_tokens.weight".into())
                })?
            } else {
                let h = source.matrix("lm_head", format)?;
                check_shape(&h, "lm_head", config.vocab_size)?;
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
        Ok(self.embedding()?.rows(ids)?.reshape(&[
            1,
            ids.size() as i32,
            self.config.hidden_size as i32,
        ])?)
    }

    /// Backs the weights with huge pages where the platform allows (see
    /// [`crate::platform::prefer_huge_pages`]): decoding reads all of them at every token.
    fn prefer_huge_pages(&self) {
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
        for (layer, c) in self.layers.iter().zip(cache.layers.iter_mut()) {
            h = layer.forward(&h, c)?;
        }
        Ok(h)
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
        let h = if last_only && seq > 1 {
            h.take_axis(Array::from_slice(&[seq - 1], &[1]), 1)?
        } else {
            h.clone()
        };
        let h = fast::rms_norm(&h, Some(norm), self.config.rms_norm_eps)?;
        head.apply(&h)
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

fn check_shape(m: &Matrix, name: &str, rows: usize) -> Result<()> {
    let got = match m {
        Matrix::Dense(w) => w.shape()[0],
        Matrix::Quantized { packed, .. } => packed.shape()[0],
    };
    if got as usize != rows {
        return Err(InferenceError::BadTensor {
            name: name.to_owned(),
            reason: format!("expected {rows} rows, found {got}"),
        });
    }
    Ok(())
}
