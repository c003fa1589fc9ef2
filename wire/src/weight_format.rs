//! The in-memory form a runner holds a model's weights in: what the node may ask of its runner
//! ([`crate::runner::NodeCommand::Load`]) and `SHOAL_DTYPE` overrides. How a model chooses its
//! form and what each form runs as on MLX is `inference::weights`.

use crate::sampling::InvalidRequest;
use std::str::FromStr;

/// The in-memory form of the weight matrices.
///
/// On MLX's CPU backend f32 is by far the fastest: f32 matmuls go to BLAS, while bf16 matmuls
/// and quantized kernels do not (measured with mlx-lm: 16.5 tok/s f32, 7.3 bf16, about 1 with
/// 4-bit). On GPUs the quantized form is fastest and smallest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WeightFormat {
    /// Dequantize everything to f32.
    F32,
    /// Dequantize to f16.
    F16,
    /// Dequantize to bf16.
    Bf16,
    /// Keep quantized tensors quantized (MLX affine layout); float tensors stay as stored.
    Quantized,
}

impl FromStr for WeightFormat {
    type Err = InvalidRequest;
    fn from_str(s: &str) -> Result<Self, InvalidRequest> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" => Ok(WeightFormat::F32),
            "f16" | "float16" => Ok(WeightFormat::F16),
            "bf16" | "bfloat16" => Ok(WeightFormat::Bf16),
            "quantized" | "q" | "native" => Ok(WeightFormat::Quantized),
            other => Err(InvalidRequest(format!(
                "unknown weight format `{other}` (use f32, f16, bf16 or quantized)"
            ))),
        }
    }
}

impl WeightFormat {
    /// The environment variable that overrides the default.
    pub const ENV: &'static str = "SHOAL_DTYPE";

    /// The fastest form for the backend this build runs on: f32 on the CPU backend (Linux
    /// builds of shoal use MLX's CPU backend), quantized on Apple GPUs. `SHOAL_DTYPE` overrides.
    pub fn default_for_backend() -> WeightFormat {
        if let Some(f) = std::env::var(Self::ENV).ok().and_then(|v| v.parse().ok()) {
            return f;
        }
        if cfg!(target_vendor = "apple") {
            WeightFormat::Quantized
        } else {
            WeightFormat::F32
        }
    }
}
