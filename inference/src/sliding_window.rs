//! Sliding-window attention layers (gpt-oss's `layer_types`, Gemma 3's local layers): which
//! layers of a model see only a recent window of positions, read from `config.json`.

use crate::error::{InferenceError, Result};
use mlx_rs::Array;
use serde_json::Value;

/// Which layers attend only to the last `size` positions (their own included): gpt-oss's
/// `layer_types`, Gemma 3's local layers. Layer indices are global, so a pipeline stage
/// holding layers `[start, end)` asks about its layers by their place in the whole model.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SlidingWindow {
    /// Positions a sliding layer's query sees, itself included (`sliding_window`).
    pub size: usize,
    /// Per layer, whether it slides.
    pub layers: Vec<bool>,
}

impl SlidingWindow {
    /// Reads `sliding_window` and `layer_types` (`"sliding_attention"` / `"full_attention"`,
    /// one per layer); where `layer_types` is absent, `default` says which layers slide.
    pub fn from_hf_json(
        v: &Value,
        num_layers: usize,
        default: impl Fn(usize) -> bool,
    ) -> Result<Option<SlidingWindow>> {
        let Some(size) = v.get("sliding_window").and_then(Value::as_u64) else {
            return Ok(None);
        };
        let layers = match v.get("layer_types").and_then(Value::as_array) {
            Some(types) => types
                .iter()
                .map(|t| match t.as_str() {
                    Some("sliding_attention") => Ok(true),
                    Some("full_attention") => Ok(false),
                    other => Err(InferenceError::BadConfig(format!(
                        "layer_types holds {other:?}; this build knows sliding_attention and \
                         full_attention"
                    ))),
                })
                .collect::<Result<Vec<bool>>>()?,
            None => (0..num_layers).map(default).collect(),
        };
        if layers.len() != num_layers || size == 0 {
            return Err(InferenceError::BadConfig(format!(
                "layer_types names {} layers of {num_layers}, sliding_window {size}: fix \
                 config.json so they agree",
                layers.len()
            )));
        }
        Ok(Some(SlidingWindow {
            size: size as usize,
            layers,
        }))
    }

    /// The window of layer `layer` (global index), or `None` for a full-attention layer.
    pub fn of_layer(&self, layer: usize) -> Option<usize> {
        self.layers
            .get(layer)
            .copied()
            .unwrap_or(false)
            .then_some(self.size)
    }
}

/// Which keys `[first, total)` each of `new` queries at positions `[offset, offset + new)` sees
/// in a sliding layer: its own position and the `window - 1` before it. `[new, total - first]`
/// booleans; `None` when that is plain causal attention.
pub(crate) fn window_mask(
    offset: usize,
    new: usize,
    first: usize,
    total: usize,
    window: usize,
) -> Option<Array> {
    let keys = total - first;
    let mut mask = Vec::with_capacity(new * keys);
    for i in offset..offset + new {
        mask.extend((first..total).map(|j| j <= i && i - j < window));
    }
    if new == 1 && mask.iter().all(|&m| m) {
        return None;
    }
    Some(Array::from_slice(&mask, &[new as i32, keys as i32]))
}

/// How queries attend to what [`visible`] gives them.
pub(crate) enum VisibleMask {
    /// Every query sees every key.
    All,
    /// Each query sees the keys up to its own position.
    Causal,
    /// `[new, keys]` booleans.
    Array(Array),
}

impl VisibleMask {
    /// The mask as attention takes it.
    pub(crate) fn as_sdpa(&self) -> Option<mlx_rs::fast::ScaledDotProductAttentionMask<'_>> {
        use mlx_rs::fast::ScaledDotProductAttentionMask as Mask;
        match self {
            VisibleMask::All => None,
            VisibleMask::Causal => Some(Mask::Causal),
            VisibleMask::Array(m) => Some(Mask::Array(m)),
        }
    }
}

/// What `new` queries at positions `[offset, offset + new)` read of a layer's held keys and
/// values (`k`, `v`: positions `held_from..offset + new`): in a sliding layer of `window`
/// (once the positions pass it) only the columns some query still sees, masked to each
/// query's window; else all of them, causal when there are several queries. A layer and the
/// layers sharing its cache read the same.
pub(crate) fn visible(
    k: &Array,
    v: &Array,
    held_from: usize,
    offset: usize,
    new: usize,
    window: Option<usize>,
) -> (Array, Array, VisibleMask) {
    use mlx_rs::ops::indexing::IndexOp;
    let total = offset + new;
    match window.filter(|&w| total > w) {
        Some(window) => {
            // Keys before the first query's window are seen by no query (and a sliding
            // cache holds positions from `held_from` on).
            let first = (offset + 1).saturating_sub(window);
            let column = (first - held_from) as i32;
            let keys = |t: &Array| t.index((.., .., column.., ..));
            let mask = match window_mask(offset, new, first, total, window) {
                Some(m) => VisibleMask::Array(m),
                None => VisibleMask::All,
            };
            (keys(k), keys(v), mask)
        }
        None if new > 1 => (k.clone(), v.clone(), VisibleMask::Causal),
        None => (k.clone(), v.clone(), VisibleMask::All),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(mask: Option<Array>) -> Option<Vec<bool>> {
        mask.map(|m| {
            m.eval().unwrap();
            m.as_slice::<bool>().to_vec()
        })
    }

    /// Queries at positions 5 and 6 with a window of 3 over keys 3..7: each sees itself and
    /// the two before it, nothing later.
    #[test]
    fn a_window_sees_its_last_positions() {
        let mask = host(window_mask(5, 2, 3, 7, 3)).unwrap();
        #[rustfmt::skip]
        let want = [
            true, true, true, false, // position 5: keys 3, 4, 5
            false, true, true, true, // position 6: keys 4, 5, 6
        ];
        assert_eq!(mask, want);
        // One query whose window is exactly the keys given needs no mask.
        assert_eq!(host(window_mask(9, 1, 7, 10, 3)), None);
    }
}
