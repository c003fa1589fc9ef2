//! The image processor of the Qwen3-VL family's towers (Qwen3.5, Qwen3.6, Qwen3-VL), as
//! mlx-vlm's numpy port of Hugging Face's `Qwen2VLImageProcessor` runs it (what its logits were
//! made from): decode to RGB (alpha dropped, as PIL's `convert("RGB")`), **smart resize** to a
//! multiple of `patch_size × merge_size` on each side within the pixel budget
//! (`size.shortest_edge` / `size.longest_edge`, or `min_pixels` / `max_pixels`) with PIL's
//! bicubic filter, rescale and normalise in f32, then cut into patches of `temporal_patch_size`
//! frames (a still image repeated) × `patch_size²` pixels × channels, laid out in the order the
//! tower's patch merger expects: every `merge_size × merge_size` block of patches together, the
//! blocks row by row.
//!
//! Unlike a fixed-size tower's, the number of image tokens depends on the image's size: it is
//! what [`QwenImageProcessor::grid`] says, before any pixel is read, so the prompt can be
//! expanded where it is rendered.

use crate::error::{Result, TextError};
use crate::image_processor::{bad, decode_dropping_alpha, preprocessor_json, resize, Resample};
use serde_json::Value;
use std::path::Path;

/// The largest side ratio the processor accepts (Hugging Face's `smart_resize` refuses more).
const MAX_ASPECT: f64 = 200.0;

/// What `preprocessor_config.json` asks of a Qwen3-VL-family processor.
#[derive(Debug, Clone, PartialEq)]
pub struct QwenImageProcessor {
    pub patch_size: u32,
    pub temporal_patch_size: u32,
    pub merge_size: u32,
    /// The pixel budget of a resized image.
    pub min_pixels: u64,
    pub max_pixels: u64,
    /// Multiplies the 0..255 values (absent: `do_rescale` false).
    pub rescale_factor: Option<f32>,
    /// `(mean, std)` per channel (absent: `do_normalize` false).
    pub normalize: Option<([f32; 3], [f32; 3])>,
}

// Its floats come from JSON numbers, never NaN: equality is an equivalence.
impl Eq for QwenImageProcessor {}

/// One processed image: its patches and their grid.
#[derive(Debug, Clone, PartialEq)]
pub struct QwenPatches {
    /// `[grid.0 · grid.1 · grid.2, channels · temporal · patch²]`, row-major.
    pub values: Vec<f32>,
    /// `(t, h, w)` in patches.
    pub grid: (u32, u32, u32),
}

impl QwenImageProcessor {
    /// Reads `dir/preprocessor_config.json`, with `processor_config.json`'s `image_processor`
    /// keys over it, as mlx-vlm reads them.
    pub fn read(dir: &Path) -> Result<QwenImageProcessor> {
        let mut json = preprocessor_json(dir)?;
        let extra = std::fs::read_to_string(dir.join("processor_config.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .and_then(|v| v.get("image_processor").cloned());
        if let (Some(Value::Object(extra)), Value::Object(base)) = (extra, &mut json) {
            base.extend(extra);
        }
        QwenImageProcessor::from_json(&json)
    }

    /// The processor a configuration describes, with mlx-vlm's defaults for what it leaves
    /// out; nonsense (a zero patch, a budget that fits no patch) is an error.
    pub fn from_json(json: &Value) -> Result<QwenImageProcessor> {
        let int = |key: &str, default: u64| {
            json.get(key)
                .map(|v| {
                    v.as_u64()
                        .ok_or_else(|| bad(format!("`{key}` must be a count")))
                })
                .unwrap_or(Ok(default))
        };
        let size = json.get("size");
        let budget = |key: &str, edge: &str, default: u64| -> Result<u64> {
            match json
                .get(key)
                .or_else(|| size.and_then(|s| s.get(edge)))
                .filter(|v| !v.is_null())
            {
                Some(v) => v
                    .as_u64()
                    .ok_or_else(|| bad(format!("`{key}` must be a pixel count"))),
                None => Ok(default),
            }
        };
        let flag =
            |key: &str, default: bool| json.get(key).and_then(Value::as_bool).unwrap_or(default);
        let triple = |key: &str| -> Result<[f32; 3]> {
            match json.get(key) {
                None => Ok([0.5; 3]),
                Some(Value::Array(v)) if v.len() == 3 => {
                    let mut out = [0f32; 3];
                    for (o, x) in out.iter_mut().zip(v) {
                        *o = x
                            .as_f64()
                            .ok_or_else(|| bad(format!("`{key}` must hold numbers")))?
                            as f32;
                    }
                    Ok(out)
                }
                _ => Err(bad(format!("`{key}` must be three numbers"))),
            }
        };
        let processor = QwenImageProcessor {
            patch_size: int("patch_size", 16)? as u32,
            temporal_patch_size: int("temporal_patch_size", 2)? as u32,
            merge_size: int("merge_size", 2)? as u32,
            min_pixels: budget("min_pixels", "shortest_edge", 56 * 56)?,
            max_pixels: budget("max_pixels", "longest_edge", 14 * 14 * 4 * 1280)?,
            rescale_factor: flag("do_rescale", true).then(|| {
                json.get("rescale_factor")
                    .and_then(Value::as_f64)
                    .unwrap_or(1.0 / 255.0) as f32
            }),
            normalize: if flag("do_normalize", true) {
                let (mean, std) = (triple("image_mean")?, triple("image_std")?);
                if std.contains(&0.0) {
                    return Err(bad("`image_std` must not be 0".into()));
                }
                Some((mean, std))
            } else {
                None
            },
        };
        let factor = u64::from(processor.factor());
        if !(1..=64).contains(&processor.patch_size)
            || !(1..=8).contains(&processor.merge_size)
            || !(1..=4).contains(&processor.temporal_patch_size)
            || processor.max_pixels < factor * factor
            || processor.min_pixels > processor.max_pixels
        {
            return Err(bad(format!(
                "patch {}, merge {}, temporal patch {} and a pixel budget of {} to {} do not \
                 make a processor",
                processor.patch_size,
                processor.merge_size,
                processor.temporal_patch_size,
                processor.min_pixels,
                processor.max_pixels
            )));
        }
        Ok(processor)
    }

    /// The side every resized side is a multiple of (a merged block).
    pub fn factor(&self) -> u32 {
        self.patch_size * self.merge_size
    }

    /// The size an image of `width × height` is resized to, `(height, width)`: each side
    /// rounded to the nearest multiple of [`Self::factor`] (ties to even, as Python rounds),
    /// then scaled down into `max_pixels` or up to `min_pixels` when outside the budget.
    /// An error for an empty image or one whose sides differ more than 200 times.
    pub fn resized_size(&self, width: u32, height: u32) -> Result<(u32, u32)> {
        if width == 0 || height == 0 {
            return Err(TextError::InvalidRequest("the image has no pixels".into()));
        }
        let (h, w) = (f64::from(height), f64::from(width));
        if h.max(w) / h.min(w) > MAX_ASPECT {
            return Err(TextError::InvalidRequest(format!(
                "the image is {width}×{height}: its sides may differ at most {MAX_ASPECT} times"
            )));
        }
        let factor = f64::from(self.factor());
        let mut h_bar = (h / factor).round_ties_even() * factor;
        let mut w_bar = (w / factor).round_ties_even() * factor;
        if h_bar * w_bar > self.max_pixels as f64 {
            let beta = ((h * w) / self.max_pixels as f64).sqrt();
            h_bar = factor.max((h / beta / factor).floor() * factor);
            w_bar = factor.max((w / beta / factor).floor() * factor);
        } else if h_bar * w_bar < self.min_pixels as f64 {
            let beta = (self.min_pixels as f64 / (h * w)).sqrt();
            h_bar = (h * beta / factor).ceil() * factor;
            w_bar = (w * beta / factor).ceil() * factor;
        }
        Ok((h_bar as u32, w_bar as u32))
    }

    /// The patch grid `(t, h, w)` of an image of `width × height` (a still image: `t` 1).
    pub fn grid(&self, width: u32, height: u32) -> Result<(u32, u32, u32)> {
        let (h, w) = self.resized_size(width, height)?;
        Ok((1, h / self.patch_size, w / self.patch_size))
    }

    /// Image tokens in the prompt for an image of `width × height`: one per merged block.
    pub fn tokens(&self, width: u32, height: u32) -> Result<usize> {
        let (t, h, w) = self.grid(width, height)?;
        Ok((t * h * w / (self.merge_size * self.merge_size)) as usize)
    }

    /// The patches of an encoded image (PNG, JPEG, WebP, GIF's first frame).
    pub fn process(&self, encoded: &[u8]) -> Result<QwenPatches> {
        let (width, height, rgb) = decode_dropping_alpha(encoded)?;
        self.process_rgb(width, height, &rgb)
    }

    /// The patches of an RGB image (`width × height × 3` bytes, row by row).
    pub fn process_rgb(&self, width: u32, height: u32, rgb: &[u8]) -> Result<QwenPatches> {
        let (out_h, out_w) = self.resized_size(width, height)?;
        let resized = resize(rgb, width, height, out_w, out_h, Resample::Bicubic);
        // Channel planes, rescaled and normalised in f32 as numpy does with f32 arrays.
        let plane = (out_w * out_h) as usize;
        let mut planes = vec![0f32; 3 * plane];
        for (i, pixel) in resized.chunks_exact(3).enumerate() {
            for c in 0..3 {
                let mut x = f32::from(pixel[c]);
                if let Some(f) = self.rescale_factor {
                    x *= f;
                }
                if let Some((mean, std)) = &self.normalize {
                    x = (x - mean[c]) / std[c];
                }
                planes[c * plane + i] = x;
            }
        }
        let (p, m, t) = (
            self.patch_size as usize,
            self.merge_size as usize,
            self.temporal_patch_size as usize,
        );
        let (gh, gw) = (out_h as usize / p, out_w as usize / p);
        let row = 3 * t * p * p;
        let mut values = Vec::with_capacity(gh * gw * row);
        // Blocks of m × m patches row by row; within a block, patches row by row; within a
        // patch, channel, frame, pixel row, pixel column.
        for bh in 0..gh / m {
            for bw in 0..gw / m {
                for i in 0..m {
                    for j in 0..m {
                        let (y0, x0) = ((bh * m + i) * p, (bw * m + j) * p);
                        for c in 0..3 {
                            for _frame in 0..t {
                                for y in y0..y0 + p {
                                    let at = c * plane + y * out_w as usize + x0;
                                    values.extend_from_slice(&planes[at..at + p]);
                                }
                            }
                        }
                    }
                }
            }
        }
        Ok(QwenPatches {
            values,
            grid: (1, gh as u32, gw as u32),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn processor() -> QwenImageProcessor {
        QwenImageProcessor::from_json(&serde_json::json!({
            "size": {"shortest_edge": 1024, "longest_edge": 16384},
            "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
        }))
        .unwrap()
    }

    #[test]
    fn sizes_round_to_blocks_within_the_budget() {
        let p = processor();
        // 56 → 64 (1.75 blocks rounds up), 40 → 32, and 80 → 64: 2.5 rounds to even.
        assert_eq!(p.resized_size(56, 56).unwrap(), (64, 64));
        assert_eq!(p.resized_size(96, 40).unwrap(), (32, 96));
        assert_eq!(p.resized_size(80, 80).unwrap(), (64, 64));
        // Past the budget: scaled into it, the aspect kept.
        assert_eq!(p.resized_size(200, 150).unwrap(), (96, 128));
        assert_eq!(p.resized_size(4000, 4000).unwrap(), (128, 128));
        // Below it: scaled up.
        assert_eq!(p.resized_size(8, 8).unwrap(), (32, 32));
        assert_eq!(p.tokens(200, 150).unwrap(), 12);
        assert!(p.resized_size(0, 10).is_err());
        assert!(p.resized_size(10_000, 20).is_err());
    }

    #[test]
    fn patches_come_in_merged_blocks() {
        let p = processor();
        // 64×64: every pixel's red channel is its patch index in raster order.
        let mut rgb = vec![0u8; 64 * 64 * 3];
        for y in 0..64 {
            for x in 0..64 {
                rgb[(y * 64 + x) * 3] = ((y / 16) * 4 + x / 16) as u8;
            }
        }
        let out = QwenPatches {
            grid: (1, 4, 4),
            ..p.process_rgb(64, 64, &rgb).unwrap()
        };
        let row = 3 * 2 * 16 * 16;
        assert_eq!(out.values.len(), 16 * row);
        let raster: Vec<u32> = (0..16)
            .map(|r| ((out.values[r * row] * 0.5 + 0.5) * 255.0).round() as u32)
            .collect();
        assert_eq!(
            raster,
            [0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15]
        );
        assert!(QwenImageProcessor::from_json(&serde_json::json!({"patch_size": 0})).is_err());
    }
}
