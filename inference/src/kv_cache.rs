//! The key/value cache of one sequence: per layer, the keys and values of its past positions.
//!
//! Buffers grow in steps of [`STEP`] positions and new entries are written in place (MLX
//! reuses a buffer nothing else holds), so a decoding step neither copies the whole cache
//! nor allocates.
//!
//! A sliding-window layer (gpt-oss's and Gemma 3's local layers) keeps only what its queries
//! can still see: when its buffer is full it forgets every position but the last
//! `window - 1` (the next query's window, itself aside) and makes room for `window` more, so
//! it holds at most `2·window - 1` positions plus one step's new ones ([`held_bound`]),
//! however long the sequence, and copies `window - 1` positions once per `window` steps.
//!
//! A linear-attention layer (Gated DeltaNet: Qwen3.5, Qwen3-Next) holds no keys or values but a
//! recurrent state of fixed size ([`RecurrentState`]: the short convolution's last inputs and
//! one matrix per value head), replaced at every step. It summarizes every position so far and
//! cannot be taken back: such a layer truncates only to its own length.

use crate::error::Result;
use crate::mrope::MropeSpans;
use mlx_rs::ops::indexing::{IndexOp, TryIndexMutOp};
use mlx_rs::{ops, Array};
use std::sync::Arc;

/// Positions added to a buffer when it is full.
pub const STEP: i32 = 256;

/// Positions a sliding layer of `window` holds at most between steps: the last
/// `window - 1` kept at a trim and room for `window` more. What the KV budget counts for it.
pub fn held_bound(window: usize) -> usize {
    2 * window.max(1) - 1
}

/// The state a recurrent (linear-attention) layer carries from one step to the next, as
/// mlx-lm's `ArraysCache(size=2)` holds it for Gated DeltaNet.
#[derive(Debug, Clone)]
pub struct RecurrentState {
    /// The last `kernel - 1` inputs of the causal convolution, `[batch, kernel - 1, channels]`.
    pub conv: Array,
    /// Per value head, the delta rule's matrix, `[batch, v_heads, v_dim, k_dim]` (float32).
    pub matrix: Array,
}

/// Keys and values of one layer, `[batch, kv_heads, capacity, head_dim]`. Column `c` holds
/// position `dropped + c`: a sliding layer forgets its oldest positions (see the module docs).
/// A recurrent layer holds its [`RecurrentState`] instead.
#[derive(Debug, Default, Clone)]
pub struct LayerCache {
    keys: Option<Array>,
    values: Option<Array>,
    len: usize,
    /// Leading positions forgotten (always 0 for a full-attention layer).
    dropped: usize,
    /// The layer's window, once a windowed append said so.
    window: Option<usize>,
    /// A recurrent layer's state, once it has seen a position.
    state: Option<RecurrentState>,
    /// Whether the layer's values carry more than the shared decode rows hold (MiniMax M3's
    /// index keys, [`crate::models::block_index`]): its sequence decodes on its own cache.
    alone: bool,
    /// The sequence's image spans, when its positions are M-RoPE's ([`crate::mrope`]): its
    /// attention rotates by them, and it decodes on its own cache.
    mrope: Option<Arc<MropeSpans>>,
    /// During a step, the keys and values this layer attended over, lent to the later layers
    /// that read them (Gemma 4's KV-shared layers); a sharing layer holds its source's here.
    lent: Option<Box<LentKv>>,
}

/// The keys and values one layer attended over in a step, `[batch, kv_heads, held, head_dim]`
/// holding positions from `held_from`, and the position of the step's first new token: what a
/// layer sharing that layer's cache attends over in the same step.
#[derive(Debug, Clone)]
pub struct LentKv {
    /// The held keys, after the step's new ones were written.
    pub keys: Array,
    /// The held values.
    pub values: Array,
    /// The position of the first held column.
    pub held_from: usize,
    /// The position of the step's first new token.
    pub offset: usize,
}

fn grow(buffer: Option<Array>, like: &Array, used: i32, needed: i32) -> Result<Array> {
    let s = like.shape();
    let capacity = buffer.as_ref().map_or(0, |b| b.shape()[2]);
    if needed <= capacity {
        if let Some(b) = buffer {
            return Ok(b);
        }
    }
    let new_capacity = (needed + STEP - 1) / STEP * STEP;
    let fresh = ops::zeros_dtype(&[s[0], s[1], new_capacity - used, s[3]], like.dtype())?;
    Ok(match buffer {
        Some(b) if used > 0 => ops::concatenate(&[b.index((.., .., 0..used, ..)), fresh], 2)?,
        _ => fresh,
    })
}

/// A fresh buffer holding the first `columns` columns of `buffer` `[batch, heads, capacity,
/// head_dim]`, sharing nothing with it (MLX may hand out a view of the same buffer for a
/// slice that is already contiguous, which would keep the whole buffer alive).
fn exact_copy(buffer: &Array, columns: i32) -> Result<Array> {
    let view = buffer.index((.., .., 0..columns, ..)).contiguous()?;
    view.eval()?;
    Ok(view.deep_clone())
}

impl LayerCache {
    /// Positions already cached (the offset of the next token).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True before the first token.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Leading positions this layer no longer holds (a sliding layer's forgotten ones).
    pub fn dropped(&self) -> usize {
        self.dropped
    }

    /// The window of a sliding layer (known after its first append).
    pub fn window(&self) -> Option<usize> {
        self.window
    }

    /// Positions held now (`len - dropped`).
    pub fn held(&self) -> usize {
        self.len - self.dropped
    }

    /// A recurrent layer's state (`None` before its first position, or for a KV layer).
    pub fn state(&self) -> Option<&RecurrentState> {
        self.state.as_ref()
    }

    /// Replaces a recurrent layer's state with the one after `new` more positions.
    pub fn set_state(&mut self, state: RecurrentState, new: usize) {
        self.state = Some(state);
        self.len += new;
    }

    /// Counts `new` more positions in a layer that keeps nothing of them (a block without
    /// attention: Nemotron-H's MLP and MoE layers), so its length stays the sequence's.
    pub fn advance(&mut self, new: usize) {
        self.len += new;
    }

    /// Whether this layer has counted positions without keeping anything of them (a block
    /// without attention): its sequence cannot join the shared decode rows, which hold keys
    /// and values for every layer.
    pub fn counts_only(&self) -> bool {
        self.len > 0 && self.keys.is_none() && self.state.is_none()
    }

    /// The sequence's M-RoPE image spans, if it has images (see [`crate::mrope`]).
    pub fn mrope(&self) -> Option<&MropeSpans> {
        self.mrope.as_deref()
    }

    /// Lends the keys and values this layer attended over in this step to the layers that
    /// share its cache ([`LayerCache::follow`]).
    pub fn lend(&mut self, kv: LentKv) {
        self.lent = Some(Box::new(kv));
    }

    /// What this layer lends (or, in a sharing layer, was lent) in this step.
    pub fn lent(&self) -> Option<&LentKv> {
        self.lent.as_deref()
    }

    /// Ends a step's lending: the buffers are this layer's alone again (so the next step
    /// writes them in place).
    pub fn end_lending(&mut self) {
        self.lent = None;
    }

    /// Makes this layer, which keeps no keys of its own, read `source`'s this step: its
    /// lent keys and values, its length and what it has forgotten. Such a layer counts
    /// positions only ([`LayerCache::counts_only`]): its sequence decodes on its own cache.
    pub fn follow(&mut self, source: &LayerCache) {
        self.lent = source.lent.clone();
        self.len = source.len;
        self.dropped = source.dropped;
        self.window = source.window;
    }

    /// Marks the layer as one whose sequence decodes on its own cache, never in the shared
    /// decode rows (its attention needs each sequence's positions: block-sparse attention).
    pub fn keep_out_of_decode_rows(&mut self) {
        self.alone = true;
    }

    /// Whether this layer holds a recurrent state (which cannot be truncated).
    pub fn is_recurrent(&self) -> bool {
        self.state.is_some()
    }

    /// Appends new keys/values `[batch, kv_heads, new, head_dim]` and returns all of them.
    pub fn append(&mut self, keys: Array, values: Array) -> Result<(Array, Array)> {
        let (k, v, _) = self.append_within(keys, values, None)?;
        Ok((k, v))
    }

    /// Appends new keys/values `[batch, kv_heads, new, head_dim]` of a layer whose queries see
    /// the last `window` positions (`None`: all of them) and returns the positions held,
    /// with the first one's index: a sliding layer first forgets what no query will see when
    /// its buffer is full (see the module docs).
    pub fn append_within(
        &mut self,
        keys: Array,
        values: Array,
        window: Option<usize>,
    ) -> Result<(Array, Array, usize)> {
        let new = keys.shape()[2];
        if let Some(w) = window {
            self.window = Some(w);
            let capacity = self.keys.as_ref().map_or(0, |b| b.shape()[2]);
            let keep = w.saturating_sub(1);
            if self.held() as i32 + new > capacity {
                // Full: forget what no query will see, and make room for `window` more.
                let from = self.len.saturating_sub(keep).max(self.dropped);
                self.forget_before(from, new.max(w as i32), &keys, &values)?;
            }
        }
        let used = self.held() as i32;
        let end = used + new;
        let mut k = grow(self.keys.take(), &keys, used, end)?;
        let mut v = grow(self.values.take(), &values, used, end)?;
        k.try_index_mut((.., .., used..end, ..), &keys)?;
        v.try_index_mut((.., .., used..end, ..), &values)?;
        let out = (k.index((.., .., 0..end, ..)), v.index((.., .., 0..end, ..)));
        self.keys = Some(k);
        self.values = Some(v);
        self.len += new as usize;
        Ok((out.0, out.1, self.dropped))
    }

    /// Drops the spare columns of this layer's buffers: a fresh copy of exactly the positions
    /// held. A cache kept for later (a prompt cache's entry) then holds what its positions
    /// take, which is what the KV budget counts, not a growth step's worth of room (256
    /// positions, 12 MB for SmolLM2, behind a 30-token chat); appending to it later grows it
    /// again.
    pub fn compact(&mut self) -> Result<()> {
        let held = self.held() as i32;
        for buffer in [&mut self.keys, &mut self.values] {
            if let Some(b) = buffer.as_ref() {
                if b.shape()[2] > held {
                    *buffer = Some(exact_copy(b, held)?);
                }
            }
        }
        Ok(())
    }

    /// Keeps positions `from..len` in fresh buffers (shaped like the new `keys` and
    /// `values` but for their length) with room for `room` more.
    fn forget_before(
        &mut self,
        from: usize,
        room: i32,
        keys: &Array,
        values: &Array,
    ) -> Result<()> {
        let (a, b) = ((from - self.dropped) as i32, self.held() as i32);
        let keep = |t: Option<Array>, like: &Array| -> Result<Array> {
            let s = like.shape();
            let spare = ops::zeros_dtype(&[s[0], s[1], room, s[3]], like.dtype())?;
            Ok(match t {
                Some(t) if b > a => ops::concatenate(&[t.index((.., .., a..b, ..)), spare], 2)?,
                _ => spare,
            })
        };
        self.keys = Some(keep(self.keys.take(), keys)?);
        self.values = Some(keep(self.values.take(), values)?);
        self.dropped = from;
        Ok(())
    }

    /// Forgets every position from `len` on (a prompt cache's entry reused for a shorter
    /// prefix): later appends overwrite them. The buffers stay; they may be shared with the
    /// entry, and MLX copies a shared buffer rather than write into it. False, and nothing
    /// changed, when a sliding layer no longer holds what the next query at `len` would see.
    pub fn truncate(&mut self, len: usize) -> bool {
        if len >= self.len {
            return true;
        }
        if !self.can_truncate(len) {
            return false;
        }
        self.len = len.max(self.dropped);
        true
    }

    /// Whether [`LayerCache::truncate`] to `len` would succeed: the layer still holds the
    /// window of the next query at `len` (a full-attention layer always does); a recurrent
    /// state only where it is, since it has folded in every position it saw.
    pub fn can_truncate(&self, len: usize) -> bool {
        if self.state.is_some() {
            return len >= self.len;
        }
        len >= self.len
            || self.dropped <= len.saturating_sub(self.window.unwrap_or(1).saturating_sub(1))
    }

    /// A cache of `len` positions over buffers `[1, kv_heads, capacity, head_dim]` whose first
    /// `len - dropped` columns hold positions `dropped..len` (a sequence leaving the decode
    /// rows, [`crate::kv_rows`]), of a layer with `window`.
    pub fn from_buffers(
        keys: Array,
        values: Array,
        len: usize,
        dropped: usize,
        window: Option<usize>,
    ) -> LayerCache {
        LayerCache {
            keys: Some(keys),
            values: Some(values),
            len,
            dropped,
            window,
            state: None,
            alone: false,
            mrope: None,
            lent: None,
        }
    }

    /// The key and value buffers (their first [`LayerCache::held`] columns are in use), if
    /// any.
    pub fn buffers(&self) -> Option<(&Array, &Array)> {
        self.keys.as_ref().zip(self.values.as_ref())
    }

    /// The cached arrays (to evaluate them together with a step's output).
    pub fn arrays(&self) -> impl Iterator<Item = &Array> {
        self.keys
            .iter()
            .chain(self.values.iter())
            .chain(self.state.iter().flat_map(|s| [&s.conv, &s.matrix]))
    }
}

/// The cache of a shard: one [`LayerCache`] per layer it holds.
#[derive(Debug, Default, Clone)]
pub struct KvCache {
    /// Per layer, in the shard's order.
    pub layers: Vec<LayerCache>,
}

impl KvCache {
    /// An empty cache for `layers` layers.
    pub fn new(layers: usize) -> KvCache {
        KvCache {
            layers: vec![LayerCache::default(); layers],
        }
    }

    /// Positions cached so far.
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, LayerCache::len)
    }

    /// True before the first token.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps only the first `len` positions of every layer (see [`LayerCache::truncate`]);
    /// false, and nothing changed, when a sliding layer has forgotten what that needs.
    pub fn truncate(&mut self, len: usize) -> bool {
        if !self.can_truncate(len) {
            return false;
        }
        self.layers.iter_mut().all(|layer| layer.truncate(len))
    }

    /// Drops every layer's spare columns ([`LayerCache::compact`]).
    pub fn compact(&mut self) -> Result<()> {
        self.layers.iter_mut().try_for_each(LayerCache::compact)
    }

    /// Whether [`KvCache::truncate`] to `len` would succeed.
    pub fn can_truncate(&self, len: usize) -> bool {
        self.layers.iter().all(|l| l.can_truncate(len))
    }

    /// Whether a layer holds a recurrent state: such a cache decodes on its own rather than
    /// in the shared decode rows ([`crate::kv_rows`], which hold keys and values).
    pub fn is_recurrent(&self) -> bool {
        self.layers.iter().any(LayerCache::is_recurrent)
    }

    /// Whether this cache must decode on its own: a layer holds a recurrent state, or keeps
    /// nothing of its positions (a pipeline stage of Nemotron-H may hold only attention and
    /// such layers), or its attention needs the sequence's own positions (block-sparse
    /// attention, or M-RoPE positions of images); the shared decode rows hold keys and values
    /// for every layer.
    pub fn decodes_alone(&self) -> bool {
        self.layers
            .iter()
            .any(|l| l.is_recurrent() || l.counts_only() || l.alone || l.mrope.is_some())
    }

    /// Sets (or, with `None`, clears) the sequence's M-RoPE image spans on every layer: a
    /// cache taken from the prompt cache for another sequence gets that one's spans.
    pub fn set_mrope(&mut self, spans: Option<Arc<MropeSpans>>) {
        for layer in &mut self.layers {
            layer.mrope = spans.clone();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A layer without attention counts positions and keeps nothing: its cache decodes on its
    /// own (the shared decode rows would find no keys for it, which failed a Nemotron-H
    /// pipeline rank holding only attention and MoE layers on a real node).
    #[test]
    fn a_cache_with_a_counting_layer_decodes_alone() {
        let mut cache = KvCache::new(2);
        cache.layers[0]
            .append(positions(0, 3), positions(0, 3))
            .unwrap();
        cache.layers[1].advance(3);
        assert_eq!(cache.len(), 3);
        assert!(cache.layers[1].counts_only() && !cache.layers[0].counts_only());
        assert!(cache.decodes_alone() && !cache.is_recurrent());
        let mut plain = KvCache::new(1);
        plain.layers[0]
            .append(positions(0, 3), positions(0, 3))
            .unwrap();
        assert!(!plain.decodes_alone());
        assert!(cache.truncate(2) && cache.layers[1].len() == 2);
    }

    /// Position `p`'s key is `p` (one head of width 1).
    fn positions(from: usize, to: usize) -> Array {
        let v: Vec<f32> = (from..to).map(|p| p as f32).collect();
        Array::from_slice(&v, &[1, 1, (to - from) as i32, 1])
    }

    fn host(a: &Array) -> Vec<f32> {
        let a = a.flatten(None, None).unwrap();
        a.eval().unwrap();
        a.as_slice::<f32>().to_vec()
    }

    #[test]
    fn a_sliding_layer_holds_its_window_however_long_the_sequence() {
        for (window, chunk) in [(8usize, 1usize), (8, 3), (5, 7), (1, 1), (16, 40)] {
            let mut cache = LayerCache::default();
            let mut len = 0;
            while len < 300 {
                let (k, _, first) = cache
                    .append_within(
                        positions(len, len + chunk),
                        positions(len, len + chunk),
                        Some(window),
                    )
                    .unwrap();
                len += chunk;
                // It gives back every position it holds, in order, up to the newest…
                let want: Vec<f32> = (first..len).map(|p| p as f32).collect();
                assert_eq!(host(&k), want, "window {window}, chunk {chunk}, at {len}");
                // …which covers the first new query's window…
                assert!(first <= (len - chunk + 1).saturating_sub(window));
                // …and no more than the bound besides the new ones.
                assert!(
                    cache.held() <= held_bound(window) + chunk,
                    "window {window}, chunk {chunk}: {} held at {len}",
                    cache.held()
                );
                assert_eq!((cache.len(), cache.dropped()), (len, first));
            }
            assert!(cache.dropped() > 0);
        }
    }

    #[test]
    fn a_compacted_cache_holds_only_its_positions_and_grows_again() {
        for window in [None, Some(8)] {
            let mut cache = KvCache::new(1);
            let layer = &mut cache.layers[0];
            for p in 0..21 {
                layer
                    .append_within(positions(p, p + 1), positions(p, p + 1), window)
                    .unwrap();
            }
            let (len, dropped) = (layer.len(), layer.dropped());
            let capacity = layer.buffers().unwrap().0.shape()[2];
            assert!(
                capacity as usize > layer.held(),
                "{window:?}: {capacity} columns"
            );
            cache.compact().unwrap();
            let layer = &mut cache.layers[0];
            let (k, v) = layer.buffers().unwrap();
            assert_eq!(
                (k.shape()[2], v.shape()[2]),
                (layer.held() as i32, layer.held() as i32)
            );
            let want: Vec<f32> = (dropped..len).map(|p| p as f32).collect();
            assert_eq!((host(k), host(v)), (want.clone(), want), "{window:?}");
            assert_eq!((layer.len(), layer.dropped()), (len, dropped));
            // Appending to it continues the sequence.
            let (k, _, first) = layer
                .append_within(positions(21, 23), positions(21, 23), window)
                .unwrap();
            let want: Vec<f32> = (first..23).map(|p| p as f32).collect();
            assert_eq!(host(&k), want, "{window:?}");
        }
    }

    #[test]
    fn a_sliding_layer_cannot_go_back_before_what_it_forgot() {
        let mut cache = KvCache::new(2);
        let (w, n) = (4, 40);
        for p in 0..n {
            cache.layers[0]
                .append_within(positions(p, p + 1), positions(p, p + 1), Some(w))
                .unwrap();
            cache.layers[1]
                .append(positions(p, p + 1), positions(p, p + 1))
                .unwrap();
        }
        let dropped = cache.layers[0].dropped();
        assert!(dropped > 0 && cache.layers[1].dropped() == 0);
        // The next query at `len` needs positions `len - (w - 1)..len`.
        let lowest = dropped + w - 1;
        assert!(!cache.can_truncate(lowest - 1));
        assert!(!cache.truncate(lowest - 1));
        assert_eq!(cache.len(), n, "a refused truncation changes nothing");
        assert!(cache.truncate(lowest));
        assert_eq!(cache.len(), lowest);
        // It continues from there with the positions it needs.
        let (k, _, first) = cache.layers[0]
            .append_within(
                positions(lowest, lowest + 1),
                positions(lowest, lowest + 1),
                Some(w),
            )
            .unwrap();
        assert!(first <= lowest + 1 - w);
        let got = host(&k);
        let want: Vec<f32> = (lowest + 1 - w..=lowest).map(|p| p as f32).collect();
        assert_eq!(&got[got.len() - w..], &want[..]);
        // A full-attention cache truncates anywhere.
        let mut full = KvCache::new(1);
        full.layers[0]
            .append(positions(0, 10), positions(0, 10))
            .unwrap();
        assert!(full.truncate(0));
    }

    #[test]
    fn a_recurrent_state_truncates_only_to_where_it_is() {
        let mut cache = KvCache::new(2);
        assert!(!cache.is_recurrent(), "a fresh cache holds no state yet");
        cache.layers[0]
            .append(positions(0, 5), positions(0, 5))
            .unwrap();
        let state = RecurrentState {
            conv: Array::from_slice(&[1.0f32; 6], &[1, 3, 2]),
            matrix: Array::from_slice(&[2.0f32; 4], &[1, 1, 2, 2]),
        };
        cache.layers[1].set_state(state, 5);
        assert!(cache.is_recurrent());
        assert_eq!(cache.len(), 5);
        // Its own length (a prompt cache entry reused whole) and beyond are fine…
        assert!(cache.can_truncate(5) && cache.can_truncate(9));
        // …anything shorter is not: the state has folded those positions in.
        assert!(!cache.can_truncate(4) && !cache.can_truncate(0));
        assert!(!cache.truncate(3));
        assert_eq!(cache.len(), 5, "a refused truncation changes nothing");
        assert!(cache.truncate(5));
        assert_eq!(
            cache.layers[1].arrays().count(),
            2,
            "the state is evaluated with a step"
        );
    }
}
