//! The `quantization` entry of an MLX-community `config.json`: the default and the per-path
//! exceptions `mlx_lm.convert` writes.

use crate::error::{InferenceError, Result};
use crate::quantized::{QuantMode, QuantSpec};
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
    /// Per-path exceptions (`model.layers.0.mlp.gate` → 8-bit), by module path.
    #[serde(default)]
    pub overrides: BTreeMap<String, QuantSpec>,
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
                    overrides.insert(path.clone(), spec(entry, QuantMode::Affine)?);
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
