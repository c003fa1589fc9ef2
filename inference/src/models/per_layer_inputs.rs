//! Per-layer inputs (Gemma 4 E2B/E4B's `hidden_size_per_layer_input`), a library piece: besides
//! the hidden state, every layer gets a small vector of its own per token, made once at the
//! embedding from the token id (a second embedding table, `embed_tokens_per_layer`, one
//! `width`-wide slice per layer) and from the embedded token (`per_layer_model_projection`,
//! normed per slice); each layer gates its output with its slice and adds the result.
//!
//! The vectors travel as columns after the hidden state: the first shard's embedding gives
//! `[1, seq, hidden + layers · width]`, each layer reads its slice of the columns and passes
//! them on, and the head reads the hidden columns only. So a pipeline rank gets its layers'
//! inputs with the hidden state, and a tensor-parallel rank computes them whole (every rank
//! has the same hidden state after each all-sum).

use crate::error::{InferenceError, Result};
use crate::linear::{Linear, Matrix};
use crate::weights::FormatOnMlx;
use crate::weights::{TensorSource, WeightFormat};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{nn, ops, Array};

/// The first shard's half: the per-layer table and the projection of the embedded token.
#[derive(Debug, Clone)]
pub struct PerLayerEmbedding {
    /// `[vocab_per_layer, layers · width]` (`model.embed_tokens_per_layer`).
    table: Matrix,
    /// Hidden to `layers · width` (`model.per_layer_model_projection`).
    projection: Linear,
    /// The RMS norm on each projected slice, `[width]` (`model.per_layer_projection_norm`).
    norm: Array,
    layers: usize,
    width: usize,
    hidden: usize,
    eps: f32,
}

impl PerLayerEmbedding {
    /// Reads the table, projection and norm for `layers` layers of `width` over a `hidden`
    /// model whose per-layer table has `vocab` rows.
    pub(crate) fn load(
        source: &mut dyn TensorSource,
        format: WeightFormat,
        (layers, width, hidden, vocab): (usize, usize, usize, usize),
        eps: f32,
    ) -> Result<PerLayerEmbedding> {
        let table = source.matrix("model.embed_tokens_per_layer", format)?;
        super::parts::check_shape(&table, "model.embed_tokens_per_layer", vocab)?;
        let projection = source.linear("model.per_layer_model_projection", format)?;
        let columns = layers * width;
        super::parts::check_shape(
            &projection.weight,
            "model.per_layer_model_projection",
            columns,
        )?;
        let norm = source.dense(
            "model.per_layer_projection_norm.weight",
            format.compute_dtype(),
        )?;
        if norm.shape() != [width as i32] {
            return Err(InferenceError::BadTensor {
                name: "model.per_layer_projection_norm.weight".into(),
                reason: format!("expected [{width}], found {:?}", norm.shape()),
            });
        }
        Ok(PerLayerEmbedding {
            table,
            projection,
            norm,
            layers,
            width,
            hidden,
            eps,
        })
    }

    /// The Hugging Face names of the first shard's per-layer tensors.
    pub(crate) fn tensor_names() -> Vec<String> {
        [
            "model.embed_tokens_per_layer.weight",
            "model.per_layer_model_projection.weight",
            "model.per_layer_projection_norm.weight",
        ]
        .map(String::from)
        .to_vec()
    }

    /// `h` (`[1, n, hidden]`, the scaled embedding of `ids`) with every layer's input after
    /// it: `[1, n, hidden + layers · width]`, each layer's slice `(norm(P h / sqrt(hidden))
    /// + T[id] · sqrt(width)) / sqrt(2)`.
    pub(crate) fn append(&self, h: &Array, ids: &Array) -> Result<Array> {
        let n = ids.size() as i32;
        let (layers, width) = (self.layers as i32, self.width as i32);
        let dtype = h.dtype();
        let scalar = |v: f32| Array::from_f32(v).as_dtype(dtype);
        let looked_up = self.table.rows(ids)?.reshape(&[1, n, layers, width])?;
        let looked_up = ops::multiply(&looked_up, scalar((self.width as f32).sqrt())?)?;
        let projected = self.projection.forward(h)?;
        let projected = ops::multiply(&projected, scalar((self.hidden as f32).powf(-0.5))?)?;
        let projected = crate::cpu_layer_ops::rms_norm(
            &projected.reshape(&[1, n, layers, width])?,
            Some(&self.norm),
            self.eps,
        )?;
        let inputs = ops::multiply(
            &ops::add(&projected, &looked_up)?,
            scalar(std::f32::consts::FRAC_1_SQRT_2)?,
        )?;
        let inputs = inputs.reshape(&[1, n, layers * width])?;
        Ok(ops::concatenate(&[h.clone(), inputs], -1)?)
    }

    /// Every array (to evaluate them eagerly).
    pub(crate) fn arrays(&self) -> Vec<&Array> {
        let mut v = self.table.arrays();
        v.extend(self.projection.arrays());
        v.push(&self.norm);
        v
    }
}

/// A layer's half: its gate on its slice of the per-layer inputs.
#[derive(Debug, Clone)]
pub struct PerLayerGate {
    /// Hidden to `width` (`per_layer_input_gate`).
    gate: Linear,
    /// `width` to hidden (`per_layer_projection`).
    projection: Linear,
    /// The RMS norm on the projection's output (`post_per_layer_input_norm`).
    norm: Array,
    /// This layer's slice of the carried columns, `[start, start + width)` after the hidden
    /// state.
    start: usize,
    width: usize,
    hidden: usize,
}

impl PerLayerGate {
    /// Layer `layer`'s gate (of `width`) over a `hidden` model.
    pub(crate) fn load(
        source: &mut dyn TensorSource,
        format: WeightFormat,
        layer: usize,
        width: usize,
        hidden: usize,
    ) -> Result<PerLayerGate> {
        let at = |part: &str| super::parts::layer_tensor(layer, part);
        let gate = source.linear(&at("per_layer_input_gate"), format)?;
        super::parts::check_shape(&gate.weight, &at("per_layer_input_gate"), width)?;
        let projection = source.linear(&at("per_layer_projection"), format)?;
        super::parts::check_shape(&projection.weight, &at("per_layer_projection"), hidden)?;
        let norm = source.dense(
            &at("post_per_layer_input_norm.weight"),
            format.compute_dtype(),
        )?;
        Ok(PerLayerGate {
            gate,
            projection,
            norm,
            start: layer * width,
            width,
            hidden,
        })
    }

    /// The Hugging Face names of layer `layer`'s per-layer tensors.
    pub(crate) fn tensor_names(layer: usize) -> Vec<String> {
        [
            "per_layer_input_gate.weight",
            "per_layer_projection.weight",
            "post_per_layer_input_norm.weight",
        ]
        .map(|p| super::parts::layer_tensor(layer, p))
        .to_vec()
    }

    /// Splits `x` (`[.., hidden + carried]`) into the hidden state and the carried columns.
    pub(crate) fn split(&self, x: &Array) -> (Array, Array) {
        let hidden = self.hidden as i32;
        (x.index((.., .., ..hidden)), x.index((.., .., hidden..)))
    }

    /// `h + norm(projection(gelu(gate(h)) · inputs[layer]))`, `carried` the columns after
    /// the hidden state.
    pub(crate) fn apply(&self, h: &Array, carried: &Array, eps: f32) -> Result<Array> {
        let (start, end) = (self.start as i32, (self.start + self.width) as i32);
        let mine = carried.index((.., .., start..end));
        let gated = ops::multiply(&nn::gelu_approximate(self.gate.forward(h)?)?, &mine)?;
        let out = self.projection.forward(&gated)?;
        let out = crate::cpu_layer_ops::rms_norm(&out, Some(&self.norm), eps)?;
        Ok(ops::add(h, &out)?)
    }

    /// Every array (to evaluate them eagerly).
    pub(crate) fn arrays(&self) -> Vec<&Array> {
        let mut v = self.gate.arrays();
        v.extend(self.projection.arrays());
        v.push(&self.norm);
        v
    }
}
