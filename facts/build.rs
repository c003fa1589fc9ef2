//! Test binaries of this crate load libmlx.so (through `inference`) from the prepared MLX.
fn main() {
    if let Ok(dir) = std::env::var("DEP_MLX_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
