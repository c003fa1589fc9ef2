//! Setup step: reference fixtures of every model family shoal runs (Qwen3-MoE, DeepSeek V3,
//! gpt-oss, GLM-4 MoE, MiniMax, Gemma 3), made by mlx-lm itself, so the family tests compare
//! shoal's logits with the reference implementation's without downloading any model.
//!
//! `scripts/family_fixtures.py` (embedded here) runs in the pinned mlx-lm venv
//! ([`crate::mlx_lm_venv`]): for each family a tiny model with every parameter randomized
//! (seeded), written in the Hugging Face layout, then quantized as `mlx_lm.convert` does, each
//! folder with mlx-lm's logits on it. The folders:
//!
//! ```text
//! <cache>/fixtures/families/<family>/<layout>/    (kit::dirs::family_fixture_dir)
//!     config.json  model.safetensors  [model.safetensors.index.json]
//!     tokenizer.json  tokenizer_config.json          SmolLM2's, so a node can serve it
//!     reference.safetensors  reference.json          mlx-lm's logits on this folder
//! <cache>/fixtures/families/manifest.json            {family: [layouts]}
//! ```
//!
//! `hf` is the Hugging Face layout (per-expert tensors, `kv_b_proj`, gpt-oss's `*_blocks`),
//! `q4`/`q8` affine 4/8-bit with group 64, `mxfp4` (group 32) for qwen3_moe and gpt_oss,
//! `mxfp8` (group 32) for qwen3_moe. The tokenizer comes from the SmolLM2 fixture, exported by
//! the inference crate's `export_hf` example (the one exporter). A stamp (the script's hash, the
//! versions, the tokenizer's hash) makes a second run free. The same step then makes a model per
//! tool-call dialect on these architectures ([`crate::dialect_fixtures`]).

use crate::mlx_lm_venv::mlx_lm_venv;
use crate::paths::{cache_dir, default_model, target_dir};
use crate::util::{run, sha256_file, Step};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The script that makes the fixtures (run by the venv's Python).
const SCRIPT: &str = include_str!("../scripts/family_fixtures.py");
/// The tokenizer files copied into every fixture folder.
const TOKENIZER_FILES: [&str; 2] = ["tokenizer.json", "tokenizer_config.json"];

/// Makes (or finds made) every family's fixtures under `<cache>/fixtures/families/`.
pub fn family_fixtures(step: Step) -> Result<(), String> {
    let root = families_root();
    fs::create_dir_all(&root).map_err(|e| format!("cannot create {}: {e}", root.display()))?;
    let tokenizer = smollm2_tokenizer(&step, &root)?;
    let script = root.join("family_fixtures.py");
    fs::write(&script, SCRIPT).map_err(|e| format!("cannot write {}: {e}", script.display()))?;
    let stamp = format!(
        "script_sha256={}\nmlx={}\nmlx_lm={}\ntokenizer_sha256={}\n",
        sha256_file(&script)?,
        crate::mlx_build::MLX_VERSION,
        crate::mlx_lm_venv::MLX_LM_VERSION,
        sha256_file(&tokenizer.join(TOKENIZER_FILES[0]))?,
    );
    let stamp_path = root.join(".shoal-ok");
    if fs::read_to_string(&stamp_path).ok().as_deref() == Some(stamp.as_str())
        && all_folders_there(&root)
    {
        step.cached(&root.display().to_string());
        let (python, _) = mlx_lm_venv()?;
        return crate::dialect_fixtures::dialect_fixtures(&step, &root, &tokenizer, &python);
    }
    let _ = fs::remove_file(&stamp_path);
    step.progress("the pinned mlx-lm venv");
    let (python, _) = mlx_lm_venv()?;
    step.progress(
        "building each family with mlx-lm (measured on 2 cores: 79 s; 6 minutes on a fresh \
         machine, most of it installing mlx-lm)",
    );
    run_fixture_script(&python, &script, &root, &tokenizer, &[])?;
    if !all_folders_there(&root) {
        return Err(format!(
            "{}: the script finished but manifest.json names folders without references",
            root.display()
        ));
    }
    fs::write(&stamp_path, stamp).map_err(|e| format!("cannot write the stamp: {e}"))?;
    step.done(&root.display().to_string());
    // The models that speak each tool-call dialect, on these families' architectures.
    crate::dialect_fixtures::dialect_fixtures(&step, &root, &tokenizer, &python)
}

/// Runs a fixture script, `python script root --tokenizer tokenizer extra...`, its output
/// shown; a failure names the script to run by hand.
pub(crate) fn run_fixture_script(
    python: &Path,
    script: &Path,
    root: &Path,
    tokenizer: &Path,
    extra: &[&Path],
) -> Result<(), String> {
    run(Command::new(python)
        .arg(script)
        .arg(root)
        .arg("--tokenizer")
        .arg(tokenizer)
        .args(extra))
    .map_err(|e| {
        format!(
            "{e}\n(the script is {}; run it by hand to see more)",
            script.display()
        )
    })
}

/// `<cache>/fixtures/families`.
fn families_root() -> PathBuf {
    kit::dirs::family_fixture_dir("x", "y")
        .parent()
        .and_then(Path::parent)
        .expect("a fixture folder is <root>/<family>/<layout>")
        .to_path_buf()
}

/// Whether `manifest.json` exists and every folder it names holds its reference.
fn all_folders_there(root: &Path) -> bool {
    let Ok(text) = fs::read_to_string(root.join("manifest.json")) else {
        return false;
    };
    let Ok(serde_json::Value::Object(families)) = serde_json::from_str(&text) else {
        return false;
    };
    !families.is_empty()
        && families.iter().all(|(family, layouts)| {
            layouts.as_array().is_some_and(|layouts| {
                layouts.iter().all(|layout| {
                    layout.as_str().is_some_and(|layout| {
                        root.join(family)
                            .join(layout)
                            .join("reference.safetensors")
                            .exists()
                    })
                })
            })
        })
}

/// A folder with SmolLM2's `tokenizer.json` and `tokenizer_config.json` (chat template
/// included): `<root>/.tokenizer`, copied from the benchmark's export when there is one, else
/// exported from the GGUF fixture by the inference crate's `export_hf` example (built here).
pub(crate) fn smollm2_tokenizer(step: &Step, root: &Path) -> Result<PathBuf, String> {
    let dir = root.join(".tokenizer");
    if TOKENIZER_FILES.iter().all(|f| dir.join(f).exists()) {
        return Ok(dir);
    }
    let bench_export = cache_dir().join("bench").join("smollm2-f32");
    let (source, scratch) = if TOKENIZER_FILES
        .iter()
        .all(|f| bench_export.join(f).exists())
    {
        (bench_export, None)
    } else {
        step.progress("building the exporter (inference's export_hf example)");
        run(crate::cargo().args(["build", "--package", "inference", "--example", "export_hf"]))?;
        let export = root.join(".smollm2-export");
        let _ = fs::remove_dir_all(&export);
        step.progress("exporting SmolLM2's tokenizer from the GGUF fixture");
        run(Command::new(
            target_dir()
                .join("debug")
                .join("examples")
                .join("export_hf"),
        )
        .arg(default_model())
        .arg(&export)
        .arg("bf16"))?;
        (export.clone(), Some(export))
    };
    let partial = root.join(".tokenizer.partial");
    let _ = fs::remove_dir_all(&partial);
    fs::create_dir_all(&partial).map_err(|e| format!("{}: {e}", partial.display()))?;
    for file in TOKENIZER_FILES {
        fs::copy(source.join(file), partial.join(file))
            .map_err(|e| format!("copying {}: {e}", source.join(file).display()))?;
    }
    let _ = fs::remove_dir_all(&dir);
    fs::rename(&partial, &dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if let Some(scratch) = scratch {
        let _ = fs::remove_dir_all(scratch);
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_folders_live_under_the_cache() {
        assert_eq!(
            families_root(),
            cache_dir().join("fixtures").join("families")
        );
        assert!(SCRIPT.contains("def build_family"));
    }

    #[test]
    fn a_manifest_counts_only_when_every_reference_is_there() {
        let root = std::env::temp_dir().join(format!("shoal-ff-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("a/hf")).unwrap();
        assert!(!all_folders_there(&root));
        fs::write(root.join("manifest.json"), r#"{"a": ["hf", "q4"]}"#).unwrap();
        fs::write(root.join("a/hf/reference.safetensors"), "").unwrap();
        assert!(!all_folders_there(&root));
        fs::create_dir_all(root.join("a/q4")).unwrap();
        fs::write(root.join("a/q4/reference.safetensors"), "").unwrap();
        assert!(all_folders_there(&root));
        fs::remove_dir_all(&root).unwrap();
    }
}
