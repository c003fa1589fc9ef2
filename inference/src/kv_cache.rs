//! The key/value cache of one sequence: per layer, the keys and values of all past positions.

use crate::error::Result;
use mlx_rs::{ops, Array};

/// Keys and values of one layer, `[batch, kv_heads, positions, head_dim]`.
#[derive(Debug, Default, Clone)]
pub struct LayerCache {
    keys: Option<Array>,
    values: Option<Array>,
    len: usize,
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

    /// Appends new keys/values and returns all of them.
    pub fn append(&mut self, keys: Array, values: Array) -> Result<(Array, Array)> {
        let added = keys.shape()[2] as usize;
        let (k, v) = match (self.keys.take(), self.values.take()) {
            (Some(pk), Some(pv)) => (
                ops::concatenate(&[pk, keys], 2)?,
                ops::concatenate(&[pv, values], 2)?,
            ),
            _ => (keys, values),
        };
        self.keys = Some(k.clone());
        self.values = Some(v.clone());
        self.len += added;
        Ok((k, v))
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
}
