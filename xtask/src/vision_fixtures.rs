//! Setup step: reference fixtures of the vision models (issue 47), made by mlx-vlm itself, so
//! the vision tests compare shoal's logits and answers with the reference implementation's
//! without downloading any model.
//!
//! `scripts/vision_fixtures.py` (embedded here) runs in the pinned mlx-vlm venv
//! ([`crate::mlx_vlm_venv`]). The folders:
//!
//! ```text
//! <cache>/fixtures/vision/images/                 square.png (56×56), wide.png (96×40 RGBA),
//!                                                 checker.jpg (80×80): drawn by the script
//! <cache>/fixtures/vision/gemma3/<layout>/        hf, f32, q4 (mlx_vlm.convert's 4-bit)
//!     config.json (vision_config, text_config)  model.safetensors  preprocessor_config.json
//!     processor_config.json  tokenizer.json  tokenizer_config.json   SmolLM2's + image tokens
//!     reference.safetensors  reference.json     mlx-vlm's logits, pixels, image features,
//!                                               greedy answers per image
//! <cache>/fixtures/vision/qwen3_5/<layout>/       hf, f32, q4: a Qwen3.5 vision model (Qwen3-VL's
//!     tower and merger, hybrid text decoder with M-RoPE), the same files, and in
//!     reference.safetensors also the grid and mlx-vlm's M-RoPE position ids
//! <cache>/fixtures/vision/qwen3_5/big.png         200×150, past the fixture's pixel budget
//! ```
//!
//! A stamp (the script's hash, the versions, the tokenizer's hash) makes a second run free.

use crate::mlx_vlm_venv::{mlx_vlm_venv, MLX_VLM_VERSION};
use crate::paths::cache_dir;
use crate::util::{sha256_file, Step};
use std::fs;
use std::path::{Path, PathBuf};

/// The script that makes the fixtures (run by the venv's Python).
const SCRIPT: &str = include_str!("../scripts/vision_fixtures.py");
/// Its Qwen3.5 half, imported from beside it.
const QWEN3_5_SCRIPT: &str = include_str!("../scripts/vision_fixtures_qwen3_5.py");
/// The folders the script makes, each with its reference.
const FOLDERS: [&str; 6] = [
    "gemma3/hf",
    "gemma3/f32",
    "gemma3/q4",
    "qwen3_5/hf",
    "qwen3_5/f32",
    "qwen3_5/q4",
];

/// `<cache>/fixtures/vision` (`kit::dirs::vision_fixtures_dir`, where the tests read it).
pub(crate) fn vision_root() -> PathBuf {
    kit::dirs::vision_fixtures_dir()
}

/// Makes (or finds made) the vision fixtures under [`vision_root`]. Needs SmolLM2's tokenizer
/// folder, which the family fixtures' step makes first.
pub fn vision_fixtures(step: Step) -> Result<(), String> {
    let root = vision_root();
    fs::create_dir_all(&root).map_err(|e| format!("cannot create {}: {e}", root.display()))?;
    let tokenizer = crate::family_fixtures::smollm2_tokenizer(&step, &families_root())?;
    let script = root.join("vision_fixtures.py");
    fs::write(&script, SCRIPT).map_err(|e| format!("cannot write {}: {e}", script.display()))?;
    let qwen = root.join("vision_fixtures_qwen3_5.py");
    fs::write(&qwen, QWEN3_5_SCRIPT)
        .map_err(|e| format!("cannot write {}: {e}", qwen.display()))?;
    let stamp = format!(
        "script_sha256={}\nqwen3_5_script_sha256={}\nmlx={}\nmlx_vlm={MLX_VLM_VERSION}\n\
         tokenizer_sha256={}\n",
        sha256_file(&script)?,
        sha256_file(&qwen)?,
        crate::mlx_build::MLX_VERSION,
        sha256_file(&tokenizer.join("tokenizer.json"))?,
    );
    let stamp_path = root.join(".shoal-ok");
    if fs::read_to_string(&stamp_path).ok().as_deref() == Some(stamp.as_str())
        && all_folders_there(&root)
    {
        step.cached(&root.display().to_string());
        return Ok(());
    }
    let _ = fs::remove_file(&stamp_path);
    step.progress(
        "the pinned mlx-vlm venv (measured on 2 cores: 2 min 40 s on a fresh machine, most of \
         it downloading wheels)",
    );
    let python = mlx_vlm_venv()?;
    step.progress(
        "building the vision models with mlx-vlm (measured on 2 cores: 18 to 46 s for \
         Gemma 3's and Qwen3.5's)",
    );
    crate::family_fixtures::run_fixture_script(&python, &script, &root, &tokenizer, &[])?;
    if !all_folders_there(&root) {
        return Err(format!(
            "{}: the script finished but a folder lacks its reference",
            root.display()
        ));
    }
    fs::write(&stamp_path, stamp).map_err(|e| format!("cannot write the stamp: {e}"))?;
    step.done(&root.display().to_string());
    Ok(())
}

/// `<cache>/fixtures/families`, where SmolLM2's tokenizer folder lives.
fn families_root() -> PathBuf {
    cache_dir().join("fixtures").join("families")
}

/// Whether every folder holds its reference and the images are there.
fn all_folders_there(root: &Path) -> bool {
    FOLDERS
        .iter()
        .all(|f| root.join(f).join("reference.safetensors").exists())
        && ["square.png", "wide.png", "checker.jpg"]
            .iter()
            .all(|i| root.join("images").join(i).exists())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_folders_live_under_the_cache_and_count_only_with_references() {
        assert_eq!(vision_root(), cache_dir().join("fixtures").join("vision"));
        assert!(SCRIPT.contains("def build_gemma3"));
        assert!(QWEN3_5_SCRIPT.contains("def build_qwen3_5"));
        let root = std::env::temp_dir().join(format!("shoal-vf-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        for folder in FOLDERS {
            fs::create_dir_all(root.join(folder)).unwrap();
            fs::write(root.join(folder).join("reference.safetensors"), "").unwrap();
        }
        assert!(!all_folders_there(&root), "the images are missing");
        fs::create_dir_all(root.join("images")).unwrap();
        for image in ["square.png", "wide.png", "checker.jpg"] {
            fs::write(root.join("images").join(image), "").unwrap();
        }
        assert!(all_folders_there(&root));
        fs::remove_file(root.join("gemma3/q4/reference.safetensors")).unwrap();
        assert!(!all_folders_there(&root));
        fs::remove_dir_all(&root).unwrap();
    }
}
