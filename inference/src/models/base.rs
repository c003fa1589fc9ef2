//! The pieces the model families share (as mlx-lm's `base.py` and the blocks its model files
//! repeat): the gated MLP, the pre-norm decoder block around an attention
//! ([`super::attention`], [`super::mla`]), and the helpers that read them from a [`TensorSource`]. A family ([`super::llama`],
//! [`super::qwen2`], [`super::qwen3`]) decides which of them its block uses and under which
//! tensor names; nothing here asks which family it serves.

pub use super::attention::{Attention, HeadNorms, NormSpan};
use super::attn_res::AttentionResiduals;
pub use super::mlp::{GateActivation, Mlp};
use super::moe::MoeBlock;
pub(crate) use super::parts::{check_shape, gguf_part_in, layer_tensor, norm_weight};
use super::per_layer_inputs::{PerLayerEmbedding, PerLayerGate};
use crate::config::ModelConfig;
use crate::error::{InferenceError, Result};
use crate::kv_cache::LayerCache;
use crate::kv_rows::LayerKv;
use crate::linear::Matrix;
use crate::ring::RingGroup;
use crate::weights::FormatOnMlx;
use crate::weights::{GgufNames, TensorSource, WeightFormat};
use mlx_rs::{ops, Array};
use std::sync::Arc;

/// What makes a model family: how one of its decoder blocks is read from its tensors, and the
/// names those tensors carry (in Hugging Face folders; in GGUF files through [`GgufNames`]).
pub trait Family: GgufNames + Sync {
    /// The `model_type` and class name (`architectures`) an export writes in config.json.
    fn hf_names(&self) -> (&'static str, &'static str);

    /// The names llama.cpp gives this family in a GGUF's `general.architecture` (none: its
    /// GGUF files are not read).
    fn gguf_architectures(&self) -> &'static [&'static str] {
        &[]
    }

    /// Reads layer `layer` from `source`. The default is the plain Llama block (Qwen2's Q/K/V
    /// biases come with the projections, `TensorSource::linear`); a family with more in its
    /// block (Qwen3's Q/K norms) reads it itself.
    fn block(
        &self,
        config: &ModelConfig,
        source: &mut dyn TensorSource,
        layer: usize,
        format: WeightFormat,
    ) -> Result<DecoderLayer> {
        let attention = Attention::load(config, source, layer, format, None)?;
        DecoderLayer::load(config, source, layer, format, attention)
    }

    /// Reads what only this family's `config.json` holds (its experts, its attention's shape,
    /// which layers slide, its own constants) into `config`, after the shared numbers are read. The default reads
    /// nothing.
    fn configure(&self, json: &serde_json::Value, config: &mut ModelConfig) -> Result<()> {
        let _ = (json, config);
        Ok(())
    }

    /// Reads what only this family's GGUF metadata holds (its experts: llama.cpp's
    /// `<arch>.expert_count`, ...) into `config`, after the shared numbers are read; `arch` is
    /// the file's `general.architecture`, the prefix of its keys. The default reads nothing (a
    /// dense family's GGUF says all it needs in the shared keys).
    fn configure_gguf(
        &self,
        file: &crate::gguf::GgufFile,
        arch: &str,
        config: &mut ModelConfig,
    ) -> Result<()> {
        let _ = (file, arch, config);
        Ok(())
    }

    /// The final norm's weight as [`crate::cpu_layer_ops::rms_norm`] takes it (Gemma stores `w` of `1 + w`).
    fn final_norm(
        &self,
        config: &ModelConfig,
        source: &mut dyn TensorSource,
        dtype: mlx_rs::Dtype,
    ) -> Result<Array> {
        let _ = config;
        source.dense("model.norm.weight", dtype)
    }

    /// The output head's tensor name, without `.weight`, when the embedding is not tied: mlx-lm
    /// names it `lm_head` in every family but Llama 4's text model (`output`).
    fn head_tensor(&self) -> &'static str {
        "lm_head"
    }

    /// The cap of the logits' soft capping, `tanh(logits / cap) · cap` (Gemma 4's
    /// `final_logit_softcapping`), `None` for none.
    fn logit_softcap(&self, config: &ModelConfig) -> Option<f32> {
        let _ = config;
        None
    }

    /// The factor on token embeddings (Gemma: `sqrt(hidden)`), `None` for none.
    fn embedding_scale(&self, config: &ModelConfig) -> Option<f32> {
        let _ = config;
        None
    }

    /// Hugging Face names of layer `layer`'s tensors (`model.layers.N.…`), as an export writes
    /// them.
    fn layer_tensor_names(&self, config: &ModelConfig, layer: usize) -> Vec<String>;

    /// The counts a tensor-parallel ring size must divide (heads, widths, their quantization
    /// groups): what placement checks before it places, and the cut checks again.
    fn tensor_divisors(&self, config: &ModelConfig) -> Vec<crate::tensor_divisors::TensorDivisor> {
        crate::tensor_divisors::standard_divisors(config)
    }

    /// The first shard's half of the per-layer inputs (Gemma 4 E2B/E4B,
    /// [`super::per_layer_inputs`]); `None` for a family without them.
    fn per_layer_embedding(
        &self,
        config: &ModelConfig,
        source: &mut dyn TensorSource,
        format: WeightFormat,
    ) -> Result<Option<PerLayerEmbedding>> {
        let _ = (config, source, format);
        Ok(None)
    }

    /// Columns carried after the hidden state from layer to layer and rank to rank (the
    /// per-layer inputs); 0 for none.
    fn carried_columns(&self, config: &ModelConfig) -> usize {
        let _ = config;
        0
    }

    /// Hugging Face names of the model-level tensors besides the embedding, the final norm
    /// and the head (the per-layer inputs' table and projection).
    fn model_tensor_names(&self, config: &ModelConfig) -> Vec<String> {
        let _ = config;
        Vec::new()
    }

    /// The earlier layer whose keys and values layer `layer` reads (Gemma 4's KV-shared
    /// layers); `None` for a layer with its own.
    fn kv_source(&self, config: &ModelConfig, layer: usize) -> Option<usize> {
        let _ = (config, layer);
        None
    }

    /// Parameters of layer `layer` when the shared count does not describe the family's
    /// layers ([`ModelConfig::parameters_of_layer`]: an attention or linear mixer, then a gated
    /// MLP or experts of three matrices each). Nemotron-H's layers are each one kind (a mixer,
    /// attention, an MLP or experts, the last two of two matrices); Gemma 4's have layers
    /// without keys, double-wide MLPs and per-layer gates. `None`: the shared count.
    fn layer_parameters(&self, config: &ModelConfig, layer: usize) -> Option<LayerParameters> {
        let _ = (config, layer);
        None
    }

    /// Parameters outside the layers beyond the token embedding, the final norm and the head
    /// (Gemma 4's per-layer inputs' table and projection): counted in the model's size.
    fn model_parameters_beyond_layers(&self, config: &ModelConfig) -> usize {
        let _ = config;
        0
    }
}

/// One layer's parameters: every one of them, and those one token runs through (the same
/// for a layer without experts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerParameters {
    /// Every parameter, each expert counted.
    pub all: usize,
    /// The router and the experts a token runs through, with the rest of the layer.
    pub active: usize,
}

impl LayerParameters {
    /// A layer whose every parameter runs for each token.
    pub fn dense(all: usize) -> LayerParameters {
        LayerParameters { all, active: all }
    }
}

/// Hugging Face names of the weight matrices and norms every family's layer has, with the GGUF
/// names llama.cpp gives them (`model.layers.N.<hf>` is `blk.N.<gguf>`).
pub(crate) const LAYER_TENSORS: &[(&str, &str)] = &[
    ("self_attn.q_proj", "attn_q"),
    ("self_attn.k_proj", "attn_k"),
    ("self_attn.v_proj", "attn_v"),
    ("self_attn.o_proj", "attn_output"),
    ("mlp.gate_proj", "ffn_gate"),
    ("mlp.up_proj", "ffn_up"),
    ("mlp.down_proj", "ffn_down"),
    ("input_layernorm", "attn_norm"),
    ("post_attention_layernorm", "ffn_norm"),
];

/// Biases of the Q, K and V projections (Qwen2 always, Llama when configured).
pub(crate) const QKV_BIASES: &[&str] = &[
    "self_attn.q_proj.bias",
    "self_attn.k_proj.bias",
    "self_attn.v_proj.bias",
];

/// A block's feed-forward: a dense SwiGLU MLP or a Mixture of Experts (the family decides,
/// layer by layer).
#[derive(Debug, Clone)]
pub enum FeedForward {
    /// One SwiGLU MLP.
    Dense(Mlp),
    /// Routed experts.
    Experts(MoeBlock),
    /// A dense MLP and routed experts side by side, each with its own norms (Gemma 4).
    DenseAndExperts(Box<super::dense_and_experts::DenseAndExperts>),
    /// None: the block is its attention (or mixer) alone (Nemotron-H).
    Absent,
}

impl FeedForward {
    /// Applies it.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            FeedForward::Dense(m) => m.forward(x),
            FeedForward::Experts(m) => m.forward(x),
            FeedForward::DenseAndExperts(m) => m.forward(x),
            FeedForward::Absent => Ok(x.clone()),
        }
    }

    /// Rank `rank`'s slice of a `size`-way tensor-parallel instance.
    pub(crate) fn cut(
        &self,
        rank: usize,
        size: usize,
        group: &Arc<RingGroup>,
        what: &str,
    ) -> Result<FeedForward> {
        Ok(match self {
            FeedForward::Dense(m) => FeedForward::Dense(m.cut(rank, size, group, what)?),
            FeedForward::Experts(m) => FeedForward::Experts(m.cut(rank, size, group, what)?),
            FeedForward::DenseAndExperts(m) => {
                FeedForward::DenseAndExperts(Box::new(m.cut(rank, size, group, what)?))
            }
            FeedForward::Absent => FeedForward::Absent,
        })
    }

    /// A dense f32 matrix of the block to time one-row products with (see
    /// [`crate::linear::calibrate_row_product`]).
    pub(crate) fn calibration_matrix(&self) -> Option<&Array> {
        match self {
            FeedForward::Dense(m) => match &m.gate_proj.weight {
                Matrix::Dense(w) => Some(w),
                Matrix::Quantized(_) => None,
            },
            FeedForward::Experts(_) | FeedForward::DenseAndExperts(_) | FeedForward::Absent => None,
        }
    }

    fn arrays(&self) -> Vec<&Array> {
        match self {
            FeedForward::Dense(m) => m.arrays(),
            FeedForward::Experts(m) => m.arrays(),
            FeedForward::DenseAndExperts(m) => m.arrays(),
            FeedForward::Absent => Vec::new(),
        }
    }
}

/// A block's attention: heads with their own keys and values, or latent attention (the
/// family decides).
#[derive(Debug, Clone)]
pub enum SelfAttention {
    /// Grouped-query heads.
    Heads(Attention),
    /// Multi-head latent attention (DeepSeek V3).
    Latent(super::mla::LatentAttention),
    /// Linear attention with a recurrent state (Gated DeltaNet: Qwen3.5, Qwen3-Next).
    Linear(super::gated_delta::GatedDeltaNet),
    /// A Mamba-2 mixer with a recurrent state (Nemotron-H).
    Mamba(super::mamba2::Mamba2),
    /// None: the block is its feed-forward alone (Nemotron-H's MLP and MoE layers). The
    /// layer's cache only counts the positions it has seen.
    Absent,
    /// Kimi Delta Attention (Kimi Linear): the delta rule with a decay per key channel.
    Kda(Box<super::kda::KimiDeltaAttention>),
    /// Queries over an earlier layer's keys and values (Gemma 4's KV-shared layers).
    SharedKv(Box<super::shared_kv::SharedKvAttention>),
}

impl From<Attention> for SelfAttention {
    fn from(a: Attention) -> SelfAttention {
        SelfAttention::Heads(a)
    }
}

impl SelfAttention {
    fn forward_segments(&self, x: &Array, segments: &mut [LayerKv<'_>]) -> Result<Array> {
        match self {
            SelfAttention::Heads(a) => a.forward_segments(x, segments),
            SelfAttention::Latent(a) => a.forward_segments(x, segments),
            SelfAttention::Linear(a) => a.forward_segments(x, segments),
            SelfAttention::Mamba(a) => a.forward_segments(x, segments),
            SelfAttention::Absent => Err(InferenceError::InvalidRequest(
                "a block without attention has no attention to run".into(),
            )),
            SelfAttention::Kda(a) => a.forward_segments(x, segments),
            SelfAttention::SharedKv(a) => a.forward_segments(x, segments),
        }
    }

    fn cut(
        &self,
        rank: usize,
        size: usize,
        group: &Arc<RingGroup>,
        what: &str,
    ) -> Result<SelfAttention> {
        Ok(match self {
            SelfAttention::Heads(a) => SelfAttention::Heads(a.cut(rank, size, group, what)?),
            SelfAttention::Latent(a) => SelfAttention::Latent(a.cut(rank, size, group, what)?),
            SelfAttention::Linear(a) => SelfAttention::Linear(a.cut(rank, size, group, what)?),
            SelfAttention::Mamba(a) => SelfAttention::Mamba(a.cut(rank, size, group, what)?),
            SelfAttention::Absent => SelfAttention::Absent,
            SelfAttention::Kda(a) => SelfAttention::Kda(Box::new(a.cut(rank, size, group, what)?)),
            SelfAttention::SharedKv(a) => {
                SelfAttention::SharedKv(Box::new(a.cut(rank, size, group, what)?))
            }
        })
    }

    fn arrays(&self) -> Vec<&Array> {
        match self {
            SelfAttention::Heads(a) => a.arrays(),
            SelfAttention::Latent(a) => a.arrays(),
            SelfAttention::Linear(a) => a.arrays(),
            SelfAttention::Mamba(a) => a.arrays(),
            SelfAttention::Absent => Vec::new(),
            SelfAttention::Kda(a) => a.arrays(),
            SelfAttention::SharedKv(a) => a.arrays(),
        }
    }
}

/// One pre-norm transformer block.
#[derive(Debug, Clone)]
pub struct DecoderLayer {
    pub(crate) input_norm: Array,
    pub(crate) attention: SelfAttention,
    pub(crate) post_attention_norm: Array,
    pub(crate) ffn: FeedForward,
    pub(crate) eps: f32,
    /// Norms on the attention's and the feed-forward's outputs before they join the residual
    /// (Gemma's sandwich), when the family has them.
    pub(crate) output_norms: Option<OutputNorms>,
    /// A learned factor on the block's whole output, residual included (Gemma 4's
    /// `layer_scalar`, `[1]`).
    pub(crate) output_scale: Option<Array>,
    /// The gate on this layer's per-layer input (Gemma 4 E2B/E4B), applied after the
    /// feed-forward and before `output_scale`; its input comes as columns after the hidden
    /// state ([`super::per_layer_inputs`]). Boxed: most layers have none.
    pub(crate) per_layer: Option<Box<PerLayerGate>>,
    /// Kimi K3's attention residuals: the block mixes earlier blocks' inputs, carried as
    /// columns after the hidden state, in place of the running residual
    /// ([`super::attn_res`]). Boxed: most layers have none.
    pub(crate) residuals: Option<Box<AttentionResiduals>>,
}

/// Norms on a block's attention and feed-forward outputs (Gemma's `post_attention_layernorm`
/// and `post_feedforward_layernorm`).
#[derive(Debug, Clone)]
pub struct OutputNorms {
    /// On the attention's output.
    pub(crate) attention: Array,
    /// On the feed-forward's output.
    pub(crate) ffn: Array,
}

impl DecoderLayer {
    /// The block of layer `layer` around `attention` with a dense MLP, and its two norms.
    pub(crate) fn load(
        config: &ModelConfig,
        source: &mut dyn TensorSource,
        layer: usize,
        format: WeightFormat,
        attention: Attention,
    ) -> Result<DecoderLayer> {
        let mlp = FeedForward::Dense(Mlp::load(config, source, layer, format)?);
        DecoderLayer::assemble(config, source, layer, format, attention, mlp)
    }

    /// The block of layer `layer` from its attention and feed-forward, with its two norms.
    pub(crate) fn assemble(
        config: &ModelConfig,
        source: &mut dyn TensorSource,
        layer: usize,
        format: WeightFormat,
        attention: impl Into<SelfAttention>,
        ffn: FeedForward,
    ) -> Result<DecoderLayer> {
        let dtype = format.compute_dtype();
        let p = |part: &str| layer_tensor(layer, part);
        let input_norm = source.dense(&p("input_layernorm.weight"), dtype)?;
        let ffn_norm = source.dense(&p("post_attention_layernorm.weight"), dtype)?;
        Ok(DecoderLayer::new(
            config, input_norm, attention, ffn_norm, ffn,
        ))
    }

    /// The block `x + attn(norm(x))`, then `h + ffn(ffn_norm(h))`, from its parts.
    pub(crate) fn new(
        config: &ModelConfig,
        input_norm: Array,
        attention: impl Into<SelfAttention>,
        ffn_norm: Array,
        ffn: FeedForward,
    ) -> DecoderLayer {
        DecoderLayer {
            input_norm,
            attention: attention.into(),
            post_attention_norm: ffn_norm,
            ffn,
            eps: config.rms_norm_eps,
            output_norms: None,
            output_scale: None,
            per_layer: None,
            residuals: None,
        }
    }

    /// With attention residuals in place of the running residual.
    pub(crate) fn with_attention_residuals(self, residuals: AttentionResiduals) -> DecoderLayer {
        DecoderLayer {
            residuals: Some(Box::new(residuals)),
            ..self
        }
    }

    /// With norms on the attention's and the feed-forward's outputs.
    pub(crate) fn with_output_norms(self, norms: OutputNorms) -> DecoderLayer {
        DecoderLayer {
            output_norms: Some(norms),
            ..self
        }
    }

    /// With a gate on the per-layer input carried after the hidden state.
    pub(crate) fn with_per_layer_gate(self, gate: PerLayerGate) -> DecoderLayer {
        DecoderLayer {
            per_layer: Some(Box::new(gate)),
            ..self
        }
    }

    /// With a learned factor `[1]` on the block's output.
    pub(crate) fn with_output_scale(self, scale: Array) -> DecoderLayer {
        DecoderLayer {
            output_scale: Some(scale),
            ..self
        }
    }

    /// Rank `rank`'s slice of a `size`-way tensor-parallel instance over `group`: its heads
    /// and its share of the feed-forward; the norms stay whole.
    pub(crate) fn cut(
        &self,
        rank: usize,
        size: usize,
        group: &Arc<RingGroup>,
        what: &str,
    ) -> Result<DecoderLayer> {
        Ok(DecoderLayer {
            input_norm: self.input_norm.clone(),
            attention: self.attention.cut(rank, size, group, what)?,
            post_attention_norm: self.post_attention_norm.clone(),
            ffn: self.ffn.cut(rank, size, group, what)?,
            eps: self.eps,
            output_norms: self.output_norms.clone(),
            output_scale: self.output_scale.clone(),
            // Whole on every rank: each has the same hidden state after the all-sums.
            per_layer: self.per_layer.clone(),
            residuals: self.residuals.clone(),
        })
    }

    /// `h = x + attn(norm(x)); h + mlp(norm(h))`.
    pub fn forward(&self, x: &Array, cache: &mut LayerCache) -> Result<Array> {
        let l = x.shape()[1] as usize;
        self.forward_segments(x, &mut [LayerKv::Own(l, cache)])
    }

    /// The block over several sequences' positions at once (see
    /// [`Attention::forward_segments`]).
    pub fn forward_segments(&self, x: &Array, segments: &mut [LayerKv<'_>]) -> Result<Array> {
        let scale = |h: Array| -> Result<Array> {
            Ok(match &self.output_scale {
                Some(scale) => ops::multiply(&h, scale)?,
                None => h,
            })
        };
        if let Some(residuals) = &self.residuals {
            return residuals.forward(self, x, segments);
        }
        match &self.per_layer {
            Some(gate) => {
                let (x, carried) = gate.split(x);
                let h = self.block(&x, segments)?;
                let h = scale(gate.apply(&h, &carried, self.eps)?)?;
                Ok(ops::concatenate(&[h, carried], -1)?)
            }
            None => scale(self.block(x, segments)?),
        }
    }

    /// The attention over `x`'s norm, without the residual.
    pub(crate) fn attend(&self, x: &Array, segments: &mut [LayerKv<'_>]) -> Result<Array> {
        let normed = crate::cpu_layer_ops::rms_norm(x, Some(&self.input_norm), self.eps)?;
        self.attention.forward_segments(&normed, segments)
    }

    /// The feed-forward over `h`'s norm, without the residual.
    pub(crate) fn feed_forward(&self, h: &Array) -> Result<Array> {
        let normed = crate::cpu_layer_ops::rms_norm(h, Some(&self.post_attention_norm), self.eps)?;
        self.ffn.forward(&normed)
    }

    /// The attention and feed-forward with their residuals, before any output scale.
    fn block(&self, x: &Array, segments: &mut [LayerKv<'_>]) -> Result<Array> {
        let norm = |t: &Array, w: &Array| crate::cpu_layer_ops::rms_norm(t, Some(w), self.eps);
        let out = self.output_norms.as_ref();
        let h = if let SelfAttention::Absent = self.attention {
            for segment in segments.iter_mut() {
                segment.advance()?;
            }
            x.clone()
        } else {
            let a = self.attend(x, segments)?;
            let a = match out {
                Some(n) => norm(&a, &n.attention)?,
                None => a,
            };
            ops::add(x, &a)?
        };
        let h = if let FeedForward::Absent = self.ffn {
            h
        } else {
            let m = self.feed_forward(&h)?;
            let m = match out {
                Some(n) => norm(&m, &n.ffn)?,
                None => m,
            };
            ops::add(&h, &m)?
        };
        Ok(h)
    }

    /// Every array of the block (to evaluate them eagerly).
    pub(crate) fn arrays(&self) -> Vec<&Array> {
        let mut v = vec![&self.input_norm, &self.post_attention_norm];
        v.extend(self.attention.arrays());
        v.extend(self.ffn.arrays());
        v.extend(
            self.output_norms
                .iter()
                .flat_map(|n| [&n.attention, &n.ffn]),
        );
        v.extend(self.output_scale.iter());
        v.extend(self.per_layer.iter().flat_map(|g| g.arrays()));
        v.extend(self.residuals.iter().flat_map(|r| r.arrays()));
        v
    }
}
