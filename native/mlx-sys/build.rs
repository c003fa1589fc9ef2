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

    // shoal's CPU kernels, as MLX primitives (`kernels/`): compiled like mlx-c, against the
    // prepared MLX's headers, and linked before it.
    println!("cargo:rerun-if-changed=kernels");
    let mlx_include = mlx_lib
        .parent()
        .map(|root| root.join("include"))
        .expect("MLX's library directory has a parent");
    cc::Build::new()
        .cpp(true)
        .std("c++20")
        .opt_level(3)
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-unused-variable")
        .include(&mlx_include)
        .include(&mlx_c_src)
        .file("kernels/cpu_qmm.cpp")
        .file("kernels/affine_kernels.cpp")
        .file("kernels/int8_path.cpp")
        .file("kernels/cpu_layer_ops.cpp")
        .compile("shoal_kernels");
    // The int8 products, one library per instruction set, each compiled for its instructions
    // (chosen at run time by `int8_path.cpp`, so the rest of the build stays baseline x86-64),
    // linked after the kernels that call them.
    if env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("x86_64") {
        let avx2: &[&str] = &["-mavx2", "-mfma", "-mf16c"];
        let evex: &[&str] = &[
            "-mavx512f",
            "-mavx512vl",
            "-mavx512bw",
            "-mavx512vnni",
            "-DSHOAL_EVEX_VNNI",
        ];
        for (library, file, extra) in [
            ("int8_avx2", "int8_avx2", &[][..]),
            ("int8_avxvnni", "int8_vnni", &["-mavxvnni"][..]),
            ("int8_avx512vnni", "int8_vnni", evex),
        ] {
            let mut build = cc::Build::new();
            // One object folder per library: int8_vnni.cpp is compiled twice.
            build
                .cpp(true)
                .std("c++20")
                .opt_level(3)
                .out_dir(out.join(library));
            for flag in avx2.iter().chain(extra) {
                build.flag(flag);
            }
            build
                .file(format!("kernels/{file}.cpp"))
                .compile(&format!("shoal_{library}"));
        }
    }

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
