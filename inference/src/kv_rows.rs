//! Decoding sequences' caches side by side, so that one decode step runs RoPE, the cache write
//! and attention once per layer for all of them instead of once per sequence.
//!
//! Per-sequence caches cost about 15 small MLX ops per layer per sequence in every step, and on
//! two CPU cores each small op costs about 40 µs of scheduling: 16 sequences spent most of a
//! 281 ms step there while the weights were read once. [`KvRows`] keeps the caches of decoding
//! sequences in one `[rows, kv_heads, capacity, head_dim]` buffer per layer (the layout of
//! mlx-lm's batch cache): rows are right-aligned, so every row's next position is written at the
//! same column in one update, RoPE takes each row's position from an array, and one masked
//! attention covers every row.
//!
//! Row `r` holds its sequence's positions in columns `starts[r]..end`; the columns before (left
//! padding) are masked out. Padding is bounded ([`KvRows::fits`]): it never exceeds half the
//! real positions plus a few per row (a sequence that would pad more keeps its own cache), and
//! leaving rows trims the padding every row shares.
//!
//! A sliding-window layer's buffer starts at a later column ([`RowLayer`]'s `first`): when it
//! is full, the columns no row's next query can see are dropped (as a sequence's own cache
//! does, [`crate::kv_cache`]), so its rows hold at most about twice the window.

use crate::error::{InferenceError, Result};
use crate::kv_cache::{KvCache, LayerCache, STEP};
use mlx_rs::ops::indexing::{IndexOp, TryIndexMutOp};
use mlx_rs::{ops, Array};

/// Left padding every row may have whatever the others hold (see [`KvRows::fits`]).
pub const PADDING_SLACK: usize = 16;

/// A sequence's KV state in one step of a shard's layers.
pub enum StepKv<'a> {
    /// `len` new positions of one sequence continuing its own cache.
    Own(usize, &'a mut KvCache),
    /// One new position for each row of the rows, in row order.
    Rows(&'a mut KvRows, &'a RowStep),
}

/// The same, for one layer.
pub enum LayerKv<'a> {
    /// `len` new positions of one sequence continuing its own layer cache.
    Own(usize, &'a mut LayerCache),
    /// One new position for each row, in row order.
    Rows(&'a mut RowLayer, &'a RowStep),
}

impl LayerKv<'_> {
    /// Counts this entry's new positions in a layer that keeps nothing of them (a block
    /// without attention); shared decode rows hold keys and values only, so such a layer is
    /// never given them (its model has recurrent layers: each sequence decodes on its own).
    pub fn advance(&mut self) -> crate::error::Result<()> {
        match self {
            LayerKv::Own(len, cache) => {
                cache.advance(*len);
                Ok(())
            }
            LayerKv::Rows(..) => Err(crate::error::InferenceError::InvalidRequest(
                "a block without attention was given shared decode rows".into(),
            )),
        }
    }
}

impl StepKv<'_> {
    /// New positions this entry covers in the step's activations.
    pub fn positions(&self) -> usize {
        match self {
            StepKv::Own(len, _) => *len,
            StepKv::Rows(_, step) => step.rows(),
        }
    }

    /// This entry's share of layer `layer`.
    pub fn layer(&mut self, layer: usize) -> LayerKv<'_> {
        match self {
            StepKv::Own(len, cache) => LayerKv::Own(*len, &mut cache.layers[layer]),
            StepKv::Rows(rows, step) => LayerKv::Rows(&mut rows.layers[layer], step),
        }
    }

    /// Makes layer `layer` read layer `source`'s keys and values this step
    /// ([`LayerCache::follow`]); shared decode rows hold no such layer (its sequence decodes
    /// on its own cache).
    pub fn follow(&mut self, layer: usize, source: usize) -> Result<()> {
        match self {
            StepKv::Own(_, cache) if source < layer && layer < cache.layers.len() => {
                let (before, from) = cache.layers.split_at_mut(layer);
                from[0].follow(&before[source]);
                Ok(())
            }
            StepKv::Own(..) => Err(InferenceError::InvalidRequest(format!(
                "layer {layer} cannot share the cache of layer {source}"
            ))),
            StepKv::Rows(..) => Err(InferenceError::InvalidRequest(
                "a layer sharing another's keys was given shared decode rows".into(),
            )),
        }
    }

    /// Ends layer `layer`'s lending of its keys and values.
    pub fn end_lending(&mut self, layer: usize) {
        if let StepKv::Own(_, cache) = self {
            if let Some(l) = cache.layers.get_mut(layer) {
                l.end_lending();
            }
        }
    }

    /// Layers it holds.
    pub fn layers(&self) -> usize {
        match self {
            StepKv::Own(_, cache) => cache.layers.len(),
            StepKv::Rows(rows, _) => rows.layers.len(),
        }
    }
}

/// What every layer of one step over the rows shares.
pub struct RowStep {
    /// Per row, the position of its new token (`[rows]`, int32): RoPE's offsets.
    pub(crate) positions: Array,
    /// `[rows, 1, 1, column + 1]` booleans: the columns each row attends to; `None` when no
    /// row has padding (every row attends to every column, as one sequence alone does).
    pub(crate) mask: Option<Array>,
    /// The column this step writes.
    column: i32,
    rows: i32,
}

/// One layer's keys and values of every row, `[rows, kv_heads, capacity, head_dim]`; buffer
/// column `c` is the rows' column `first + c`.
pub struct RowLayer {
    keys: Array,
    values: Array,
    /// The rows' column of the buffers' first (0 unless a sliding layer dropped some).
    first: usize,
    /// A sliding layer's window.
    window: Option<usize>,
}

impl RowLayer {
    /// Writes the step's new keys/values (`[rows, kv_heads, 1, head_dim]`) at its column and
    /// returns every row's columns held, up to it, with the rows' column of the first: a
    /// full buffer grows, or, in a sliding layer, first drops what no query will see again.
    pub fn write(
        &mut self,
        keys: &Array,
        values: &Array,
        step: &RowStep,
    ) -> Result<(Array, Array, usize)> {
        let column = step.column as usize;
        let capacity = self.keys.shape()[2] as usize;
        if column - self.first >= capacity {
            let keep_from = match self.window {
                Some(w) => (column + 1).saturating_sub(w).max(self.first),
                None => self.first,
            };
            let room = match self.window {
                Some(w) => column - keep_from + w,
                None => round_up(column + 1) - keep_from,
            };
            let (a, b) = (
                (keep_from - self.first) as i32,
                (column - self.first) as i32,
            );
            self.keys = pad_right(self.keys.index((.., .., a..b, ..)), room)?;
            self.values = pad_right(self.values.index((.., .., a..b, ..)), room)?;
            self.first = keep_from;
        }
        let c = (column - self.first) as i32;
        self.keys.try_index_mut((.., .., c..c + 1, ..), keys)?;
        self.values.try_index_mut((.., .., c..c + 1, ..), values)?;
        Ok((
            self.keys.index((.., .., 0..c + 1, ..)),
            self.values.index((.., .., 0..c + 1, ..)),
            self.first,
        ))
    }
}

/// Caches of decoding sequences as rows of shared buffers (see the module docs).
#[derive(Default)]
pub struct KvRows {
    layers: Vec<RowLayer>,
    starts: Vec<usize>,
    end: usize,
}

fn round_up(n: usize) -> usize {
    n.div_ceil(STEP as usize) * STEP as usize
}

/// How a buffer whose column 0 holds position `held_from`, where position `p` lands on the
/// rows' column `offset + p`, fills the rows' columns from `first` on: the buffer column to
/// start at and the zero columns to put before it (columns it does not hold).
fn held_columns(first: usize, offset: usize, held_from: usize) -> (i32, usize) {
    let lands = offset + held_from;
    if first >= lands {
        ((first - lands) as i32, 0)
    } else {
        (0, lands - first)
    }
}

/// `a` (`[r, h, n, d]`) with `pad` zero columns before it.
fn pad_left(a: Array, pad: usize) -> Result<Array> {
    if pad == 0 {
        return Ok(a);
    }
    let s = a.shape();
    let zeros = ops::zeros_dtype(&[s[0], s[1], pad as i32, s[3]], a.dtype())?;
    Ok(ops::concatenate(&[zeros, a], 2)?)
}

/// `a` (`[r, h, n, d]`) with zero columns after it up to `capacity`.
fn pad_right(a: Array, capacity: usize) -> Result<Array> {
    let s = a.shape();
    let spare = capacity as i32 - s[2];
    if spare <= 0 {
        return Ok(a);
    }
    let zeros = ops::zeros_dtype(&[s[0], s[1], spare, s[3]], a.dtype())?;
    Ok(ops::concatenate(&[a, zeros], 2)?)
}

impl KvRows {
    /// Rows held.
    pub fn rows(&self) -> usize {
        self.starts.len()
    }

    /// True with no rows.
    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }

    /// Positions row `row` holds.
    pub fn len_of(&self, row: usize) -> usize {
        self.end - self.starts[row]
    }

    /// Whether sequences of `lens` positions may join while the left padding stays within
    /// half the real positions (plus [`PADDING_SLACK`] per row, so sequences of about the same
    /// length always share): the KV budget counts real positions, and the rows may exceed
    /// them by that much, besides the growth room every cache has.
    pub fn fits(&self, lens: &[usize]) -> bool {
        let rows = self.rows() + lens.len();
        let end = lens.iter().copied().fold(self.end, usize::max);
        let real: usize =
            (0..self.rows()).map(|r| self.len_of(r)).sum::<usize>() + lens.iter().sum::<usize>();
        let padding = rows * end - real;
        2 * padding <= real + 2 * PADDING_SLACK * rows
    }

    /// Appends `caches` (each with at least one position, of this shard's layers) as new rows,
    /// in order.
    pub fn join(&mut self, caches: Vec<KvCache>) -> Result<()> {
        if caches.is_empty() {
            return Ok(());
        }
        let layers = caches[0].layers.len();
        if caches
            .iter()
            .any(|c| c.is_empty() || c.layers.len() != layers)
            || (!self.is_empty() && self.layers.len() != layers)
        {
            return Err(InferenceError::InvalidRequest(
                "a cache joining the decode rows is empty or of another shard".into(),
            ));
        }
        let lens: Vec<usize> = caches.iter().map(KvCache::len).collect();
        let end = lens.iter().copied().fold(self.end, usize::max);
        let shift = end - self.end;
        let mut joined = Vec::with_capacity(layers);
        for j in 0..layers {
            let window = self
                .layers
                .get(j)
                .map_or(caches[0].layers[j].window(), |l| l.window);
            // A sliding layer keeps the columns the next step's queries see: the last
            // `window - 1` before column `end`.
            let first = window.map_or(0, |w| end.saturating_sub(w.saturating_sub(1)));
            let capacity = match window {
                Some(w) => end - first + w,
                None => round_up(end + 1),
            };
            let mut keys = Vec::with_capacity(caches.len() + 1);
            let mut values = Vec::with_capacity(caches.len() + 1);
            if let Some(layer) = self.layers.get(j) {
                // Its column `first` was `first - shift` before; it holds from `layer.first`.
                let (from, pad) = held_columns(first, shift, layer.first);
                let to = (self.end - layer.first) as i32;
                keys.push(pad_left(layer.keys.index((.., .., from..to, ..)), pad)?);
                values.push(pad_left(layer.values.index((.., .., from..to, ..)), pad)?);
            }
            for (cache, &len) in caches.iter().zip(&lens) {
                let layer = &cache.layers[j];
                let (k, v) = layer.buffers().ok_or_else(|| {
                    InferenceError::InvalidRequest("a layer of a joining cache is empty".into())
                })?;
                // Its position `p` lands on column `end - len + p`.
                let (from, pad) = held_columns(first, end - len, layer.dropped());
                let to = layer.held() as i32;
                keys.push(pad_left(k.index((.., .., from..to, ..)), pad)?);
                values.push(pad_left(v.index((.., .., from..to, ..)), pad)?);
            }
            joined.push(RowLayer {
                keys: pad_right(ops::concatenate(&keys, 0)?, capacity)?,
                values: pad_right(ops::concatenate(&values, 0)?, capacity)?,
                first,
                window,
            });
        }
        self.layers = joined;
        for s in &mut self.starts {
            *s += shift;
        }
        self.starts.extend(lens.iter().map(|&l| end - l));
        self.end = end;
        Ok(())
    }

    /// Row `row`'s cache as a sequence's own (a copy, evaluated, with room to grow), for a
    /// prompt cache or a sequence leaving the rows to run a longer part.
    pub fn extract(&self, row: usize) -> Result<KvCache> {
        let start = self.starts[row];
        let r = row as i32;
        let len = self.len_of(row);
        let mut layers = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            // The row's first column this layer still holds.
            let from = start.max(layer.first);
            let held = self.end - from;
            let capacity = match layer.window {
                Some(w) => held + w,
                None => round_up(len + 1),
            };
            let (a, b) = ((from - layer.first) as i32, (self.end - layer.first) as i32);
            let k = pad_right(layer.keys.index((r..r + 1, .., a..b, ..)), capacity)?;
            let v = pad_right(layer.values.index((r..r + 1, .., a..b, ..)), capacity)?;
            layers.push(LayerCache::from_buffers(
                k,
                v,
                len,
                from - start,
                layer.window,
            ));
        }
        let cache = KvCache { layers };
        mlx_rs::transforms::eval(cache.layers.iter().flat_map(LayerCache::arrays))?;
        Ok(cache)
    }

    /// Removes rows `rows` (any order, no repeats); the others keep their order. Padding that
    /// every remaining row has is cut.
    pub fn remove(&mut self, rows: &[usize]) -> Result<()> {
        let keep: Vec<usize> = (0..self.rows()).filter(|r| !rows.contains(r)).collect();
        if keep.len() == self.rows() {
            return Ok(());
        }
        if keep.is_empty() {
            *self = KvRows::default();
            return Ok(());
        }
        let cut = keep.iter().map(|&r| self.starts[r]).min().unwrap_or(0);
        let index = Array::from_slice(
            &keep.iter().map(|&r| r as i32).collect::<Vec<_>>(),
            &[keep.len() as i32],
        );
        for layer in &mut self.layers {
            // Columns before `cut` go; a sliding layer may hold none of them already.
            let from = cut.saturating_sub(layer.first) as i32;
            layer.keys = layer
                .keys
                .index((.., .., from.., ..))
                .take_axis(&index, 0)?;
            layer.values = layer
                .values
                .index((.., .., from.., ..))
                .take_axis(&index, 0)?;
            layer.first = layer.first.saturating_sub(cut);
        }
        self.starts = keep.iter().map(|&r| self.starts[r] - cut).collect();
        self.end -= cut;
        Ok(())
    }

    /// Prepares a step that gives every row one new position: each row's position and the
    /// attention mask (each layer makes room for the column when it writes it).
    pub fn begin_step(&mut self) -> Result<RowStep> {
        let column = self.end;
        let rows = self.rows();
        let positions: Vec<i32> = self.starts.iter().map(|&s| (column - s) as i32).collect();
        let width = column + 1;
        let mask = if self.starts.iter().all(|&s| s == 0) {
            None
        } else {
            let mut mask = vec![true; rows * width];
            for (r, &s) in self.starts.iter().enumerate() {
                mask[r * width..r * width + s].fill(false);
            }
            Some(Array::from_slice(&mask, &[rows as i32, 1, 1, width as i32]))
        };
        Ok(RowStep {
            positions: Array::from_slice(&positions, &[rows as i32]),
            mask,
            column: column as i32,
            rows: rows as i32,
        })
    }

    /// Ends a step begun with [`KvRows::begin_step`] that wrote every row's column.
    pub fn end_step(&mut self) {
        self.end += 1;
    }

    /// Every buffer (to evaluate them with a step's output).
    pub fn arrays(&self) -> impl Iterator<Item = &Array> {
        self.layers.iter().flat_map(|l| [&l.keys, &l.values])
    }
}

impl RowStep {
    /// Rows (new positions) in the step.
    pub fn rows(&self) -> usize {
        self.rows as usize
    }
}

#[cfg(test)]
pub(crate) mod tests;
