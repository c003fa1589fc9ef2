//! shoal's CPU primitives for a layer's small operations (`inference::cpu_layer_ops`) against
//! MLX's own `fast::` operations, which on the CPU run as their compositions: RMS norm, RoPE
//! (offsets, per-entry positions, partial widths, periods, scales) and attention (grouped
//! heads, causal, boolean and additive masks, a row with every key masked, keys and values
//! that are views of a larger cache), with strided inputs, plus attention against an f64
//! reference written here. Bad operands give errors; a property test draws random shapes.

use inference::cpu_layer_ops::{
    fused_attention, fused_rms_norm, fused_rope, RopePositions, FUSED_ATTENTION_MAX_QUERIES,
};
use mlx_rs::fast::{self, ScaledDotProductAttentionMask};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};
use proptest::prelude::*;

mod common;

use common::qmm_case::{host, max_diff, Rng};

/// Seeded values in `[-scale, scale)`, as `shape`.
fn random(seed: u64, shape: &[i32], scale: f32) -> Array {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let n: i32 = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| rng.uniform() * scale).collect();
    Array::from_slice(&v, shape)
}

/// `a` and `b` agree within `tol` relative to `b`'s largest magnitude (at least 1).
fn assert_close(what: &str, a: &Array, b: &Array, tol: f32) {
    assert_eq!(a.shape(), b.shape(), "{what}: shapes");
    let (a, b) = (host(a), host(b));
    let big = b.iter().fold(1.0f32, |m, x| m.max(x.abs()));
    let d = max_diff(&a, &b);
    assert!(d <= tol * big, "{what}: off by {d} (largest {big})");
    assert!(a.iter().all(|x| x.is_finite()), "{what}: not finite");
}

#[test]
fn rms_norm_equals_mlx_for_plain_and_strided_rows() {
    for (seed, shape) in [(1, vec![1, 1, 576]), (2, vec![2, 5, 64]), (3, vec![3, 7])] {
        let x = random(seed, &shape, 3.0);
        let w = random(seed + 10, &[*shape.last().unwrap()], 1.5);
        assert_close(
            &format!("rms_norm {shape:?}"),
            &fused_rms_norm(&x, &w, 1e-5).unwrap(),
            &fast::rms_norm(&x, Some(&w), 1e-5).unwrap(),
            2e-6,
        );
    }
    // A transposed view: rows are not contiguous.
    let x = random(4, &[6, 3, 64], 2.0)
        .transpose_axes(&[1, 0, 2])
        .unwrap();
    let w = random(5, &[64], 1.0);
    assert_close(
        "rms_norm of a transposed view",
        &fused_rms_norm(&x, &w, 1e-6).unwrap(),
        &fast::rms_norm(&x, Some(&w), 1e-6).unwrap(),
        2e-6,
    );
}

/// `[b, heads, l, d]` as the attention passes it: a projection `[b, l, heads, d]` transposed.
fn heads(seed: u64, b: i32, heads: i32, l: i32, d: i32) -> Array {
    random(seed, &[b, l, heads, d], 2.0)
        .transpose_axes(&[0, 2, 1, 3])
        .unwrap()
}

#[test]
fn rope_equals_mlx_at_any_offset_width_scale_and_periods() {
    let periods = Array::from_slice(
        &(0..16)
            .map(|i| 10000f32.powf(i as f32 / 16.0) * 1.7)
            .collect::<Vec<_>>(),
        &[16],
    );
    for (seed, (l, dims, scale, offset, with_periods)) in [
        (1, 64, 1.0, 0, false),
        (3, 64, 1.0, 7, false),
        (1, 64, 1.0, 1000, false),
        (5, 32, 1.0, 3, false),
        (2, 64, 0.25, 11, false),
        (4, 32, 1.0, 5, true),
    ]
    .into_iter()
    .enumerate()
    {
        let x = heads(seed as u64, 2, 3, l, 64);
        let p = with_periods.then_some(&periods);
        let base = (!with_periods).then_some(10000.0);
        let ours = fused_rope(&x, dims, base, scale, RopePositions::From(offset), p).unwrap();
        let mlx = fast::rope(&x, dims, false, base, scale, offset, p).unwrap();
        // Angles reach `offset · scale` radians: an ulp of them is the tolerance's scale.
        let tol = 2e-6 * (1.0 + offset as f32 * scale);
        assert_close(
            &format!("rope l {l} dims {dims} scale {scale} offset {offset} periods {with_periods}"),
            &ours,
            &mlx,
            tol,
        );
    }
}

#[test]
fn rope_with_a_position_per_entry_equals_mlx() {
    let x = heads(9, 4, 3, 1, 64);
    let starts = Array::from_slice(&[0i32, 5, 130, 17], &[4]);
    assert_close(
        "rope per entry",
        &fused_rope(
            &x,
            64,
            Some(100000.0),
            1.0,
            RopePositions::PerEntry(&starts),
            None,
        )
        .unwrap(),
        &fast::rope_dynamic(&x, 64, false, Some(100000.0), 1.0, &starts, None).unwrap(),
        4e-6,
    );
}

/// Keys and values as a cache holds them: the first `t` columns of a `capacity`-column buffer.
fn cache_view(seed: u64, b: i32, kv: i32, t: i32, d: i32) -> Array {
    random(seed, &[b, kv, t + 13, d], 1.5).index((.., .., ..t, ..))
}

/// Attention in f64 on the host, as MLX composes it: `q · scale`, grouped heads, masked keys
/// at the float minimum, softmax, values.
fn reference(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    mask: &dyn Fn(usize, usize, usize, usize) -> Option<f64>,
) -> Vec<f32> {
    let (qs, ks, vs) = (q.shape().to_vec(), k.shape().to_vec(), v.shape().to_vec());
    let (b, hq, l, d) = (
        qs[0] as usize,
        qs[1] as usize,
        qs[2] as usize,
        qs[3] as usize,
    );
    let (hkv, t, dv) = (ks[1] as usize, ks[2] as usize, vs[3] as usize);
    // Views (a cache's first columns, transposed heads) copied dense to be read.
    let dense = |a: &Array| host(&a.reshape(&[-1]).unwrap());
    let (q, k, v) = (dense(q), dense(k), dense(v));
    let mut out = vec![0f32; b * hq * l * dv];
    for bi in 0..b {
        for h in 0..hq {
            let g = h / (hq / hkv);
            for li in 0..l {
                let qr = &q[((bi * hq + h) * l + li) * d..][..d];
                let scores: Vec<f64> = (0..t)
                    .map(|ti| {
                        let kr = &k[((bi * hkv + g) * t + ti) * d..][..d];
                        let s: f64 = qr
                            .iter()
                            .zip(kr)
                            .map(|(a, b)| *a as f64 * scale as f64 * *b as f64)
                            .sum();
                        match mask(bi, h, li, ti) {
                            Some(add) => s + add,
                            None => f32::MIN as f64,
                        }
                    })
                    .collect();
                let top = scores.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
                let sum: f64 = e.iter().sum();
                for c in 0..dv {
                    let o: f64 = (0..t)
                        .map(|ti| e[ti] / sum * v[((bi * hkv + g) * t + ti) * dv + c] as f64)
                        .sum();
                    out[((bi * hq + h) * l + li) * dv + c] = o as f32;
                }
            }
        }
    }
    out
}

/// A mask as the tests name it (MLX's type is not `Clone`).
#[derive(Clone, Copy)]
enum Mask<'a> {
    None,
    Causal,
    Array(&'a Array),
}

impl<'a> Mask<'a> {
    fn mlx(self) -> Option<ScaledDotProductAttentionMask<'a>> {
        match self {
            Mask::None => None,
            Mask::Causal => Some(ScaledDotProductAttentionMask::Causal),
            Mask::Array(m) => Some(ScaledDotProductAttentionMask::Array(m)),
        }
    }
}

fn check_attention(
    what: &str,
    q: &Array,
    k: &Array,
    v: &Array,
    mask: Mask<'_>,
    visible: &dyn Fn(usize, usize, usize, usize) -> Option<f64>,
) {
    let scale = 0.125;
    let ours = fused_attention(q, k, v, scale, mask.mlx()).unwrap();
    let mlx = fast::scaled_dot_product_attention(q, k, v, scale, mask.mlx(), None).unwrap();
    assert_close(&format!("{what}: against MLX"), &ours, &mlx, 2e-6);
    let want = Array::from_slice(&reference(q, k, v, scale, visible), ours.shape());
    assert_close(&format!("{what}: against f64"), &ours, &want, 2e-6);
}

#[test]
fn attention_equals_mlx_and_f64_for_grouped_heads_and_masks() {
    let all = |_: usize, _: usize, _: usize, _: usize| Some(0.0);
    // One decode position over a cache view, 9 query heads on 3 key/value heads.
    let (q, k, v) = (
        heads(1, 1, 9, 1, 64),
        cache_view(2, 1, 3, 37, 64),
        cache_view(3, 1, 3, 37, 64),
    );
    check_attention("decode", &q, &k, &v, Mask::None, &all);
    // Four new positions, causal (lower right: query i sees keys up to t - 4 + i).
    let (q, k, v) = (
        heads(4, 2, 4, 4, 32),
        cache_view(5, 2, 2, 11, 32),
        cache_view(6, 2, 2, 11, 32),
    );
    let causal = |_: usize, _: usize, l: usize, t: usize| (t <= 11 - 4 + l).then_some(0.0);
    check_attention("causal", &q, &k, &v, Mask::Causal, &causal);
    // Decoding rows: each row sees its own columns (a boolean mask [rows, 1, 1, t]); row 2
    // sees none (every key then counts equally, as in MLX).
    let rows = 3;
    let starts = [0usize, 4, 20];
    let bits: Vec<bool> = (0..rows)
        .flat_map(|r| (0..20).map(move |c| c >= starts[r]))
        .collect();
    let mask = Array::from_slice(&bits, &[rows as i32, 1, 1, 20]);
    let (q, k, v) = (
        heads(7, 3, 6, 1, 16),
        cache_view(8, 3, 2, 20, 16),
        cache_view(9, 3, 2, 20, 16),
    );
    let rowwise = |b: usize, _: usize, _: usize, t: usize| (t >= starts[b]).then_some(0.0);
    check_attention("row mask", &q, &k, &v, Mask::Array(&mask), &rowwise);
    // An additive mask of one value per query and key, broadcast over heads.
    let add = random(10, &[2, 9], 3.0);
    let added = host(&add);
    let (q, k, v) = (
        heads(11, 1, 4, 2, 16),
        cache_view(12, 1, 4, 9, 16),
        cache_view(13, 1, 4, 9, 16),
    );
    let additive = move |_: usize, _: usize, l: usize, t: usize| Some(added[l * 9 + t] as f64);
    check_attention("additive", &q, &k, &v, Mask::Array(&add), &additive);
}

#[test]
fn bad_operands_are_errors() {
    let x = random(1, &[2, 8], 1.0);
    // The first MLX operation of this test's thread may be this rejected one: the process must
    // not exit (mlx-c's default handler's way), and the error says why.
    let why = fused_rms_norm(&x, &random(2, &[7], 1.0), 1e-5)
        .unwrap_err()
        .to_string();
    assert!(
        why.contains("w must be one weight per element of x's last axis"),
        "{why}"
    );
    assert!(fused_rms_norm(
        &x.as_dtype(Dtype::Float16).unwrap(),
        &random(2, &[8], 1.0),
        1e-5
    )
    .is_err());
    let h = heads(3, 1, 2, 1, 8);
    assert!(fused_rope(&h, 9, Some(10000.0), 1.0, RopePositions::From(0), None).is_err());
    assert!(fused_rope(&h, 16, Some(10000.0), 1.0, RopePositions::From(0), None).is_err());
    assert!(fused_rope(&x, 8, Some(10000.0), 1.0, RopePositions::From(0), None).is_err());
    assert!(fused_rope(&h, 8, None, 1.0, RopePositions::From(0), None).is_err());
    let wrong_starts = Array::from_slice(&[1i32, 2], &[2]);
    assert!(fused_rope(
        &h,
        8,
        Some(1e4),
        1.0,
        RopePositions::PerEntry(&wrong_starts),
        None
    )
    .is_err());
    let (q, k) = (heads(4, 1, 3, 1, 8), cache_view(5, 1, 2, 4, 8));
    assert!(
        fused_attention(&q, &k, &k, 1.0, None).is_err(),
        "3 heads over 2 groups"
    );
    let q = heads(4, 1, 2, 1, 4);
    assert!(
        fused_attention(&q, &k, &k, 1.0, None).is_err(),
        "widths differ"
    );
    let int_mask = Array::from_slice(&[1i32, 0, 1, 1], &[1, 1, 1, 4]);
    let q = heads(4, 1, 2, 1, 8);
    assert!(fused_attention(
        &q,
        &k,
        &k,
        1.0,
        Some(ScaledDotProductAttentionMask::Array(&int_mask))
    )
    .is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn random_shapes_agree_with_mlx(
        seed in 1u64..1_000_000,
        b in 1i32..3,
        groups in 1i32..4,
        repeats in 1i32..4,
        l in 1i32..=FUSED_ATTENTION_MAX_QUERIES,
        extra in 0i32..40,
        half in 1i32..20,
        offset in 0i32..300,
    ) {
        let d = 2 * half;
        let t = l + extra;
        let q = heads(seed, b, groups * repeats, l, d);
        let (k, v) = (cache_view(seed + 1, b, groups, t, d), cache_view(seed + 2, b, groups, t, d));
        let causal = if l > 1 { Mask::Causal } else { Mask::None };
        assert_close(
            "attention",
            &fused_attention(&q, &k, &v, 0.3, causal.mlx()).unwrap(),
            &fast::scaled_dot_product_attention(&q, &k, &v, 0.3, causal.mlx(), None).unwrap(),
            4e-6,
        );
        assert_close(
            "rope",
            &fused_rope(&q, d, Some(10000.0), 1.0, RopePositions::From(offset), None).unwrap(),
            &fast::rope(&q, d, false, Some(10000.0), 1.0, offset, None).unwrap(),
            2e-6 * (1.0 + offset as f32),
        );
        let w = random(seed + 3, &[d], 1.0);
        assert_close(
            "rms_norm",
            &fused_rms_norm(&q, &w, 1e-5).unwrap(),
            &fast::rms_norm(&q, Some(&w), 1e-5).unwrap(),
            2e-6,
        );
    }
}
