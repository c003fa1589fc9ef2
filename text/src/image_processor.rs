//! The image processor of a vision model, as its `preprocessor_config.json` says and as
//! transformers' PIL backend runs it (what mlx-vlm loads, so what its logits were made from):
//! decode, convert to RGB (transparency composited onto white), resize to the model's size with
//! PIL's resampling, rescale (`rescale_factor`, 1/255), normalise (`image_mean`, `image_std`),
//! giving `pixel_values` as `[3, height, width]` floats. The tower then cuts them into patches.
//!
//! The resampling is PIL's own arithmetic (its separable two-pass filter with coefficients in
//! fixed point and 8-bit rounding between the passes), so the pixels equal transformers' bit for
//! bit on PNG input; a JPEG's pixels can differ by the decoders' rounding (libjpeg's in PIL, the
//! `image` crate's here). Pan-and-scan (`do_pan_and_scan`) is refused for now.

use crate::error::{Result, TextError};
use serde_json::Value;
use std::path::Path;

/// Fraction bits of PIL's fixed-point resampling coefficients (8-bit images).
const PRECISION_BITS: u32 = 32 - 8 - 2;

/// A resampling filter, as PIL numbers them (`resample` in the configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resample {
    /// PIL's `BILINEAR` (2): a triangle of support 1.
    Bilinear,
    /// PIL's `BICUBIC` (3): Keys' cubic with a = −0.5, support 2.
    Bicubic,
}

impl Resample {
    fn support(self) -> f64 {
        match self {
            Resample::Bilinear => 1.0,
            Resample::Bicubic => 2.0,
        }
    }

    fn weight(self, x: f64) -> f64 {
        let x = x.abs();
        match self {
            Resample::Bilinear => (1.0 - x).max(0.0),
            Resample::Bicubic => {
                const A: f64 = -0.5;
                if x < 1.0 {
                    ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * A
                } else {
                    0.0
                }
            }
        }
    }
}

/// What `preprocessor_config.json` asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageProcessor {
    /// The size every image is resized to.
    pub height: u32,
    pub width: u32,
    pub resample: Resample,
    /// Multiplies the 0..255 values (absent: `do_rescale` false).
    pub rescale_factor: Option<f64>,
    /// `(mean, std)` per channel (absent: `do_normalize` false).
    pub normalize: Option<([f32; 3], [f32; 3])>,
}

/// An error in the folder's `preprocessor_config.json`.
pub(crate) fn bad(message: String) -> TextError {
    TextError::BadConfig(format!("preprocessor_config.json: {message}"))
}

/// `dir/preprocessor_config.json`, parsed (every image processor starts from it).
pub(crate) fn preprocessor_json(dir: &Path) -> Result<Value> {
    let path = dir.join("preprocessor_config.json");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| bad(format!("cannot read {}: {e}", path.display())))?;
    serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))
}

impl ImageProcessor {
    /// Reads `dir/preprocessor_config.json`.
    pub fn read(dir: &Path) -> Result<ImageProcessor> {
        ImageProcessor::from_json(&preprocessor_json(dir)?)
    }

    /// The processor a configuration describes; a setting shoal does not implement is an
    /// error naming it, never ignored.
    pub fn from_json(json: &Value) -> Result<ImageProcessor> {
        let flag =
            |key: &str, default: bool| json.get(key).and_then(Value::as_bool).unwrap_or(default);
        if flag("do_pan_and_scan", false) {
            return Err(bad("`do_pan_and_scan` is not supported yet".into()));
        }
        if !flag("do_resize", true) {
            return Err(bad(
                "`do_resize: false` is not supported (the tower has a fixed size)".into(),
            ));
        }
        let size = json.get("size");
        let side = |key: &str| {
            size.and_then(|s| s.get(key))
                .and_then(Value::as_u64)
                .filter(|&v| (1..=8192).contains(&v))
                .map(|v| v as u32)
                .ok_or_else(|| bad(format!("`size.{key}` must be a size from 1 to 8192")))
        };
        let (height, width) = (side("height")?, side("width")?);
        let resample = match json.get("resample").and_then(Value::as_u64).unwrap_or(2) {
            2 => Resample::Bilinear,
            3 => Resample::Bicubic,
            other => return Err(bad(format!("`resample` {other} is not supported (2 or 3)"))),
        };
        let rescale_factor = flag("do_rescale", true).then(|| {
            json.get("rescale_factor")
                .and_then(Value::as_f64)
                .unwrap_or(1.0 / 255.0)
        });
        let triple = |key: &str| -> Result<[f32; 3]> {
            match json.get(key) {
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
                Some(Value::Number(n)) => Ok([n.as_f64().unwrap_or(0.0) as f32; 3]),
                _ => Err(bad(format!("`{key}` must be three numbers"))),
            }
        };
        let normalize = if flag("do_normalize", true) {
            let (mean, std) = (triple("image_mean")?, triple("image_std")?);
            if std.contains(&0.0) {
                return Err(bad("`image_std` must not be 0".into()));
            }
            Some((mean, std))
        } else {
            None
        };
        Ok(ImageProcessor {
            height,
            width,
            resample,
            rescale_factor,
            normalize,
        })
    }

    /// `pixel_values` of an encoded image (PNG, JPEG, WebP, GIF's first frame): `[3, height,
    /// width]`, channel by channel.
    pub fn process(&self, encoded: &[u8]) -> Result<Vec<f32>> {
        let (width, height, rgb) = decode_rgb(encoded)?;
        Ok(self.process_rgb(width, height, &rgb))
    }

    /// `pixel_values` of an RGB image (`width × height × 3` bytes, row by row).
    pub fn process_rgb(&self, width: u32, height: u32, rgb: &[u8]) -> Vec<f32> {
        let resized = resize(rgb, width, height, self.width, self.height, self.resample);
        let plane = (self.width * self.height) as usize;
        let mut out = vec![0f32; 3 * plane];
        for (i, pixel) in resized.chunks_exact(3).enumerate() {
            for c in 0..3 {
                // As transformers: the bytes times the factor in f64, kept as f32, then
                // (x - mean) / std in f32.
                let mut x = match self.rescale_factor {
                    Some(f) => (f64::from(pixel[c]) * f) as f32,
                    None => f32::from(pixel[c]),
                };
                if let Some((mean, std)) = &self.normalize {
                    x = (x - mean[c]) / std[c];
                }
                out[c * plane + i] = x;
            }
        }
        out
    }
}

/// Decodes an image to RGB bytes as transformers' `convert_to_rgb` makes them: an image with
/// transparency is composited onto opaque white (PIL's `alpha_composite` arithmetic), others
/// converted. Returns `(width, height, bytes)`.
pub fn decode_rgb(encoded: &[u8]) -> Result<(u32, u32, Vec<u8>)> {
    let decoded = image::load_from_memory(encoded)
        .map_err(|e| TextError::InvalidRequest(format!("the image cannot be decoded: {e}")))?;
    let (width, height) = (decoded.width(), decoded.height());
    if !decoded.color().has_alpha() {
        return Ok((width, height, decoded.into_rgb8().into_raw()));
    }
    let rgba = decoded.into_rgba8().into_raw();
    let rgb = rgba
        .chunks_exact(4)
        .flat_map(|p| {
            let a = u32::from(p[3]);
            [0, 1, 2].map(|c| over_white(u32::from(p[c]), a))
        })
        .collect();
    Ok((width, height, rgb))
}

/// Decodes an image to RGB bytes as PIL's `convert("RGB")` makes them, which the Qwen3-VL
/// processors use: transparency is dropped, not composited. Returns `(width, height, bytes)`.
pub fn decode_dropping_alpha(encoded: &[u8]) -> Result<(u32, u32, Vec<u8>)> {
    let decoded = image::load_from_memory(encoded)
        .map_err(|e| TextError::InvalidRequest(format!("the image cannot be decoded: {e}")))?;
    Ok((
        decoded.width(),
        decoded.height(),
        decoded.into_rgb8().into_raw(),
    ))
}

/// One channel of PIL's `alpha_composite(white, pixel)`: 7 fraction bits, division by 255 as
/// `((x >> 8) + x) >> 8`.
fn over_white(value: u32, alpha: u32) -> u8 {
    const BITS: u32 = 7;
    let coef1 = alpha << BITS;
    let coef2 = (255 << BITS) - coef1;
    let t = value * coef1 + 255 * coef2 + (0x80 << BITS);
    ((((t >> 8) + t) >> 8) >> BITS) as u8
}

/// PIL's fixed-point coefficients resampling `in_size` samples to `out_size`: for each output
/// sample, its first input sample and its weights.
fn coefficients(in_size: u32, out_size: u32, filter: Resample) -> Vec<(usize, Vec<i32>)> {
    let scale = f64::from(in_size) / f64::from(out_size);
    let filter_scale = scale.max(1.0);
    let support = filter.support() * filter_scale;
    (0..out_size)
        .map(|xx| {
            let center = (f64::from(xx) + 0.5) * scale;
            // PIL rounds by truncating `x + 0.5` (an int cast).
            let xmin = ((center - support + 0.5) as i64).max(0) as usize;
            let xmax = ((center + support + 0.5) as i64).min(i64::from(in_size)) as usize;
            let weights: Vec<f64> = (xmin..xmax)
                .map(|x| filter.weight((x as f64 - center + 0.5) / filter_scale))
                .collect();
            let total: f64 = weights.iter().sum();
            let fixed = weights
                .iter()
                .map(|w| {
                    let w = if total != 0.0 { w / total } else { *w };
                    let scaled = w * f64::from(1u32 << PRECISION_BITS);
                    if w < 0.0 {
                        (scaled - 0.5) as i32
                    } else {
                        (scaled + 0.5) as i32
                    }
                })
                .collect();
            (xmin, fixed)
        })
        .collect()
}

fn clip8(sum: i64) -> u8 {
    (sum >> PRECISION_BITS).clamp(0, 255) as u8
}

/// PIL's `Image.resize` of an RGB image: horizontal pass, then vertical, each rounded to bytes;
/// a pass whose size does not change is skipped (an image already at the size is copied).
pub(crate) fn resize(
    rgb: &[u8],
    width: u32,
    height: u32,
    out_w: u32,
    out_h: u32,
    filter: Resample,
) -> Vec<u8> {
    let mut image = rgb.to_vec();
    let mut w = width as usize;
    if out_w != width {
        let coefs = coefficients(width, out_w, filter);
        let mut next = vec![0u8; out_w as usize * height as usize * 3];
        for y in 0..height as usize {
            for (xx, (xmin, k)) in coefs.iter().enumerate() {
                for c in 0..3 {
                    let mut sum: i64 = 1 << (PRECISION_BITS - 1);
                    for (i, &weight) in k.iter().enumerate() {
                        sum += i64::from(image[(y * w + xmin + i) * 3 + c]) * i64::from(weight);
                    }
                    next[(y * out_w as usize + xx) * 3 + c] = clip8(sum);
                }
            }
        }
        image = next;
        w = out_w as usize;
    }
    if out_h != height {
        let coefs = coefficients(height, out_h, filter);
        let mut next = vec![0u8; w * out_h as usize * 3];
        for (yy, (ymin, k)) in coefs.iter().enumerate() {
            for x in 0..w {
                for c in 0..3 {
                    let mut sum: i64 = 1 << (PRECISION_BITS - 1);
                    for (i, &weight) in k.iter().enumerate() {
                        sum += i64::from(image[((ymin + i) * w + x) * 3 + c]) * i64::from(weight);
                    }
                    next[(yy * w + x) * 3 + c] = clip8(sum);
                }
            }
        }
        image = next;
    }
    image
}

#[cfg(test)]
#[path = "image_processor_tests.rs"]
mod tests;
