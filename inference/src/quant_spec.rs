//! How a quantized tensor is encoded ([`QuantMode`], [`QuantSpec`]), apart from the tensors
//! themselves: the checkpoint's configuration, the loader, the quantized products and shoal's
//! CPU kernels all read it.

use crate::error::{InferenceError, Result};
use std::ffi::CStr;

/// How a quantized matrix encodes its weights.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum QuantMode {
    /// `w = scale * q + bias` per group (MLX's default).
    Affine,
    /// OCP MX FP4: 4-bit floats (e2m1), one shared 8-bit exponent per group of 32.
    Mxfp4,
    /// OCP MX FP8: 8-bit floats (e4m3), one shared 8-bit exponent per group of 32.
    Mxfp8,
}

impl QuantMode {
    /// Parses the `mode` of a checkpoint's `quantization` entry.
    pub fn parse(name: &str) -> Result<QuantMode> {
        match name {
            "affine" => Ok(QuantMode::Affine),
            "mxfp4" => Ok(QuantMode::Mxfp4),
            "mxfp8" => Ok(QuantMode::Mxfp8),
            other => Err(InferenceError::BadConfig(format!(
                "quantization mode `{other}` is not supported (affine, mxfp4 and mxfp8 are)"
            ))),
        }
    }

    pub(crate) fn c_name(self) -> &'static CStr {
        match self {
            QuantMode::Affine => c"affine",
            QuantMode::Mxfp4 => c"mxfp4",
            QuantMode::Mxfp8 => c"mxfp8",
        }
    }

    /// Whether groups carry an additive bias besides their scale.
    pub fn has_biases(self) -> bool {
        self == QuantMode::Affine
    }
}

/// How one tensor is quantized: the group size, the bits per weight and the mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QuantSpec {
    /// Weights per scale (and bias) group.
    pub group_size: i32,
    /// Bits per weight.
    pub bits: i32,
    /// The encoding.
    pub mode: QuantMode,
}
