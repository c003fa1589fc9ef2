//! Compiles shoal's CPU kernels (`cpp/`) against the headers of the MLX and mlx-c that
//! `mlx-sys` links, which it names through its `links = "mlx"` metadata (`DEP_MLX_INCLUDE`,
//! `DEP_MLX_C_INCLUDE`). Only this script reads `cpp/`, so a kernel edit recompiles the kernels
//! and never reruns mlx-sys's bindgen.
use std::env;
use std::path::PathBuf;

/// A directory mlx-sys's build script printed as `cargo::metadata=KEY=...`.
fn from_mlx_sys(key: &str) -> PathBuf {
    let var = format!("DEP_MLX_{key}");
    println!("cargo:rerun-if-env-changed={var}");
    env::var_os(&var).map(PathBuf::from).unwrap_or_else(|| {
        panic!("{var} is not set: mlx-sys's build script names MLX's headers (is mlx-sys a direct dependency?)")
    })
}

fn main() {
    println!("cargo:rerun-if-changed=cpp");
    let mlx_include = from_mlx_sys("INCLUDE");
    let mlx_c_include = from_mlx_sys("C_INCLUDE");
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    // This crate's test binaries load libmlx.so from the prepared MLX (a library target links
    // nothing, so only they see this).
    let mlx_lib = from_mlx_sys("LIB_DIR");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", mlx_lib.display());

    // The primitives, compiled like mlx-c against the prepared MLX's headers; this crate depends
    // on mlx-sys, so they are linked before mlx-c and MLX.
    cc::Build::new()
        .cpp(true)
        .std("c++20")
        .opt_level(3)
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-unused-variable")
        .include(&mlx_include)
        .include(&mlx_c_include)
        .file("cpp/cpu_qmm.cpp")
        .file("cpp/affine_kernels.cpp")
        .file("cpp/int8_path.cpp")
        .file("cpp/cpu_layer_ops.cpp")
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
                .file(format!("cpp/{file}.cpp"))
                .compile(&format!("shoal_{library}"));
        }
    }
}
