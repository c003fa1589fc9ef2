//! GGML block formats: dequantization to f32 (repacking into MLX's affine layout is
//! `ggml_repack.rs`), and the row order of GGUF's attention weights.
//!
//! MLX's affine quantization stores, per group of `group_size` consecutive weights of a row,
//! a scale and a bias (`w = scale * q + bias`) and packs the unsigned integers `q` into
//! little-endian `u32` words, element 0 in the lowest bits. GGML's Q4_0, Q4_1 and Q8_0 are the
//! same idea with groups of 32, so they convert without loss; the 5-bit types and K-quants
//! repack too ([`crate::ggml_repack`]).

use crate::gguf::GgmlType;
use crate::gguf_kquant as kq;
use half::{bf16, f16};

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Dequantizes `bytes` of type `ty` into f32 values (`bytes` must hold whole blocks).
pub fn dequantize(ty: GgmlType, bytes: &[u8]) -> Vec<f32> {
    let (block, block_bytes) = ty.block();
    let blocks = bytes.len() / block_bytes;
    let mut out = Vec::with_capacity(blocks * block);
    match ty {
        GgmlType::F32 => out.extend(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        ),
        GgmlType::F16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()),
        ),
        GgmlType::Bf16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()),
        ),
        GgmlType::Q4_0 => {
            for b in bytes.chunks_exact(block_bytes) {
                let d = f16_at(b, 0);
                let qs = &b[2..18];
                out.extend(qs.iter().map(|&q| d * ((q & 0x0f) as f32 - 8.0)));
                out.extend(qs.iter().map(|&q| d * ((q >> 4) as f32 - 8.0)));
            }
        }
        GgmlType::Q4_1 => {
            for b in bytes.chunks_exact(block_bytes) {
                let (d, m) = (f16_at(b, 0), f16_at(b, 2));
                let qs = &b[4..20];
                out.extend(qs.iter().map(|&q| d * (q & 0x0f) as f32 + m));
                out.extend(qs.iter().map(|&q| d * (q >> 4) as f32 + m));
            }
        }
        GgmlType::Q8_0 => {
            for b in bytes.chunks_exact(block_bytes) {
                let d = f16_at(b, 0);
                out.extend(b[2..34].iter().map(|&q| d * (q as i8) as f32));
            }
        }
        GgmlType::Q5_0 => kq::dequantize_q5_0(bytes, &mut out),
        GgmlType::Q5_1 => kq::dequantize_q5_1(bytes, &mut out),
        GgmlType::Q2K => kq::dequantize_q2_k(bytes, &mut out),
        GgmlType::Q3K => kq::dequantize_q3_k(bytes, &mut out),
        GgmlType::Q4K => kq::dequantize_q4_k(bytes, &mut out),
        GgmlType::Q5K => kq::dequantize_q5_k(bytes, &mut out),
        GgmlType::Q6K => kq::dequantize_q6_k(bytes, &mut out),
        GgmlType::Iq4Nl => kq::dequantize_iq4_nl(bytes, &mut out),
        GgmlType::Mxfp4 => crate::ggml_mxfp4::dequantize(bytes, &mut out),
    }
    out
}

/// Reorders rows: row `i` of the result is row `source_row(i)` of `data` (rows of `row_len`).
pub fn gather_rows<T: Copy>(
    data: &[T],
    row_len: usize,
    source_row: impl Fn(usize) -> usize,
) -> Vec<T> {
    let rows = data.len() / row_len;
    let mut out = Vec::with_capacity(data.len());
    for i in 0..rows {
        let s = source_row(i);
        out.extend_from_slice(&data[s * row_len..(s + 1) * row_len]);
    }
    out
}

/// GGUF stores Llama's Q and K projections with the rows of each head interleaved for GGML's
/// RoPE: Hugging Face row `(head, half, j)` sits at GGUF row `(head, j, half)`. This maps a
/// Hugging Face row index to the GGUF row that holds it.
pub fn llama_unpermute_source_row(hf_row: usize, head_dim: usize) -> usize {
    let half = head_dim / 2;
    let (head, within) = (hf_row / head_dim, hf_row % head_dim);
    let (i, j) = (within / half, within % half);
    head * head_dim + 2 * j + i
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A Q4_1 block of `d`, `m` and the 4-bit values `q` (also for `ggml_repack`'s tests).
    pub(crate) fn q4_1_block(d: f32, m: f32, q: &[u8; 32]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend(f16::from_f32(d).to_le_bytes());
        b.extend(f16::from_f32(m).to_le_bytes());
        for j in 0..16 {
            b.push(q[j] | (q[j + 16] << 4));
        }
        b
    }

    #[test]
    fn q4_1_dequantizes_as_d_q_plus_m() {
        let q: [u8; 32] = std::array::from_fn(|i| (i % 16) as u8);
        let b = q4_1_block(0.5, -1.0, &q);
        let w = dequantize(GgmlType::Q4_1, &b);
        let want: Vec<f32> = q.iter().map(|&v| 0.5 * v as f32 - 1.0).collect();
        assert_eq!(w, want);
    }

    #[test]
    fn q8_0_and_q4_0_dequantize() {
        let mut b = f16::from_f32(0.25).to_le_bytes().to_vec();
        b.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let w = dequantize(GgmlType::Q8_0, &b);
        assert_eq!(w[0], -4.0);
        assert_eq!(w[31], 15.0 * 0.25);
        let mut b = f16::from_f32(2.0).to_le_bytes().to_vec();
        b.extend((0..16).map(|j| (j as u8) | (15 << 4)));
        let w = dequantize(GgmlType::Q4_0, &b);
        assert_eq!(w[0], -16.0);
        assert_eq!(w[3], -10.0);
        assert_eq!(w[16], 14.0);
    }

    #[test]
    fn unpermute_inverts_the_gguf_interleave() {
        // GGUF row (head, j, i) = HF row (head, i, j); head_dim 8 -> half 4.
        assert_eq!(llama_unpermute_source_row(0, 8), 0);
        assert_eq!(llama_unpermute_source_row(1, 8), 2);
        assert_eq!(llama_unpermute_source_row(4, 8), 1);
        assert_eq!(llama_unpermute_source_row(7, 8), 7);
        assert_eq!(llama_unpermute_source_row(9, 8), 10);
        let mut seen: Vec<usize> = (0..16).map(|r| llama_unpermute_source_row(r, 8)).collect();
        seen.sort();
        assert_eq!(seen, (0..16).collect::<Vec<_>>());
    }
}
