//! Where shoal keeps its files, resolved in one place for the node, the xtask and the tests.
//!
//! - cache (MLX, models, the venv, the shared build directory): `SHOAL_CACHE_DIR`, else
//!   `$XDG_CACHE_HOME/shoal`, else `~/.cache/shoal`;
//! - data (a node's identity and state): `$XDG_DATA_HOME/shoal`, else `~/.local/share/shoal`;
//! - config: `$XDG_CONFIG_HOME/shoal`, else `~/.config/shoal`.
//!
//! The roots themselves (cache, data, config) come from the `shoal-paths` crate, which
//! `native/mlx-sys/build.rs` uses too; this module adds what lives under them.

pub use paths::{
    cache_dir, cache_dir_in, config_dir, config_dir_in, data_dir, data_dir_in, Env, ProcessEnv,
};
use std::path::PathBuf;

/// File name of the SmolLM2 fixture that `cargo xtask setup` downloads.
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Cargo's target directory: `CARGO_TARGET_DIR` if set, else `<cache>/target`, outside the
/// clone so that a fresh clone on the same machine (CI) reuses earlier builds.
pub fn target_dir() -> PathBuf {
    ProcessEnv
        .var("CARGO_TARGET_DIR")
        .unwrap_or_else(|| cache_dir().join("target"))
}

/// Where downloaded models live: `<cache>/models`.
pub fn models_dir() -> PathBuf {
    cache_dir().join("models")
}

/// The SmolLM2 fixture (`--model default`), once setup has fetched it.
pub fn default_model_path() -> PathBuf {
    models_dir().join(DEFAULT_MODEL_FILE)
}

/// The SmolLM2 fixture requantized by llama.cpp's `llama-quantize` to `quant` (`Q4_K_M`,
/// `Q5_K_M`, `Q6_K`, ...): `<cache>/kquants/SmolLM2-135M-Instruct.<quant>.gguf`, made by
/// `cargo xtask setup` for the K-quant tests (outside [`models_dir`], so nodes do not list them).
pub fn kquant_fixture_path(quant: &str) -> PathBuf {
    cache_dir()
        .join("kquants")
        .join(format!("SmolLM2-135M-Instruct.{quant}.gguf"))
}

/// One reference fixture of a model family, made by `cargo xtask setup` with mlx-lm itself:
/// `<cache>/fixtures/families/<family>/<layout>/`. `family` is mlx-lm's `model_type`
/// (`qwen3_moe`, `deepseek_v3`, `gpt_oss`, `glm4_moe`, `minimax`, `gemma3_text`); `layout` is
/// `hf` (the Hugging Face layout: per-expert tensors, `kv_b_proj`, gpt-oss's mxfp4 blocks),
/// `q4` / `q8` (`mlx_lm.convert`'s affine 4/8-bit, group 64), `mxfp4` or `mxfp8` (group 32;
/// not every family has them: `manifest.json` beside the families lists what exists). Each folder holds a
/// model shoal can load and serve (SmolLM2's tokenizer) and `reference.safetensors`: mlx-lm's
/// logits on that very folder, which the family tests compare against.
pub fn family_fixture_dir(family: &str, layout: &str) -> PathBuf {
    cache_dir()
        .join("fixtures")
        .join("families")
        .join(family)
        .join(layout)
}

/// The MoE GGUF fixtures `cargo xtask setup` makes with llama.cpp's own converter and
/// `llama-quantize` (issue 46): `<cache>/fixtures/gguf-moe/`, holding `<arch>.<type>.gguf`
/// (`qwen3moe.F32.gguf`, `.Q8_0`, `.Q4_K_M`), llama.cpp's logits on each
/// (`<arch>.<type>.logits.f32`) and `reference.json` (the prompt, llama.cpp's greedy tokens and
/// its greedy answer to a chat), so the tests compare shoal with llama.cpp's own reader.
pub fn moe_gguf_fixtures_dir() -> PathBuf {
    cache_dir().join("fixtures").join("gguf-moe")
}

/// The vision fixtures `cargo xtask setup` makes with mlx-vlm (issue 47):
/// `<cache>/fixtures/vision/`, holding `images/` (synthetic PNG and JPEG test images) and one
/// folder per model (`gemma3/hf`, `gemma3/f32`, `gemma3/q4`, each with mlx-vlm's
/// `reference.safetensors`; `gemma3/pixel_values.safetensors`, its image processor's output).
pub fn vision_fixtures_dir() -> PathBuf {
    cache_dir().join("fixtures").join("vision")
}

/// The Python venv with the pinned `openai` client and jinja2: `<cache>/venv`.
pub fn venv_dir() -> PathBuf {
    cache_dir().join("venv")
}

/// The venv's own interpreter (what `cargo xtask pyenv` creates).
pub fn venv_python() -> PathBuf {
    venv_dir().join("bin").join("python")
}

/// The interpreter tests run: `SHOAL_PYTHON` (set by `cargo xtask test`), else
/// [`venv_python`].
pub fn python() -> PathBuf {
    python_in(&ProcessEnv)
}

/// [`python`] in `env`.
pub fn python_in(env: &(impl Env + ?Sized)) -> PathBuf {
    env.var("SHOAL_PYTHON")
        .unwrap_or_else(|| cache_dir_in(env).join("venv").join("bin").join("python"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_is_shoal_python_else_the_venv() {
        let env: &[(&str, &str)] = &[("SHOAL_PYTHON", "/usr/bin/python3"), ("HOME", "/h")];
        assert_eq!(python_in(env), PathBuf::from("/usr/bin/python3"));
        let env: &[(&str, &str)] = &[("SHOAL_CACHE_DIR", "/c")];
        assert_eq!(python_in(env), PathBuf::from("/c/venv/bin/python"));
    }
}
