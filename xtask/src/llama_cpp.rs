//! llama.cpp tools built from the sources that the pinned `llama-cpp-python` sdist vendors
//! (see `reference.rs`): `llama-bench` for `cargo xtask bench inference --with-llama-cpp`,
//! `llama-server` for `cargo xtask bench llama-server`,
//! `llama-quantize` for the K-quant fixtures (`kquants.rs`). One build directory,
//! `<cache>/llama.cpp-<version>/build`, serves both, so the second tool reuses the first's
//! objects (ggml and libllama are most of the work).

use crate::paths::cache_dir;
use crate::reference::{sdist, LLAMA_CPP_IN_SDIST, LLAMA_CPP_PYTHON_VERSION};
use crate::util::{run, run_quiet, Step};
use std::path::PathBuf;
use std::process::Command;

/// Where the tools are built: `<cache>/llama.cpp-<version>/`.
pub fn dir() -> PathBuf {
    cache_dir().join(format!("llama.cpp-{LLAMA_CPP_PYTHON_VERSION}"))
}

/// The binary of `target` once built.
pub fn tool_path(target: &str) -> PathBuf {
    dir().join("build/bin").join(target)
}

/// The stamp that says `target` was built completely.
fn stamp(target: &str) -> PathBuf {
    if target == "llama-bench" {
        dir().join(format!(".shoal-ok-llama-bench-{BENCH_CONFIG}"))
    } else {
        dir().join(format!(".shoal-ok-{target}"))
    }
}

/// The version of `llama-bench`'s build configuration, in its stamp: one built with older
/// flags is built again (2: AMX off, see [`build_tool`]; the first build crashed on AMX CPUs).
const BENCH_CONFIG: u32 = 2;

/// Whether `target` is built (binary and stamp).
pub fn is_built(target: &str) -> bool {
    tool_path(target).exists() && stamp(target).exists()
}

/// `llama-quantize`, built on first use (the fixtures that llama.cpp's own tools make).
pub fn quantize_tool(step: &Step) -> Result<PathBuf, String> {
    if is_built("llama-quantize") {
        return Ok(tool_path("llama-quantize"));
    }
    build_tool(
        step,
        "llama-quantize",
        "about 5 minutes on 2 idle cores, less after llama-bench",
    )
}

/// Builds llama.cpp's `target` (Release, CPU only, static, tuned for this CPU like a local
/// llama.cpp build) from the sources in the pinned sdist; a second call finds it built.
/// `estimate` is said in the progress line (how long the compile takes).
pub fn build_tool(step: &Step, target: &str, estimate: &str) -> Result<PathBuf, String> {
    let bin = tool_path(target);
    if is_built(target) {
        return Ok(bin);
    }
    let archive = sdist(step)?;
    let root = dir();
    let src = root.join("src");
    let build = root.join("build");
    if !src.join("CMakeLists.txt").exists() {
        step.progress("extracting llama.cpp's sources");
        let _ = std::fs::remove_dir_all(&src);
        std::fs::create_dir_all(&src).map_err(|e| e.to_string())?;
        let depth = LLAMA_CPP_IN_SDIST.split('/').count();
        run(Command::new("tar")
            .arg("xzf")
            .arg(&archive)
            .arg("-C")
            .arg(&src)
            .arg(format!("--strip-components={depth}"))
            .arg(LLAMA_CPP_IN_SDIST))?;
    }
    step.progress("configuring (cmake, CPU only)");
    run_quiet(
        Command::new("cmake")
            .arg("-S")
            .arg(&src)
            .arg("-B")
            .arg(&build)
            .args([
                "-DCMAKE_BUILD_TYPE=Release",
                "-DBUILD_SHARED_LIBS=OFF",
                "-DGGML_NATIVE=ON",
                // Every native instruction set but AMX: on a CPU that advertises AMX (as this
                // 2-core VM's Sapphire Rapids does) ggml's AMX matrix product crashed llama-bench
                // with SIGSEGV on the first prompt; AVX-512 and VNNI stay on.
                "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
                "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
                "-DLLAMA_BUILD_TESTS=OFF",
                "-DLLAMA_BUILD_EXAMPLES=OFF",
                // The server's targets exist (llama-server for `bench llama-server`); only the
                // asked-for target is compiled. Its web page would be fetched from a hub
                // (`LLAMA_USE_PREBUILT_UI`) or built with npm: neither, the API is enough.
                "-DLLAMA_BUILD_SERVER=ON",
                "-DLLAMA_USE_PREBUILT_UI=OFF",
                "-DLLAMA_BUILD_UI=OFF",
                "-DLLAMA_BUILD_APP=OFF",
                "-DLLAMA_OPENSSL=OFF",
                "--log-level=WARNING",
            ]),
    )?;
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get());
    step.progress(&format!("compiling {target} with {jobs} jobs ({estimate})"));
    run_quiet(
        Command::new("cmake")
            .arg("--build")
            .arg(&build)
            .args(["--target", target])
            .arg(format!("-j{jobs}")),
    )?;
    if !bin.exists() {
        return Err(format!("the llama.cpp build left no {}", bin.display()));
    }
    std::fs::write(stamp(target), "").map_err(|e| e.to_string())?;
    // The binaries are static: the 176 MB of sources are not needed any more (another tool
    // extracts them again; their old timestamps leave the objects built here valid).
    let _ = std::fs::remove_dir_all(&src);
    Ok(bin)
}
