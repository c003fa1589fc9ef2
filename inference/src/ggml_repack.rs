//! GGML's quantized blocks repacked into MLX's affine layout, so that a GGUF file's weights stay
//! quantized on the CPU and run on shoal's kernel (`cpu_kernels`): Q4_0, Q4_1 and Q8_0 (groups
//! of 32 with one scale and offset, [`to_mlx_quantized`] writes them directly), and the 5-bit
//! types and K-quants ([`repack`]). (IQ4_NL's non-uniform levels have no affine form.)
//!
//! Every one of the 5-bit types and K-quants is, per group of 16 or 32 weights, `w = s * u + b` for an unsigned
//! integer `u` once its offset is folded into the bias:
//!
//! | type | bits | group | scale `s` | bias `b` |
//! |---|---:|---:|---|---|
//! | Q5_0 | 5 | 32 | `d` | `-16 d` |
//! | Q5_1 | 5 | 32 | `d` | `m` |
//! | Q2_K | 2 | 16 | `d * sc` | `-(dmin * m)` |
//! | Q3_K | 3 | 16 | `d * sc` (signed) | `-4 s` |
//! | Q4_K | 4 | 32 | `d * sc` | `-(dmin * m)` |
//! | Q5_K | 5 | 32 | `d * sc` | `-(dmin * m)` |
//! | Q6_K | 6 | 16 | `d * sc` (signed) | `-32 s` |
//!
//! `s` and `b` are kept as f32, computed in GGML's own f32 operations, and the repacked weights
//! equal GGML's values exactly: `s * u + b` rounded once (what the kernel's FMA computes) is
//! GGML's `(d * sc) * q - (dmin * m)` or `(d * sc) * (q - offset)`. Each of GGML's products is
//! exact in f32 (an f16 factor has 11 significant bits, a sub-block scale at most 6 and a value
//! at most 5: 22 bits), so GGML rounds once, at its last step, as the FMA does; Q6_K's
//! product `(d * sc) * (q - 32)` may need 25 bits, but it is GGML's only rounding and the FMA
//! rounds the same exact value. The unit test measures it on random blocks: no difference.
//!
//! MLX's own kernels (Apple GPUs, CUDA) read groups of 32, 64 and 128 only; the groups of 16
//! (Q2_K, Q3_K, Q6_K) are served by shoal's CPU kernel alone, so the loader dequantizes those
//! where that kernel does not run (see `GgufSource::matrix`).

use crate::gguf::GgmlType;
use crate::gguf_kquant as kq;
use crate::quant_spec::{QuantMode, QuantSpec};
use half::f16;

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Bits and group size of the affine layout `ty` repacks into; `None` when it does not.
pub fn repacked_layout(ty: GgmlType) -> Option<(i32, i32)> {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q4_1 => Some((4, 32)),
        GgmlType::Q8_0 => Some((8, 32)),
        GgmlType::Q5_0 | GgmlType::Q5_1 => Some((5, 32)),
        GgmlType::Q2K => Some((2, 16)),
        GgmlType::Q3K => Some((3, 16)),
        GgmlType::Q4K => Some((4, 32)),
        GgmlType::Q5K => Some((5, 32)),
        GgmlType::Q6K => Some((6, 16)),
        _ => None,
    }
}

/// Whether a quantized matrix of `ty` runs repacked on this node: it repacks, and MLX's own
/// kernels read its layout or shoal's CPU kernel runs here. Groups of 16 (Q2_K, Q3_K, Q6_K)
/// where that kernel does not run (GPUs, `SHOAL_QMM=mlx`) are dequantized instead, since
/// MLX's kernels refuse them.
pub fn runs_repacked(ty: GgmlType) -> bool {
    repacked_layout(ty).is_some_and(|(bits, group_size)| {
        let spec = QuantSpec {
            group_size,
            bits,
            mode: QuantMode::Affine,
        };
        crate::cpu_kernels::mlx_reads(spec) || crate::cpu_kernels::active().is_some()
    })
}

/// Appends `values` (each below `2^bits`) to `out` in MLX's packing: a little-endian bit
/// stream, value `i` in bits `bits * i ..`. `values.len() * bits` must be a multiple of 32.
pub fn pack_values(values: &[u8], bits: u32, out: &mut Vec<u32>) {
    let (mut acc, mut filled) = (0u64, 0u32);
    for &v in values {
        acc |= (v as u64) << filled;
        filled += bits;
        if filled >= 32 {
            out.push(acc as u32);
            acc >>= 32;
            filled -= 32;
        }
    }
    debug_assert_eq!(filled, 0, "a block fills whole words");
}

/// One block's unsigned values and per-group scales and biases, as repacked.
struct Block<'a> {
    values: &'a mut [u8],
    scales: &'a mut Vec<f32>,
    biases: &'a mut Vec<f32>,
}

/// Q5_0 / Q5_1 (blocks of 32).
fn q5(ty: GgmlType, b: &[u8], out: Block) {
    let (d, bias, rest) = if ty == GgmlType::Q5_0 {
        let d = f16_at(b, 0);
        (d, -16.0 * d, &b[2..])
    } else {
        (f16_at(b, 0), f16_at(b, 2), &b[4..])
    };
    let qh = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]);
    out.values.copy_from_slice(&kq::q5_values(qh, &rest[4..20]));
    out.scales.push(d);
    out.biases.push(bias);
}

/// Q2_K: element `128 * half + 32 * plane + 16 * sub + l` is bits `2 * plane` of
/// `qs[32 * half + 16 * sub + l]`; its group (of 16) is `element / 16`.
fn q2_k(b: &[u8], out: Block) {
    let (scales, qs) = (&b[0..16], &b[16..80]);
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    for (e, v) in out.values.iter_mut().enumerate() {
        let (half, plane, within) = (e / 128, (e / 32) % 4, e % 32);
        *v = (qs[32 * half + within] >> (2 * plane)) & 3;
    }
    for &sc in scales {
        out.scales.push(d * (sc & 0x0f) as f32);
        out.biases.push(-(dmin * (sc >> 4) as f32));
    }
}

/// Q3_K: Q2_K's low bits plus a high bit from `hmask` (set: `+0`, clear: `-4`), so the
/// unsigned value `low + 4 * high` carries an offset of 4.
fn q3_k(b: &[u8], out: Block) {
    let (hmask, qs) = (&b[0..32], &b[32..96]);
    let scales = kq::q3_k_scales(&b[96..108]);
    let d = f16_at(b, 108);
    for (e, v) in out.values.iter_mut().enumerate() {
        let (half, plane, within) = (e / 128, (e / 32) % 4, e % 32);
        let low = (qs[32 * half + within] >> (2 * plane)) & 3;
        let high = (hmask[within] >> (4 * half + plane)) & 1;
        *v = low | (high << 2);
    }
    for sc in scales {
        let s = d * sc as f32;
        out.scales.push(s);
        out.biases.push(-4.0 * s);
    }
}

/// Q4_K / Q5_K: eight groups of 32; pair `p` of groups reads `qs[32 p .. 32 p + 32]`, low
/// nibbles first; Q5_K's fifth bit of group `g` is bit `g` of `qh[l]`.
fn q45_k(ty: GgmlType, b: &[u8], out: Block) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    let (qh, qs) = if ty == GgmlType::Q5K {
        (Some(&b[16..48]), &b[48..176])
    } else {
        (None, &b[16..144])
    };
    for (e, v) in out.values.iter_mut().enumerate() {
        let (group, l) = (e / 32, e % 32);
        let low = (qs[32 * (group / 2) + l] >> (4 * (group % 2))) & 0x0f;
        let high = qh.map_or(0, |h| (h[l] >> group) & 1);
        *v = low | (high << 4);
    }
    for g in 0..8 {
        let (sc, m) = kq::k4_scale_min(g, scales);
        out.scales.push(d * sc as f32);
        out.biases.push(-(dmin * m as f32));
    }
}

/// Q6_K: element `128 * half + 32 * k + l` takes a nibble of `ql[64 half + l + 32 (k % 2)]`
/// (low for `k < 2`) and bits `2k..2k + 2` of `qh[32 half + l]`; unsigned with offset 32.
fn q6_k(b: &[u8], out: Block) {
    let (ql, qh) = (&b[0..128], &b[128..192]);
    let d = f16_at(b, 208);
    for (e, v) in out.values.iter_mut().enumerate() {
        let (half, k, l) = (e / 128, (e / 32) % 4, e % 32);
        let low = (ql[64 * half + l + 32 * (k % 2)] >> (4 * (k / 2))) & 0x0f;
        let high = (qh[32 * half + l] >> (2 * k)) & 3;
        *v = low | (high << 4);
    }
    for &sc in &b[192..208] {
        let s = d * (sc as i8) as f32;
        out.scales.push(s);
        out.biases.push(-32.0 * s);
    }
}

/// A matrix in MLX's affine quantized layout, on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct MlxQuantized {
    /// Packed integers, `rows * cols * bits / 32` words.
    pub packed: Vec<u32>,
    /// One scale per group, `rows * cols / group_size`.
    pub scales: Vec<f32>,
    /// One bias per group.
    pub biases: Vec<f32>,
    /// Bits per weight (2, 3, 4, 5, 6 or 8).
    pub bits: i32,
    /// Weights per group (32, or 16 for Q2_K, Q3_K and Q6_K).
    pub group_size: i32,
}

/// Whether a tensor of `ty` keeps its scales and biases as f16 where shoal's CPU kernel runs:
/// Q4_0, Q4_1 and Q8_0 store f16 factors, and their repacked biases (`m`, `-8·d`, `-128·d`)
/// are exact in f16 too, so the matrix takes its file's bytes (f32 would add 4 bytes per 32
/// weights: 17 MB on SmolLM2-135M's 98 MB). The K-quants' products of two factors are not.
pub fn keeps_f16_scales(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0)
        && crate::cpu_kernels::active().is_some()
}

/// Bytes of one group's scale and bias as a tensor of `ty` runs repacked (see
/// [`keeps_f16_scales`]).
pub fn scale_bias_bytes(ty: GgmlType) -> u64 {
    if keeps_f16_scales(ty) {
        4
    } else {
        8
    }
}

/// Whether every value of `values` is exactly an f16 (a bias `-128·d` of a huge `d` would
/// overflow).
pub fn exact_in_f16(values: &[f32]) -> bool {
    values.iter().all(|&v| f16::from_f32(v).to_f32() == v)
}

/// Converts a GGML quantized tensor into MLX's layout
/// ([`repacked_layout`] says which); `None` for float types and IQ4_NL.
pub fn to_mlx_quantized(ty: GgmlType, bytes: &[u8]) -> Option<MlxQuantized> {
    let (_, block_bytes) = ty.block();
    let blocks = bytes.len() / block_bytes;
    let (bits, words_per_block) = match ty {
        GgmlType::Q4_0 | GgmlType::Q4_1 => (4, 4),
        GgmlType::Q8_0 => (8, 8),
        _ => return repack(ty, bytes),
    };
    let mut q = MlxQuantized {
        packed: Vec::with_capacity(blocks * words_per_block),
        scales: Vec::with_capacity(blocks),
        biases: Vec::with_capacity(blocks),
        bits,
        group_size: 32,
    };
    let mut values = [0u8; 32];
    for b in bytes.chunks_exact(block_bytes) {
        match ty {
            GgmlType::Q4_0 | GgmlType::Q4_1 => {
                let (d, m, qs) = if ty == GgmlType::Q4_0 {
                    let d = f16_at(b, 0);
                    (d, -8.0 * d, &b[2..18])
                } else {
                    (f16_at(b, 0), f16_at(b, 2), &b[4..20])
                };
                for (j, &byte) in qs.iter().enumerate() {
                    values[j] = byte & 0x0f;
                    values[j + 16] = byte >> 4;
                }
                q.scales.push(d);
                q.biases.push(m);
                for word in values.chunks_exact(8) {
                    q.packed.push(
                        word.iter()
                            .enumerate()
                            .fold(0u32, |acc, (k, &v)| acc | (v as u32) << (4 * k)),
                    );
                }
            }
            _ => {
                let d = f16_at(b, 0);
                for (j, &byte) in b[2..34].iter().enumerate() {
                    values[j] = (byte as i8 as i16 + 128) as u8;
                }
                q.scales.push(d);
                q.biases.push(-128.0 * d);
                for word in values.chunks_exact(4) {
                    q.packed.push(
                        word.iter()
                            .enumerate()
                            .fold(0u32, |acc, (k, &v)| acc | (v as u32) << (8 * k)),
                    );
                }
            }
        }
    }
    Some(q)
}

/// Repacks a tensor of the 5-bit types or K-quants (whole blocks; rows of whole blocks) into
/// MLX's affine layout ([`repacked_layout`]); `None` for other types.
pub fn repack(ty: GgmlType, bytes: &[u8]) -> Option<MlxQuantized> {
    let (bits, group_size) = repacked_layout(ty)?;
    let (block, block_bytes) = ty.block();
    let blocks = bytes.len() / block_bytes;
    let groups = blocks * block / group_size as usize;
    let mut q = MlxQuantized {
        packed: Vec::with_capacity(blocks * block * bits as usize / 32),
        scales: Vec::with_capacity(groups),
        biases: Vec::with_capacity(groups),
        bits,
        group_size,
    };
    let mut values = vec![0u8; block];
    for b in bytes.chunks_exact(block_bytes) {
        let out = Block {
            values: &mut values,
            scales: &mut q.scales,
            biases: &mut q.biases,
        };
        match ty {
            GgmlType::Q5_0 | GgmlType::Q5_1 => q5(ty, b, out),
            GgmlType::Q2K => q2_k(b, out),
            GgmlType::Q3K => q3_k(b, out),
            GgmlType::Q4K | GgmlType::Q5K => q45_k(ty, b, out),
            GgmlType::Q6K => q6_k(b, out),
            _ => return None,
        }
        pack_values(&values, bits as u32, &mut q.packed);
    }
    Some(q)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize;
    use crate::quant::tests::q4_1_block;

    /// Random bytes for `blocks` blocks of `ty`, with sane f16 factors (the random bits of
    /// an f16 may be a NaN or huge).
    fn random_blocks(ty: GgmlType, blocks: usize, seed: u64) -> Vec<u8> {
        let mut state = seed | 1;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let (_, size) = ty.block();
        let mut bytes: Vec<u8> = (0..blocks * size).map(|_| next() as u8).collect();
        let factors: &[usize] = match ty {
            GgmlType::Q5_0 => &[0],
            GgmlType::Q5_1 | GgmlType::Q4K | GgmlType::Q5K => &[0, 2],
            GgmlType::Q2K => &[80, 82],
            GgmlType::Q3K => &[108],
            GgmlType::Q6K => &[208],
            _ => &[],
        };
        for b in bytes.chunks_exact_mut(size) {
            for &at in factors {
                let v = ((next() % 2000) as f32 - 1000.0) * 1e-5;
                b[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
            }
        }
        bytes
    }

    /// The repacked value of every weight, `s * u + b` rounded once (what the kernel's FMA
    /// computes), against GGML's dequantization: the largest difference in units of the last
    /// place of the larger of `s * u` and `b`.
    fn worst_ulps(ty: GgmlType, bytes: &[u8]) -> f64 {
        let want = dequantize(ty, bytes);
        let q = repack(ty, bytes).unwrap();
        let bits = q.bits as usize;
        let group = q.group_size as usize;
        let mut words = Vec::new();
        for w in &q.packed {
            words.extend(w.to_le_bytes());
        }
        assert_eq!(q.packed.len() * 32, want.len() * bits);
        let mut worst = 0.0f64;
        for (i, &w) in want.iter().enumerate() {
            let bit = i * bits;
            let pair = words[bit / 8] as u32 | (*words.get(bit / 8 + 1).unwrap_or(&0) as u32) << 8;
            let u = (pair >> (bit % 8)) & ((1 << bits) - 1);
            let g = i / group;
            let got = (q.scales[g] as f64 * u as f64 + q.biases[g] as f64) as f32;
            // GGML rounds its product and its difference: the error is of the order of the
            // largest term's last place.
            let terms = (q.scales[g] as f64 * u as f64)
                .abs()
                .max(q.biases[g].abs() as f64);
            let ulp = terms.max(f32::MIN_POSITIVE as f64) * f32::EPSILON as f64;
            worst = worst.max((got as f64 - w as f64).abs() / ulp);
        }
        worst
    }

    #[test]
    fn repacked_weights_equal_ggml_values() {
        for ty in [
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q2K,
            GgmlType::Q3K,
            GgmlType::Q4K,
            GgmlType::Q5K,
            GgmlType::Q6K,
        ] {
            let bytes = random_blocks(ty, 24, ty as u64 + 3);
            let ulps = worst_ulps(ty, &bytes);
            eprintln!("{ty:?}: largest difference {ulps} ulp");
            assert_eq!(ulps, 0.0, "{ty:?}: the repacked weights are GGML's");
        }
    }

    #[test]
    fn packing_is_mlx_bit_stream() {
        // Eight 3-bit values 0..8 fill three bytes: 0b000, 0b001, ... little-endian.
        let mut out = Vec::new();
        let values: Vec<u8> = (0..32).map(|i| (i % 8) as u8).collect();
        pack_values(&values, 3, &mut out);
        assert_eq!(out.len(), 3);
        let bytes: Vec<u8> = out.iter().flat_map(|w| w.to_le_bytes()).collect();
        // 0 | 1 << 3 | 2 << 6 = 0x88; then 2 >> 2 | 3 << 1 | 4 << 4 | 5 << 7 ...
        assert_eq!(&bytes[..3], &[0x88, 0xc6, 0xfa]);
        assert_eq!(&bytes[3..6], &[0x88, 0xc6, 0xfa]);
    }

    #[test]
    fn repacked_blocks_dequantize_to_the_same_values() {
        let q: [u8; 32] = std::array::from_fn(|i| ((i * 7) % 16) as u8);
        for ty in [GgmlType::Q4_1, GgmlType::Q4_0, GgmlType::Q8_0] {
            let bytes = match ty {
                GgmlType::Q4_1 => q4_1_block(0.125, 0.5, &q),
                GgmlType::Q4_0 => {
                    let mut b = q4_1_block(0.125, 0.0, &q);
                    b.drain(2..4);
                    b
                }
                _ => {
                    let mut b = f16::from_f32(0.125).to_le_bytes().to_vec();
                    b.extend(q.iter().map(|&v| (v as i8 * 7 - 50) as u8));
                    b
                }
            };
            let want = dequantize(ty, &bytes);
            let m = to_mlx_quantized(ty, &bytes).unwrap();
            let per_word = 32 / m.bits as usize;
            let mask = (1u32 << m.bits) - 1;
            let got: Vec<f32> = (0..32)
                .map(|i| {
                    let v = (m.packed[i / per_word] >> (m.bits as usize * (i % per_word))) & mask;
                    m.scales[0] * v as f32 + m.biases[0]
                })
                .collect();
            assert_eq!(got, want, "{ty:?}");
        }
    }
}
