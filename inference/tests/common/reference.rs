//! mlx-lm's logits of a family fixture folder (`reference.safetensors`, written by
//! `xtask/scripts/family_fixtures.py`): what the families' tests and the tensor-parallel
//! rings compare shoal's logits with.

use super::host;
use mlx_rs::Array;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// mlx-lm's logits of one fixture folder.
pub struct Reference {
    pub prompt: Vec<u32>,
    /// `[prompt, vocab]`.
    pub prefill: Vec<Vec<f32>>,
    pub decode_tokens: Vec<u32>,
    /// `[decode, vocab]`: the logits after each decode token.
    pub decode: Vec<Vec<f32>>,
}

/// The rows of a `[.., vocab]` array of logits.
pub fn rows_of(a: &Array) -> Vec<Vec<f32>> {
    let vocab = *a.shape().last().unwrap() as usize;
    host(a).chunks(vocab).map(<[f32]>::to_vec).collect()
}

fn ids_of(a: &Array) -> Vec<u32> {
    let a = a.as_dtype(mlx_rs::Dtype::Int32).unwrap();
    a.eval().unwrap();
    a.as_slice::<i32>().iter().map(|&t| t as u32).collect()
}

impl Reference {
    /// The reference of fixture folder `dir`.
    pub fn read(dir: &Path) -> Reference {
        let path = dir.join("reference.safetensors");
        let arrays: HashMap<String, Array> =
            Array::load_safetensors(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let get = |k: &str| {
            arrays
                .get(k)
                .unwrap_or_else(|| panic!("{} has no `{k}`", path.display()))
        };
        Reference {
            prompt: ids_of(get("prompt")),
            prefill: rows_of(get("prefill_logits")),
            decode_tokens: ids_of(get("decode_tokens")),
            decode: rows_of(get("decode_logits")),
        }
    }
}

/// The fixture folder of `family` in `layout`; setup must have made it.
pub fn fixture(family: &str, layout: &str) -> PathBuf {
    let dir = kit::dirs::family_fixture_dir(family, layout);
    assert!(
        dir.join("reference.safetensors").exists(),
        "{} is missing: run `cargo xtask setup`",
        dir.display()
    );
    dir
}

/// The configuration shoal reads from the `config.json` of folder `dir`.
pub fn config_of(dir: &std::path::Path) -> inference::config::ModelConfig {
    let text = std::fs::read_to_string(dir.join("config.json"))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    inference::config::ModelConfig::from_hf_json(&json)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// The largest difference between rows of logits.
pub fn worst(want: &[Vec<f32>], got: &[Vec<f32>]) -> f32 {
    assert_eq!(want.len(), got.len());
    want.iter()
        .zip(got)
        .map(|(w, g)| super::max_abs_diff(w, g))
        .fold(0.0, f32::max)
}
