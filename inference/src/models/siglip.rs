//! The SigLIP vision encoder (`siglip_vision_model`), as mlx-vlm runs it for Gemma 3: the image
//! cut into `patch_size` squares, each projected to `hidden_size` (a convolution whose stride is
//! its kernel, computed here as one matrix product over the flattened patches) plus a learned
//! position embedding, then pre-norm transformer layers (LayerNorm, full bidirectional attention
//! with biases, LayerNorm, a GELU MLP with the tanh approximation) and a final LayerNorm.
//!
//! Weights are read under `<prefix>.embeddings`, `<prefix>.encoder.layers.N` and
//! `<prefix>.post_layernorm` (Gemma 3: `vision_tower.vision_model`), with the patch kernel in
//! MLX's `[out, kh, kw, in]` order (mlx-community's folders) or PyTorch's `[out, in, kh, kw]`
//! (Hugging Face's). The tower always computes in f32 (it is small beside the language model,
//! and mlx-vlm leaves it unquantized).

use crate::error::{InferenceError, Result};
use crate::linear::Linear;
use crate::weights::{TensorSource, WeightFormat};
use mlx_rs::{fast, nn, ops, Array, Dtype};
use serde_json::Value;

/// The encoder's shape (`vision_config` in `config.json`).
#[derive(Debug, Clone, PartialEq)]
pub struct SiglipConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub patch_size: usize,
    /// The side of the square image the tower takes.
    pub image_size: usize,
    pub num_channels: usize,
    /// The encoder layers' LayerNorm epsilon (the final LayerNorm uses MLX's default, 1e-5,
    /// as mlx-vlm builds it).
    pub layer_norm_eps: f32,
}

impl SiglipConfig {
    /// Parameters of the tower: the patch embedding and positions, each encoder layer's
    /// attention (four projections with biases), MLP (two with biases) and two LayerNorms,
    /// and the final LayerNorm.
    pub fn parameters(&self) -> u64 {
        let (d, i, p) = (self.hidden_size, self.intermediate_size, self.patch_size);
        let patches = self.patches_per_side().pow(2);
        let embedding = self.num_channels * p * p * d + d + patches * d;
        let layer = 4 * (d * d + d) + 2 * d * i + i + d + 4 * d;
        (embedding + self.num_layers * layer + 2 * d) as u64
    }

    /// Reads `vision_config`, with mlx-vlm's defaults for what it leaves out.
    pub fn from_json(v: &Value) -> Result<SiglipConfig> {
        let get = |key: &str, default: Option<u64>| {
            v.get(key)
                .and_then(Value::as_u64)
                .or(default)
                .filter(|&n| n > 0)
                .map(|n| n as usize)
                .ok_or_else(|| {
                    InferenceError::BadConfig(format!(
                        "vision_config.{key} is missing or not a positive integer"
                    ))
                })
        };
        let config = SiglipConfig {
            hidden_size: get("hidden_size", None)?,
            intermediate_size: get("intermediate_size", None)?,
            num_layers: get("num_hidden_layers", None)?,
            num_heads: get("num_attention_heads", None)?,
            patch_size: get("patch_size", None)?,
            image_size: get("image_size", Some(224))?,
            num_channels: get("num_channels", Some(3))?,
            layer_norm_eps: v
                .get("layer_norm_eps")
                .and_then(Value::as_f64)
                .unwrap_or(1e-6) as f32,
        };
        if !config.hidden_size.is_multiple_of(config.num_heads)
            || !config.image_size.is_multiple_of(config.patch_size)
        {
            return Err(InferenceError::BadConfig(format!(
                "vision_config: hidden_size {} must divide by num_attention_heads {}, and \
                 image_size {} by patch_size {}",
                config.hidden_size, config.num_heads, config.image_size, config.patch_size
            )));
        }
        Ok(config)
    }

    /// Patches along one side of the image.
    pub fn patches_per_side(&self) -> usize {
        self.image_size / self.patch_size
    }
}

/// A LayerNorm's weight and bias.
#[derive(Debug, Clone)]
struct LayerNorm {
    weight: Array,
    bias: Array,
    eps: f32,
}

impl LayerNorm {
    fn load(source: &mut dyn TensorSource, prefix: &str, eps: f32) -> Result<LayerNorm> {
        Ok(LayerNorm {
            weight: source.dense(&format!("{prefix}.weight"), Dtype::Float32)?,
            bias: source.dense(&format!("{prefix}.bias"), Dtype::Float32)?,
            eps,
        })
    }

    fn forward(&self, x: &Array) -> Result<Array> {
        Ok(fast::layer_norm(x, &self.weight, &self.bias, self.eps)?)
    }
}

/// One encoder layer.
#[derive(Debug, Clone)]
struct EncoderLayer {
    norm1: LayerNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    out: Linear,
    norm2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

impl EncoderLayer {
    fn forward(&self, x: &Array, heads: usize) -> Result<Array> {
        let h = self.norm1.forward(x)?;
        let (batch, len, dim) = (x.shape()[0], x.shape()[1], x.shape()[2]);
        let head_dim = dim / heads as i32;
        let split = |t: Array| -> Result<Array> {
            Ok(t.reshape(&[batch, len, heads as i32, head_dim])?
                .transpose_axes(&[0, 2, 1, 3])?)
        };
        let (q, k, v) = (
            split(self.q.forward(&h)?)?,
            split(self.k.forward(&h)?)?,
            split(self.v.forward(&h)?)?,
        );
        let scale = (head_dim as f32).powf(-0.5);
        let attended = crate::cpu_layer_ops::attention(&q, &k, &v, scale, None, None)?
            .transpose_axes(&[0, 2, 1, 3])?
            .reshape(&[batch, len, dim])?;
        let h = ops::add(x, &self.out.forward(&attended)?)?;
        let m = self.fc1.forward(&self.norm2.forward(&h)?)?;
        let m = self.fc2.forward(&nn::gelu_approximate(&m)?)?;
        Ok(ops::add(&h, &m)?)
    }

    fn arrays(&self) -> Vec<&Array> {
        let mut v = vec![
            &self.norm1.weight,
            &self.norm1.bias,
            &self.norm2.weight,
            &self.norm2.bias,
        ];
        for l in [&self.q, &self.k, &self.v, &self.out, &self.fc1, &self.fc2] {
            v.extend(l.arrays());
        }
        v
    }
}

/// The loaded encoder.
#[derive(Debug, Clone)]
pub struct SiglipTower {
    pub config: SiglipConfig,
    /// The patch kernel flattened in `(kh, kw, channel)` order: `[hidden, patch² · channels]`.
    patch_weight: Array,
    patch_bias: Array,
    /// `[patches, hidden]`.
    positions: Array,
    layers: Vec<EncoderLayer>,
    post_norm: LayerNorm,
}

impl SiglipTower {
    /// Reads the tower under `prefix` (e.g. `vision_tower.vision_model`).
    pub fn load(
        config: &SiglipConfig,
        source: &mut dyn TensorSource,
        prefix: &str,
    ) -> Result<SiglipTower> {
        let (p, c, d) = (config.patch_size, config.num_channels, config.hidden_size);
        let name = format!("{prefix}.embeddings.patch_embedding.weight");
        let kernel = source.dense(&name, Dtype::Float32)?;
        let shape: Vec<usize> = kernel.shape().iter().map(|&s| s as usize).collect();
        let kernel = if shape == [d, p, p, c] {
            kernel
        } else if shape == [d, c, p, p] {
            kernel.transpose_axes(&[0, 2, 3, 1])?
        } else {
            return Err(InferenceError::BadTensor {
                name,
                reason: format!(
                    "shape {shape:?}, expected [{d}, {p}, {p}, {c}] or [{d}, {c}, {p}, {p}]"
                ),
            });
        };
        let patch_weight = kernel.reshape(&[d as i32, (p * p * c) as i32])?;
        let patch_bias = source.dense(
            &format!("{prefix}.embeddings.patch_embedding.bias"),
            Dtype::Float32,
        )?;
        let positions = source.dense(
            &format!("{prefix}.embeddings.position_embedding.weight"),
            Dtype::Float32,
        )?;
        let patches = config.patches_per_side().pow(2);
        if positions.shape() != [patches as i32, d as i32] {
            return Err(InferenceError::BadTensor {
                name: format!("{prefix}.embeddings.position_embedding.weight"),
                reason: format!("shape {:?}, expected [{patches}, {d}]", positions.shape()),
            });
        }
        let eps = config.layer_norm_eps;
        let layers = (0..config.num_layers)
            .map(|i| {
                let l = format!("{prefix}.encoder.layers.{i}");
                let mut linear =
                    |name: &str| source.linear(&format!("{l}.{name}"), WeightFormat::F32);
                Ok(EncoderLayer {
                    q: linear("self_attn.q_proj")?,
                    k: linear("self_attn.k_proj")?,
                    v: linear("self_attn.v_proj")?,
                    out: linear("self_attn.out_proj")?,
                    fc1: linear("mlp.fc1")?,
                    fc2: linear("mlp.fc2")?,
                    norm1: LayerNorm::load(source, &format!("{l}.layer_norm1"), eps)?,
                    norm2: LayerNorm::load(source, &format!("{l}.layer_norm2"), eps)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let post_norm = LayerNorm::load(source, &format!("{prefix}.post_layernorm"), 1e-5)?;
        let tower = SiglipTower {
            config: config.clone(),
            patch_weight,
            patch_bias,
            positions,
            layers,
            post_norm,
        };
        mlx_rs::transforms::eval(tower.arrays())?;
        Ok(tower)
    }

    fn arrays(&self) -> Vec<&Array> {
        let mut v = vec![
            &self.patch_weight,
            &self.patch_bias,
            &self.positions,
            &self.post_norm.weight,
            &self.post_norm.bias,
        ];
        v.extend(self.layers.iter().flat_map(EncoderLayer::arrays));
        v
    }

    /// The encoder's output for images given as pixel values `[images, channels, size, size]`
    /// (the image processor's layout): `[images, patches, hidden]`, patches row by row.
    pub fn forward(&self, pixel_values: &Array) -> Result<Array> {
        let (p, c) = (
            self.config.patch_size as i32,
            self.config.num_channels as i32,
        );
        let side = self.config.patches_per_side() as i32;
        let size = side * p;
        let images = pixel_values.shape()[0];
        if pixel_values.shape() != [images, c, size, size] {
            return Err(InferenceError::InvalidRequest(format!(
                "pixel values of shape {:?}; the tower takes [images, {c}, {size}, {size}]",
                pixel_values.shape()
            )));
        }
        // [n, c, gh·p, gw·p] → [n, gh, gw, p, p, c] → one row of p·p·c values per patch.
        let patches = pixel_values
            .reshape(&[images, c, side, p, side, p])?
            .transpose_axes(&[0, 2, 4, 3, 5, 1])?
            .reshape(&[images, side * side, p * p * c])?;
        let embedded = ops::add(
            &ops::matmul(&patches, self.patch_weight.t())?,
            &self.patch_bias,
        )?;
        let mut h = ops::add(&embedded, &self.positions)?;
        for layer in &self.layers {
            h = layer.forward(&h, self.config.num_heads)?;
        }
        self.post_norm.forward(&h)
    }
}
