//! The venv with pinned mlx-vlm, the reference implementation of the vision models (issue 47):
//! `pip install 'mlx[cpu]==<setup's MLX>' mlx-vlm==<MLX_VLM_VERSION>`, the MLX that shoal links,
//! so both sides run the same kernels. It is its own venv, `<cache>/bench/mlx-vlm-venv`, beside
//! mlx-lm's ([`crate::mlx_lm_venv`]): mlx-vlm brings its own transformers, Pillow and OpenCV, and
//! mlx-lm's venv stays exactly as pinned.

use crate::paths::cache_dir;
use std::path::PathBuf;

/// mlx-vlm's release the vision fixtures are made with: the newest that runs on MLX 0.32.2
/// (0.7.6 asks for `mlx>=0.32.2`; 0.7.8 and later ask for 0.32.3 or 0.32.4).
pub(crate) const MLX_VLM_VERSION: &str = "0.7.6";

/// The venv's folder.
pub(crate) fn venv_dir() -> PathBuf {
    cache_dir().join("bench").join("mlx-vlm-venv")
}

/// The venv with the pinned mlx-vlm (made, or brought to the pinned versions, on first use:
/// measured 2 min 40 s on 2 cores, most of it downloading ~900 MB of wheels); its Python.
pub(crate) fn mlx_vlm_venv() -> Result<PathBuf, String> {
    crate::mlx_lm_venv::pinned_venv(&venv_dir(), "mlx-vlm", "mlx_vlm", MLX_VLM_VERSION)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mlx_build::MLX_VERSION;

    #[test]
    fn the_venv_is_pinned_to_shoals_mlx_and_apart_from_mlx_lms() {
        assert_eq!(MLX_VERSION, "0.32.2");
        assert_eq!(MLX_VLM_VERSION, "0.7.6");
        assert!(venv_dir().ends_with("bench/mlx-vlm-venv"));
        assert_ne!(venv_dir(), crate::mlx_lm_venv::venv_dir());
    }
}
