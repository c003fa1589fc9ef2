//! Dequantization of GGML's 5-bit block formats (Q5_0, Q5_1) and its "K-quants" (Q2_K, Q3_K,
//! Q4_K, Q5_K, Q6_K), the types most GGUF files on the hub use (`Q4_K_M` and `Q5_K_M` files
//! mix Q4_K/Q5_K with Q6_K), and IQ4_NL.
//!
//! K-quants need rows of a multiple of 256 weights; `llama-quantize` stores the other
//! tensors of a K-quant file in a fallback type: Q5_0 for Q4_K, Q5_1 for Q5_K, Q8_0 for Q6_K,
//! Q4_0 for Q2_K and Q3_K (IQ4_NL in other llama.cpp versions, and for IQ4_XS). Models whose
//! hidden size is not a multiple of 256 (SmolLM2-135M: 576) therefore need those too.
//!
//! K-quants pack 256 weights in a super-block: one or two f16 factors for the whole block and,
//! per sub-block of 16 or 32 weights, a small integer scale (and minimum) that those factors
//! multiply. The arithmetic here is GGML's, in the same f32 operations and order
//! (`(d * scale) * q - (dmin * min)`), so the values equal llama.cpp's and gguf-py's exactly;
//! `inference/tests/kquants.rs` checks every tensor of real files against gguf-py.
//!
//! Each function takes whole blocks (`bytes.len()` a multiple of the block size; the GGUF
//! reader checks this) and appends to `out`.

use half::f16;

/// Weights per K-quant super-block.
pub const QK_K: usize = 256;

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Bytes per block of Q5_0 (f16 `d`, 32 high bits, 16 bytes of low nibbles).
pub const Q5_0_BYTES: usize = 22;
/// Bytes per block of Q5_1 (f16 `d`, f16 `m`, 32 high bits, 16 bytes of low nibbles).
pub const Q5_1_BYTES: usize = 24;
/// Bytes per super-block of Q2_K.
pub const Q2_K_BYTES: usize = 84;
/// Bytes per super-block of Q3_K.
pub const Q3_K_BYTES: usize = 110;
/// Bytes per super-block of Q4_K.
pub const Q4_K_BYTES: usize = 144;
/// Bytes per super-block of Q5_K.
pub const Q5_K_BYTES: usize = 176;
/// Bytes per super-block of Q6_K.
pub const Q6_K_BYTES: usize = 210;

/// Bytes per block of IQ4_NL (f16 `d`, 16 bytes of 4-bit indices).
pub const IQ4_NL_BYTES: usize = 18;

/// IQ4_NL's 16 levels (a non-uniform grid, denser near zero), as GGML defines them.
const IQ4_NL_LEVELS: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// IQ4_NL: blocks of 32, `w = d * level[q]` (element `j` and `j + 16` share byte `j`, low
/// nibble first).
pub fn dequantize_iq4_nl(bytes: &[u8], out: &mut Vec<f32>) {
    for b in bytes.chunks_exact(IQ4_NL_BYTES) {
        let d = f16_at(b, 0);
        let qs = &b[2..18];
        out.extend(
            qs.iter()
                .map(|&q| d * IQ4_NL_LEVELS[(q & 0x0f) as usize] as f32),
        );
        out.extend(
            qs.iter()
                .map(|&q| d * IQ4_NL_LEVELS[(q >> 4) as usize] as f32),
        );
    }
}

/// The 5-bit values of a Q5_0/Q5_1 block: low nibbles from `qs` (element `j` and `j + 16`
/// share byte `j`), the fifth bit from `qh` (bit `i` for element `i`).
pub fn q5_values(qh: u32, qs: &[u8]) -> [u8; 32] {
    let mut v = [0u8; 32];
    for j in 0..16 {
        let h0 = ((qh >> j) & 1) as u8;
        let h1 = ((qh >> (j + 16)) & 1) as u8;
        v[j] = (qs[j] & 0x0f) | (h0 << 4);
        v[j + 16] = (qs[j] >> 4) | (h1 << 4);
    }
    v
}

/// Q5_0: blocks of 32, `w = d * (q - 16)`.
pub fn dequantize_q5_0(bytes: &[u8], out: &mut Vec<f32>) {
    for b in bytes.chunks_exact(Q5_0_BYTES) {
        let d = f16_at(b, 0);
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        let v = q5_values(qh, &b[6..22]);
        out.extend(v.iter().map(|&q| (q as i32 - 16) as f32 * d));
    }
}

/// Q5_1: blocks of 32, `w = d * q + m`.
pub fn dequantize_q5_1(bytes: &[u8], out: &mut Vec<f32>) {
    for b in bytes.chunks_exact(Q5_1_BYTES) {
        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
        let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        let v = q5_values(qh, &b[8..24]);
        out.extend(v.iter().map(|&q| q as f32 * d + m));
    }
}

/// Q2_K: 16 sub-blocks of 16, each with a 4-bit scale and a 4-bit minimum (one byte,
/// scale low); 2-bit values, four to a byte; `w = (d * scale) * q - (dmin * min)`.
///
/// Layout: `scales[16]`, `qs[64]`, f16 `d`, f16 `dmin`. Each half of the block (128 weights)
/// reads 32 bytes of `qs` four times, two bits further each time; the first 16 bytes feed
/// one sub-block, the next 16 the following one.
pub fn dequantize_q2_k(bytes: &[u8], out: &mut Vec<f32>) {
    for b in bytes.chunks_exact(Q2_K_BYTES) {
        let scales = &b[0..16];
        let qs = &b[16..80];
        let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
        let mut is = 0;
        for half in 0..2 {
            let q = &qs[half * 32..half * 32 + 32];
            for shift in [0, 2, 4, 6] {
                for sub in 0..2 {
                    let sc = scales[is];
                    is += 1;
                    let dl = d * (sc & 0x0f) as f32;
                    let ml = dmin * (sc >> 4) as f32;
                    out.extend(
                        q[sub * 16..sub * 16 + 16]
                            .iter()
                            .map(|&x| dl * ((x >> shift) & 3) as f32 - ml),
                    );
                }
            }
        }
    }
}

/// The 16 signed 6-bit scales of a Q3_K block, packed in 12 bytes: the low four bits of
/// scale `i` are the low (`i < 8`) or high nibble of byte `i % 8`, the top two bits are bits
/// `2 * (i / 4)` of byte `8 + i % 4`; stored with an offset of 32.
pub fn q3_k_scales(packed: &[u8]) -> [i32; 16] {
    std::array::from_fn(|i| {
        let low = if i < 8 {
            packed[i] & 0x0f
        } else {
            packed[i - 8] >> 4
        };
        let high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
        (low | (high << 4)) as i32 - 32
    })
}

/// Q3_K: 16 sub-blocks of 16 with signed 6-bit scales; 3-bit values, the low two bits packed
/// like Q2_K's and the third in `hmask` (bit set: add nothing; clear: subtract 4);
/// `w = (d * scale) * q` with `q` in -4..=3.
///
/// Layout: `hmask[32]`, `qs[64]`, `scales[12]`, f16 `d`. The high bit of element
/// `128 * half + 32 * j + l` is bit `4 * half + j` of `hmask[l]`.
pub fn dequantize_q3_k(bytes: &[u8], out: &mut Vec<f32>) {
    for b in bytes.chunks_exact(Q3_K_BYTES) {
        let hmask = &b[0..32];
        let qs = &b[32..96];
        let scales = q3_k_scales(&b[96..108]);
        let d = f16_at(b, 108);
        let mut is = 0;
        let mut bit = 0;
        for half in 0..2 {
            let q = &qs[half * 32..half * 32 + 32];
            for shift in [0, 2, 4, 6] {
                for sub in 0..2 {
                    let dl = d * scales[is] as f32;
                    is += 1;
                    let range = sub * 16..sub * 16 + 16;
                    out.extend(q[range.clone()].iter().zip(&hmask[range]).map(|(&x, &h)| {
                        let low = ((x >> shift) & 3) as i32;
                        let minus = if h & (1 << bit) != 0 { 0 } else { 4 };
                        dl * (low - minus) as f32
                    }));
                }
                bit += 1;
            }
        }
    }
}

/// Scale and minimum `j` (0..8) of a Q4_K/Q5_K block, 6 bits each, packed in 12 bytes: for
/// `j < 4` the low six bits of bytes `j` and `j + 4`; for `j >= 4` a nibble of byte `j + 4`
/// with the top two bits of bytes `j - 4` and `j`.
pub fn k4_scale_min(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Q4_K: 8 sub-blocks of 32 with 6-bit scales and minimums; 4-bit values;
/// `w = (d * scale) * q - (dmin * min)`.
///
/// Layout: f16 `d`, f16 `dmin`, `scales[12]`, `qs[128]`. Each 32 bytes of `qs` hold two
/// sub-blocks: the low nibbles the first, the high nibbles the second.
pub fn dequantize_q4_k(bytes: &[u8], out: &mut Vec<f32>) {
    for b in bytes.chunks_exact(Q4_K_BYTES) {
        let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
        let scales = &b[4..16];
        for (pair, q) in b[16..144].chunks_exact(32).enumerate() {
            for (nibble, shift) in [(0usize, 0u8), (1, 4)] {
                let (sc, m) = k4_scale_min(2 * pair + nibble, scales);
                let (d1, m1) = (d * sc as f32, dmin * m as f32);
                out.extend(q.iter().map(|&x| d1 * ((x >> shift) & 0x0f) as f32 - m1));
            }
        }
    }
}

/// Q5_K: as Q4_K with a fifth bit per value from `qh` (sub-block `s` reads bit `s` of
/// `qh[l]`); `w = (d * scale) * q - (dmin * min)`.
///
/// Layout: f16 `d`, f16 `dmin`, `scales[12]`, `qh[32]`, `qs[128]`.
pub fn dequantize_q5_k(bytes: &[u8], out: &mut Vec<f32>) {
    for b in bytes.chunks_exact(Q5_K_BYTES) {
        let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
        let scales = &b[4..16];
        let qh = &b[16..48];
        for (pair, ql) in b[48..176].chunks_exact(32).enumerate() {
            for (nibble, shift) in [(0usize, 0u8), (1, 4)] {
                let sub = 2 * pair + nibble;
                let (sc, m) = k4_scale_min(sub, scales);
                let (d1, m1) = (d * sc as f32, dmin * m as f32);
                out.extend(ql.iter().zip(qh).map(|(&x, &h)| {
                    let high = if h & (1 << sub) != 0 { 16 } else { 0 };
                    d1 * (((x >> shift) & 0x0f) + high) as f32 - m1
                }));
            }
        }
    }
}

/// Q6_K: 16 sub-blocks of 16 with signed 8-bit scales; 6-bit values (low four bits in `ql`,
/// top two in `qh`), offset 32; `w = (d * scale) * (q - 32)`.
///
/// Layout: `ql[128]`, `qh[64]`, `scales[16]` (i8), f16 `d`. Each half of the block (128
/// weights) uses 64 bytes of `ql` and 32 of `qh`: its element `32 * k + l` (k in 0..4, l in
/// 0..32) takes the low (k < 2) or high nibble of `ql[l + 32 * (k % 2)]` and bits `2k, 2k + 1`
/// of `qh[l]`.
pub fn dequantize_q6_k(bytes: &[u8], out: &mut Vec<f32>) {
    for b in bytes.chunks_exact(Q6_K_BYTES) {
        let d = f16_at(b, 208);
        let scales: [i8; 16] = std::array::from_fn(|i| b[192 + i] as i8);
        let start = out.len();
        out.resize(start + QK_K, 0.0);
        let y = &mut out[start..];
        for half in 0..2 {
            let ql = &b[half * 64..half * 64 + 64];
            let qh = &b[128 + half * 32..128 + half * 32 + 32];
            let sc = &scales[half * 8..half * 8 + 8];
            let y = &mut y[half * 128..half * 128 + 128];
            for l in 0..32 {
                let is = l / 16;
                let h = qh[l];
                let q1 = ((ql[l] & 0x0f) | ((h & 3) << 4)) as i32 - 32;
                let q2 = ((ql[l + 32] & 0x0f) | (((h >> 2) & 3) << 4)) as i32 - 32;
                let q3 = ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i32 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i32 - 32;
                y[l] = d * sc[is] as f32 * q1 as f32;
                y[l + 32] = d * sc[is + 2] as f32 * q2 as f32;
                y[l + 64] = d * sc[is + 4] as f32 * q3 as f32;
                y[l + 96] = d * sc[is + 6] as f32 * q4 as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16_bytes(v: f32) -> [u8; 2] {
        f16::from_f32(v).to_le_bytes()
    }

    #[test]
    fn q5_0_and_q5_1_take_the_fifth_bit_from_qh() {
        // Element i has value i (0..32): low nibble i & 15, fifth bit i >> 4.
        let qs: [u8; 16] = std::array::from_fn(|j| (j as u8) | ((j as u8) << 4));
        let qh: u32 = 0xffff_0000; // elements 16..32 have the fifth bit
        let mut b = f16_bytes(0.5).to_vec();
        b.extend(qh.to_le_bytes());
        b.extend(qs);
        let mut w = Vec::new();
        dequantize_q5_0(&b, &mut w);
        let want: Vec<f32> = (0..32).map(|i| 0.5 * (i as f32 - 16.0)).collect();
        assert_eq!(w, want);
        let mut b = f16_bytes(0.25).to_vec();
        b.extend(f16_bytes(-1.0));
        b.extend(qh.to_le_bytes());
        b.extend(qs);
        let mut w = Vec::new();
        dequantize_q5_1(&b, &mut w);
        let want: Vec<f32> = (0..32).map(|i| 0.25 * i as f32 - 1.0).collect();
        assert_eq!(w, want);
    }

    #[test]
    fn iq4_nl_reads_its_levels() {
        let mut b = f16_bytes(2.0).to_vec();
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let mut w = Vec::new();
        dequantize_iq4_nl(&b, &mut w);
        assert_eq!(w[0], -254.0);
        assert_eq!(w[15], 226.0);
        assert_eq!(w[16], 226.0);
        assert_eq!(w[31], -254.0);
    }

    #[test]
    fn q4_k_scale_packing_round_trips() {
        // Pack eight (scale, min) pairs the way GGML does and read them back.
        let pairs: [(u8, u8); 8] =
            std::array::from_fn(|j| ((j * 7 + 3) as u8 % 64, (63 - j * 5) as u8));
        let mut p = [0u8; 12];
        for (j, &(s, m)) in pairs.iter().enumerate() {
            if j < 4 {
                p[j] |= s;
                p[j + 4] |= m;
            } else {
                p[j + 4] = (s & 0x0f) | ((m & 0x0f) << 4);
                p[j - 4] |= (s >> 4) << 6;
                p[j] |= (m >> 4) << 6;
            }
        }
        for (j, &pair) in pairs.iter().enumerate() {
            assert_eq!(k4_scale_min(j, &p), pair, "sub-block {j}");
        }
    }

    #[test]
    fn q4_k_block_with_one_scale_is_affine() {
        // All sub-blocks scale 2, min 1; d = 0.5, dmin = 0.25: w = 1.0 * q - 0.25.
        let mut b = f16_bytes(0.5).to_vec();
        b.extend(f16_bytes(0.25));
        let mut scales = [0u8; 12];
        for j in 0..4 {
            scales[j] = 2;
            scales[j + 4] = 1;
        }
        scales[8..12].fill(2 | (1 << 4));
        b.extend(scales);
        b.extend((0..128).map(|i| (i % 16) as u8 | ((15 - i % 16) as u8) << 4));
        let mut w = Vec::new();
        dequantize_q4_k(&b, &mut w);
        assert_eq!(w.len(), QK_K);
        for pair in 0..4 {
            for l in 0..32 {
                assert_eq!(w[pair * 64 + l], (l % 16) as f32 - 0.25);
                assert_eq!(w[pair * 64 + 32 + l], (15 - l % 16) as f32 - 0.25);
            }
        }
    }

    #[test]
    fn q6_k_values_span_minus_32_to_31() {
        // Every value q = 0 (stored) → -32; scale 1, d 1 except sub-block 3 with scale -2.
        let mut b = vec![0u8; Q6_K_BYTES];
        for i in 0..16 {
            b[192 + i] = 1;
        }
        b[192 + 3] = (-2i8) as u8;
        b[208..210].copy_from_slice(&f16_bytes(1.0));
        // Element 0: ql[0] low nibble 15, qh[0] bits 0..2 = 3 → 63 - 32 = 31.
        b[0] = 0x0f;
        b[128] = 0x03;
        let mut w = Vec::new();
        dequantize_q6_k(&b, &mut w);
        assert_eq!(w[0], 31.0);
        assert_eq!(w[1], -32.0);
        // Sub-block 3 is elements 48..64 (l 16..32 of the second quarter): scale -2.
        assert_eq!(w[48], 64.0);
        assert_eq!(w[47], -32.0);
    }

    #[test]
    fn q2_k_and_q3_k_decode_their_bit_planes() {
        // Q2_K: every value 3 in the lowest plane, 0 elsewhere; scales 1, mins 0, d 1.
        let mut b = vec![0u8; Q2_K_BYTES];
        b[..16].fill(0x01);
        b[16..80].fill(0x03);
        b[80..82].copy_from_slice(&f16_bytes(1.0));
        let mut w = Vec::new();
        dequantize_q2_k(&b, &mut w);
        // Plane 0 (shift 0) is elements 0..32 of each half.
        assert!(w[..32].iter().all(|&v| v == 3.0));
        assert!(w[32..128].iter().all(|&v| v == 0.0));
        assert!(w[128..160].iter().all(|&v| v == 3.0));
        // Q3_K: all low bits 0, high bits clear (→ -4) except bit 0 of hmask[0] (→ 0);
        // scales all stored as 33 (→ 1).
        let mut b = vec![0u8; Q3_K_BYTES];
        b[0] = 0x01;
        for i in 0..8 {
            b[96 + i] = 0x01 | (0x01 << 4); // low nibbles of 33 = 0b10_0001
        }
        for i in 8..12 {
            b[96 + i] = 0b1010_1010; // top bits 0b10 for every scale
        }
        b[108..110].copy_from_slice(&f16_bytes(1.0));
        let mut w = Vec::new();
        dequantize_q3_k(&b, &mut w);
        assert_eq!(w[0], 0.0);
        assert!(w[1..].iter().all(|&v| v == -4.0));
        assert_eq!(q3_k_scales(&b[96..108]), [1; 16]);
    }
}
