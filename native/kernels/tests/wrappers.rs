//! The Rust wrappers over the C++ entries, on operands small enough to check by hand: an
//! 8-bit product and its dequantization against the affine formula, RMS norm against its
//! definition, and a rejected operand's reason reaching the caller. The full coverage of the
//! kernels (every width and group, each instruction set, strided operands, the gathered form)
//! is `inference`'s `cpu_qmm`, `cpu_qmm_int8` and `cpu_layer_ops` tests, through the choice of
//! kernel that crate adds; see `README.md`.

use kernels::{affine_dequantize, affine_product, fused_rms_norm, KernelIsa, Layout};
use mlx_rs::Array;

/// Two rows of 32 8-bit weights, `q[r][c] = (7 * r + 3 * c) % 256`, packed four to a
/// little-endian word as MLX packs them; one group per row with scale `0.5 + r` and bias `-r`.
fn operands() -> (Array, Array, Array, Vec<f32>) {
    let q = |r: u32, c: u32| (7 * r + 3 * c) % 256;
    let words: Vec<u32> = (0..2u32)
        .flat_map(|r| (0..8u32).map(move |w| (0..4).map(|b| q(r, 4 * w + b) << (8 * b)).sum()))
        .collect();
    let dense: Vec<f32> = (0..2u32)
        .flat_map(|r| (0..32u32).map(move |c| (0.5 + r as f32) * q(r, c) as f32 - r as f32))
        .collect();
    let packed = Array::from_slice(&words, &[2, 8]);
    let scales = Array::from_slice(&[0.5f32, 1.5], &[2, 1]);
    let biases = Array::from_slice(&[0.0f32, -1.0], &[2, 1]);
    (packed, scales, biases, dense)
}

/// The operands' layout: 8-bit weights, one group of 32 per row.
const EIGHT_BITS: Layout = Layout {
    group_size: 32,
    bits: 8,
};

fn host(a: &Array) -> Vec<f32> {
    a.eval().unwrap();
    a.as_slice::<f32>().to_vec()
}

#[test]
fn the_plain_path_is_always_there() {
    assert!(KernelIsa::Scalar.is_available());
    assert!(KernelIsa::available().contains(&KernelIsa::Exact));
}

#[test]
fn an_8_bit_product_and_its_dequantization_follow_the_affine_formula() {
    let (packed, scales, biases, dense) = operands();
    let weights =
        host(&affine_dequantize(&packed, &scales, &biases, EIGHT_BITS, KernelIsa::Scalar).unwrap());
    assert_eq!(weights, dense);
    let x: Vec<f32> = (0..32).map(|c| (c as f32 - 16.0) / 8.0).collect();
    let want: Vec<f32> = dense
        .chunks(32)
        .map(|row| row.iter().zip(&x).map(|(w, x)| w * x).sum())
        .collect();
    let x = Array::from_slice(&x, &[1, 32]);
    for isa in [KernelIsa::Scalar, KernelIsa::Exact] {
        let got = host(&affine_product(&x, &packed, &scales, &biases, EIGHT_BITS, isa).unwrap());
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (g - w).abs() <= 1e-4 * w.abs().max(1.0),
                "{isa:?}: {got:?} against {want:?}"
            );
        }
    }
}

#[test]
fn rms_norm_follows_its_definition() {
    let x = [1.0f32, -2.0, 3.0, 0.5];
    let w = [1.0f32, 0.5, 2.0, -1.0];
    let rms = (x.iter().map(|v| v * v).sum::<f32>() / 4.0 + 1e-5).sqrt();
    let got = host(
        &fused_rms_norm(
            &Array::from_slice(&x, &[1, 4]),
            &Array::from_slice(&w, &[4]),
            1e-5,
        )
        .unwrap(),
    );
    for i in 0..4 {
        assert!((got[i] - x[i] / rms * w[i]).abs() < 1e-6, "{got:?}");
    }
}

#[test]
fn a_rejected_operand_says_why() {
    let (packed, scales, biases, _) = operands();
    let x = Array::from_slice(&[0.0f32; 16], &[1, 16]);
    let why = affine_product(&x, &packed, &scales, &biases, EIGHT_BITS, KernelIsa::Scalar)
        .unwrap_err()
        .to_string();
    assert!(
        why.starts_with("MLX rejected shoal_cpu_affine_qmm: "),
        "{why}"
    );
    assert!(why.contains("does not match w's packed width"), "{why}");
}
