//! GGML's MXFP4 blocks (gpt-oss's experts in llama.cpp's GGUF files) read two ways: expanded
//! to floats, and moved into MLX's own `mxfp4` layout so the gathered product reads the stored
//! 4-bit codes (issue 46). Both encodings are OCP microscaling FP4: 32 E2M1 codes sharing one
//! E8M0 exponent byte; only where the codes sit differs, so the move is exact.
//!
//! A GGML block is 17 bytes: the exponent `e`, then 16 bytes whose low nibbles are elements
//! 0–15 and high nibbles elements 16–31 (llama.cpp's converter reorders the released
//! checkpoint's bytes into this). MLX packs a row as little-endian 32-bit words of eight codes,
//! element `k` of a group in bits `4k..4k+4` of its 16 bytes (byte `i`: elements `2i` low,
//! `2i + 1` high), and keeps the exponents as `uint8` scales, one per group of 32.

/// Bytes of one GGML MXFP4 block of 32 weights.
pub const BLOCK_BYTES: usize = 17;

/// E2M1's sixteen values (sign bit high): what a 4-bit code means before its block's scale.
const E2M1: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// `2^(e - 127)`, E8M0's value (exact in f32 for every `e` but 255, which OCP calls NaN and no
/// converter writes; `e` 0 is `2^-127`, a subnormal f32).
fn e8m0(e: u8) -> f32 {
    (2f64).powi(i32::from(e) - 127) as f32
}

/// Every block of `bytes` expanded to floats, 32 per block, in row order.
pub fn dequantize(bytes: &[u8], out: &mut Vec<f32>) {
    for block in bytes.chunks_exact(BLOCK_BYTES) {
        let scale = e8m0(block[0]);
        let qs = &block[1..];
        out.extend(qs.iter().map(|&q| E2M1[usize::from(q & 0x0f)] * scale));
        out.extend(qs.iter().map(|&q| E2M1[usize::from(q >> 4)] * scale));
    }
}

/// The blocks of `bytes` in MLX's `mxfp4` layout: the packed codes (four 32-bit words per
/// block, in row order) and the exponents (one byte per block).
pub fn to_mlx(bytes: &[u8]) -> (Vec<u32>, Vec<u8>) {
    let blocks = bytes.len() / BLOCK_BYTES;
    let mut words = Vec::with_capacity(blocks * 4);
    let mut scales = Vec::with_capacity(blocks);
    for block in bytes.chunks_exact(BLOCK_BYTES) {
        scales.push(block[0]);
        let qs = &block[1..];
        let code = |k: usize| {
            if k < 16 {
                u32::from(qs[k] & 0x0f)
            } else {
                u32::from(qs[k - 16] >> 4)
            }
        };
        for word in 0..4 {
            words.push((0..8).fold(0u32, |w, n| w | (code(word * 8 + n) << (4 * n))));
        }
    }
    (words, scales)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One block with codes 0..16 then 15..=0 under exponent 128 (scale 2): the floats are the
    /// E2M1 table doubled, and MLX's words hold the codes in element order.
    #[test]
    fn a_block_expands_and_moves_into_mlx_order() {
        let mut block = vec![128u8];
        block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let mut floats = Vec::new();
        dequantize(&block, &mut floats);
        assert_eq!(floats.len(), 32);
        assert_eq!(&floats[..8], &[0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0]);
        assert_eq!(
            floats[16], -12.0,
            "element 16 is the first high nibble (code 15)"
        );
        assert_eq!(floats[31], 0.0);
        let (words, scales) = to_mlx(&block);
        assert_eq!(scales, [128]);
        assert_eq!(words[0], 0x7654_3210, "elements 0..8, element 0 lowest");
        assert_eq!(words[1], 0xfedc_ba98);
        assert_eq!(words[2], 0x89ab_cdef, "elements 16..24 are 15, 14, ...");
        assert_eq!(words[3], 0x0123_4567);
        // Reading MLX's words back with MLX's rule gives the same floats.
        let back: Vec<f32> = words
            .iter()
            .flat_map(|w| (0..8).map(move |n| (w >> (4 * n)) & 0xf))
            .map(|q| E2M1[q as usize] * e8m0(scales[0]))
            .collect();
        assert_eq!(back, floats);
    }
}
