//! Setup step: Mixture-of-Experts GGUF fixtures made by llama.cpp's own tools (issue 46), so
//! llama.cpp's reader defines the layout shoal loads and llama.cpp's graph gives the logits
//! shoal must equal.
//!
//! `scripts/moe_gguf_fixtures.py` (embedded) makes a tiny random-weight Qwen3-MoE, GLM-4.5 and
//! DeepSeek V3 as Hugging Face folders, converts each with the pinned sdist's
//! `convert_hf_to_gguf.py` (f32), quantizes it with `llama-quantize` (Q8_0, Q4_K_M), converts a
//! tiny gpt-oss in OpenAI's released layout twice (its MXFP4 experts through the converter's
//! MXFP4 path, and the same weights as floats) and runs `scripts/llama_logits.cpp` (compiled here
//! against the `libllama.a` that building `llama-quantize` leaves) on each file: every prompt
//! position's logits and the greedy answer to a chat. The converter imports torch, so it runs
//! in its own venv, `<cache>/gguf-convert-venv`, with what llama.cpp's
//! `requirements-convert_hf_to_gguf.txt` names (PyPI's torch wheel pulls NVIDIA's CUDA
//! libraries: 4.7 GB, about a minute to install here). Output: [`kit::dirs::moe_gguf_fixtures_dir`]; a
//! stamp (the scripts' hashes, the sdist, the pins, the tokenizer) makes a second run free.

use crate::llama_cpp;
use crate::paths::cache_dir;
use crate::reference::{sdist, LLAMA_CPP_IN_SDIST, LLAMA_CPP_PYTHON_VERSION};
use crate::util::{command_exists, run, run_quiet, sha256_file, Step};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const SCRIPT: &str = include_str!("../scripts/moe_gguf_fixtures.py");
const LOGITS_CPP: &str = include_str!("../scripts/llama_logits.cpp");

/// What `convert_hf_to_gguf.py` imports, at the versions the sdist's
/// `requirements/requirements-convert_hf_to_gguf.txt` names (numpy, sentencepiece, transformers,
/// protobuf, torch) and what its `gguf-py` needs (tqdm, PyYAML, requests).
const REQUIREMENTS: &[&str] = &[
    "torch==2.11.0",
    "numpy==2.2.6",
    "sentencepiece==0.2.1",
    "transformers==4.57.6",
    "protobuf==4.25.8",
    "tqdm==4.70.1",
    "PyYAML==6.0.4",
    "requests==2.34.2",
];

/// The parts of llama.cpp's sources the step uses: the converter and its gguf-py, and the
/// headers `llama_logits.cpp` includes.
const SOURCES: &[&str] = &[
    "convert_hf_to_gguf.py",
    "conversion",
    "gguf-py",
    "include",
    "ggml/include",
];

/// Makes (or finds made) the fixtures in `<cache>/fixtures/gguf-moe/`.
pub fn moe_gguf_fixtures(step: Step) -> Result<(), String> {
    let dir = kit::dirs::moe_gguf_fixtures_dir();
    let families = dir.with_file_name("families");
    let tokenizer = crate::family_fixtures::smollm2_tokenizer(&step, &families)?;
    let stamp = format!(
        "script={}\nlogits={}\nllama-cpp-python={LLAMA_CPP_PYTHON_VERSION}\nvenv={}\n\
         tokenizer={}\n",
        fnv(SCRIPT),
        fnv(LOGITS_CPP),
        REQUIREMENTS.join(","),
        sha256_file(&tokenizer.join("tokenizer.json"))?,
    );
    let stamp_path = dir.join(".shoal-ok");
    if fs::read_to_string(&stamp_path).ok().as_deref() == Some(stamp.as_str()) {
        step.cached(&dir.display().to_string());
        return Ok(());
    }
    let quantize = llama_cpp::quantize_tool(&step)?;
    let python = convert_venv(&step)?;
    let work = cache_dir().join(format!("gguf-moe-work-{LLAMA_CPP_PYTHON_VERSION}"));
    let src = extract_sources(&step, &work)?;
    let logits = compile_logits(&step, &work, &src)?;
    let script = work.join("moe_gguf_fixtures.py");
    fs::write(&script, SCRIPT).map_err(|e| e.to_string())?;
    step.progress(
        "converting, quantizing and running llama.cpp on the tiny Qwen3-MoE, GLM-4.5, gpt-oss \
         and DeepSeek V3 (about 2 minutes on 2 idle cores)",
    );
    run(Command::new(&python)
        .arg(&script)
        .arg(&dir)
        .arg("--tokenizer")
        .arg(&tokenizer)
        .arg("--llama-cpp")
        .arg(&src)
        .arg("--quantize")
        .arg(&quantize)
        .arg("--logits")
        .arg(&logits)
        .env("PYTHONPATH", src.join("gguf-py")))?;
    fs::write(&stamp_path, stamp).map_err(|e| e.to_string())?;
    let _ = fs::remove_dir_all(&work);
    step.done(&dir.display().to_string());
    Ok(())
}

/// FNV-1a of a script embedded in this binary: it changes when the script does (a stamp, not
/// a checksum anyone verifies).
pub(crate) fn fnv(text: &str) -> String {
    let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{hash:016x}")
}

/// The converter's venv, `<cache>/gguf-convert-venv`, with [`REQUIREMENTS`]; its Python.
pub(crate) fn convert_venv(step: &Step) -> Result<PathBuf, String> {
    let dir = cache_dir().join("gguf-convert-venv");
    let python = dir.join("bin/python");
    let stamp = dir.join(".shoal-requirements");
    let wanted = REQUIREMENTS.join("\n");
    if python.exists() && fs::read_to_string(&stamp).ok().as_deref() == Some(wanted.as_str()) {
        return Ok(python);
    }
    if !command_exists("python3") {
        return Err("python3 (and python3-venv) is needed for llama.cpp's converter".into());
    }
    if !python.exists() {
        let _ = fs::remove_dir_all(&dir);
        run(Command::new("python3").arg("-m").arg("venv").arg(&dir))?;
    }
    step.progress("installing llama.cpp's converter requirements (torch: 4.7 GB, about 1 min)");
    run(Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(REQUIREMENTS))?;
    fs::write(&stamp, wanted).map_err(|e| e.to_string())?;
    Ok(python)
}

/// Extracts [`SOURCES`] from the sdist into `<work>/llama.cpp`.
pub(crate) fn extract_sources(step: &Step, work: &Path) -> Result<PathBuf, String> {
    let archive = sdist(step)?;
    let src = work.join("llama.cpp");
    let _ = fs::remove_dir_all(&src);
    fs::create_dir_all(&src).map_err(|e| e.to_string())?;
    let depth = LLAMA_CPP_IN_SDIST.split('/').count();
    run_quiet(
        Command::new("tar")
            .arg("xzf")
            .arg(&archive)
            .arg("-C")
            .arg(&src)
            .arg(format!("--strip-components={depth}"))
            .args(SOURCES.iter().map(|p| format!("{LLAMA_CPP_IN_SDIST}/{p}"))),
    )?;
    Ok(src)
}

/// Compiles `llama_logits.cpp` against the static libraries of the `llama-quantize` build.
fn compile_logits(step: &Step, work: &Path, src: &Path) -> Result<PathBuf, String> {
    step.progress("compiling llama_logits against libllama");
    let cpp = work.join("llama_logits.cpp");
    fs::write(&cpp, LOGITS_CPP).map_err(|e| e.to_string())?;
    let build = llama_cpp::dir().join("build");
    let bin = work.join("llama_logits");
    run_quiet(
        Command::new("c++")
            .args(["-O2", "-std=c++17"])
            .arg(format!("-I{}", src.join("include").display()))
            .arg(format!("-I{}", src.join("ggml/include").display()))
            .arg(&cpp)
            .arg(build.join("src/libllama.a"))
            .arg(build.join("ggml/src/libggml.a"))
            .arg(build.join("ggml/src/libggml-cpu.a"))
            .arg(build.join("ggml/src/libggml-base.a"))
            .args(["-fopenmp", "-lpthread", "-ldl", "-o"])
            .arg(&bin),
    )?;
    Ok(bin)
}
