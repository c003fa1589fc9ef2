//! The node library's test binaries load libmlx.so from the prepared MLX, and the node knows
//! which MLX build that is (`SHOAL_MLX_BUILD`: `cpu`, `cuda-12`, `cuda-13` or `metal`).
fn main() {
    if let Ok(dir) = std::env::var("DEP_MLX_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
    let backend = std::env::var("DEP_MLX_BACKEND").unwrap_or_else(|_| "cpu".into());
    println!("cargo:rustc-env=SHOAL_MLX_BUILD={backend}");
}
