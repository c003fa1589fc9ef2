//! Raw bindings to mlx-c, generated at build time from the mlx-sys 0.7.0 sources that
//! `cargo xtask setup` downloaded and patched (see "How MLX is built on Linux" in
//! `docs/architecture.md`).
//!
//! This crate replaces the published `mlx-sys` through `[patch.crates-io]`, because the
//! published build script only knows how to build for Apple platforms with network access.
#![allow(non_upper_case_globals)]
#![allow(non_camel_case_types)]
#![allow(non_snake_case)]
#![allow(clippy::all)]
#![allow(missing_docs)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

/// mlx-rs seeds its random generator with macOS's `mach_approximate_time`. Off Apple
/// platforms that symbol does not exist, so the link of every mlx-rs program would fail;
/// a monotonic nanosecond clock serves the same purpose (a seed, never compared across hosts).
#[cfg(not(target_vendor = "apple"))]
#[unsafe(no_mangle)]
pub extern "C" fn mach_approximate_time() -> u64 {
    use std::time::Instant;
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let start = START.get_or_init(Instant::now);
    // Offset by one so the seed is never zero.
    start.elapsed().as_nanos() as u64 + 1
}
