//! Reference data for the tokenizer and chat-template tests, fetched at setup time and never
//! committed: the `llama-cpp-python` source distribution on PyPI vendors llama.cpp (MIT), whose
//! `models/` folder holds real Hugging Face chat templates (`templates/*.jinja`: Qwen2.5,
//! Llama 3.x, ...) and vocab-only GGUFs with tokenizer test vectors (`ggml-vocab-NAME.gguf`
//! plus `.gguf.inp`, the inputs, and `.gguf.out`, the token ids llama.cpp expects).
//!
//! Only those files are extracted, into `<cache>/reference/llama.cpp-<version>/`
//! (`templates/`, `vocab/`, `LICENSE`). The sdist stays in `<cache>/downloads`, where
//! `cargo xtask bench inference --with-llama-cpp` finds llama.cpp's sources to build.

use crate::paths::cache_dir;
use crate::pypi::pip_download_sdist;
use crate::util::{run, Step};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The pinned llama-cpp-python release (it vendors llama.cpp at a fixed commit).
pub const LLAMA_CPP_PYTHON_VERSION: &str = "0.3.36";
const SDIST: &str = "llama_cpp_python-0.3.36.tar.gz";
const SDIST_SHA256: &str = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e";
/// Where llama.cpp lives inside the sdist.
pub const LLAMA_CPP_IN_SDIST: &str = "llama_cpp_python-0.3.36/vendor/llama.cpp";

/// Vocabularies that come with test vectors (`.inp`/`.out`) in this llama.cpp.
const VOCABS: &[&str] = &[
    "bert-bge",
    "command-r",
    "deepseek-coder",
    "deepseek-llm",
    "falcon",
    "gemma-4",
    "gpt-2",
    "llama-bpe",
    "llama-spm",
    "mpt",
    "phi-3",
    "qwen2",
    "qwen35",
    "refact",
    "starcoder",
];

/// Templates the tests render; their absence means the sdist is not what was pinned.
const REQUIRED_TEMPLATES: &[&str] = &[
    "Qwen-Qwen2.5-7B-Instruct.jinja",
    "meta-llama-Llama-3.1-8B-Instruct.jinja",
    "meta-llama-Llama-3.2-3B-Instruct.jinja",
    "meta-llama-Llama-3.3-70B-Instruct.jinja",
    // The tool-calling tests' templates (inference/tests/tool_chat_templates.rs).
    "Qwen-Qwen3-0.6B.jinja",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "Mistral-Small-3.2-24B-Instruct-2506.jinja",
];

/// The extracted reference folder (the tests compute the same path from the cache root).
pub fn reference_dir() -> PathBuf {
    cache_dir()
        .join("reference")
        .join(format!("llama.cpp-{LLAMA_CPP_PYTHON_VERSION}"))
}

/// The downloaded sdist, fetched (sha256 checked) if absent.
pub fn sdist(step: &Step) -> Result<PathBuf, String> {
    pip_download_sdist(
        &format!("llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"),
        SDIST,
        SDIST_SHA256,
        &cache_dir().join("downloads"),
        step,
    )
}

/// Setup step: download the sdist and extract the templates and vocabularies.
pub fn reference_data(step: Step) -> Result<(), String> {
    let dest = reference_dir();
    let stamp = dest.join(".shoal-ok");
    if fs::read_to_string(&stamp).ok().as_deref() == Some(SDIST_SHA256) {
        step.cached(&dest.display().to_string());
        return Ok(());
    }
    let archive = sdist(&step)?;
    step.progress("extracting templates and vocabularies");
    let unpack = dest.with_extension("unpack");
    let _ = fs::remove_dir_all(&unpack);
    fs::create_dir_all(&unpack).map_err(|e| e.to_string())?;
    let models = format!("{LLAMA_CPP_IN_SDIST}/models");
    let mut tar = Command::new("tar");
    tar.arg("xzf")
        .arg(&archive)
        .arg("-C")
        .arg(&unpack)
        .arg("--wildcards")
        .arg(format!("{LLAMA_CPP_IN_SDIST}/LICENSE"))
        .arg(format!("{models}/templates/*.jinja"));
    for vocab in VOCABS {
        for ext in ["gguf", "gguf.inp", "gguf.out"] {
            tar.arg(format!("{models}/ggml-vocab-{vocab}.{ext}"));
        }
    }
    run(&mut tar)?;
    let root = unpack.join(LLAMA_CPP_IN_SDIST);
    check_extracted(&root.join("models"))?;
    let _ = fs::remove_dir_all(&dest);
    fs::create_dir_all(dest.join("vocab")).map_err(|e| e.to_string())?;
    let rename = |from: PathBuf, to: PathBuf| {
        fs::rename(&from, &to).map_err(|e| format!("{} -> {}: {e}", from.display(), to.display()))
    };
    rename(root.join("LICENSE"), dest.join("LICENSE"))?;
    rename(root.join("models/templates"), dest.join("templates"))?;
    for entry in fs::read_dir(root.join("models")).map_err(|e| e.to_string())? {
        let entry = entry.map_err(|e| e.to_string())?;
        if entry.file_type().is_ok_and(|t| t.is_file()) {
            rename(entry.path(), dest.join("vocab").join(entry.file_name()))?;
        }
    }
    let _ = fs::remove_dir_all(&unpack);
    fs::write(&stamp, SDIST_SHA256).map_err(|e| e.to_string())?;
    step.done(&format!(
        "{} from llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}",
        dest.display()
    ));
    Ok(())
}

fn check_extracted(models: &Path) -> Result<(), String> {
    let mut missing: Vec<String> = REQUIRED_TEMPLATES
        .iter()
        .map(|t| format!("templates/{t}"))
        .chain(VOCABS.iter().flat_map(|v| {
            ["gguf", "gguf.inp", "gguf.out"].map(|ext| format!("ggml-vocab-{v}.{ext}"))
        }))
        .filter(|f| !models.join(f).is_file())
        .collect();
    missing.truncate(5);
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the llama-cpp-python sdist lacks {} (and maybe more) under {}",
            missing.join(", "),
            models.display()
        ))
    }
}
