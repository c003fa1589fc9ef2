//! The CPU product's aarch64 paths (NEON for 4-bit decode rows), cross-compiled with Debian's
//! `aarch64-linux-gnu-g++` and run under `qemu-aarch64` (both installed by `cargo xtask
//! setup`): no aarch64 machine is at hand, and the product's tests in `inference` run on the
//! host's instructions only. The check itself is `cpp/check/aarch64_product.cpp` (against
//! an f64 reference and the plain C++ path); a broken NEON path fails it (offsetting its x by
//! one half block gave 0.56).
#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

use std::path::PathBuf;
use std::process::Command;

/// MLX's headers, as `cargo xtask setup` recorded the prepared MLX (`native/READY`).
fn mlx_include() -> PathBuf {
    let stamp = paths::cache_dir().join("native").join("READY");
    let text = std::fs::read_to_string(&stamp)
        .unwrap_or_else(|e| panic!("{}: {e}; run `cargo xtask setup`", stamp.display()));
    let lib = text
        .lines()
        .filter_map(|line| line.split_once('='))
        .find(|(k, _)| k.trim() == "mlx_lib")
        .map(|(_, v)| PathBuf::from(v.trim()))
        .expect("the stamp names mlx_lib");
    lib.parent().expect("lib has a parent").join("include")
}

fn tool(name: &str) -> &str {
    let found = Command::new(name).arg("--version").output().is_ok();
    assert!(found, "{name} is missing: `cargo xtask setup` installs it (Debian's g++-aarch64-linux-gnu and qemu-user)");
    name
}

#[test]
fn neon_products_equal_the_reference_under_qemu() {
    // The crate's folder where this run finds it (cargo sets it for the test process): the one
    // compiled in may be another clone's, since cargo reuses a test binary across checkouts
    // that share a target directory.
    let crate_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    let kernels = crate_dir.join("cpp");
    let out = std::env::temp_dir().join(format!("shoal-aarch64-check-{}", std::process::id()));
    let compiled = Command::new(tool("aarch64-linux-gnu-g++"))
        .args(["-std=c++20", "-O2", "-static", "-Wall"])
        .arg(format!("-I{}", kernels.display()))
        .arg(format!("-I{}", mlx_include().display()))
        .arg(kernels.join("affine_kernels.cpp"))
        .arg(kernels.join("int8_path.cpp"))
        .arg(kernels.join("check/aarch64_product.cpp"))
        .arg("-o")
        .arg(&out)
        .args(["-ldl", "-lpthread"])
        .output()
        .expect("the cross compiler runs");
    assert!(
        compiled.status.success(),
        "cross compile failed:\n{}",
        String::from_utf8_lossy(&compiled.stderr)
    );
    let ran = Command::new(tool("qemu-aarch64"))
        .arg(&out)
        .output()
        .expect("qemu runs");
    let _ = std::fs::remove_file(&out);
    let said = String::from_utf8_lossy(&ran.stdout).into_owned();
    assert!(ran.status.success(), "the aarch64 check failed: {said}");
    assert!(said.contains("90 cases"), "{said}");
}
