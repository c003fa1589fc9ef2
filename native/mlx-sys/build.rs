//! Generates bindings for mlx-c and links the MLX that `cargo xtask setup` prepared.
//!
//! Setup leaves, under the shoal cache directory (`SHOAL_CACHE_DIR`, else
//! `$XDG_CACHE_HOME/shoal`, else `~/.cache/shoal`, as the `shoal-paths` crate resolves it):
//! - `native/mlx-sys-0.7.0/`: the published crate's sources with shoal's patch applied;
//! - `native/mlxc-0.7.0/lib/libmlxc.a`: mlx-c built against the prepared MLX;
//! - `native/mlx-<version>/mlx/lib/`: MLX itself (the official PyPI wheel on Linux);
//! - `native/READY`: written last; names the directories above.
//!
//! Without that stamp the build stops with the command to run.
use std::env;
use std::path::{Path, PathBuf};

/// `key=value` lines written by `cargo xtask setup`.
fn read_stamp(path: &Path) -> Option<Vec<(String, String)>> {
    let text = std::fs::read_to_string(path).ok()?;
    Some(
        text.lines()
            .filter_map(|line| line.split_once('='))
            .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
            .collect(),
    )
}

fn main() {
    println!("cargo:rerun-if-env-changed=SHOAL_CACHE_DIR");
    println!("cargo:rerun-if-env-changed=XDG_CACHE_HOME");
    let cache = paths::cache_dir();
    let stamp_path = cache.join("native").join("READY");
    println!("cargo:rerun-if-changed={}", stamp_path.display());
    let Some(stamp) = read_stamp(&stamp_path) else {
        panic!(
            "\n\nMLX is not prepared for this machine (no {}).\n\
             Run `cargo xtask setup` once (or `cargo xtask build` / `cargo xtask test`, which run it),\n\
             then build again.\n\n",
            stamp_path.display()
        );
    };
    let get = |key: &str| -> PathBuf {
        stamp
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| PathBuf::from(v))
            .unwrap_or_else(|| {
                panic!(
                    "{} lacks `{key}`; run `cargo xtask setup` again",
                    stamp_path.display()
                )
            })
    };
    let mlx_c_src = get("mlx_c_src");
    let mlx_c_lib = get("mlx_c_lib");
    let mlx_lib = get("mlx_lib");

    let mut headers: Vec<PathBuf> = std::fs::read_dir(mlx_c_src.join("mlx/c"))
        .unwrap_or_else(|e| panic!("cannot read mlx-c headers in {}: {e}", mlx_c_src.display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|ext| ext == "h"))
        .collect();
    headers.sort();
    let builder = headers.iter().fold(
        bindgen::Builder::default()
            .clang_arg(format!("-I{}", mlx_c_src.display()))
            .blocklist_function("malloc")
            .blocklist_function("realloc"),
        |builder, header| builder.header(header.to_string_lossy()),
    );
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    builder
        .generate()
        .expect("bindgen could not read the mlx-c headers (is libclang-dev installed?)")
        .write_to_file(out.join("bindings.rs"))
        .expect("cannot write bindings.rs");

    println!("cargo:rustc-link-search=native={}", mlx_c_lib.display());
    println!("cargo:rustc-link-lib=static=mlxc");
    println!("cargo:rustc-link-search=native={}", mlx_lib.display());
    println!("cargo:rustc-link-lib=dylib=mlx");
    let target_os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if target_os == "macos" {
        println!("cargo:rustc-link-lib=dylib=c++");
    } else {
        println!("cargo:rustc-link-lib=dylib=stdc++");
    }
    // shoal's CPU kernels (`native/kernels`, the `shoal-kernels` crate) are compiled by their own
    // build script against the headers of this very MLX and mlx-c: it reads them as
    // DEP_MLX_INCLUDE and DEP_MLX_C_INCLUDE, so a kernel edit never reruns bindgen.
    let mlx_include = mlx_lib
        .parent()
        .map(|root| root.join("include"))
        .expect("MLX's library directory has a parent");
    println!("cargo::metadata=include={}", mlx_include.display());
    println!("cargo::metadata=c_include={}", mlx_c_src.display());
    // Final binaries read this as DEP_MLX_LIB_DIR to set their run path to MLX's shared library.
    println!("cargo::metadata=lib_dir={}", mlx_lib.display());
    // ... and this as DEP_MLX_BACKEND: which build setup prepared (`cpu`, `cuda-12`, `cuda-13`,
    // `metal`), so a node offers the GPU backend only when its MLX can drive it. A stamp from
    // before setup chose builds is a CPU build.
    let backend = stamp
        .iter()
        .find(|(k, _)| k == "mlx_backend")
        .map_or("cpu", |(_, v)| v.as_str());
    println!("cargo::metadata=backend={backend}");
}
