//! Which MLX build setup prepares for this machine, and the pinned PyPI wheels of each.
//!
//! - Linux x86_64 with an NVIDIA driver (`nvidia-smi` answers): `mlx-cuda-13` when the driver
//!   supports CUDA 13, else `mlx-cuda-12`; their CUDA libraries (cuBLAS, cuDNN, cuFFT, NCCL,
//!   NVRTC, nvJitLink) come as NVIDIA's PyPI wheels, unpacked next to MLX so that libmlx's
//!   `$ORIGIN/../../nvidia/*/lib` run path finds them.
//! - macOS arm64: `mlx-metal` (MLX's own build, Metal shaders included) — chosen and pinned
//!   here, but setup does not prepare macOS yet (the mlx-sys patch is Linux's).
//! - anything else: `mlx-cpu`, as before.
//!
//! `SHOAL_MLX=cpu|cuda|metal` overrides the choice (`cuda` still picks 12 or 13 by driver).
//! Every wheel is pinned by file name and sha256 (read from PyPI's own digests).

/// MLX release that mlx-c 0.7.0 (inside mlx-sys 0.7.0) is written against: the release every
/// build below is of, and the one the mlx-lm venv pins (kept here, with the builds, so that the
/// venv and the fixtures read it without depending on setup, which depends on them).
pub const MLX_VERSION: &str = "0.32.2";

/// An MLX build and the wheels it is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MlxFlavor {
    /// `mlx-cpu` (Linux).
    Cpu,
    /// `mlx-cuda-12` and its CUDA 12 libraries (Linux x86_64).
    Cuda12,
    /// `mlx-cuda-13` and its CUDA 13 libraries (Linux x86_64).
    Cuda13,
    /// `mlx-metal` (macOS arm64).
    Metal,
}

/// One pinned wheel: the pip requirement, the file it must download as, and its sha256.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wheel {
    /// `name==version`.
    pub spec: &'static str,
    /// The file pip downloads.
    pub file: &'static str,
    /// PyPI's sha256 of that file.
    pub sha256: &'static str,
}

const fn wheel(spec: &'static str, file: &'static str, sha256: &'static str) -> Wheel {
    Wheel { spec, file, sha256 }
}

const CPU: &[Wheel] = &[wheel(
    "mlx-cpu==0.32.2",
    "mlx_cpu-0.32.2-py3-none-manylinux_2_35_x86_64.whl",
    "fc5d31b90fc4f457b2f9614ed45651a567d22a6a11a03d114a90a4e10bdd8878",
)];

const CUDA12: &[Wheel] = &[
    wheel(
        "mlx-cuda-12==0.32.2",
        "mlx_cuda_12-0.32.2-py3-none-manylinux_2_35_x86_64.whl",
        "35445ead9724855826f310b9085d57137d0a2c5381cc293cb6d86b03bb4feadf",
    ),
    wheel(
        "nvidia-cublas-cu12==12.9.3.13",
        "nvidia_cublas_cu12-12.9.3.13-py3-none-manylinux_2_27_x86_64.whl",
        "d7d51055f161b317c7105ddaae90e71eda059026074ffef93cf7cde2886bfe72",
    ),
    wheel(
        "nvidia-cuda-nvrtc-cu12==12.9.86",
        "nvidia_cuda_nvrtc_cu12-12.9.86-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl",
        "210cf05005a447e29214e9ce50851e83fc5f4358df8b453155d5e1918094dcb4",
    ),
    wheel(
        "nvidia-cudnn-cu12==9.28.0.42",
        "nvidia_cudnn_cu12-9.28.0.42-py3-none-manylinux_2_27_x86_64.whl",
        "9ff58b7f36dacd0a93e89f8f2957b52466889217963701daa15e577317cfa375",
    ),
    wheel(
        "nvidia-cufft-cu12==11.4.1.4",
        "nvidia_cufft_cu12-11.4.1.4-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        "c67884f2a7d276b4b80eb56a79322a95df592ae5e765cf1243693365ccab4e28",
    ),
    wheel(
        "nvidia-nccl-cu12==2.32.3",
        "nvidia_nccl_cu12-2.32.3-py3-none-manylinux_2_27_x86_64.whl",
        "bb94b2348e4861d5e8aa00b36c3d12d9bdf9c6369b82cbb723de0b582280a21c",
    ),
    wheel(
        "nvidia-nvjitlink-cu12==12.9.86",
        "nvidia_nvjitlink_cu12-12.9.86-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl",
        "e3f1171dbdc83c5932a45f0f4c99180a70de9bd2718c1ab77d14104f6d7147f9",
    ),
];

const CUDA13: &[Wheel] = &[
    wheel(
        "mlx-cuda-13==0.32.2",
        "mlx_cuda_13-0.32.2-py3-none-manylinux_2_35_x86_64.whl",
        "335094ccd1c0c6dc3e09c8caba207c8180602bacc0c38ba20c1d81e9456ab394",
    ),
    wheel(
        "nvidia-cublas==13.10.0.20",
        "nvidia_cublas-13.10.0.20-py3-none-manylinux1_x86_64.manylinux_2_5_x86_64.whl",
        "dcc6d63884c53d07e267ce7e6feac17b2538cebaafec5db865736c3e28e4dc84",
    ),
    wheel(
        "nvidia-cuda-nvrtc==13.5.37",
        "nvidia_cuda_nvrtc-13.5.37-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl",
        "86b4d68058807988b7d9af5b44917a0601e9c337f35ccd657bfb3c759ff8d8bc",
    ),
    wheel(
        "nvidia-cuda-runtime==13.5.37",
        "nvidia_cuda_runtime-13.5.37-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        "df2b79a8852f10d1fef8c848489c49eebb5754051bf870202a862831412b179d",
    ),
    wheel(
        "nvidia-cudnn-cu13==9.28.1.4",
        "nvidia_cudnn_cu13-9.28.1.4-py3-none-manylinux_2_27_x86_64.whl",
        "a54f205b1db1f2895d99f398754db1369816f0569dd459731f925635cf7b65ec",
    ),
    wheel(
        "nvidia-cufft==12.5.0.14",
        "nvidia_cufft-12.5.0.14-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        "b8be26837a5abad2b5b74f3e92dd29f622a42934b355be0961a48712cbba23ad",
    ),
    wheel(
        "nvidia-nccl-cu13==2.32.3",
        "nvidia_nccl_cu13-2.32.3-py3-none-manylinux_2_27_x86_64.whl",
        "1459723080ac889d73a26edfa3e04383a7928ab31ac8f0ec43b3ea9548b04ff3",
    ),
    wheel(
        "nvidia-nvjitlink==13.5.37",
        "nvidia_nvjitlink-13.5.37-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl",
        "280d7cb9649704145f074b8dbde500de04ce02d0872e066e20a83c17bcaa93eb",
    ),
];

const METAL: &[Wheel] = &[wheel(
    "mlx-metal==0.32.2",
    "mlx_metal-0.32.2-py3-none-macosx_14_0_arm64.whl",
    "3825fff379dbc107dd3413e564a06caeaa24819910ec49c0439e454c06a1b9b8",
)];

impl MlxFlavor {
    /// The name in `native/READY` (`mlx_backend=`), in the prepared folder's name and in logs.
    pub fn name(self) -> &'static str {
        match self {
            MlxFlavor::Cpu => "cpu",
            MlxFlavor::Cuda12 => "cuda-12",
            MlxFlavor::Cuda13 => "cuda-13",
            MlxFlavor::Metal => "metal",
        }
    }

    /// The wheels to unpack, MLX's own first.
    pub fn wheels(self) -> &'static [Wheel] {
        match self {
            MlxFlavor::Cpu => CPU,
            MlxFlavor::Cuda12 => CUDA12,
            MlxFlavor::Cuda13 => CUDA13,
            MlxFlavor::Metal => METAL,
        }
    }

    /// The folder, next to `mlx/`, where auditwheel put the libraries MLX's wheel bundles.
    pub fn bundled_libs(self) -> &'static str {
        match self {
            MlxFlavor::Cpu => "mlx_cpu.libs",
            MlxFlavor::Cuda12 => "mlx_cuda_12.libs",
            MlxFlavor::Cuda13 => "mlx_cuda_13.libs",
            MlxFlavor::Metal => "mlx_metal.libs",
        }
    }
}

/// The highest CUDA major version the driver supports, from plain `nvidia-smi`'s banner
/// (`... CUDA Version: 12.4 ...`); `None` when it does not say.
pub fn driver_cuda_major(nvidia_smi_banner: &str) -> Option<u32> {
    let rest = nvidia_smi_banner.split("CUDA Version:").nth(1)?;
    rest.trim_start()
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// What setup knows about the machine when it chooses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Machine<'a> {
    /// `std::env::consts::OS`.
    pub os: &'a str,
    /// `std::env::consts::ARCH`.
    pub arch: &'a str,
    /// `Some(banner)` when `nvidia-smi` answered.
    pub nvidia_smi: Option<&'a str>,
    /// `SHOAL_MLX`, when set.
    pub requested: Option<&'a str>,
}

/// The MLX build for `machine`, or why none fits (an override this machine cannot run).
pub fn choose(machine: Machine) -> Result<MlxFlavor, String> {
    let linux_x86 = machine.os == "linux" && machine.arch == "x86_64";
    let mac_arm = machine.os == "macos" && machine.arch == "aarch64";
    let cuda = |why: &str| -> Result<MlxFlavor, String> {
        if !linux_x86 {
            return Err(format!(
                "{why}: MLX's CUDA wheels exist for Linux x86_64 only (this is {} {})",
                machine.os, machine.arch
            ));
        }
        let Some(banner) = machine.nvidia_smi else {
            return Err(format!(
                "{why}, but `nvidia-smi` does not answer: install the NVIDIA driver, or set \
                 SHOAL_MLX=cpu"
            ));
        };
        match driver_cuda_major(banner) {
            Some(major) if major >= 13 => Ok(MlxFlavor::Cuda13),
            Some(12) => Ok(MlxFlavor::Cuda12),
            Some(major) => Err(format!(
                "the NVIDIA driver supports CUDA {major}; MLX needs CUDA 12 or 13: update the \
                 driver, or set SHOAL_MLX=cpu"
            )),
            // A driver that prints no version: CUDA 12 runs on more of them.
            None => Ok(MlxFlavor::Cuda12),
        }
    };
    match machine.requested.map(str::trim).filter(|r| !r.is_empty()) {
        Some("cpu") if linux_x86 => Ok(MlxFlavor::Cpu),
        Some("cpu") => Err(format!(
            "SHOAL_MLX=cpu: the mlx-cpu wheel exists for Linux x86_64 only (this is {} {})",
            machine.os, machine.arch
        )),
        Some("cuda") => cuda("SHOAL_MLX=cuda"),
        Some("metal") if mac_arm => Ok(MlxFlavor::Metal),
        Some("metal") => Err("SHOAL_MLX=metal: Metal exists on Apple silicon Macs only".into()),
        Some(other) => Err(format!(
            "SHOAL_MLX={other} is not a build: say cpu, cuda or metal"
        )),
        None if mac_arm => Ok(MlxFlavor::Metal),
        None if linux_x86 && machine.nvidia_smi.is_some() => cuda("an NVIDIA GPU is present"),
        None if linux_x86 => Ok(MlxFlavor::Cpu),
        None => Err(format!(
            "no MLX build for {} {}: MLX ships Linux x86_64 (CPU, CUDA) and macOS arm64 (Metal)",
            machine.os, machine.arch
        )),
    }
}

/// Asks this machine: `nvidia-smi`'s banner (if it answers) and `SHOAL_MLX`.
pub fn choose_here() -> Result<MlxFlavor, String> {
    let banner = std::process::Command::new("nvidia-smi")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    let requested = std::env::var("SHOAL_MLX").ok();
    choose(Machine {
        os: std::env::consts::OS,
        arch: std::env::consts::ARCH,
        nvidia_smi: banner.as_deref(),
        requested: requested.as_deref(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BANNER_12: &str =
        "| NVIDIA-SMI 550.54.15  Driver Version: 550.54.15  CUDA Version: 12.4     |";
    const BANNER_13: &str = "| NVIDIA-SMI 580.65  Driver Version: 580.65.06  CUDA Version: 13.0 |";

    fn linux(smi: Option<&'static str>, requested: Option<&'static str>) -> Machine<'static> {
        Machine {
            os: "linux",
            arch: "x86_64",
            nvidia_smi: smi,
            requested,
        }
    }

    #[test]
    fn reads_the_drivers_cuda_version() {
        assert_eq!(driver_cuda_major(BANNER_12), Some(12));
        assert_eq!(driver_cuda_major(BANNER_13), Some(13));
        assert_eq!(driver_cuda_major("no banner"), None);
    }

    #[test]
    fn picks_the_build_per_platform() {
        assert_eq!(choose(linux(None, None)), Ok(MlxFlavor::Cpu));
        assert_eq!(choose(linux(Some(BANNER_12), None)), Ok(MlxFlavor::Cuda12));
        assert_eq!(choose(linux(Some(BANNER_13), None)), Ok(MlxFlavor::Cuda13));
        let mac = Machine {
            os: "macos",
            arch: "aarch64",
            nvidia_smi: None,
            requested: None,
        };
        assert_eq!(choose(mac), Ok(MlxFlavor::Metal));
        let intel_mac = Machine {
            arch: "x86_64",
            ..mac
        };
        assert!(choose(intel_mac).unwrap_err().contains("no MLX build"));
    }

    #[test]
    fn the_override_wins_or_says_why_not() {
        assert_eq!(
            choose(linux(Some(BANNER_13), Some("cpu"))),
            Ok(MlxFlavor::Cpu)
        );
        assert_eq!(
            choose(linux(Some(BANNER_12), Some("cuda"))),
            Ok(MlxFlavor::Cuda12)
        );
        assert!(choose(linux(None, Some("cuda")))
            .unwrap_err()
            .contains("nvidia-smi"));
        assert!(choose(linux(None, Some("metal")))
            .unwrap_err()
            .contains("Apple"));
        assert!(choose(linux(None, Some("rocm")))
            .unwrap_err()
            .contains("cpu, cuda or metal"));
        let old = "CUDA Version: 11.8";
        assert!(choose(linux(Some(old), None))
            .unwrap_err()
            .contains("CUDA 11"));
    }

    #[test]
    fn every_build_pins_mlx_first_with_a_sha256() {
        for flavor in [
            MlxFlavor::Cpu,
            MlxFlavor::Cuda12,
            MlxFlavor::Cuda13,
            MlxFlavor::Metal,
        ] {
            let wheels = flavor.wheels();
            assert!(wheels[0].spec.starts_with("mlx-"), "{flavor:?}");
            assert!(wheels[0].spec.ends_with("==0.32.2"), "{flavor:?}");
            for w in wheels {
                assert_eq!(w.sha256.len(), 64, "{}", w.file);
                assert!(w.sha256.chars().all(|c| c.is_ascii_hexdigit()));
                assert!(w.file.ends_with(".whl"));
                let name = w.spec.split("==").next().unwrap().replace('-', "_");
                assert!(w.file.starts_with(&name), "{} vs {}", w.file, w.spec);
            }
        }
    }
}
