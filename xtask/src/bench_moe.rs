//! The Mixture-of-Experts models `cargo xtask bench concurrency --moe` (and `--moe-hybrid`)
//! serves, of realistic proportions scaled to one small machine
//! (`xtask/scripts/moe_bench_model.py`): a Qwen3-MoE (24 layers of width 1024, 64 experts of
//! which 8 run per token, about 1.9 B parameters) and a Qwen3.5-MoE (the same width and depth,
//! three Gated DeltaNet layers to one full-attention layer, 128 experts of which 8 run plus a
//! shared one, about 1.4 B parameters), 4-bit with routers at 8 bits, each made once by the
//! pinned mlx-lm with random weights into `<cache>/bench/`, and what each server's process
//! holds once loaded.

use crate::mlx_lm_venv::mlx_lm_venv;
use crate::paths::cache_dir;
use crate::util::run;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The generator, embedded so the bench needs no checkout path.
const SCRIPT: &str = include_str!("../scripts/moe_bench_model.py");

/// `mx.gather_qmm` of mlx-lm 0.32.2 passes `global_scale=None`, which MLX 0.32.2 (the one
/// shoal links) does not take: every quantized MoE fails in `mlx_lm.server`. A
/// `sitecustomize` on the server's `PYTHONPATH` drops the argument when it is `None`.
const SITECUSTOMIZE: &str = r#"
import mlx.core as _mx
_gather_qmm = _mx.gather_qmm
def _without_global_scale(*args, global_scale=None, **kwargs):
    if global_scale is not None:
        kwargs["global_scale"] = global_scale
    return _gather_qmm(*args, **kwargs)
_mx.gather_qmm = _without_global_scale
"#;

/// Which bench model: the script's shape argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MoeShape {
    /// Qwen3-30B-A3B's proportions (attention on every layer).
    Qwen3Moe,
    /// Qwen3.5-35B-A3B's pattern (Gated DeltaNet layers, a full-attention layer every fourth).
    Qwen35Moe,
}

impl MoeShape {
    /// The script's name for the shape (mlx-lm's `model_type`).
    fn name(self) -> &'static str {
        match self {
            MoeShape::Qwen3Moe => "qwen3_moe",
            MoeShape::Qwen35Moe => "qwen3_5_moe",
        }
    }

    /// The folder under `<cache>/bench`.
    fn folder(self) -> &'static str {
        match self {
            MoeShape::Qwen3Moe => "qwen3-moe-bench-4bit",
            MoeShape::Qwen35Moe => "qwen3.5-moe-bench-4bit",
        }
    }

    /// What the benchmark's table says it ran.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            MoeShape::Qwen3Moe => {
                "a Qwen3-MoE of 1.9 B parameters (64 experts, 8 active) at 4 bits"
            }
            MoeShape::Qwen35Moe => {
                "a Qwen3.5-MoE of 1.4 B parameters (18 Gated DeltaNet and 6 attention layers, \
                 128 experts, 8 active, one shared) at 4 bits"
            }
        }
    }
}

/// The bench model's folder, made on first use (a few minutes).
pub(crate) fn moe_bench_model(shape: MoeShape) -> Result<PathBuf, String> {
    let bench = cache_dir().join("bench");
    let folder = bench.join(shape.folder());
    let stamp = folder.join(".script");
    let made_by = format!("{SCRIPT}\n# shape: {}", shape.name());
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(made_by.as_str()) {
        return Ok(folder);
    }
    let tokenizer = kit::dirs::family_fixture_dir("x", "y")
        .parent()
        .and_then(Path::parent)
        .map(|root| root.join(".tokenizer"))
        .filter(|t| t.join("tokenizer.json").exists())
        .ok_or(
            "the SmolLM2 tokenizer of the family fixtures is missing: run `cargo xtask setup`",
        )?;
    let (python, _) = mlx_lm_venv()?;
    std::fs::create_dir_all(&bench).map_err(|e| e.to_string())?;
    let script = bench.join("moe_bench_model.py");
    std::fs::write(&script, SCRIPT).map_err(|e| e.to_string())?;
    eprintln!(
        "bench: making the {} bench model with mlx-lm (a few minutes) ...",
        shape.name()
    );
    run(Command::new(&python)
        .arg(&script)
        .arg(&folder)
        .arg(&tokenizer)
        .arg(shape.name()))?;
    std::fs::write(&stamp, made_by).map_err(|e| e.to_string())?;
    Ok(folder)
}

/// A folder holding [`SITECUSTOMIZE`], for `mlx_lm.server`'s `PYTHONPATH`.
pub(crate) fn mlx_lm_patch_dir() -> Result<PathBuf, String> {
    let dir = cache_dir().join("bench").join("mlx-lm-patch");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("sitecustomize.py"), SITECUSTOMIZE).map_err(|e| e.to_string())?;
    Ok(dir)
}

/// Bytes of the folder's weight files.
pub(crate) fn weight_bytes(folder: &Path) -> u64 {
    std::fs::read_dir(folder)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}

/// Resident memory of process `pid` (`VmRSS`), in bytes.
pub(crate) fn resident_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Whether process `pid` is a shoal runner (`shoal runner ...`).
pub(crate) fn is_runner(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| c.split(|&b| b == 0).any(|arg| arg == b"runner"))
        .unwrap_or(false)
}
