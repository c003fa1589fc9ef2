//! shoal's decode-sized quantized products on int8 x (see `inference::cpu_kernels`): every
//! int8 path this CPU has (AVX2, AVX-VNNI, AVX-512 VNNI, and the plain C++ one they are checked
//! against) within the rounding bound of an f64 reference for 4- and 8-bit weights, groups of
//! 32, 64 and 128, f32/f16/bf16 scales, 1 to 31 rows, the gathered form and random shapes;
//! groups below 32 keep x exact.

use inference::cpu_kernels::{affine_product, KernelIsa};
use mlx_rs::{Array, Dtype};
use proptest::prelude::*;

mod common;

use common::qmm_case::{host, max_diff, worst, Case, Rng};

/// The most an int8-x product may differ from the exact sum at output column `r` for the row
/// `x`: each x is rounded to a step of `dx = max|x| / 127` of its chunk of 32, so by at most
/// `dx / 2`, and multiplies the centred weight `scale * (q - middle)` (the kernel gives the
/// rest, `bias + scale * middle`, the exact sum of x). Plus the float rounding every path has.
fn int8_bound(case: &Case, x: &[f32], r: usize) -> f64 {
    let per_word = 32 / case.bits;
    let mut bound = 0.0;
    for chunk in 0..case.k / 32 {
        let cols = chunk * 32..(chunk + 1) * 32;
        let dx = cols.clone().map(|c| x[c].abs()).fold(0.0f32, f32::max) as f64 / 127.0;
        let scale = case.scales[r * case.k / case.group + chunk * 32 / case.group].abs() as f64;
        let middle = (1u32 << (case.bits - 1)) as f64;
        let q_sum: f64 = cols
            .map(|c| {
                let word = case.words[r * case.k * case.bits / 32 + c / per_word];
                let q = (word >> (case.bits * (c % per_word))) & ((1u32 << case.bits) - 1);
                (q as f64 - middle).abs()
            })
            .sum();
        bound += scale * q_sum * dx / 2.0;
    }
    bound + 2e-5 * (case.k as f64).sqrt() * 0.5
}

/// The int8 paths this CPU runs, the plain C++ one first.
fn int8_paths() -> Vec<KernelIsa> {
    let paths: Vec<KernelIsa> = KernelIsa::available()
        .into_iter()
        .filter(|isa| isa.rounds_x(1, 32, 4) && *isa != KernelIsa::Best)
        .collect();
    assert_eq!(paths.first(), Some(&KernelIsa::Int8Scalar));
    if cfg!(target_arch = "x86_64") && std::is_x86_feature_detected!("avx2") {
        assert!(paths.contains(&KernelIsa::Int8Avx2), "{paths:?}");
    }
    paths
}

/// Every output of `isa` within [`int8_bound`] of the reference; returns the largest
/// difference from the exact sum (zero would mean x was not rounded at all).
fn check_int8(case: &mut Case, dtype: Dtype, isa: KernelIsa) -> f64 {
    let (x, w, scales, biases) = case.arrays(dtype);
    let got = host(&affine_product(&x, &w, &scales, &biases, case.spec(), isa).unwrap());
    let want = case.reference();
    let mut largest: f64 = 0.0;
    for i in 0..case.m {
        let row = &case.x[i * case.k..(i + 1) * case.k];
        for r in 0..case.n {
            let off = (got[i * case.n + r] as f64 - want[i * case.n + r]).abs();
            let bound = int8_bound(case, row, r);
            assert!(
                off <= bound,
                "{isa:?} m {} n {} k {} group {} bits {} {dtype:?}: output ({i}, {r}) off by \
                 {off}, bound {bound}",
                case.m,
                case.n,
                case.k,
                case.group,
                case.bits
            );
            largest = largest.max(off);
        }
    }
    largest
}

/// Decode-sized products on int8 x (every int8 path this CPU has, and `Best`, which takes one
/// below 32 rows): within the rounding bound for every layout and row count, and really
/// rounded (so the bound is what is tested, not an exact path by accident).
#[test]
fn int8_paths_stay_within_the_rounding_bound() {
    let mut seed = 500;
    let mut paths = int8_paths();
    paths.push(KernelIsa::Best);
    for isa in paths {
        for bits in [4, 8] {
            for group in [32, 64, 128] {
                for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
                    for m in [1, 2, 3, 4, 5, 8, 31] {
                        seed += 1;
                        assert!(isa.rounds_x(m, group as i32, bits as i32), "{isa:?}");
                        let mut case = Case::new(seed, m, 37, group * 3, group, bits);
                        let largest = check_int8(&mut case, dtype, isa);
                        assert!(largest > 1e-6, "{isa:?} {bits}-bit: x was not rounded");
                    }
                }
            }
        }
    }
}

/// The instruction-set forms compute the same integer sums as the plain C++ int8 path: only
/// the order of the float additions differs.
#[test]
fn int8_instruction_sets_equal_the_plain_int8_path() {
    let paths = int8_paths();
    println!("int8 paths on this CPU: {paths:?}");
    for bits in [4, 8] {
        for (m, group) in [(1, 32), (3, 64), (8, 128), (13, 32)] {
            let mut case = Case::new(77 + m as u64, m, 53, group * 4, group, bits);
            let (x, w, scales, biases) = case.arrays(Dtype::Float16);
            let plain = host(
                &affine_product(&x, &w, &scales, &biases, case.spec(), KernelIsa::Int8Scalar)
                    .unwrap(),
            );
            for &isa in &paths[1..] {
                let got =
                    host(&affine_product(&x, &w, &scales, &biases, case.spec(), isa).unwrap());
                let e = max_diff(&got, &plain);
                assert!(
                    e < 1e-4,
                    "{isa:?} {bits}-bit m {m}: {e} from the plain int8 path"
                );
            }
        }
    }
}

/// Groups that int8 x does not serve (not a multiple of 32) stay exact on every path.
#[test]
fn groups_below_32_keep_x_exact() {
    for (group, bits) in [(16, 4), (8, 8), (16, 8)] {
        let mut case = Case::new(900 + group as u64, 2, 19, group * 3, group, bits);
        let (x, w, scales, biases) = case.arrays(Dtype::Float32);
        for isa in KernelIsa::available() {
            assert!(!isa.rounds_x(2, group as i32, bits as i32), "{isa:?}");
            let out = affine_product(&x, &w, &scales, &biases, case.spec(), isa).unwrap();
            let e = worst(&case, &host(&out));
            assert!(e < 2e-5, "{isa:?} group {group} {bits}-bit: off by {e}");
        }
    }
}

/// The gathered product on int8 x: each (token, expert) row within the rounding bound of its
/// expert's exact product.
#[test]
fn gathered_int8_products_stay_within_the_rounding_bound() {
    use inference::cpu_kernels::affine_gather_product;
    let (experts, n, k, group) = (4, 24, 128, 32);
    for bits in [4, 8] {
        let mut case = Case::new(61 + bits as u64, 1, experts * n, k, group, bits);
        let (_, w, scales, biases) = case.arrays(Dtype::Bfloat16);
        let packed = w.reshape(&[experts as i32, n as i32, -1]).unwrap();
        let scales = scales.reshape(&[experts as i32, n as i32, -1]).unwrap();
        let biases = biases.reshape(&[experts as i32, n as i32, -1]).unwrap();
        let mut rng = Rng(17);
        let tokens = 3;
        let xs: Vec<f32> = (0..tokens * k).map(|_| rng.uniform()).collect();
        let x = Array::from_slice(&xs, &[tokens as i32, 1, 1, k as i32]);
        let picks = [3u32, 0, 2, 2, 1, 3];
        let pick_array = Array::from_slice(&picks, &[tokens as i32, 2]);
        for isa in int8_paths() {
            let got = host(
                &affine_gather_product(
                    &x,
                    &packed,
                    &scales,
                    &biases,
                    &pick_array,
                    case.spec(),
                    isa,
                )
                .unwrap(),
            );
            assert_eq!(got.len(), tokens * 2 * n);
            for (slot, &expert) in picks.iter().enumerate() {
                let row = &xs[(slot / 2) * k..(slot / 2 + 1) * k];
                for r in 0..n {
                    let column = expert as usize * n + r;
                    let want: f64 = (0..k).map(|c| row[c] as f64 * case.weight(column, c)).sum();
                    let off = (got[slot * n + r] as f64 - want).abs();
                    let bound = int8_bound(&case, row, column);
                    assert!(
                        off <= bound,
                        "{isa:?} {bits}-bit pick {slot}: {off} > {bound}"
                    );
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]
    /// Random shapes on every int8 path, ragged widths included.
    #[test]
    fn int8_random_shapes_stay_within_the_rounding_bound(
        seed in 0u64..1_000_000,
        m in 1usize..32,
        n in 1usize..70,
        groups in 1usize..5,
        group in prop::sample::select(vec![32usize, 64, 128]),
        bits in prop::sample::select(vec![4usize, 8]),
    ) {
        for isa in int8_paths() {
            let mut case = Case::new(seed, m, n, groups * group, group, bits);
            check_int8(&mut case, Dtype::Float32, isa);
        }
    }
}
