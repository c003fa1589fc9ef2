//! shoal's CPU products with affine-quantized weights against a plain reference: the weights
//! dequantized in f64 from the packed words (MLX's layout, read independently here) and
//! multiplied in f64, for 4 and 8 bits, groups of 32, 64 and 128, f32/f16/bf16 scales, one
//! to many rows, ragged output widths, strided inputs and sliced weights, on every instruction
//! set this machine has (the best one and the plain C++ path); MLX's own `quantized_matmul`
//! agrees with the same reference, which checks the layout. Bad operands give errors.

use inference::cpu_kernels::{affine_product, KernelIsa};
use inference::quantized::{QuantMode, QuantSpec};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{ops, Array, Dtype};
use proptest::prelude::*;

/// A small deterministic generator (xorshift), so each case is reproducible from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

struct Case {
    x: Vec<f32>,
    words: Vec<u32>,
    scales: Vec<f32>,
    biases: Vec<f32>,
    m: usize,
    n: usize,
    k: usize,
    group: usize,
    bits: usize,
}

impl Case {
    fn new(seed: u64, m: usize, n: usize, k: usize, group: usize, bits: usize) -> Case {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let words = (0..n * k * bits / 32).map(|_| rng.next() as u32).collect();
        let scales = (0..n * k / group).map(|_| rng.uniform() * 0.05).collect();
        let biases = (0..n * k / group).map(|_| rng.uniform() * 0.2).collect();
        let x = (0..m * k).map(|_| rng.uniform()).collect();
        Case {
            x,
            words,
            scales,
            biases,
            m,
            n,
            k,
            group,
            bits,
        }
    }

    /// Element `(r, c)` of the weights, as MLX's affine layout defines it.
    fn weight(&self, r: usize, c: usize) -> f64 {
        let per_word = 32 / self.bits;
        let word = self.words[r * self.k * self.bits / 32 + c / per_word];
        let q = (word >> (self.bits * (c % per_word))) & ((1u32 << self.bits) - 1);
        let g = r * self.k / self.group + c / self.group;
        // The scales and biases as the kernel reads them (rounded to their dtype by the caller).
        self.scales[g] as f64 * q as f64 + self.biases[g] as f64
    }

    fn reference(&self) -> Vec<f64> {
        let mut out = vec![0.0; self.m * self.n];
        for i in 0..self.m {
            for r in 0..self.n {
                out[i * self.n + r] = (0..self.k)
                    .map(|c| self.x[i * self.k + c] as f64 * self.weight(r, c))
                    .sum();
            }
        }
        out
    }

    fn spec(&self) -> QuantSpec {
        QuantSpec {
            group_size: self.group as i32,
            bits: self.bits as i32,
            mode: QuantMode::Affine,
        }
    }

    /// The operands as MLX arrays, scales and biases in `dtype` (and the case's own values
    /// rounded the same way, so the reference sees what the kernel sees).
    fn arrays(&mut self, dtype: Dtype) -> (Array, Array, Array, Array) {
        let groups = (self.n as i32, (self.k / self.group) as i32);
        let round = |v: &[f32]| -> (Array, Vec<f32>) {
            let a = Array::from_slice(v, &[groups.0, groups.1])
                .as_dtype(dtype)
                .unwrap();
            let back = a.as_dtype(Dtype::Float32).unwrap();
            back.eval().unwrap();
            (a, back.as_slice::<f32>().to_vec())
        };
        let (scales, s) = round(&self.scales);
        let (biases, b) = round(&self.biases);
        self.scales = s;
        self.biases = b;
        let x = Array::from_slice(&self.x, &[self.m as i32, self.k as i32]);
        let w = Array::from_slice(
            &self.words,
            &[self.n as i32, (self.k * self.bits / 32) as i32],
        );
        (x, w, scales, biases)
    }
}

fn host(a: &Array) -> Vec<f32> {
    let a = a.as_dtype(Dtype::Float32).unwrap();
    a.eval().unwrap();
    a.as_slice::<f32>().to_vec()
}

/// The worst difference from the reference, relative to the size of the terms summed.
fn worst(case: &Case, got: &[f32]) -> f64 {
    let want = case.reference();
    assert_eq!(got.len(), want.len());
    let scale = (case.k as f64).sqrt() * 0.5;
    want.iter()
        .zip(got)
        .map(|(w, &g)| (w - g as f64).abs() / scale.max(1.0))
        .fold(0.0, f64::max)
}

fn check(seed: u64, m: usize, n: usize, k: usize, group: usize, bits: usize, dtype: Dtype) {
    let mut case = Case::new(seed, m, n, k, group, bits);
    let (x, w, scales, biases) = case.arrays(dtype);
    for isa in [KernelIsa::Exact, KernelIsa::Scalar] {
        let out = affine_product(&x, &w, &scales, &biases, case.spec(), isa).unwrap();
        assert_eq!(out.shape(), [m as i32, n as i32]);
        let e = worst(&case, &host(&out));
        assert!(
            e < 2e-5,
            "{isa:?} m {m} n {n} k {k} group {group} bits {bits} {dtype:?}: off by {e}"
        );
    }
}

#[test]
fn every_layout_and_row_count_equals_the_reference() {
    let mut seed = 1;
    for bits in [4, 8] {
        for group in [32, 64, 128] {
            for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
                // 32 rows and more go through dequantized tiles and the BLAS's sgemm.
                for m in [1, 3, 4, 8, 31, 32, 45] {
                    seed += 1;
                    check(seed, m, 37, group * 3, group, bits, dtype);
                }
            }
        }
    }
}

#[test]
fn mlx_reads_the_layout_as_the_reference_does() {
    for bits in [4, 8] {
        let mut case = Case::new(7, 2, 16, 128, 64, bits);
        let (x, w, scales, biases) = case.arrays(Dtype::Float32);
        let out = ops::quantized_matmul(&x, &w, &scales, &biases, true, 64, bits as i32).unwrap();
        let e = worst(&case, &host(&out));
        assert!(e < 2e-5, "MLX's product differs from the reference by {e}");
    }
}

#[test]
fn strided_inputs_and_sliced_weights_are_read_right() {
    let mut case = Case::new(11, 6, 40, 256, 64, 4);
    let (x, w, scales, biases) = case.arrays(Dtype::Bfloat16);
    // x as a transposed view: its rows are not where a dense [6, 256] would have them.
    let xt = Array::from_slice(&case.x, &[6, 256])
        .transpose_axes(&[1, 0])
        .unwrap();
    let x_view = xt.transpose_axes(&[1, 0]).unwrap();
    // A batch axis, and a slice of the weights' rows (a tensor-parallel rank's share).
    let x3 = x.reshape(&[2, 3, 256]).unwrap();
    for isa in [KernelIsa::Exact, KernelIsa::Scalar] {
        let out = affine_product(&x_view, &w, &scales, &biases, case.spec(), isa).unwrap();
        assert!(worst(&case, &host(&out)) < 2e-5);
        let out3 = affine_product(&x3, &w, &scales, &biases, case.spec(), isa).unwrap();
        assert_eq!(out3.shape(), [2, 3, 40]);
        assert!(worst(&case, &host(&out3)) < 2e-5);
        let rows = affine_product(
            &x,
            &w.index((10..30, ..)),
            &scales.index((10..30, ..)),
            &biases.index((10..30, ..)),
            case.spec(),
            isa,
        )
        .unwrap();
        let all = host(&affine_product(&x, &w, &scales, &biases, case.spec(), isa).unwrap());
        let part = host(&rows);
        for i in 0..6 {
            assert_eq!(&part[i * 20..(i + 1) * 20], &all[i * 40 + 10..i * 40 + 30]);
        }
        // Input columns 64..192 (two whole groups of each row): a row-parallel share.
        let cols = affine_product(
            &x.index((.., 64..192)),
            &w.index((.., 8..24)),
            &scales.index((.., 1..3)),
            &biases.index((.., 1..3)),
            case.spec(),
            isa,
        )
        .unwrap();
        let mut narrow = Case::new(11, 6, 40, 256, 64, 4);
        narrow.scales = case.scales.clone();
        narrow.biases = case.biases.clone();
        let want: Vec<f64> = (0..6 * 40)
            .map(|o| {
                let (i, r) = (o / 40, o % 40);
                (64..192)
                    .map(|c| case.x[i * 256 + c] as f64 * narrow.weight(r, c))
                    .sum()
            })
            .collect();
        let got = host(&cols);
        let e = want
            .iter()
            .zip(&got)
            .map(|(w, &g)| (w - g as f64).abs())
            .fold(0.0, f64::max);
        assert!(e < 1e-4, "column slice off by {e}");
    }
}

/// The many-rows path (dequantized tiles and sgemm): more than one tile of output columns,
/// rows of `x` that are not contiguous, and output rows in a batch.
#[test]
fn many_rows_with_strided_inputs_and_several_tiles_equal_the_reference() {
    let (m, n, k) = (40, 300, 192);
    let mut case = Case::new(23, m, n, k, 64, 4);
    let (x, w, scales, biases) = case.arrays(Dtype::Float16);
    let xt = Array::from_slice(&case.x, &[m as i32, k as i32])
        .transpose_axes(&[1, 0])
        .unwrap();
    let x_view = xt.transpose_axes(&[1, 0]).unwrap();
    let x3 = x.reshape(&[4, 10, k as i32]).unwrap();
    for isa in [KernelIsa::Exact, KernelIsa::Scalar] {
        for input in [&x, &x_view] {
            let out = affine_product(input, &w, &scales, &biases, case.spec(), isa).unwrap();
            let e = worst(&case, &host(&out));
            assert!(e < 2e-5, "{isa:?}: off by {e}");
        }
        let out3 = affine_product(&x3, &w, &scales, &biases, case.spec(), isa).unwrap();
        assert_eq!(out3.shape(), [4, 10, n as i32]);
        assert!(worst(&case, &host(&out3)) < 2e-5);
    }
}

#[test]
fn operands_that_do_not_fit_are_errors() {
    let mut case = Case::new(3, 2, 8, 64, 32, 4);
    let (x, w, scales, biases) = case.arrays(Dtype::Float32);
    let spec = case.spec();
    let with = |bits: i32, group: i32| QuantSpec {
        bits,
        group_size: group,
        ..spec
    };
    let cases = [
        affine_product(&x, &w, &scales, &biases, with(3, 32), KernelIsa::Best),
        affine_product(&x, &w, &scales, &biases, with(4, 12), KernelIsa::Best),
        affine_product(&x, &w, &scales, &biases, with(8, 32), KernelIsa::Best),
        affine_product(
            &x.index((.., 0..32)),
            &w,
            &scales,
            &biases,
            spec,
            KernelIsa::Best,
        ),
        affine_product(
            &x.as_dtype(Dtype::Float16).unwrap(),
            &w,
            &scales,
            &biases,
            spec,
            KernelIsa::Best,
        ),
        affine_product(
            &x,
            &w,
            &scales.index((.., 0..1)),
            &biases,
            spec,
            KernelIsa::Best,
        ),
    ];
    for (i, result) in cases.into_iter().enumerate() {
        assert!(result.is_err(), "case {i} was accepted");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]
    /// Random shapes, ragged widths included.
    #[test]
    fn random_shapes_equal_the_reference(
        seed in 0u64..1_000_000,
        m in 1usize..12,
        n in 1usize..70,
        groups in 1usize..5,
        group in prop::sample::select(vec![32usize, 64, 128]),
        bits in prop::sample::select(vec![4usize, 8]),
    ) {
        check(seed, m, n, groups * group, group, bits, Dtype::Float32);
    }
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The gathered product: each batch entry's rows against its expert's matrix, as MLX's
/// `gather_qmm` computes it (the reference here), with indices broadcast against `x`, in any
/// order, repeated, and out of range (those rows are zero, never a read past the weights).
#[test]
fn gathered_products_equal_mlx_gather_qmm() {
    use inference::cpu_kernels::affine_gather_product;
    for (bits, group) in [(4, 64), (8, 32), (4, 128)] {
        let (experts, n, k) = (5, 24, group * 2);
        let mut case = Case::new(21 + bits as u64, 1, experts * n, k, group, bits);
        let (_, w, scales, biases) = case.arrays(Dtype::Bfloat16);
        let packed = w.reshape(&[experts as i32, n as i32, -1]).unwrap();
        let scales = scales.reshape(&[experts as i32, n as i32, -1]).unwrap();
        let biases = biases.reshape(&[experts as i32, n as i32, -1]).unwrap();
        let spec = case.spec();
        let mut rng = Rng(99);
        // Decode-shaped: [tokens, 1, 1, k] against [tokens, top_k] picks.
        let tokens = 3;
        let x: Vec<f32> = (0..tokens * k).map(|_| rng.uniform()).collect();
        let x = Array::from_slice(&x, &[tokens as i32, 1, 1, k as i32]);
        let picks = Array::from_slice(&[4u32, 0, 2, 2, 1, 4], &[tokens as i32, 2]);
        let want = ops::gather_qmm(
            &x,
            &packed,
            &scales,
            &biases,
            None,
            &picks,
            true,
            group as i32,
            bits as i32,
            false,
        )
        .unwrap();
        // Prefill-shaped: one row per (token, expert) pair, sorted by expert.
        let rows = x.reshape(&[tokens as i32, 1, k as i32]).unwrap();
        let sorted = Array::from_slice(&[0u32, 3, 3], &[3]);
        let want_sorted = ops::gather_qmm(
            &rows,
            &packed,
            &scales,
            &biases,
            None,
            &sorted,
            true,
            group as i32,
            bits as i32,
            true,
        )
        .unwrap();
        for isa in [KernelIsa::Exact, KernelIsa::Scalar] {
            let got =
                affine_gather_product(&x, &packed, &scales, &biases, &picks, spec, isa).unwrap();
            assert_eq!(got.shape(), want.shape());
            let (g, w) = (host(&got), host(&want));
            let e = max_diff(&g, &w);
            assert!(e < 1e-4, "{isa:?} {bits}-bit: {e}");
            let got = affine_gather_product(&rows, &packed, &scales, &biases, &sorted, spec, isa)
                .unwrap();
            let (g, w) = (host(&got), host(&want_sorted));
            assert_eq!(g.len(), w.len());
            let e = max_diff(&g, &w);
            assert!(e < 1e-4, "{isa:?} {bits}-bit sorted: {e}");
        }
        // An expert index past the stack gives zeros, not a crash.
        let bad = Array::from_slice(&[7u32, 1, 2, 2, 1, 4], &[tokens as i32, 2]);
        let got = host(
            &affine_gather_product(&x, &packed, &scales, &biases, &bad, spec, KernelIsa::Best)
                .unwrap(),
        );
        assert!(got[..n].iter().all(|&v| v == 0.0));
        assert!(got[n..].iter().any(|&v| v != 0.0));
    }
}

/// Many tokens routed to one expert (a prefill): that expert's rows take the many-rows path,
/// and its output rows are not next to each other (each token's row holds both its experts).
#[test]
fn an_expert_with_many_rows_equals_mlx_gather_qmm() {
    use inference::cpu_kernels::affine_gather_product;
    let (experts, n, k, group, bits) = (5, 40, 128, 64, 4);
    let mut case = Case::new(31, 1, experts * n, k, group, bits);
    let (_, w, scales, biases) = case.arrays(Dtype::Float16);
    let packed = w.reshape(&[experts as i32, n as i32, -1]).unwrap();
    let scales = scales.reshape(&[experts as i32, n as i32, -1]).unwrap();
    let biases = biases.reshape(&[experts as i32, n as i32, -1]).unwrap();
    let mut rng = Rng(5);
    let tokens = 40;
    let x: Vec<f32> = (0..tokens * k).map(|_| rng.uniform()).collect();
    let x = Array::from_slice(&x, &[tokens as i32, 1, 1, k as i32]);
    // Every token picks expert 4 (40 rows) and one of the others.
    let picks: Vec<u32> = (0..tokens).flat_map(|t| [4, t as u32 % 4]).collect();
    let picks = Array::from_slice(&picks, &[tokens as i32, 2]);
    let want = ops::gather_qmm(
        &x,
        &packed,
        &scales,
        &biases,
        None,
        &picks,
        true,
        group as i32,
        bits as i32,
        false,
    )
    .unwrap();
    for isa in [KernelIsa::Exact, KernelIsa::Scalar] {
        let got =
            affine_gather_product(&x, &packed, &scales, &biases, &picks, case.spec(), isa).unwrap();
        let e = max_diff(&host(&got), &host(&want));
        assert!(e < 1e-4, "{isa:?}: {e}");
    }
}

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
