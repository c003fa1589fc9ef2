//! Gemma 3's vision (`gemma3` with `vision_config`), as mlx-vlm's `gemma3` runs it: the SigLIP
//! tower ([`super::siglip`]) over each image, then the projector: the patch grid average-pooled
//! to `mm_tokens_per_image` tokens, a Gemma RMS norm (`1 + w`) and one matrix to the language
//! model's width. The prompt holds `mm_tokens_per_image` image tokens (`image_token_index`) per
//! image; their embeddings are replaced by the image's features, divided by the square root of
//! the configuration's top-level `hidden_size` (mlx-vlm's default 2048 when absent, as in the
//! published checkpoints) and then scaled as every embedding is (`sqrt(text hidden)`, rounded
//! to bf16). The language model is Gemma 3's text decoder ([`super::gemma3`]), unchanged: only
//! rank 0, which embeds the prompt, needs the tower.

use super::image_processor::ImageProcessor;
use super::shard::ModelShard;
use super::siglip::{SiglipConfig, SiglipTower};
use crate::error::{InferenceError, Result};
use crate::weights::TensorSource;
use mlx_rs::{ops, Array, Dtype};
use serde_json::Value;
use std::path::Path;

/// What a Gemma 3 configuration says about images.
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma3VisionConfig {
    pub tower: SiglipConfig,
    /// Image tokens per image in the prompt (a square number).
    pub tokens_per_image: usize,
    /// The id of the image token (`<image_soft_token>`).
    pub image_token: u32,
    /// Width of the language model.
    pub text_hidden: usize,
    /// The divisor of the image features is this one's square root (top-level `hidden_size`).
    pub feature_divisor: usize,
}

impl Gemma3VisionConfig {
    /// Parameters of the tower and the projector (its norm and projection).
    pub fn parameters(&self) -> u64 {
        let d = self.tower.hidden_size as u64;
        self.tower.parameters() + d + d * self.text_hidden as u64
    }

    /// Reads a `config.json`; `None` for a configuration without `vision_config` (a text-only
    /// Gemma 3).
    pub fn from_json(v: &Value) -> Result<Option<Gemma3VisionConfig>> {
        let Some(vision) = v.get("vision_config").filter(|c| c.is_object()) else {
            return Ok(None);
        };
        let tower = SiglipConfig::from_json(vision)?;
        let text = v.get("text_config").unwrap_or(v);
        let number = |value: Option<&Value>, what: &str| {
            value
                .and_then(Value::as_u64)
                .map(|n| n as usize)
                .ok_or_else(|| {
                    InferenceError::BadConfig(format!("a gemma3 config.json needs `{what}`"))
                })
        };
        let tokens_per_image = number(
            v.get("mm_tokens_per_image")
                .or_else(|| text.get("mm_tokens_per_image")),
            "mm_tokens_per_image",
        )?;
        let per_side = (tokens_per_image as f64).sqrt() as usize;
        let patches = tower.patches_per_side();
        if per_side * per_side != tokens_per_image
            || per_side == 0
            || !patches.is_multiple_of(per_side)
        {
            return Err(InferenceError::BadConfig(format!(
                "mm_tokens_per_image {tokens_per_image} must be the square of a divisor of the \
                 tower's {patches} patches a side"
            )));
        }
        Ok(Some(Gemma3VisionConfig {
            tower,
            tokens_per_image,
            image_token: number(v.get("image_token_index"), "image_token_index")? as u32,
            text_hidden: number(text.get("hidden_size"), "text_config.hidden_size")?,
            feature_divisor: v.get("hidden_size").and_then(Value::as_u64).unwrap_or(2048) as usize,
        }))
    }
}

/// The tower, the projector and the image processor of a Gemma 3 vision model.
#[derive(Debug, Clone)]
pub struct Gemma3Vision {
    pub config: Gemma3VisionConfig,
    pub processor: ImageProcessor,
    tower: SiglipTower,
    /// The norm's `1 + w`.
    norm: Array,
    /// `[vision hidden, text hidden]`.
    projection: Array,
}

impl Gemma3Vision {
    /// Reads the vision half of the model in `dir` from `source`; `None` for a text-only model.
    pub fn load(dir: &Path, source: &mut dyn TensorSource) -> Result<Option<Gemma3Vision>> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|source| InferenceError::Io {
            path: path.clone(),
            source,
        })?;
        let json: Value = serde_json::from_str(&text)
            .map_err(|e| InferenceError::BadConfig(format!("{}: {e}", path.display())))?;
        let Some(config) = Gemma3VisionConfig::from_json(&json)? else {
            return Ok(None);
        };
        let processor = ImageProcessor::read(dir)?;
        if (processor.height as usize, processor.width as usize)
            != (config.tower.image_size, config.tower.image_size)
        {
            return Err(InferenceError::BadConfig(format!(
                "preprocessor_config.json resizes to {}×{}, the tower takes {}×{}",
                processor.width, processor.height, config.tower.image_size, config.tower.image_size
            )));
        }
        let tower = SiglipTower::load(&config.tower, source, "vision_tower.vision_model")?;
        let norm = source.dense(
            "multi_modal_projector.mm_soft_emb_norm.weight",
            Dtype::Float32,
        )?;
        let norm = ops::add(&norm, Array::from_f32(1.0))?;
        let projection = source.dense(
            "multi_modal_projector.mm_input_projection_weight",
            Dtype::Float32,
        )?;
        let want = [config.tower.hidden_size as i32, config.text_hidden as i32];
        if projection.shape() != want {
            return Err(InferenceError::BadTensor {
                name: "multi_modal_projector.mm_input_projection_weight".into(),
                reason: format!("shape {:?}, expected {want:?}", projection.shape()),
            });
        }
        mlx_rs::transforms::eval([&norm, &projection])?;
        Ok(Some(Gemma3Vision {
            config,
            processor,
            tower,
            norm,
            projection,
        }))
    }

    /// Pixel values of encoded images (the image processor's): `[images, 3, size, size]`.
    pub fn pixel_values(&self, images: &[&[u8]]) -> Result<Array> {
        let size = self.config.tower.image_size as i32;
        let mut values = Vec::new();
        for image in images {
            values.extend(self.processor.process(image)?);
        }
        Ok(Array::from_slice(
            &values,
            &[images.len() as i32, 3, size, size],
        ))
    }

    /// The image features of pixel values `[images, 3, size, size]`: `[images,
    /// tokens_per_image, text hidden]`, each image's tokens row by row over the pooled grid.
    pub fn features(&self, pixel_values: &Array) -> Result<Array> {
        let h = self.tower.forward(pixel_values)?;
        let images = h.shape()[0];
        let side = self.config.tower.patches_per_side() as i32;
        let per_side = (self.config.tokens_per_image as f64).sqrt() as i32;
        let kernel = side / per_side;
        let dim = self.config.tower.hidden_size as i32;
        // Patches [n, gh·gw, d] → [n, per_side, kernel, per_side, kernel, d], averaged over
        // each kernel × kernel window.
        let pooled = h
            .reshape(&[images, per_side, kernel, per_side, kernel, dim])?
            .mean_axes(&[2, 4], false)?
            .reshape(&[images, per_side * per_side, dim])?;
        let normed =
            crate::cpu_layer_ops::rms_norm(&pooled, &self.norm, self.config.tower.layer_norm_eps)?;
        Ok(ops::matmul(&normed, &self.projection)?)
    }

    /// The rows that replace the image tokens' embeddings: `features` (`[images,
    /// tokens_per_image, hidden]`) divided by the square root of the feature divisor, then
    /// scaled as every embedding is (`embed_scale`), as mlx-vlm does: `[images ×
    /// tokens_per_image, hidden]`, float32 (cast to the embeddings' type where spliced).
    pub fn image_rows(&self, features: &Array, embed_scale: Option<f32>) -> Result<Array> {
        let divisor = Array::from_f32((self.config.feature_divisor as f32).sqrt());
        let mut scaled = ops::divide(features, &divisor)?;
        if let Some(scale) = embed_scale {
            scaled = ops::multiply(&scaled, Array::from_f32(scale))?;
        }
        let rows = features.shape()[0] * features.shape()[1];
        Ok(scaled.reshape(&[rows, self.config.text_hidden as i32])?)
    }

    /// The prompt's embeddings on rank 0: `shard`'s token embeddings, with each run of image
    /// tokens replaced by the next image's features (`features`: `[images, tokens_per_image,
    /// hidden]`, in the order the images appear). `[1, tokens, hidden]`.
    pub fn embed_prompt(
        &self,
        shard: &ModelShard,
        tokens: &[u32],
        features: &Array,
    ) -> Result<Array> {
        let per_image = self.config.tokens_per_image;
        let images = features.shape()[0] as usize;
        let positions: Vec<usize> = (0..tokens.len())
            .filter(|&i| tokens[i] == self.config.image_token)
            .collect();
        if positions.len() != images * per_image {
            return Err(InferenceError::InvalidRequest(format!(
                "the prompt holds {} image tokens for {images} images of {per_image} tokens \
                 each",
                positions.len()
            )));
        }
        let text = shard.embed(tokens)?;
        if images == 0 {
            return Ok(text);
        }
        let rows = self.image_rows(features, shard.embed_scale)?;
        let runs = crate::vision::runs_of(&positions, &rows, 0..tokens.len());
        crate::vision::splice(text, &runs)
    }
}
