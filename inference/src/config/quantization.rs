//! The `quantization` entry of an MLX-community `config.json`: the default and the per-path
//! exceptions `mlx_lm.convert` writes.

use crate::error::{InferenceError, Result};
use crate::gguf::{GgmlType, GgufFile};
use crate::quantized::{QuantMode, QuantSpec};
use crate::weights::FormatOnMlx;
use serde_json::Value;
use std::collections::BTreeMap;

/// Quantization of an MLX-community checkpoint (`quantization` in config.json): the default
/// for every quantized tensor, and the per-path entries `mlx_lm.convert` writes for tensors
/// quantized otherwise (routers kept at 8 bits, say). Whether a tensor is quantized at all is
/// told by its `.scales` being in the files, as mlx-lm decides it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QuantizationConfig {
    /// Weights per scale/bias group.
    pub group_size: i32,
    /// Bits per weight.
    pub bits: i32,
    /// The encoding of the default.
    #[serde(default = "affine")]
    pub mode: QuantMode,
    /// Per-path exceptions (`model.layers.0.mlp.gate` → 8-bit), by module path; for a GGUF
    /// file, every other encoding it uses, by GGML type (`gguf:Q6_K`).
    #[serde(default)]
    pub overrides: BTreeMap<String, QuantSpec>,
    /// For a GGUF file: the bytes its weights take as they run quantized, repacked into MLX's
    /// layout: K-quants and 5-bit types with f32 scales and biases (more than the file: a Q4_K
    /// group of 32 carries 8 bytes of f32 scale and bias where the file has 1.5 bytes of
    /// sub-block scales), Q4_0/Q4_1/Q8_0 with their f16 ones where shoal's CPU kernel runs
    /// (the file's bytes, [`crate::ggml_repack::keeps_f16_scales`]), the tensors that do not
    /// repack counted as f32. `None` for MLX checkpoints, which run as
    /// stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_bytes: Option<u64>,
}

fn affine() -> QuantMode {
    QuantMode::Affine
}

impl QuantizationConfig {
    /// Reads a `quantization` object. An entry without `mode` means affine, also under a
    /// micro-scaled default: mlx-lm builds per-path layers from the entry alone.
    pub fn from_json(q: &Value) -> Result<QuantizationConfig> {
        let spec = |v: &Value, default_mode: QuantMode| -> Result<QuantSpec> {
            Ok(QuantSpec {
                group_size: v.get("group_size").and_then(Value::as_i64).unwrap_or(64) as i32,
                bits: v.get("bits").and_then(Value::as_i64).unwrap_or(4) as i32,
                mode: match v.get("mode").and_then(Value::as_str) {
                    Some(m) => QuantMode::parse(m)?,
                    None => default_mode,
                },
            })
        };
        let default = spec(q, QuantMode::Affine)?;
        let mut overrides = BTreeMap::new();
        if let Some(map) = q.as_object() {
            for (path, entry) in map {
                if entry.is_object() {
                    // Paths of a multimodal release's language model as a text model's.
                    let path = crate::weights::text_model_name(path).into_owned();
                    overrides.insert(path, spec(entry, QuantMode::Affine)?);
                }
            }
        }
        for s in std::iter::once(&default).chain(overrides.values()) {
            if !matches!(s.bits, 2 | 3 | 4 | 5 | 6 | 8)
                || !matches!(s.group_size, 16 | 32 | 64 | 128)
            {
                return Err(InferenceError::BadConfig(format!(
                    "quantization {s:?} is not one MLX has (2, 3, 4, 5, 6 or 8 bits; groups of 16 to 128)"
                )));
            }
        }
        Ok(QuantizationConfig {
            group_size: default.group_size,
            bits: default.bits,
            mode: default.mode,
            overrides,
            running_bytes: None,
        })
    }

    /// How a GGUF file runs quantized: its quantized matrices repacked into MLX's affine
    /// layout ([`crate::ggml_repack::repacked_layout`]), the encoding holding the most
    /// weights as the default and the others as overrides by GGML type, and
    /// [`Self::running_bytes`]; MXFP4 experts stay MLX's `mxfp4` (an override, or the default
    /// when they are the only quantized tensors). `None` when the file holds no quantized
    /// matrix, or one that does not repack (IQ4_NL): such a file runs dequantized. Read from the tensor directory
    /// alone, so every node decides the same; only the byte count depends on the node's kind:
    /// where shoal's CPU kernel does not run (GPUs, `SHOAL_QMM=mlx`), the groups of 16 that
    /// MLX's kernels refuse load as floats of the quantized form's compute dtype, and count
    /// so.
    pub fn of_gguf(file: &GgufFile) -> Option<QuantizationConfig> {
        let float_bytes = match crate::weights::WeightFormat::Quantized.compute_dtype() {
            mlx_rs::Dtype::Float32 => 4,
            _ => 2,
        };
        let mut weights: BTreeMap<(i32, i32), u64> = BTreeMap::new();
        let mut overrides = BTreeMap::new();
        let mut running = 0u64;
        let mut mxfp4 = 0u64;
        for info in file.tensors.values() {
            let elements = info.elements() as u64;
            let ty = info.ggml_type.ok()?;
            if ty == GgmlType::Mxfp4 {
                // MLX's own mxfp4: the codes and one exponent byte per 32, as stored.
                running += elements * 17 / 32;
                mxfp4 += elements;
                continue;
            }
            let float = matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16);
            if float || info.shape.len() != 2 {
                // Floats, and quantized vectors or stacks, load as f32.
                running += 4 * elements;
                continue;
            }
            let (bits, group_size) = crate::ggml_repack::repacked_layout(ty)?;
            running += if crate::ggml_repack::runs_repacked(ty) {
                elements * bits as u64 / 8
                    + crate::ggml_repack::scale_bias_bytes(ty) * elements / group_size as u64
            } else {
                float_bytes * elements
            };
            *weights.entry((bits, group_size)).or_default() += elements;
            let spec = QuantSpec {
                group_size,
                bits,
                mode: QuantMode::Affine,
            };
            overrides.insert(format!("gguf:{}", ty.name()), spec);
        }
        let mxfp4_spec = QuantSpec {
            group_size: 32,
            bits: 4,
            mode: QuantMode::Mxfp4,
        };
        let Some((&(bits, group_size), _)) = weights.iter().max_by_key(|&(layout, n)| (n, *layout))
        else {
            // Only MXFP4 stacks (gpt-oss's experts beside float attention).
            return (mxfp4 > 0).then_some(QuantizationConfig {
                group_size: 32,
                bits: 4,
                mode: QuantMode::Mxfp4,
                overrides,
                running_bytes: Some(running),
            });
        };
        overrides.retain(|_, s| (s.bits, s.group_size) != (bits, group_size));
        if mxfp4 > 0 {
            overrides.insert(format!("gguf:{}", GgmlType::Mxfp4.name()), mxfp4_spec);
        }
        Some(QuantizationConfig {
            group_size,
            bits,
            mode: QuantMode::Affine,
            overrides,
            running_bytes: Some(running),
        })
    }

    /// How the tensor at module path `prefix` (`model.layers.3.mlp.gate`) is quantized.
    pub fn spec_for(&self, prefix: &str) -> QuantSpec {
        self.overrides.get(prefix).copied().unwrap_or(QuantSpec {
            group_size: self.group_size,
            bits: self.bits,
            mode: self.mode,
        })
    }

    /// Every encoding the checkpoint uses: its default and each per-path exception.
    pub fn specs(&self) -> impl Iterator<Item = QuantSpec> + '_ {
        let default = QuantSpec {
            group_size: self.group_size,
            bits: self.bits,
            mode: self.mode,
        };
        std::iter::once(default).chain(self.overrides.values().copied())
    }
}
