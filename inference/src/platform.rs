//! Facts about, and requests to, the platform this process runs on.

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

/// Asks Linux to back the memory of `arrays` (evaluated weights) with 2 MiB pages; returns the
/// bytes it could advise.
///
/// Decoding reads every weight once per token: about 135,000 pages of 4 KiB per token for
/// SmolLM2-135M in f32, and the TLB misses that come with them. Linux's default THP mode,
/// `madvise`, only gives huge pages where a program asks, so ask: `MADV_HUGEPAGE` for what is
/// faulted in later and `MADV_COLLAPSE` (Linux 6.1 and newer) to rebuild the pages already
/// loaded now. Measured on the 2-core development machine: about 10% more generation speed. It
/// is advice: a kernel that refuses costs speed, never correctness, so errors are ignored.
#[cfg(target_os = "linux")]
pub fn prefer_huge_pages(arrays: &[&mlx_rs::Array]) -> usize {
    const PAGE: usize = 4096;
    // Allocations this close together are advised as one range, so that 2 MiB pages also
    // cover the tensors smaller than one (SmolLM2: 540 of 588 MB on huge pages, against 440
    // when each tensor is advised alone).
    const GAP: usize = 2 << 20;
    let mut ranges: Vec<(usize, usize)> = arrays
        .iter()
        .filter(|a| a.nbytes() > 0)
        .map(|a| {
            // SAFETY: reading the data pointer of an evaluated array; no access through it.
            let start = unsafe { mlx_sys::mlx_array_data_uint8(a.as_ptr()) } as usize;
            (
                start / PAGE * PAGE,
                (start + a.nbytes()).div_ceil(PAGE) * PAGE,
            )
        })
        .filter(|&(start, _)| start != 0)
        .collect();
    ranges.sort_unstable();
    let mut merged: Vec<(usize, usize)> = Vec::new();
    for (start, end) in ranges {
        match merged.last_mut() {
            Some(last) if start <= last.1 + GAP => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    let mut advised = 0;
    for (start, end) in merged {
        let (ptr, len) = (start as *mut libc::c_void, end - start);
        // SAFETY: advice on pages of this process's own mappings; it changes how they are
        // backed, never their contents. Gaps between allocations fail with ENOMEM and are
        // skipped by the kernel, which still advises the mapped parts.
        unsafe {
            if libc::madvise(ptr, len, libc::MADV_HUGEPAGE) == 0 {
                advised += len;
            }
            libc::madvise(ptr, len, MADV_COLLAPSE);
        }
    }
    advised
}

/// `MADV_COLLAPSE` (Linux 6.1): not in the libc crate for every target.
#[cfg(target_os = "linux")]
const MADV_COLLAPSE: libc::c_int = 25;

/// Huge pages are a Linux request; elsewhere nothing to do.
#[cfg(not(target_os = "linux"))]
pub fn prefer_huge_pages(_arrays: &[&mlx_rs::Array]) -> usize {
    0
}
