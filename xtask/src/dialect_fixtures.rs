//! Part of the family-fixture setup step: a model per tool-call dialect (gpt-oss harmony,
//! Qwen3-Coder, GLM-4.7, DeepSeek V3.1, Kimi K2, MiniMax M2) that writes that dialect's calls
//! and thoughts in its own token stream, for `tests/family_dialects.rs` to drive through a
//! real node and every official client.
//!
//! `scripts/dialect_fixtures.py` (embedded here, next to `family_fixtures.py`, whose configs
//! it reuses) builds each with the family's special tokens as its real tokenizer declares them
//! and its real chat template (the reference data's `templates/`): on its family fixture's
//! architecture with random weights plus a bigram path, or, for the XML dialects (Qwen3-Coder,
//! MiniMax M2), whose calls a bigram cannot write, a sliding-window gpt-oss trained at setup
//! (seeded, about 10 s each); then it checks with mlx-lm that greedy decoding writes each
//! route. About 30–40 s and 250 MB; a stamp makes a second run free.
//!
//! ```text
//! <cache>/fixtures/families/dialects/<dialect>/    (kit::dirs::family_fixture_dir("dialects", d))
//!     config.json  model.safetensors  tokenizer.json  tokenizer_config.json
//!     routes.json                                  what the model writes, after which prompt
//! <cache>/fixtures/families/dialects/manifest.json [dialects]
//! ```

use crate::util::{sha256_file, Step};
use std::fs;
use std::path::{Path, PathBuf};

/// The script that makes the dialect models (run by the mlx-lm venv's Python).
const SCRIPT: &str = include_str!("../scripts/dialect_fixtures.py");

/// Makes (or finds made) every dialect's model under `<families>/dialects/`; `families` is
/// the family fixtures' root (holding `family_fixtures.py`, which the script imports) and
/// `tokenizer` the SmolLM2 tokenizer folder.
pub fn dialect_fixtures(
    step: &Step,
    families: &Path,
    tokenizer: &Path,
    python: &Path,
) -> Result<(), String> {
    let root = families.join("dialects");
    fs::create_dir_all(&root).map_err(|e| format!("cannot create {}: {e}", root.display()))?;
    let script = families.join("dialect_fixtures.py");
    fs::write(&script, SCRIPT).map_err(|e| format!("cannot write {}: {e}", script.display()))?;
    let templates = crate::reference::reference_dir().join("templates");
    let stamp = format!(
        "script_sha256={}\nfamilies_sha256={}\ntokenizer_sha256={}\ntemplates={}\nmlx={}\nmlx_lm={}\n",
        sha256_file(&script)?,
        sha256_file(&families.join("family_fixtures.py"))?,
        sha256_file(&tokenizer.join("tokenizer.json"))?,
        templates.display(),
        crate::mlx_build::MLX_VERSION,
        crate::mlx_lm_venv::MLX_LM_VERSION,
    );
    let stamp_path = root.join(".shoal-ok");
    if fs::read_to_string(&stamp_path).ok().as_deref() == Some(stamp.as_str()) && all_there(&root) {
        step.cached(&root.display().to_string());
        return Ok(());
    }
    let _ = fs::remove_file(&stamp_path);
    step.progress(
        "a model per tool-call dialect (measured on 2 cores: 46 s quiet, 7 minutes beside a build)",
    );
    crate::family_fixtures::run_fixture_script(
        python,
        &script,
        &root,
        tokenizer,
        &[Path::new("--templates"), &templates],
    )?;
    if !all_there(&root) {
        return Err(format!(
            "{}: the script finished but manifest.json names folders without routes",
            root.display()
        ));
    }
    fs::write(&stamp_path, stamp).map_err(|e| format!("cannot write the stamp: {e}"))?;
    step.done(&root.display().to_string());
    Ok(())
}

/// Whether `manifest.json` names dialects and each folder holds its model and routes.
fn all_there(root: &Path) -> bool {
    let Ok(text) = fs::read_to_string(root.join("manifest.json")) else {
        return false;
    };
    let Ok(names) = serde_json::from_str::<Vec<String>>(&text) else {
        return false;
    };
    !names.is_empty()
        && names.iter().all(|name| {
            let folder: PathBuf = root.join(name);
            ["routes.json", "model.safetensors", "tokenizer_config.json"]
                .iter()
                .all(|f| folder.join(f).exists())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_counts_only_when_every_folder_is_whole() {
        let root = std::env::temp_dir().join(format!("shoal-df-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("glm")).unwrap();
        assert!(!all_there(&root));
        fs::write(root.join("manifest.json"), r#"["glm"]"#).unwrap();
        assert!(!all_there(&root));
        for f in ["routes.json", "model.safetensors", "tokenizer_config.json"] {
            fs::write(root.join("glm").join(f), "").unwrap();
        }
        assert!(all_there(&root));
        fs::remove_dir_all(&root).unwrap();
        assert!(SCRIPT.contains("import family_fixtures"));
    }
}
