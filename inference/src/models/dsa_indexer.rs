//! DeepSeek Sparse Attention's lightning indexer (DeepSeek V3.2, GLM-5), as mlx-lm's
//! `deepseek_v32.py` runs it: a small scorer that picks, for every query, the `index_topk`
//! past positions its latent attention ([`super::mla`]) may read. Per layer:
//!
//! - queries from the attention's normalized query bottleneck, `q = W_qb · qr`
//!   (`index_n_heads` heads of `index_head_dim`), one key per position
//!   `k = LayerNorm(W_k · x)`, both rotated over their first `qk_rope_head_dim` numbers;
//! - per query, head weights `w = W_w · x · (heads · head_dim)^-1/2`;
//! - position j's score `Σ_h w_h · relu(q_h · k_j)`, and the query attends to the `index_topk`
//!   best scored visible positions (all of them while a sequence has no more than that).
//!
//! The indexer's keys are cache state: they ride in the latent cache's values beside the
//! rotated key (`[k_pe ‖ k_index]`, see [`super::mla`]), so the prompt cache, truncation,
//! batching rows and their joining and leaving keep them with the latent, position for
//! position. Tensor parallel: the indexer is replicated (it is small, and every rank must pick
//! the same positions), so nothing here is cut.

use super::base::layer_tensor;
use super::parts::check_shape;
use crate::config::ModelConfig;
use crate::error::{InferenceError, Result};
use crate::linear::Linear;
use crate::weights::FormatOnMlx;
use crate::weights::{TensorSource, WeightFormat};
use mlx_rs::fast;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{ops, Array};

/// The indexer's shape, from `index_n_heads`, `index_head_dim`, `index_topk` and
/// `indexer_rope_interleave`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct IndexerShape {
    /// Scoring heads (`index_n_heads`).
    pub heads: usize,
    /// Width of each head and of the one key per position (`index_head_dim`).
    pub head_dim: usize,
    /// Positions each query may read (`index_topk`).
    pub topk: usize,
    /// Whether its RoPE rotates interleaved pairs (GLM-5) or halves (DeepSeek V3.2).
    pub interleaved: bool,
}

impl IndexerShape {
    /// Reads a DeepSeek V3.2-shaped configuration into `config`: the sigmoid-routed experts
    /// (every layer past the dense ones: `moe_layer_freq` 1), the latent attention with
    /// `norm_eps` for its bottlenecks, and this indexer on it. `family` names it in errors.
    pub(crate) fn configure(
        self,
        v: &serde_json::Value,
        config: &mut ModelConfig,
        family: &str,
        moe_layer_freq: usize,
        norm_eps: f32,
    ) -> Result<()> {
        if moe_layer_freq != 1 {
            return Err(InferenceError::BadConfig(format!(
                "{family} with moe_layer_freq {moe_layer_freq} is not supported (1 is)"
            )));
        }
        config.moe = Some(super::sigmoid_moe::sigmoid_moe_config(v)?);
        super::latent_moe::configure_latent(v, config, norm_eps)?;
        self.attach(config, family)
    }

    /// Gives the latent attention of `config` (read already) this indexer, after checking it
    /// can be built; `family` names the configuration in errors.
    fn attach(self, config: &mut ModelConfig, family: &str) -> Result<()> {
        let Some(latent) = config.attention.latent.as_mut() else {
            return Err(InferenceError::BadConfig(format!(
                "a {family} configuration without latent attention"
            )));
        };
        // Widths size the indexer's projections and the cache per position: as the latent's
        // own widths, implausibly large ones are refused before anything is sized by them.
        if self.heads == 0
            || self.heads > 1 << 12
            || self.head_dim > 1024
            || self.topk == 0
            || self.head_dim < latent.qk_rope_head_dim
            || !self.head_dim.is_multiple_of(2)
            || latent.q_lora_rank.is_none()
        {
            return Err(InferenceError::BadConfig(format!(
                "a {family} config.json's indexer of {self:?} cannot be built: it needs \
                 heads (at most 4096), a positive index_topk, an even index_head_dim of at \
                 least qk_rope_head_dim ({}) and at most 1024, and a q_lora_rank",
                latent.qk_rope_head_dim
            )));
        }
        latent.indexer = Some(self);
        Ok(())
    }
}

/// The names of an indexer's tensors under `model.layers.N.self_attn.indexer.`.
const TENSORS: [&str; 5] = [
    "wq_b.weight",
    "wk.weight",
    "k_norm.weight",
    "k_norm.bias",
    "weights_proj.weight",
];

/// `nn.LayerNorm`'s default epsilon, which the reference's key norm keeps.
const KEY_NORM_EPS: f32 = 1e-5;

/// One layer's indexer (see the module docs).
#[derive(Debug, Clone)]
pub struct Indexer {
    wq_b: Linear,
    wk: Linear,
    k_norm_weight: Array,
    k_norm_bias: Array,
    weights_proj: Linear,
    shape: IndexerShape,
    /// The rotated width (the attention's `qk_rope_head_dim`) and its periods and YaRN
    /// magnitude factor (the attention's own).
    rope_dims: i32,
    periods: Array,
    mscale: f32,
}

/// The indexer's view of new positions: queries `[b, heads, l, head_dim]`, keys
/// `[b, 1, l, head_dim]` (both not yet rotated) and head weights `[b, heads, l, 1]`.
pub(crate) struct IndexerInputs {
    pub(crate) q: Array,
    pub(crate) k: Array,
    pub(crate) w: Array,
}

impl Indexer {
    /// Layer `layer`'s indexer. `rope_dims`, `periods` and `mscale` are the attention's RoPE,
    /// which the reference builds again, alike, for the indexer.
    pub(crate) fn load(
        shape: &IndexerShape,
        source: &mut dyn TensorSource,
        layer: usize,
        format: WeightFormat,
        rope: (i32, Array, f32),
    ) -> Result<Indexer> {
        let p = |part: &str| layer_tensor(layer, &format!("self_attn.indexer.{part}"));
        let wq_b = source.linear(&p("wq_b"), format)?;
        check_shape(&wq_b.weight, &p("wq_b"), shape.heads * shape.head_dim)?;
        let wk = source.linear(&p("wk"), format)?;
        check_shape(&wk.weight, &p("wk"), shape.head_dim)?;
        let weights_proj = source.linear(&p("weights_proj"), format)?;
        check_shape(&weights_proj.weight, &p("weights_proj"), shape.heads)?;
        let dtype = format.compute_dtype();
        let (rope_dims, periods, mscale) = rope;
        if rope_dims as usize > shape.head_dim {
            return Err(InferenceError::BadConfig(format!(
                "the indexer's heads ({}) are narrower than the rotated width ({rope_dims})",
                shape.head_dim
            )));
        }
        Ok(Indexer {
            wq_b,
            wk,
            k_norm_weight: source.dense(&p("k_norm.weight"), dtype)?,
            k_norm_bias: source.dense(&p("k_norm.bias"), dtype)?,
            weights_proj,
            shape: shape.clone(),
            rope_dims,
            periods,
            mscale,
        })
    }

    /// Hugging Face names of layer `layer`'s indexer tensors.
    pub(crate) fn tensor_names(layer: usize) -> impl Iterator<Item = String> {
        TENSORS
            .iter()
            .map(move |t| layer_tensor(layer, &format!("self_attn.indexer.{t}")))
    }

    /// Queries, keys and head weights of new positions `x` `[b, l, hidden]`, with `qr` the
    /// attention's normalized query bottleneck `[b, l, q_lora_rank]`.
    pub(crate) fn project(&self, x: &Array, qr: &Array) -> Result<IndexerInputs> {
        let (b, l) = (x.shape()[0], x.shape()[1]);
        let (heads, dim) = (self.shape.heads as i32, self.shape.head_dim as i32);
        let q = self
            .wq_b
            .forward(qr)?
            .reshape(&[b, l, heads, dim])?
            .transpose_axes(&[0, 2, 1, 3])?;
        let k = fast::layer_norm(
            self.wk.forward(x)?,
            &self.k_norm_weight,
            &self.k_norm_bias,
            KEY_NORM_EPS,
        )?
        .expand_dims(1)?;
        let scale = (self.shape.heads as f32).powf(-0.5) * (self.shape.head_dim as f32).powf(-0.5);
        let w = ops::multiply(self.weights_proj.forward(x)?, Array::from_f32(scale))?
            .swap_axes(-1, -2)?
            .expand_dims(-1)?;
        Ok(IndexerInputs { q, k, w })
    }

    /// `x` with its YaRN factor on the rotated part (the reference scales only that part).
    fn scaled(&self, x: &Array) -> Result<Array> {
        if self.mscale == 1.0 {
            return Ok(x.clone());
        }
        let d = self.rope_dims;
        let rotated = ops::multiply(x.index((.., .., .., ..d)), Array::from_f32(self.mscale))?;
        Ok(ops::concatenate(
            &[rotated, x.index((.., .., .., d..))],
            -1,
        )?)
    }

    /// `x` `[b, heads, l, head_dim]` rotated at positions `offset..offset + l`.
    pub(crate) fn rotate(&self, x: &Array, offset: usize) -> Result<Array> {
        Ok(fast::rope(
            self.scaled(x)?,
            self.rope_dims,
            self.shape.interleaved,
            None,
            1.0,
            offset as i32,
            Some(&self.periods),
        )?)
    }

    /// `x` `[rows, heads, 1, head_dim]` rotated, each row at its own position.
    pub(crate) fn rotate_at(&self, x: &Array, positions: &Array) -> Result<Array> {
        Ok(fast::rope_dynamic(
            self.scaled(x)?,
            self.rope_dims,
            self.shape.interleaved,
            None,
            1.0,
            positions,
            Some(&self.periods),
        )?)
    }

    /// Which of the cached `keys` `[b, 1, columns, head_dim]` each query of `q`
    /// `[b, heads, l, head_dim]` (rotated) with head weights `w` may read: `[b, 1, l, columns]`
    /// booleans, within `visible` (booleans broadcasting against them; `None`: every column).
    /// `None` when there are no more columns than `index_topk`: every visible one is read.
    pub(crate) fn select(
        &self,
        q: &Array,
        w: &Array,
        keys: &Array,
        visible: Option<&Array>,
    ) -> Result<Option<Array>> {
        let columns = keys.shape()[2];
        if columns as usize <= self.shape.topk {
            return Ok(None);
        }
        let topk = self.shape.topk as i32;
        let scores = ops::maximum(
            ops::matmul(q, keys.swap_axes(-1, -2)?)?,
            Array::from_f32(0.0),
        )?;
        let mut scores = ops::multiply(&scores, w)?.sum_axis(1, true)?;
        if let Some(visible) = visible {
            scores = ops::select(
                visible,
                &scores,
                Array::from_f32(f32::NEG_INFINITY).as_dtype(scores.dtype())?,
            )?;
        }
        // The topk-th best score of each query: a visible column at or above it is read (a
        // query with fewer visible columns has -inf there, and reads all it sees).
        let kth = ops::partition_axis(&scores, columns - topk, -1)?.index((
            ..,
            ..,
            ..,
            columns - topk..columns - topk + 1,
        ));
        let chosen = scores.ge(&kth)?;
        Ok(Some(match visible {
            Some(visible) => ops::logical_and(&chosen, visible)?,
            None => chosen,
        }))
    }

    /// Every array of the indexer.
    pub(crate) fn arrays(&self) -> Vec<&Array> {
        let mut v = self.wq_b.arrays();
        v.extend(self.wk.arrays());
        v.push(&self.k_norm_weight);
        v.push(&self.k_norm_bias);
        v.extend(self.weights_proj.arrays());
        v
    }

    /// Parameters of one layer's indexer over `hidden` with a query bottleneck of `q_lora`.
    pub fn parameters(shape: &IndexerShape, hidden: usize, q_lora: usize) -> usize {
        let (h, d) = (shape.heads, shape.head_dim);
        q_lora * h * d + hidden * d + 2 * d + hidden * h
    }
}
