//! Qwen3.5's vision tower (`qwen3_5` with `vision_config`), as mlx-vlm's
//! `qwen3_vl` vision model runs it for Qwen3.5 (deepstack off, as mlx-vlm requires for this
//! family):
//!
//! - **patch embedding**: each patch of `temporal_patch_size` frames × `patch_size²` pixels ×
//!   channels projected to `hidden_size` (a 3-D convolution whose stride is its kernel, here one
//!   matrix product over the processor's flattened patches), plus a **learned position
//!   embedding** on a `√num_position_embeddings`-sided grid, bilinearly interpolated to the
//!   image's patch grid (`linspace` over the table, the four neighbours weighted) and laid out
//!   in merged-block order as the patches are;
//! - **blocks**: pre-norm (LayerNorm 1e-6) attention over all of one image's patches, with a
//!   fused `qkv` and a 2-D rotary embedding (half the rotated frequencies follow the patch's
//!   row, half its column), and a GELU (tanh) MLP;
//! - **patch merger**: LayerNorm, every 2×2 block of patches concatenated, then `linear_fc1`,
//!   exact GELU, `linear_fc2` to the language model's width: one image token per block.
//!
//! The features replace the prompt's `<|image_pad|>` embeddings as they are (no scaling). The
//! tower computes in f32 (mlx-vlm leaves it unquantized). The language side (M-RoPE positions
//! for the image tokens) is [`crate::mrope`].

use super::qwen_image_processor::{QwenImageProcessor, QwenPatches};
use crate::error::{InferenceError, Result};
use crate::linear::Linear;
use crate::mrope::{ImageSpan, MropeSpans};
use crate::vision::ChatImage;
use crate::weights::{TensorSource, WeightFormat};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{fast, nn, ops, Array, Dtype};
use serde_json::Value;
use std::path::Path;

/// The tower's shape (`vision_config`) and the prompt's vision tokens (top level).
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen3_5VisionConfig {
    pub depth: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_heads: usize,
    /// The language model's width (the merger's output).
    pub out_hidden_size: usize,
    pub patch_size: usize,
    pub temporal_patch_size: usize,
    pub spatial_merge_size: usize,
    pub in_channels: usize,
    /// Entries of the learned position table (a square number).
    pub num_position_embeddings: usize,
    /// `<|image_pad|>`'s id.
    pub image_token: u32,
    /// `<|vision_start|>`'s id.
    pub vision_start: u32,
    /// `<|vision_end|>`'s id.
    pub vision_end: u32,
}

impl Qwen3_5VisionConfig {
    /// Reads a `config.json` of `qwen3_5`; `None` without `vision_config`.
    /// mlx-vlm's defaults for what the tower's configuration leaves out; deepstack features
    /// are refused, as mlx-vlm refuses them for this family.
    pub fn from_json(v: &Value) -> Result<Option<Qwen3_5VisionConfig>> {
        let Some(vision) = v.get("vision_config").filter(|c| c.is_object()) else {
            return Ok(None);
        };
        let get = |from: &Value, key: &str, default: Option<u64>| {
            from.get(key)
                .and_then(Value::as_u64)
                .or(default)
                .filter(|&n| n > 0)
                .map(|n| n as usize)
                .ok_or_else(|| {
                    InferenceError::BadConfig(format!(
                        "a qwen3_5 config.json needs a positive `{key}`"
                    ))
                })
        };
        if vision
            .get("deepstack_visual_indexes")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
        {
            return Err(InferenceError::BadConfig(
                "vision_config.deepstack_visual_indexes: Qwen3.5 runs without deepstack".into(),
            ));
        }
        let text = v.get("text_config").unwrap_or(v);
        let config = Qwen3_5VisionConfig {
            depth: get(vision, "depth", Some(32))?,
            hidden_size: get(vision, "hidden_size", Some(1280))?,
            intermediate_size: get(vision, "intermediate_size", Some(3420))?,
            num_heads: get(vision, "num_heads", Some(16))?,
            out_hidden_size: get(
                vision,
                "out_hidden_size",
                text.get("hidden_size").and_then(Value::as_u64),
            )?,
            patch_size: get(vision, "patch_size", Some(14))?,
            temporal_patch_size: get(vision, "temporal_patch_size", Some(2))?,
            spatial_merge_size: get(vision, "spatial_merge_size", Some(2))?,
            in_channels: get(vision, "in_channels", Some(3))?,
            num_position_embeddings: get(vision, "num_position_embeddings", Some(2304))?,
            image_token: get(v, "image_token_id", Some(248056))? as u32,
            vision_start: get(v, "vision_start_token_id", Some(248045))? as u32,
            vision_end: get(v, "vision_end_token_id", Some(248046))? as u32,
        };
        let side = config.position_side();
        let head_dim = config.hidden_size / config.num_heads;
        if side * side != config.num_position_embeddings
            || !config.hidden_size.is_multiple_of(config.num_heads)
            || !head_dim.is_multiple_of(4)
            || config.in_channels != 3
        {
            return Err(InferenceError::BadConfig(format!(
                "vision_config: num_position_embeddings {} must be a square, hidden_size {} \
                 split into heads of a multiple of 4 by num_heads {}, and in_channels 3",
                config.num_position_embeddings, config.hidden_size, config.num_heads
            )));
        }
        Ok(Some(config))
    }

    /// The side of the learned position grid.
    pub fn position_side(&self) -> usize {
        (self.num_position_embeddings as f64).sqrt().round() as usize
    }

    /// Values of one flattened patch: channels × frames × pixels.
    fn patch_values(&self) -> usize {
        self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size
    }

    /// Parameters of the tower and merger (what placement counts on the embedding rank).
    pub fn parameters(&self) -> u64 {
        let (d, i, o) = (
            self.hidden_size,
            self.intermediate_size,
            self.out_hidden_size,
        );
        let merged = d * self.spatial_merge_size * self.spatial_merge_size;
        let embed = self.patch_values() * d + d + self.num_position_embeddings * d;
        let block = 4 * d + (3 * d * d + 3 * d) + (d * d + d) + (d * i + i) + (i * d + d);
        let merger = 2 * d + (merged * merged + merged) + (merged * o + o);
        (embed + self.depth * block + merger) as u64
    }
}

/// Whether the model folder `dir` holds the tower's weights (its learned position table, under
/// Qwen's or mlx-vlm's name), by the index's weight map or else each file's header: a text-only
/// conversion (mlx-lm's) keeps `vision_config` but drops the tower, and takes text only.
pub fn has_tower_weights(dir: &Path) -> bool {
    let names = [
        "model.visual.pos_embed.weight",
        "vision_tower.pos_embed.weight",
    ];
    let index = dir.join("model.safetensors.index.json");
    if let Ok(text) = std::fs::read_to_string(&index) {
        let map = serde_json::from_str::<Value>(&text).ok();
        let map = map.as_ref().and_then(|v| v.get("weight_map"));
        return names.iter().any(|n| map.and_then(|m| m.get(n)).is_some());
    }
    let Ok(files) = crate::weights::safetensors_files(dir) else {
        return false;
    };
    files
        .iter()
        .any(|f| safetensors_header(f).is_some_and(|h| names.iter().any(|n| h.get(n).is_some())))
}

/// A safetensors file's header (its JSON table of tensors), when it can be read.
fn safetensors_header(path: &Path) -> Option<Value> {
    use std::io::Read;
    let mut file = std::fs::File::open(path).ok()?;
    let mut size = [0u8; 8];
    file.read_exact(&mut size).ok()?;
    let size = u64::from_le_bytes(size);
    // A header past 100 MB is not one (the format caps it there).
    if size > 100_000_000 {
        return None;
    }
    let mut header = vec![0u8; size as usize];
    file.read_exact(&mut header).ok()?;
    serde_json::from_slice(&header).ok()
}

/// A LayerNorm's weight and bias (eps 1e-6 throughout the tower).
#[derive(Debug, Clone)]
struct LayerNorm {
    weight: Array,
    bias: Array,
}

impl LayerNorm {
    fn load(source: &mut dyn TensorSource, prefix: &str) -> Result<LayerNorm> {
        Ok(LayerNorm {
            weight: source.dense(&format!("{prefix}.weight"), Dtype::Float32)?,
            bias: source.dense(&format!("{prefix}.bias"), Dtype::Float32)?,
        })
    }

    fn forward(&self, x: &Array) -> Result<Array> {
        Ok(fast::layer_norm(x, &self.weight, &self.bias, 1e-6)?)
    }
}

/// One block of the tower.
#[derive(Debug, Clone)]
struct Block {
    norm1: LayerNorm,
    qkv: Linear,
    proj: Linear,
    norm2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

impl Block {
    /// `x`: one image's patches `[n, hidden]`; `cos`, `sin`: `[1, n, 1, head_dim]`.
    fn forward(&self, x: &Array, heads: i32, cos: &Array, sin: &Array) -> Result<Array> {
        let (n, dim) = (x.shape()[0], x.shape()[1]);
        let head_dim = dim / heads;
        let qkv = self
            .qkv
            .forward(&self.norm1.forward(x)?)?
            .reshape(&[n, 3, heads, head_dim])?;
        let part = |i: i32| qkv.index((.., i, .., ..)).expand_dims(0);
        let turn = |t: Array| -> Result<Array> {
            Ok(rotate(&t, cos, sin)?.transpose_axes(&[0, 2, 1, 3])?)
        };
        let (q, k) = (turn(part(0)?)?, turn(part(1)?)?);
        let v = part(2)?.transpose_axes(&[0, 2, 1, 3])?;
        let scale = (head_dim as f32).powf(-0.5);
        let attended = crate::cpu_layer_ops::attention(&q, &k, &v, scale, None, None)?
            .transpose_axes(&[0, 2, 1, 3])?
            .reshape(&[n, dim])?;
        let h = ops::add(x, &self.proj.forward(&attended)?)?;
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
        for l in [&self.qkv, &self.proj, &self.fc1, &self.fc2] {
            v.extend(l.arrays());
        }
        v
    }
}

/// `x * cos + rotate_half(x) * sin` over the whole head (`[1, n, heads, head_dim]`).
fn rotate(x: &Array, cos: &Array, sin: &Array) -> Result<Array> {
    let d = x.shape()[3];
    let half = d / 2;
    let rotated = ops::concatenate(
        &[
            ops::negative(x.index((.., .., .., half..)))?,
            x.index((.., .., .., ..half)),
        ],
        -1,
    )?;
    Ok(ops::add(
        &ops::multiply(x, cos)?,
        &ops::multiply(&rotated, sin)?,
    )?)
}

/// Qwen3.5's tower, merger and image processor.
#[derive(Debug, Clone)]
pub struct Qwen3_5Vision {
    pub config: Qwen3_5VisionConfig,
    pub processor: QwenImageProcessor,
    /// The patch kernel as `[hidden, channels · frames · patch²]` (the processor's order).
    patch_weight: Array,
    patch_bias: Array,
    /// `[num_position_embeddings, hidden]`.
    positions: Array,
    blocks: Vec<Block>,
    merger_norm: LayerNorm,
    merger_fc1: Linear,
    merger_fc2: Linear,
}

impl Qwen3_5Vision {
    /// Reads the vision half of the model in `dir` from `source` (Qwen's `model.visual.*` or
    /// mlx-vlm's `vision_tower.*`); `None` for a model without `vision_config`.
    pub fn load(dir: &Path, source: &mut dyn TensorSource) -> Result<Option<Qwen3_5Vision>> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|source| InferenceError::Io {
            path: path.clone(),
            source,
        })?;
        let json: Value = serde_json::from_str(&text)
            .map_err(|e| InferenceError::BadConfig(format!("{}: {e}", path.display())))?;
        let Some(config) = Qwen3_5VisionConfig::from_json(&json)? else {
            return Ok(None);
        };
        if !has_tower_weights(dir) {
            return Ok(None);
        }
        let processor = QwenImageProcessor::read(dir)?;
        if (
            processor.patch_size as usize,
            processor.merge_size as usize,
            processor.temporal_patch_size as usize,
        ) != (
            config.patch_size,
            config.spatial_merge_size,
            config.temporal_patch_size,
        ) {
            return Err(InferenceError::BadConfig(format!(
                "preprocessor_config.json cuts {}-pixel patches merged {}×, {} frames; the tower \
                 takes {}, {}×, {}",
                processor.patch_size,
                processor.merge_size,
                processor.temporal_patch_size,
                config.patch_size,
                config.spatial_merge_size,
                config.temporal_patch_size
            )));
        }
        let prefix = if source.contains("vision_tower.pos_embed.weight") {
            "vision_tower"
        } else {
            "model.visual"
        };
        let (d, c, t, p) = (
            config.hidden_size,
            config.in_channels,
            config.temporal_patch_size,
            config.patch_size,
        );
        let name = format!("{prefix}.patch_embed.proj.weight");
        let kernel = source.dense(&name, Dtype::Float32)?;
        let shape: Vec<usize> = kernel.shape().iter().map(|&s| s as usize).collect();
        // Qwen's [out, C, T, P, P], or MLX's [out, T, P, P, C] (mlx-vlm's save).
        let kernel = if shape == [d, c, t, p, p] {
            kernel
        } else if shape == [d, t, p, p, c] {
            kernel.transpose_axes(&[0, 4, 1, 2, 3])?
        } else {
            return Err(InferenceError::BadTensor {
                name,
                reason: format!("shape {shape:?}, expected [{d}, {c}, {t}, {p}, {p}] or [{d}, {t}, {p}, {p}, {c}]"),
            });
        };
        let patch_weight = kernel.reshape(&[d as i32, config.patch_values() as i32])?;
        let patch_bias =
            source.dense(&format!("{prefix}.patch_embed.proj.bias"), Dtype::Float32)?;
        let positions = source.dense(&format!("{prefix}.pos_embed.weight"), Dtype::Float32)?;
        if positions.shape() != [config.num_position_embeddings as i32, d as i32] {
            return Err(InferenceError::BadTensor {
                name: format!("{prefix}.pos_embed.weight"),
                reason: format!(
                    "shape {:?}, expected [{}, {d}]",
                    positions.shape(),
                    config.num_position_embeddings
                ),
            });
        }
        let blocks = (0..config.depth)
            .map(|i| {
                let b = format!("{prefix}.blocks.{i}");
                let mut linear = |name: String| source.linear(&name, WeightFormat::F32);
                Ok(Block {
                    qkv: linear(format!("{b}.attn.qkv"))?,
                    proj: linear(format!("{b}.attn.proj"))?,
                    fc1: linear(format!("{b}.mlp.linear_fc1"))?,
                    fc2: linear(format!("{b}.mlp.linear_fc2"))?,
                    norm1: LayerNorm::load(source, &format!("{b}.norm1"))?,
                    norm2: LayerNorm::load(source, &format!("{b}.norm2"))?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let merger_fc1 =
            source.linear(&format!("{prefix}.merger.linear_fc1"), WeightFormat::F32)?;
        let merger_fc2 =
            source.linear(&format!("{prefix}.merger.linear_fc2"), WeightFormat::F32)?;
        let merger_norm = LayerNorm::load(source, &format!("{prefix}.merger.norm"))?;
        let vision = Qwen3_5Vision {
            config,
            processor,
            patch_weight,
            patch_bias,
            positions,
            blocks,
            merger_norm,
            merger_fc1,
            merger_fc2,
        };
        let mut arrays = vec![
            &vision.patch_weight,
            &vision.patch_bias,
            &vision.positions,
            &vision.merger_norm.weight,
            &vision.merger_norm.bias,
        ];
        arrays.extend(vision.merger_fc1.arrays());
        arrays.extend(vision.merger_fc2.arrays());
        arrays.extend(vision.blocks.iter().flat_map(Block::arrays));
        mlx_rs::transforms::eval(arrays)?;
        Ok(Some(vision))
    }

    /// Qwen3.5's features of `images`, which fill the image-token `positions` of a prompt in
    /// order, each image's run of tokens contiguous: the rows, each image's token count, and the
    /// images' M-RoPE spans.
    pub fn encode(
        &self,
        positions: &[usize],
        images: &[ChatImage],
    ) -> Result<(Array, Vec<usize>, MropeSpans)> {
        let m = self.config.spatial_merge_size as u32;
        let (mut features, mut counts, mut spans) = (Vec::new(), Vec::new(), Vec::new());
        let mut at = 0usize;
        for image in images {
            let patches = self.processor.process(&image.data)?;
            let (_, gh, gw) = patches.grid;
            let (rows, cols) = ((gh / m) as usize, (gw / m) as usize);
            let run = &positions[at.min(positions.len())..(at + rows * cols).min(positions.len())];
            if run.len() != rows * cols || run.windows(2).any(|w| w[1] != w[0] + 1) {
                return Err(InferenceError::InvalidRequest(format!(
                    "the prompt's image tokens do not hold this image's {} tokens ({rows}×{cols} \
                     blocks) in one run",
                    rows * cols
                )));
            }
            spans.push(ImageSpan {
                start: run[0],
                rows,
                cols,
            });
            features.push(self.features(&patches)?);
            counts.push(rows * cols);
            at += rows * cols;
        }
        if at != positions.len() {
            return Err(InferenceError::InvalidRequest(format!(
                "the prompt holds {} image tokens, its {} images take {at}",
                positions.len(),
                images.len()
            )));
        }
        let rows = if features.is_empty() {
            Array::from_slice(&[0f32; 0], &[0, self.config.out_hidden_size as i32])
        } else {
            ops::concatenate(&features, 0)?
        };
        Ok((rows, counts, MropeSpans::new(spans)?))
    }

    /// The image features of one processed image: `[tokens, out_hidden]`, one row per merged
    /// block, blocks row by row (the order of the prompt's image tokens).
    pub fn features(&self, patches: &QwenPatches) -> Result<Array> {
        let (t, gh, gw) = patches.grid;
        let m = self.config.spatial_merge_size as u32;
        let n = (t * gh * gw) as i32;
        let width = self.config.patch_values() as i32;
        if t != 1 || gh % m != 0 || gw % m != 0 || patches.values.len() != (n * width) as usize {
            return Err(InferenceError::InvalidRequest(format!(
                "{} patch values for a grid of {t}×{gh}×{gw}",
                patches.values.len()
            )));
        }
        let pixels = Array::from_slice(&patches.values, &[n, width]);
        let embedded = ops::add(
            &ops::matmul(&pixels, self.patch_weight.t())?,
            &self.patch_bias,
        )?;
        let mut h = ops::add(&embedded, &self.interpolated_positions(gh, gw)?)?;
        let (cos, sin) = self.rotary(gh, gw)?;
        for block in &self.blocks {
            h = block.forward(&h, self.config.num_heads as i32, &cos, &sin)?;
        }
        let merged = (self.config.hidden_size * (m * m) as usize) as i32;
        let h = self.merger_norm.forward(&h)?.reshape(&[-1, merged])?;
        let h = nn::gelu(&self.merger_fc1.forward(&h)?)?;
        self.merger_fc2.forward(&h)
    }

    /// The learned positions interpolated to a `gh × gw` patch grid, in merged-block order:
    /// `[gh · gw, hidden]`.
    fn interpolated_positions(&self, gh: u32, gw: u32) -> Result<Array> {
        let side = self.config.position_side();
        let axis = |count: u32| -> Result<(Vec<i32>, Vec<i32>, Vec<f32>)> {
            let at = ops::linspace::<f32, f32>(
                0.0,
                (side - 1) as f32,
                ops::LinspaceOptions {
                    count: count as i32,
                    endpoint: true,
                },
            )?;
            at.eval()?;
            let at = at.as_slice::<f32>();
            let floor: Vec<i32> = at.iter().map(|&x| x as i32).collect();
            let ceil = floor
                .iter()
                .map(|&f| (f + 1).min(side as i32 - 1))
                .collect();
            let frac = at.iter().zip(&floor).map(|(&x, &f)| x - f as f32).collect();
            Ok((floor, ceil, frac))
        };
        let (h_floor, h_ceil, dh) = axis(gh)?;
        let (w_floor, w_ceil, dw) = axis(gw)?;
        let side = side as i32;
        let (gh, gw) = (gh as usize, gw as usize);
        // The four neighbours of each grid point, row by row, and their weights (in f32 as
        // mlx-vlm computes them).
        let mut index: Vec<Vec<i32>> = (0..4).map(|_| Vec::with_capacity(gh * gw)).collect();
        let mut weight: Vec<Vec<f32>> = (0..4).map(|_| Vec::with_capacity(gh * gw)).collect();
        for y in 0..gh {
            for x in 0..gw {
                let corners = [
                    (h_floor[y], w_floor[x], (1.0 - dh[y]) * (1.0 - dw[x])),
                    (h_floor[y], w_ceil[x], (1.0 - dh[y]) * dw[x]),
                    (h_ceil[y], w_floor[x], dh[y] * (1.0 - dw[x])),
                    (h_ceil[y], w_ceil[x], dh[y] * dw[x]),
                ];
                for (k, (row, col, w)) in corners.into_iter().enumerate() {
                    index[k].push(row * side + col);
                    weight[k].push(w);
                }
            }
        }
        let n = (gh * gw) as i32;
        let mut sum: Option<Array> = None;
        for k in 0..4 {
            let rows = self
                .positions
                .take_axis(Array::from_slice(&index[k], &[n]), 0)?;
            let term = ops::multiply(&rows, Array::from_slice(&weight[k], &[n, 1]))?;
            sum = Some(match sum {
                Some(s) => ops::add(&s, &term)?,
                None => term,
            });
        }
        let sum = sum.expect("four terms");
        // Raster order → merged-block order.
        let m = self.config.spatial_merge_size as i32;
        let d = self.config.hidden_size as i32;
        let (gh, gw) = (gh as i32, gw as i32);
        Ok(sum
            .reshape(&[gh / m, m, gw / m, m, d])?
            .transpose_axes(&[0, 2, 1, 3, 4])?
            .reshape(&[n, d])?)
    }

    /// The 2-D rotary embedding's `cos` and `sin` for a `gh × gw` grid in merged-block order:
    /// `[1, n, 1, head_dim]`, the first quarter of frequencies turning with the patch's row,
    /// the second with its column, repeated for the two halves of the head.
    fn rotary(&self, gh: u32, gw: u32) -> Result<(Array, Array)> {
        let head_dim = (self.config.hidden_size / self.config.num_heads) as i32;
        let dim = head_dim / 2;
        let inv_freq = crate::mrope::inverse_frequencies(dim, 10000.0)?;
        let m = self.config.spatial_merge_size as u32;
        let (mut rows, mut cols) = (Vec::new(), Vec::new());
        for bh in 0..gh / m {
            for bw in 0..gw / m {
                for i in 0..m {
                    for j in 0..m {
                        rows.push((bh * m + i) as f32);
                        cols.push((bw * m + j) as f32);
                    }
                }
            }
        }
        let n = rows.len() as i32;
        let outer = |p: Vec<f32>| ops::multiply(Array::from_slice(&p, &[n, 1]), &inv_freq);
        let freqs = ops::concatenate(&[outer(rows)?, outer(cols)?], -1)?;
        let angles = ops::concatenate(&[&freqs, &freqs], -1)?.reshape(&[1, n, 1, head_dim])?;
        Ok((ops::cos(&angles)?, ops::sin(&angles)?))
    }
}
