//! The key/value cache of one sequence: per layer, the keys and values of all past positions.
//!
//! Buffers grow in steps of [`STEP`] positions and new entries are written in place (MLX
//! reuses a buffer nothing else holds), so a decoding step neither copies the whole cache
//! nor allocates.

use crate::error::Result;
use mlx_rs::ops::indexing::{IndexOp, TryIndexMutOp};
use mlx_rs::{ops, Array};

/// Positions added to a buffer when it is full.
pub const STEP: i32 = 256;

/// Keys and values of one layer, `[batch, kv_heads, capacity, head_dim]`.
#[derive(Debug, Default, Clone)]
pub struct LayerCache {
    keys: Option<Array>,
    values: Option<Array>,
    len: usize,
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

impl LayerCache {
    /// Positions already cached (the offset of the next token).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True before the first token.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends new keys/values `[batch, kv_heads, new, head_dim]` and returns all of them.
    pub fn append(&mut self, keys: Array, values: Array) -> Result<(Array, Array)> {
        let used = self.len as i32;
        let end = used + keys.shape()[2];
        let mut k = grow(self.keys.take(), &keys, used, end)?;
        let mut v = grow(self.values.take(), &values, used, end)?;
        k.try_index_mut((.., .., used..end, ..), &keys)?;
        v.try_index_mut((.., .., used..end, ..), &values)?;
        let out = (k.index((.., .., 0..end, ..)), v.index((.., .., 0..end, ..)));
        self.keys = Some(k);
        self.values = Some(v);
        self.len = end as usize;
        Ok(out)
    }

    /// Forgets every position from `len` on (a prompt cache's entry reused for a shorter
    /// prefix): later appends overwrite them. The buffers stay; they may be shared with the
    /// entry, and MLX copies a shared buffer rather than write into it.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// A cache of `len` positions over buffers `[1, kv_heads, capacity, head_dim]` whose first
    /// `len` columns hold them (a sequence leaving the decode rows, [`crate::kv_rows`]).
    pub fn from_buffers(keys: Array, values: Array, len: usize) -> LayerCache {
        LayerCache {
            keys: Some(keys),
            values: Some(values),
            len,
        }
    }

    /// The key and value buffers (their first [`LayerCache::len`] columns are in use), if any.
    pub fn buffers(&self) -> Option<(&Array, &Array)> {
        self.keys.as_ref().zip(self.values.as_ref())
    }

    /// The cached arrays (to evaluate them together with a step's output).
    pub fn arrays(&self) -> impl Iterator<Item = &Array> {
        self.keys.iter().chain(self.values.iter())
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

    /// Keeps only the first `len` positions of every layer (see [`LayerCache::truncate`]).
    pub fn truncate(&mut self, len: usize) {
        for layer in &mut self.layers {
            layer.truncate(len);
        }
    }
}
