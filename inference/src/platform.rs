//! Facts about the MLX build this process runs on.

/// Which shared libraries provide BLAS to this process, read from `/proc/self/maps`.
///
/// shoal must multiply through the system OpenBLAS (about 30x faster than the reference
/// BLAS the MLX wheel bundles); this lets tests and `shoal` diagnostics check it.
#[cfg(target_os = "linux")]
pub fn loaded_blas_libraries() -> Vec<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut libs: Vec<String> = maps
        .lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .filter(|path| {
            let name = path.rsplit('/').next().unwrap_or(path);
            name.contains("blas") || name.contains("lapack")
        })
        .map(str::to_owned)
        .collect();
    libs.sort();
    libs.dedup();
    libs
}
