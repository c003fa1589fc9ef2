//! shoal's CPU products with affine-quantized weights against a plain reference: the weights
//! dequantized in f64 from the packed words (MLX's layout, read independently here) and
//! multiplied in f64, for 2, 3, 4, 5, 6 and 8 bits, groups of 16, 32, 64 and 128, f32/f16/bf16
//! scales, one to many rows, ragged output widths, strided inputs and sliced weights, the
//! gathered form and the dequantization, with x kept in f32 (`KernelIsa::Exact`, the fastest
//! such path this machine has, and the plain C++ one; the int8-x paths of decode-sized
//! products are `cpu_qmm_int8.rs`); MLX's own `quantized_matmul` agrees with the same reference
//! wherever it takes the layout (groups of 32 and more), which checks that the packing is
//! MLX's. Bad operands give errors.

use inference::cpu_kernels::{affine_product, KernelIsa};
use inference::quantized::QuantSpec;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{ops, Array, Dtype};
use proptest::prelude::*;

mod common;

use common::qmm_case::{host, max_diff, worst, Case, Rng};

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

/// Every width the kernel serves.
const BITS: [usize; 6] = [2, 3, 4, 5, 6, 8];

/// `groups` groups of `group` columns, doubled when the rows would not fill whole words.
fn columns(groups: usize, group: usize, bits: usize) -> usize {
    let k = groups * group;
    if (k * bits).is_multiple_of(32) {
        k
    } else {
        2 * k
    }
}

#[test]
fn every_layout_and_row_count_equals_the_reference() {
    let mut seed = 1;
    for bits in BITS {
        for group in [16, 32, 64, 128] {
            for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
                // 32 rows and more go through dequantized tiles and the BLAS's sgemm.
                for m in [1, 3, 4, 8, 31, 32, 45] {
                    seed += 1;
                    check(seed, m, 37, columns(3, group, bits), group, bits, dtype);
                }
            }
        }
    }
}

#[test]
fn mlx_reads_the_layout_as_the_reference_does() {
    for bits in BITS {
        for group in [32, 64] {
            let mut case = Case::new(7, 2, 16, 128, group, bits);
            let (x, w, scales, biases) = case.arrays(Dtype::Float32);
            let out =
                ops::quantized_matmul(&x, &w, &scales, &biases, true, group as i32, bits as i32)
                    .unwrap();
            let e = worst(&case, &host(&out));
            assert!(
                e < 2e-5,
                "MLX's {bits}-bit product differs from the reference by {e}"
            );
        }
    }
}

/// The dequantization (embedding lookups of such weights): every weight equals the
/// reference's, for every layout, a stack of matrices included.
#[test]
fn dequantized_weights_equal_the_reference() {
    use inference::cpu_kernels::affine_dequantize;
    let mut seed = 500;
    for bits in BITS {
        for group in [16, 32, 128] {
            seed += 1;
            let (n, k) = (6, columns(2, group, bits));
            let mut case = Case::new(seed, 1, n, k, group, bits);
            let (_, w, scales, biases) = case.arrays(Dtype::Bfloat16);
            let stack = |a: &Array| a.reshape(&[2, 3, -1]).unwrap();
            for isa in [KernelIsa::Exact, KernelIsa::Scalar] {
                for (w, s, b) in [
                    (w.clone(), scales.clone(), biases.clone()),
                    (stack(&w), stack(&scales), stack(&biases)),
                ] {
                    let got = affine_dequantize(&w, &s, &b, case.spec(), isa).unwrap();
                    let mut want_shape = w.shape().to_vec();
                    *want_shape.last_mut().unwrap() = k as i32;
                    assert_eq!(got.shape(), want_shape.as_slice());
                    let got = host(&got);
                    for (i, &g) in got.iter().enumerate() {
                        let want = case.weight(i / k, i % k);
                        assert!(
                            (g as f64 - want).abs() <= 1e-6 * want.abs().max(1.0),
                            "{isa:?} {bits} bits, groups of {group}: weight {i} is {g}, not {want}"
                        );
                    }
                }
            }
        }
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

/// Products large enough to be shared with the crew (chunks claimed by each thread, the
/// dequantized tiles of many-row products too), back to back with changing shapes so that a
/// helper still busy with, or late for, one product meets the next: each equals the reference.
/// Ragged widths (not a multiple of the 8-column chunk alignment) and a large `k` (narrower
/// tiles) included.
#[test]
fn shared_products_back_to_back_equal_the_reference() {
    let shapes = [
        (1, 520, 512),
        (3, 300, 4096),
        (40, 520, 512),
        (40, 300, 4096),
        (7, 1000, 512),
    ];
    for round in 0..12u64 {
        for (i, &(m, n, k)) in shapes.iter().enumerate() {
            let mut case = Case::new(100 + round * 8 + i as u64, m, n, k, 64, 4);
            let (x, w, scales, biases) = case.arrays(Dtype::Float32);
            let out =
                affine_product(&x, &w, &scales, &biases, case.spec(), KernelIsa::Exact).unwrap();
            let e = worst(&case, &host(&out));
            assert!(e < 2e-5, "round {round}, m {m} n {n} k {k}: off by {e}");
        }
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
        affine_product(&x, &w, &scales, &biases, with(7, 32), KernelIsa::Best),
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
        group in prop::sample::select(vec![16usize, 32, 64, 128]),
        bits in prop::sample::select(BITS.to_vec()),
    ) {
        check(seed, m, n, columns(groups, group, bits), group, bits, Dtype::Float32);
    }
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

/// The gathered form for every width (groups of 16 too, which MLX's `gather_qmm` refuses):
/// each (token, pick) row against its expert's matrix, from the reference.
#[test]
fn gathered_products_of_every_width_equal_the_reference() {
    use inference::cpu_kernels::affine_gather_product;
    let mut seed = 900;
    for bits in BITS {
        for group in [16, 32] {
            seed += 1;
            let (experts, n, k) = (4, 12, columns(4, group, bits));
            let mut case = Case::new(seed, 1, experts * n, k, group, bits);
            let (_, w, scales, biases) = case.arrays(Dtype::Float32);
            let stack = |a: &Array| a.reshape(&[experts as i32, n as i32, -1]).unwrap();
            let (packed, scales, biases) = (stack(&w), stack(&scales), stack(&biases));
            let mut rng = Rng(seed);
            // Decode-shaped (one row per token) and a token whose rows take the many-rows path.
            for (tokens, m) in [(3usize, 1usize), (2, 40)] {
                let xs: Vec<f32> = (0..tokens * m * k).map(|_| rng.uniform()).collect();
                let x = Array::from_slice(&xs, &[tokens as i32, 1, m as i32, k as i32]);
                let picks: Vec<u32> = (0..tokens * 2).map(|i| (i * 3 % experts) as u32).collect();
                let picks_array = Array::from_slice(&picks, &[tokens as i32, 2]);
                for isa in [KernelIsa::Exact, KernelIsa::Scalar] {
                    let got = affine_gather_product(
                        &x,
                        &packed,
                        &scales,
                        &biases,
                        &picks_array,
                        case.spec(),
                        isa,
                    )
                    .unwrap();
                    assert_eq!(got.shape(), [tokens as i32, 2, m as i32, n as i32]);
                    let got = host(&got);
                    for (o, &g) in got.iter().enumerate() {
                        let (t, j, i, r) = (o / (2 * m * n), o / (m * n) % 2, o / n % m, o % n);
                        let e = picks[t * 2 + j] as usize;
                        let want: f64 = (0..k)
                            .map(|c| xs[(t * m + i) * k + c] as f64 * case.weight(e * n + r, c))
                            .sum();
                        assert!(
                            (g as f64 - want).abs() < 1e-4,
                            "{isa:?} {bits} bits, groups of {group}, {m} rows: {g} != {want}"
                        );
                    }
                }
            }
        }
    }
}

/// SwiGLU's gate and up products as one primitive (`linear::swiglu`) give what
/// the two products and MLX's `silu` and product give, for decode rows, a few rows and a
/// prompt's (the sgemm path), 4 and 8 bits, f32 and f16 scales; a dense or biased projection
/// is not served (the MLP composes the operations then).
#[test]
fn swiglu_product_equals_its_composition() {
    use inference::linear::{swiglu as swiglu_product, Linear, Matrix};
    use inference::quantized::QuantizedMatrix;
    let linear = |w: Array, scales: Array, biases: Array, spec| Linear {
        weight: Matrix::Quantized(QuantizedMatrix {
            packed: w,
            scales,
            biases: Some(biases),
            spec,
        }),
        bias: None,
    };
    let mut seed = 900;
    for (m, bits, group, dtype) in [
        (1, 4, 32, Dtype::Float32),
        (1, 4, 64, Dtype::Float16),
        (3, 8, 32, Dtype::Float32),
        (6, 4, 32, Dtype::Float16),
        (40, 4, 32, Dtype::Float32),
    ] {
        seed += 2;
        let k = columns(3, group, bits);
        let mut g = Case::new(seed, m, 29, k, group, bits);
        let mut u = Case::new(seed + 1, m, 29, k, group, bits);
        let (x, wg, sg, bg) = g.arrays(dtype);
        let (_, wu, su, bu) = u.arrays(dtype);
        let gate_out = affine_product(&x, &wg, &sg, &bg, g.spec(), KernelIsa::Exact).unwrap();
        let up_out = affine_product(&x, &wu, &su, &bu, u.spec(), KernelIsa::Exact).unwrap();
        let want = host(&ops::multiply(mlx_rs::nn::silu(&gate_out).unwrap(), &up_out).unwrap());
        let (gate, up) = (linear(wg, sg, bg, g.spec()), linear(wu, su, bu, u.spec()));
        let got = swiglu_product(&x, &gate, &up)
            .unwrap()
            .expect("served: both quantized alike, no bias");
        assert_eq!(got.shape(), [m as i32, 29]);
        let got = host(&got);
        let big = want.iter().fold(1.0f32, |a, v| a.max(v.abs()));
        let d = max_diff(&got, &want);
        assert!(
            d <= 1e-5 * big,
            "m {m} bits {bits} group {group} {dtype:?}: off by {d}"
        );
        let dense = Linear {
            weight: Matrix::Dense(ops::ones::<f32>(&[29, k as i32]).unwrap()),
            bias: None,
        };
        assert!(swiglu_product(&x, &gate, &dense).unwrap().is_none());
        let biased = Linear {
            bias: Some(ops::ones::<f32>(&[29]).unwrap()),
            ..up
        };
        assert!(swiglu_product(&x, &gate, &biased).unwrap().is_none());
    }
}
