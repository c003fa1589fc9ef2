//! The accelerators a machine has: NVIDIA GPUs (asked of `nvidia-smi`, else named by the
//! driver's files under `/proc/driver/nvidia/gpus`) and, on macOS, the Apple GPU that shares
//! the machine's memory.
//!
//! Whether a node may *use* a GPU also depends on the MLX it linked (a CPU build cannot run on
//! CUDA): [`backends`] combines the two, so a Linux box with a GPU but a CPU build of MLX says
//! `mlx_cpu` only and is never given work it cannot do on the GPU.

use placement::ComputeBackend;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// One accelerator, as the profile record publishes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    /// `nvidia` or `apple`.
    pub vendor: String,
    /// The device's name (`NVIDIA H200`, `Apple M2 Max`).
    pub name: String,
    /// Device memory, bytes (for Apple, what MLX may wire of the shared memory).
    pub memory_total: u64,
    /// Free device memory, bytes (rounded to 64 MiB so small changes do not churn the state);
    /// 0 when the driver does not say.
    pub memory_free: u64,
}

/// The MLX build a binary linked, as `cargo xtask setup` prepared it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MlxBuild {
    /// CPU only (the `mlx-cpu` wheel).
    Cpu,
    /// CUDA (an `mlx-cuda-*` wheel).
    Cuda,
    /// Metal (macOS).
    Metal,
}

impl MlxBuild {
    /// Parses the build's name as setup writes it (`cpu`, `cuda`, `cuda-12`, `metal`).
    pub fn parse(name: &str) -> Option<MlxBuild> {
        match name.trim() {
            "cpu" | "" => Some(MlxBuild::Cpu),
            n if n == "cuda" || n.starts_with("cuda-") => Some(MlxBuild::Cuda),
            "metal" => Some(MlxBuild::Metal),
            _ => None,
        }
    }
}

/// The backends a node offers, best first: the GPU backend when the machine has that GPU *and*
/// the linked MLX can drive it, then the CPU (always).
pub fn backends(build: MlxBuild, gpus: &[Gpu]) -> Vec<ComputeBackend> {
    let has = |vendor: &str| gpus.iter().any(|g| g.vendor == vendor);
    let mut out = Vec::new();
    match build {
        MlxBuild::Cuda if has("nvidia") => out.push(ComputeBackend::MlxCuda),
        MlxBuild::Metal if has("apple") || cfg!(target_os = "macos") => {
            out.push(ComputeBackend::MlxMetal)
        }
        _ => {}
    }
    out.push(ComputeBackend::MlxCpu);
    out
}

/// Where detection looks; tests point it at a fake `nvidia-smi` and a fake driver tree.
#[derive(Debug, Clone)]
pub struct Probe {
    /// The `nvidia-smi` to run (`SHOAL_NVIDIA_SMI`, else `nvidia-smi` on `PATH`).
    pub nvidia_smi: PathBuf,
    /// The NVIDIA driver's per-GPU folders (`/proc/driver/nvidia/gpus`).
    pub nvidia_proc: PathBuf,
}

impl Default for Probe {
    fn default() -> Probe {
        Probe {
            nvidia_smi: std::env::var_os("SHOAL_NVIDIA_SMI")
                .filter(|v| !v.is_empty())
                .map_or_else(|| PathBuf::from("nvidia-smi"), PathBuf::from),
            nvidia_proc: PathBuf::from("/proc/driver/nvidia/gpus"),
        }
    }
}

/// How long `nvidia-smi` may take before it counts as not answering (a wedged driver must not
/// hold up a node's start).
const SMI_TIMEOUT: Duration = Duration::from_secs(5);

const ROUND: u64 = 64 << 20;

impl Probe {
    /// The GPUs of this machine. Never fails: a machine without a driver has none.
    pub fn gpus(&self, system_memory: u64) -> Vec<Gpu> {
        if cfg!(target_os = "macos") {
            return vec![apple_gpu(system_memory)];
        }
        if let Some(out) = run_with_timeout(&self.nvidia_smi, SMI_TIMEOUT) {
            let gpus = parse_nvidia_smi(&out);
            if !gpus.is_empty() {
                return gpus;
            }
        }
        nvidia_proc_gpus(&self.nvidia_proc)
    }
}

/// Runs `nvidia-smi` with the query shoal reads, or `None` if it is missing, fails or hangs.
fn run_with_timeout(smi: &Path, timeout: Duration) -> Option<String> {
    let mut child = Command::new(smi)
        .args([
            "--query-gpu=name,memory.total,memory.free",
            "--format=csv,noheader,nounits",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let started = std::time::Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => break,
            Ok(Some(_)) | Err(_) => return None,
            Ok(None) if started.elapsed() > timeout => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    let mut text = String::new();
    use std::io::Read;
    child.stdout.take()?.read_to_string(&mut text).ok()?;
    Some(text)
}

/// Parses `name, memory.total, memory.free` lines (MiB, `--format=csv,noheader,nounits`).
/// Lines that do not parse are skipped; `[N/A]` memory counts as 0.
pub fn parse_nvidia_smi(text: &str) -> Vec<Gpu> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.rsplitn(3, ',').map(str::trim);
            let free = fields.next()?;
            let total = fields.next()?;
            let name = fields.next()?;
            if name.is_empty() {
                return None;
            }
            let mib = |v: &str| v.parse::<u64>().map_or(0, |m| m.saturating_mul(1 << 20));
            let total = mib(total);
            if total == 0 {
                return None;
            }
            Some(Gpu {
                vendor: "nvidia".into(),
                name: name.to_string(),
                memory_total: total,
                memory_free: mib(free).min(total) / ROUND * ROUND,
            })
        })
        .collect()
}

/// GPUs named by the driver's `information` files when `nvidia-smi` is absent; memory unknown.
fn nvidia_proc_gpus(dir: &Path) -> Vec<Gpu> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut folders: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    folders.sort();
    folders
        .iter()
        .filter_map(|f| std::fs::read_to_string(f.join("information")).ok())
        .filter_map(|text| {
            let model = text
                .lines()
                .find_map(|l| l.strip_prefix("Model:"))?
                .trim()
                .to_string();
            Some(Gpu {
                vendor: "nvidia".into(),
                name: model,
                memory_total: 0,
                memory_free: 0,
            })
        })
        .collect()
}

/// The Apple GPU: it shares system memory, of which MLX may wire about three quarters by
/// default (macOS's recommended working set). Untested here: no Mac in this project's CI.
fn apple_gpu(system_memory: u64) -> Gpu {
    let name = Command::new("sysctl")
        .args(["-n", "machdep.cpu.brand_string"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "Apple GPU".into());
    Gpu {
        vendor: "apple".into(),
        name,
        memory_total: system_memory / 4 * 3,
        memory_free: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_nvidia_smi_lines() {
        let text = "NVIDIA H200, 143771, 143000\nNVIDIA GeForce RTX 4090, 24564, [N/A]\n\ngarbage\n, 1, 1\n";
        let gpus = parse_nvidia_smi(text);
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[0].name, "NVIDIA H200");
        assert_eq!(gpus[0].memory_total, 143771 << 20);
        assert_eq!(gpus[0].memory_free, (143000u64 << 20) / ROUND * ROUND);
        assert_eq!(gpus[1].name, "NVIDIA GeForce RTX 4090");
        assert_eq!(gpus[1].memory_free, 0);
    }

    #[test]
    fn a_gpu_name_with_commas_keeps_them() {
        let gpus = parse_nvidia_smi("Tesla, the card, 1024, 512\n");
        assert_eq!(gpus[0].name, "Tesla, the card");
        assert_eq!(gpus[0].memory_total, 1 << 30);
    }

    #[test]
    fn a_gpu_counts_only_with_a_build_that_drives_it() {
        let h200 = parse_nvidia_smi("NVIDIA H200, 143771, 143000\n");
        assert_eq!(
            backends(MlxBuild::Cuda, &h200),
            vec![ComputeBackend::MlxCuda, ComputeBackend::MlxCpu]
        );
        assert_eq!(backends(MlxBuild::Cpu, &h200), vec![ComputeBackend::MlxCpu]);
        assert_eq!(backends(MlxBuild::Cuda, &[]), vec![ComputeBackend::MlxCpu]);
        assert_eq!(MlxBuild::parse("cuda-13"), Some(MlxBuild::Cuda));
        assert_eq!(MlxBuild::parse("rocm"), None);
    }

    #[cfg(unix)]
    #[test]
    fn asks_a_fake_nvidia_smi_and_falls_back_to_the_driver_files() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("shoal-gpu-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("gpus/0000:01:00.0")).unwrap();
        let smi = dir.join("nvidia-smi");
        std::fs::write(&smi, "#!/bin/sh\necho 'NVIDIA L4, 23034, 22000'\n").unwrap();
        std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(
            dir.join("gpus/0000:01:00.0/information"),
            "Model: \t\t NVIDIA A100-SXM4-80GB\nIRQ:   42\n",
        )
        .unwrap();
        let probe = Probe {
            nvidia_smi: smi.clone(),
            nvidia_proc: dir.join("gpus"),
        };
        let gpus = probe.gpus(0);
        if cfg!(target_os = "linux") {
            assert_eq!(gpus.len(), 1);
            assert_eq!(gpus[0].name, "NVIDIA L4");
            assert_eq!(gpus[0].memory_total, 23034 << 20);
            // A failing nvidia-smi (driver loaded, tool broken): the driver's files name it.
            std::fs::write(&smi, "#!/bin/sh\nexit 9\n").unwrap();
            let gpus = probe.gpus(0);
            assert_eq!(gpus.len(), 1);
            assert_eq!(gpus[0].name, "NVIDIA A100-SXM4-80GB");
            assert_eq!(gpus[0].memory_total, 0);
            // None at all.
            let none = Probe {
                nvidia_smi: dir.join("absent"),
                nvidia_proc: dir.join("absent"),
            };
            assert!(none.gpus(0).is_empty());
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
