//! M-RoPE positions of a prompt with images (Qwen3.5 / Qwen3-VL), as mlx-vlm's
//! `get_rope_index` places them: text positions count on as usual; the tokens of an image whose
//! merged grid is `rows × cols` all start at the position `p` the next text token would have had,
//! and take `(p, p + row, p + col)` as their (temporal, height, width) positions; the text after
//! the image continues at `p + max(rows, cols)`. So every position past an image is shifted by
//! `max(rows, cols) - rows · cols` (mlx-vlm's `rope_deltas`) from its index in the sequence, in
//! prefill and in every decoding step after it.
//!
//! The rotation turns each frequency of the rotated part of a head by one of the three
//! positions, interleaved as `[t, h, w, t, h, w, …]` (`mrope_section` says how many frequencies
//! each of h and w gets at most; the others follow t): mlx-vlm's `interleaved` style. Text
//! positions are equal in all three, so a step without image tokens is plain RoPE at the
//! shifted position, which keeps text-only sequences exactly as they were.
//!
//! A sequence's spans ride on its KV cache ([`crate::kv_cache::KvCache::set_mrope`]): every
//! attention layer of every step reads them there.

use crate::error::{InferenceError, Result};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{ops, Array};
use std::ops::Range;

/// One image's run of tokens in a sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageSpan {
    /// Index of its first image token in the sequence.
    pub start: usize,
    /// The merged grid: tokens per column and per row.
    pub rows: usize,
    pub cols: usize,
}

impl ImageSpan {
    fn len(&self) -> usize {
        self.rows * self.cols
    }
}

/// The image spans of one sequence, in order (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MropeSpans {
    spans: Vec<ImageSpan>,
}

impl MropeSpans {
    /// Spans in order, none overlapping (an error otherwise).
    pub fn new(spans: Vec<ImageSpan>) -> Result<MropeSpans> {
        let mut end = 0;
        for s in &spans {
            if s.start < end || s.rows == 0 || s.cols == 0 {
                return Err(InferenceError::InvalidRequest(format!(
                    "image spans overlap or are empty: {spans:?}"
                )));
            }
            end = s.start + s.len();
        }
        Ok(MropeSpans { spans })
    }

    /// The spans.
    pub fn spans(&self) -> &[ImageSpan] {
        &self.spans
    }

    /// The (temporal, height, width) position of sequence index `i`.
    pub fn position(&self, i: usize) -> [i64; 3] {
        let mut shift = 0i64;
        for s in &self.spans {
            if i < s.start {
                break;
            }
            if i < s.start + s.len() {
                let base = s.start as i64 + shift;
                let k = i - s.start;
                return [base, base + (k / s.cols) as i64, base + (k % s.cols) as i64];
            }
            shift += s.rows.max(s.cols) as i64 - s.len() as i64;
        }
        let p = i as i64 + shift;
        [p, p, p]
    }

    /// Whether any index of `range` is an image token.
    pub fn has_image_in(&self, range: Range<usize>) -> bool {
        self.spans
            .iter()
            .any(|s| s.start < range.end && range.start < s.start + s.len())
    }
}

/// Which of the three positions each of `frequencies` frequencies turns with (mlx-vlm's
/// interleaved selector for `sections`).
pub fn selector(sections: [usize; 3], frequencies: usize) -> Vec<usize> {
    (0..frequencies)
        .map(|f| match f % 3 {
            1 if f < 3 * sections[1] => 1,
            2 if f < 3 * sections[2] => 2,
            _ => 0,
        })
        .collect()
}

/// RoPE's frequencies for `dims` rotated features, base `theta`, computed as mlx-vlm computes
/// them (`1 / theta^(arange(0, dims, 2) / dims)` in f32): `[dims / 2]`.
pub fn inverse_frequencies(dims: i32, theta: f32) -> Result<Array> {
    let exponents = ops::divide(
        Array::from_iter((0..dims).step_by(2).map(|i| i as f32), &[dims / 2]),
        Array::from_f32(dims as f32),
    )?;
    Ok(ops::divide(
        Array::from_f32(1.0),
        &ops::power(Array::from_f32(theta), &exponents)?,
    )?)
}

/// Rotates the first `dims` features of `x` (`[batch, heads, l, head_dim]`, the half-split
/// layout) of the sequence indices `first..first + l` by their M-RoPE positions, base `theta`.
pub fn rotate(
    x: &Array,
    dims: i32,
    theta: f32,
    sections: [usize; 3],
    spans: &MropeSpans,
    first: usize,
) -> Result<Array> {
    let l = x.shape()[2] as usize;
    let frequencies = (dims / 2) as usize;
    let inv_freq = inverse_frequencies(dims, theta)?;
    let select = selector(sections, frequencies);
    let mut chosen = Vec::with_capacity(l * frequencies);
    for i in first..first + l {
        let p = spans.position(i);
        chosen.extend(select.iter().map(|&s| p[s] as f32));
    }
    let angles = ops::multiply(
        Array::from_slice(&chosen, &[l as i32, frequencies as i32]),
        &inv_freq,
    )?;
    let angles = ops::concatenate(&[&angles, &angles], -1)?.reshape(&[1, 1, l as i32, dims])?;
    let (cos, sin) = (
        ops::cos(&angles)?.as_dtype(x.dtype())?,
        ops::sin(&angles)?.as_dtype(x.dtype())?,
    );
    let turned = x.index((.., .., .., ..dims));
    let half = dims / 2;
    let rotated = ops::concatenate(
        &[
            ops::negative(turned.index((.., .., .., half..)))?,
            turned.index((.., .., .., ..half)),
        ],
        -1,
    )?;
    let out = ops::add(
        &ops::multiply(&turned, &cos)?,
        &ops::multiply(&rotated, &sin)?,
    )?;
    if dims < x.shape()[3] {
        Ok(ops::concatenate(&[out, x.index((.., .., .., dims..))], -1)?)
    } else {
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_follow_mlx_vlms_rope_index() {
        // mlx-vlm's position ids for the Qwen3.5 fixture's prompt: 4 text tokens, a 2×2
        // image, then text (rope delta -2).
        let spans = MropeSpans::new(vec![ImageSpan {
            start: 4,
            rows: 2,
            cols: 2,
        }])
        .unwrap();
        let got: Vec<[i64; 3]> = (0..10).map(|i| spans.position(i)).collect();
        let t = [0, 1, 2, 3, 4, 4, 4, 4, 6, 7];
        let h = [0, 1, 2, 3, 4, 4, 5, 5, 6, 7];
        let w = [0, 1, 2, 3, 4, 5, 4, 5, 6, 7];
        for i in 0..10 {
            assert_eq!(got[i], [t[i], h[i], w[i]], "index {i}");
        }
        // A wide image (1×3) then a tall one (3×1): each shifts by max - count.
        let two = MropeSpans::new(vec![
            ImageSpan {
                start: 1,
                rows: 1,
                cols: 3,
            },
            ImageSpan {
                start: 5,
                rows: 3,
                cols: 1,
            },
        ])
        .unwrap();
        assert_eq!(two.position(3), [1, 1, 3]);
        assert_eq!(two.position(4), [4, 4, 4]);
        assert_eq!(two.position(7), [5, 7, 5]);
        assert_eq!(two.position(8), [8, 8, 8]);
        assert!(two.has_image_in(3..5) && !two.has_image_in(4..5) && !two.has_image_in(8..20));
        assert!(MropeSpans::new(vec![
            ImageSpan {
                start: 1,
                rows: 2,
                cols: 2
            },
            ImageSpan {
                start: 3,
                rows: 1,
                cols: 1
            },
        ])
        .is_err());
    }

    #[test]
    fn the_selector_interleaves_sections() {
        assert_eq!(selector([3, 3, 2], 8), [0, 1, 2, 0, 1, 2, 0, 1]);
        assert_eq!(selector([24, 20, 20], 64)[58..], [1, 2, 0, 0, 0, 0]);
    }
}
