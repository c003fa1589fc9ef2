//! Images in a prompt, from the rendered chat to the splice on rank 0 (issue 47).
//!
//! - **The prompt** ([`ImagePrompt`], on the node that renders it): the chat template shows
//!   each image as the model's begin-of-image text (Gemma 3's `<start_of_image>`), which is
//!   expanded, as the Hugging Face processor and mlx-vlm expand it, to
//!   `\n\n<start_of_image>` + `<image_soft_token>` × tokens per image + `<end_of_image>\n\n`
//!   before the prompt is tokenized. The image tokens are prompt tokens like any other: they
//!   count towards the context, the KV budget and batching.
//! - **The features** ([`VisionTower`], in the runner of rank 0, the one that embeds): each
//!   image's encoded file goes through the model's image processor, tower and projector once,
//!   when its request is submitted ([`PromptImages`]).
//! - **The splice** ([`splice`]): in every step that runs some of those positions (a prompt
//!   chunk may hold part of an image span), their token embeddings are replaced by the
//!   image's rows. Only rank 0 embeds, so the other ranks never see images.
//! - **The prompt cache** keys image positions by the image's content hash
//!   ([`PromptImages::cache_key`]): every image's token run is the same ids, so without it two
//!   different images would share a cached prefix; with it the same image in a follow-up turn
//!   reuses its prefix and another image does not.

use crate::error::{InferenceError, Result};
use crate::models::gemma3_vision::{Gemma3Vision, Gemma3VisionConfig};
use crate::models::qwen3_5_vision::{Qwen3_5Vision, Qwen3_5VisionConfig};
use crate::models::qwen_image_processor::QwenImageProcessor;
use crate::models::shard::ModelShard;
use crate::mrope::MropeSpans;
use crate::tokenizer::Tokenizer;
use crate::weights::SafetensorsSource;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{ops, Array};
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
pub use text::image_prompt::ImagePrompt;
pub use wire::chat::ChatImage;

/// `config.json` of the model folder at `path`, or `None` for a file (GGUF holds no tower).
fn folder_config(path: &Path) -> Result<Option<serde_json::Value>> {
    if !path.is_dir() {
        return Ok(None);
    }
    let file = path.join("config.json");
    let text = std::fs::read_to_string(&file).map_err(|source| InferenceError::Io {
        path: file.clone(),
        source,
    })?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| InferenceError::BadConfig(format!("{}: {e}", file.display())))
}

/// The vision configuration of a model shoal has a tower for.
enum TowerConfig {
    /// Gemma 3 with `vision_config`.
    Gemma3(Gemma3VisionConfig),
    /// Qwen3.5 (dense) with `vision_config`.
    Qwen3_5(Qwen3_5VisionConfig),
}

fn vision_config(json: &serde_json::Value) -> Result<Option<TowerConfig>> {
    match json.get("model_type").and_then(|t| t.as_str()) {
        Some("gemma3") => Ok(Gemma3VisionConfig::from_json(json)?.map(TowerConfig::Gemma3)),
        // Qwen3.5-MoE has the same tower in mlx-vlm, but no fixture proves it here yet: its
        // releases take text only until one does.
        Some("qwen3_5") => Ok(Qwen3_5VisionConfig::from_json(json)?.map(TowerConfig::Qwen3_5)),
        _ => Ok(None),
    }
}

/// Reading how a model holds images: a trait because [`ImagePrompt`] is the node's plain data in
/// `text`, while reading it needs this crate's tower configurations.
pub trait ReadImagePrompt: Sized {
    /// How the model at `path` holds images, `None` for a model without a tower shoal runs.
    /// An error when it has one whose configuration or image processor cannot be read (the
    /// tower would not load either).
    fn read(path: &Path, tokenizer: &Tokenizer) -> Result<Option<Self>>;
}

impl ReadImagePrompt for ImagePrompt {
    fn read(path: &Path, tokenizer: &Tokenizer) -> Result<Option<ImagePrompt>> {
        let Some(json) = folder_config(path)? else {
            return Ok(None);
        };
        let config = match vision_config(&json)? {
            None => return Ok(None),
            Some(TowerConfig::Qwen3_5(_))
                if !crate::models::qwen3_5_vision::has_tower_weights(path) =>
            {
                return Ok(None);
            }
            Some(TowerConfig::Qwen3_5(config)) => {
                let token = |id: u32| {
                    tokenizer.id_to_token(id).ok_or_else(|| {
                        InferenceError::BadConfig(format!(
                            "vision token {id} is not in the tokenizer"
                        ))
                    })
                };
                return Ok(Some(ImagePrompt {
                    boi: token(config.vision_start)?,
                    image: token(config.image_token)?,
                    eoi: token(config.vision_end)?,
                    tokens_per_image: 0,
                    tower_bytes: 4 * config.parameters(),
                    sized: Some(QwenImageProcessor::read(path)?),
                }));
            }
            Some(TowerConfig::Gemma3(config)) => config,
        };
        crate::models::image_processor::ImageProcessor::read(path)?;
        let text = |key: &str| -> Result<String> {
            let id = json.get(key).and_then(|v| v.as_u64()).ok_or_else(|| {
                InferenceError::BadConfig(format!("a gemma3 vision config.json needs `{key}`"))
            })?;
            tokenizer.id_to_token(id as u32).ok_or_else(|| {
                InferenceError::BadConfig(format!("`{key}` {id} is not in the tokenizer"))
            })
        };
        Ok(Some(ImagePrompt {
            boi: text("boi_token_index")?,
            image: text("image_token_index")?,
            eoi: text("eoi_token_index")?,
            tokens_per_image: config.tokens_per_image,
            tower_bytes: 4 * config.parameters(),
            sized: None,
        }))
    }
}

/// A model's vision tower on rank 0: what turns a request's images into rows of embeddings.
pub struct VisionTower {
    tower: Tower,
    /// The factor every embedding of the shard gets (Gemma 3's rows get it too).
    embed_scale: Option<f32>,
}

/// The towers shoal runs.
enum Tower {
    Gemma3(Gemma3Vision),
    Qwen3_5(Qwen3_5Vision),
}

impl VisionTower {
    /// The tower of the model at `path` for `shard`, `None` when the model has none or the
    /// shard does not embed (only rank 0 splices).
    pub fn load(path: &Path, shard: &ModelShard) -> Result<Option<VisionTower>> {
        if !shard.is_first() {
            return Ok(None);
        }
        let Some(json) = folder_config(path)? else {
            return Ok(None);
        };
        let Some(config) = vision_config(&json)? else {
            return Ok(None);
        };
        let mut source = SafetensorsSource::open(path, &shard.config)?;
        let tower = match config {
            TowerConfig::Gemma3(_) => Gemma3Vision::load(path, &mut source)?.map(Tower::Gemma3),
            TowerConfig::Qwen3_5(_) => Qwen3_5Vision::load(path, &mut source)?.map(Tower::Qwen3_5),
        };
        Ok(tower.map(|tower| VisionTower {
            tower,
            embed_scale: shard.embed_scale,
        }))
    }

    /// The image token's id.
    pub fn image_token(&self) -> u32 {
        match &self.tower {
            Tower::Gemma3(t) => t.config.image_token,
            Tower::Qwen3_5(t) => t.config.image_token,
        }
    }

    /// The features of `images` for `prompt`, whose image-token runs they fill in order.
    pub fn encode(&self, prompt: &[u32], images: &[ChatImage]) -> Result<PromptImages> {
        let positions: Vec<usize> = (0..prompt.len())
            .filter(|&i| prompt[i] == self.image_token())
            .collect();
        let hashes = images
            .iter()
            .map(|i| *blake3::hash(&i.data).as_bytes())
            .collect();
        let (rows, counts, mrope) = match &self.tower {
            Tower::Gemma3(gemma3) => {
                let per_image = gemma3.config.tokens_per_image;
                if positions.len() != images.len() * per_image {
                    return Err(InferenceError::InvalidRequest(format!(
                        "the prompt holds {} image tokens for {} images of {per_image} tokens \
                         each",
                        positions.len(),
                        images.len()
                    )));
                }
                let bytes: Vec<&[u8]> = images.iter().map(|i| i.data.as_slice()).collect();
                let features = gemma3.features(&gemma3.pixel_values(&bytes)?)?;
                let rows = gemma3.image_rows(&features, self.embed_scale)?;
                (rows, vec![per_image; images.len()], None)
            }
            Tower::Qwen3_5(qwen) => {
                let (rows, counts, spans) = qwen.encode(&positions, images)?;
                (rows, counts, Some(Arc::new(spans)))
            }
        };
        rows.eval()?;
        Ok(PromptImages {
            positions,
            rows,
            hashes,
            counts,
            mrope,
        })
    }
}

/// One request's images, ready to splice: which prompt positions they fill and the rows that
/// fill them (see the module docs).
#[derive(Debug, Clone)]
pub struct PromptImages {
    /// The prompt positions of image tokens, ascending (images × tokens per image).
    positions: Vec<usize>,
    /// One row per position, `[positions, hidden]`, scaled as embeddings are.
    rows: Array,
    /// Each image's content hash (of its encoded file).
    hashes: Vec<[u8; 32]>,
    /// Each image's token count.
    counts: Vec<usize>,
    /// The images' M-RoPE spans, for a model whose positions are M-RoPE's (Qwen3.5).
    mrope: Option<Arc<MropeSpans>>,
}

impl PromptImages {
    /// The runs of image rows within prompt positions `range`: `(offset from range.start,
    /// rows)`, one per run of consecutive image positions.
    pub fn runs(&self, range: Range<usize>) -> Vec<(usize, Array)> {
        runs_of(&self.positions, &self.rows, range)
    }

    /// `context` as the prompt cache keys it: each image position's token replaced by a
    /// value drawn from its image's content hash and its place in the image, above every
    /// token id (bit 31 set), so that prefixes match only where the images are the same.
    pub fn cache_key(&self, context: &[u32]) -> Vec<u32> {
        let mut key = context.to_vec();
        let mut positions = self.positions.iter();
        for (hash, &count) in self.hashes.iter().zip(&self.counts) {
            let seed = u64::from_le_bytes(hash[..8].try_into().expect("8 bytes"));
            for (n, &p) in positions.by_ref().take(count).enumerate() {
                if let Some(k) = key.get_mut(p) {
                    *k = 0x8000_0000 | (splitmix64(seed ^ n as u64) as u32 >> 1);
                }
            }
        }
        key
    }

    /// The images' M-RoPE spans, for a model whose image tokens take M-RoPE positions.
    pub fn mrope(&self) -> Option<&Arc<MropeSpans>> {
        self.mrope.as_ref()
    }
}

/// The runs of `rows` (one per position of `positions`, ascending) within `range`: `(offset
/// from range.start, rows)`, one per run of consecutive positions.
pub(crate) fn runs_of(
    positions: &[usize],
    rows: &Array,
    range: Range<usize>,
) -> Vec<(usize, Array)> {
    let first = positions.partition_point(|&p| p < range.start);
    let end = positions.partition_point(|&p| p < range.end);
    let mut runs = Vec::new();
    let mut i = first;
    while i < end {
        let mut j = i + 1;
        while j < end && positions[j] == positions[j - 1] + 1 {
            j += 1;
        }
        runs.push((positions[i] - range.start, rows.index(i as i32..j as i32)));
        i = j;
    }
    runs
}

/// SplitMix64's output function: well-spread 64 bits from any seed.
fn splitmix64(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `h` (`[1, tokens, hidden]` embeddings) with rows replaced: each `(at, rows)` puts `rows`
/// (`[n, hidden]`) at positions `at..at + n`. Runs must be in order and not overlap.
pub fn splice(h: Array, runs: &[(usize, Array)]) -> Result<Array> {
    if runs.is_empty() {
        return Ok(h);
    }
    let (total, hidden) = (h.shape()[1], h.shape()[2]);
    let flat = h.reshape(&[total, hidden])?;
    let mut parts = Vec::with_capacity(2 * runs.len() + 1);
    let mut at = 0i32;
    for (start, rows) in runs {
        let start = *start as i32;
        let n = rows.shape()[0];
        if start < at || start + n > total || rows.shape()[1] != hidden {
            return Err(InferenceError::InvalidRequest(format!(
                "image rows {start}..{} do not fit a step of {total} positions",
                start + n
            )));
        }
        if start > at {
            parts.push(flat.index(at..start));
        }
        parts.push(rows.as_dtype(flat.dtype())?);
        at = start + n;
    }
    if at < total {
        parts.push(flat.index(at..total));
    }
    Ok(ops::concatenate(&parts, 0)?.reshape(&[1, total, hidden])?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn images(hashes: &[u8]) -> PromptImages {
        let n = hashes.len() * 2;
        PromptImages {
            positions: (0..hashes.len())
                .flat_map(|i| [3 + 5 * i, 4 + 5 * i])
                .collect(),
            rows: Array::from_slice(&vec![1.0f32; n * 4], &[n as i32, 4]),
            hashes: hashes.iter().map(|&h| [h; 32]).collect(),
            counts: vec![2; hashes.len()],
            mrope: None,
        }
    }

    #[test]
    fn image_positions_are_keyed_by_their_images_hash() {
        let context: Vec<u32> = (0..12).collect();
        let (a, b) = (images(&[1, 2]), images(&[1, 3]));
        let (ka, kb) = (a.cache_key(&context), b.cache_key(&context));
        // Text positions keep their tokens; image positions do not.
        assert_eq!(ka[..3], context[..3]);
        assert!(ka[3] >= 0x8000_0000 && ka[3] != ka[4]);
        // Same first image: same key up to the second image, which differs.
        assert_eq!(ka[..8], kb[..8]);
        assert_ne!(ka[8], kb[8]);
        assert_eq!(ka[10..], context[10..]);
    }

    #[test]
    fn runs_cover_the_image_positions_of_a_chunk() {
        let im = images(&[1, 2]);
        // Positions 3, 4, 8, 9: a chunk 4..9 holds the end of one and the start of the other.
        let runs = im.runs(4..9);
        let spans: Vec<(usize, i32)> = runs.iter().map(|(at, r)| (*at, r.shape()[0])).collect();
        assert_eq!(spans, [(0, 1), (4, 1)]);
        assert!(im.runs(5..8).is_empty());
        let h = Array::from_slice(&[0.0f32; 6 * 4], &[1, 6, 4]);
        let spliced = splice(h, &runs[..1]).unwrap();
        spliced.eval().unwrap();
        let got = spliced.as_slice::<f32>();
        assert_eq!(got[..4], [1.0; 4]);
        assert_eq!(got[4..], [0.0; 20]);
    }
}
