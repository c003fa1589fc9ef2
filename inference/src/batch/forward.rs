//! What the batcher runs a step on: [`BatchForward`], with the whole model in this process
//! ([`LocalBatch`], any number of sequences in one pass); rank 0 of a distributed instance
//! implements it too ([`super::RingBatch`]).

use crate::config::ModelConfig;
use crate::error::{InferenceError, Result};
use crate::kv_cache::KvCache;
use crate::models::shard::{BatchPart, ModelShard};
use mlx_rs::Array;
use std::collections::BTreeMap;

/// A sequence's slot in a [`BatchForward`] (its KV cache).
pub type Slot = u64;

/// One sequence's share of a step.
pub struct Part<'a> {
    /// Its slot.
    pub slot: Slot,
    /// Its new tokens.
    pub tokens: &'a [u32],
    /// Whether the logits of its last new position are wanted.
    pub wants_logits: bool,
}

/// Runs steps of several sequences, each in its own slot.
pub trait BatchForward {
    /// The model's configuration.
    fn config(&self) -> &ModelConfig;
    /// The most sequences one step takes.
    fn max_sequences(&self) -> usize;
    /// The most tokens one step takes, all sequences together (bounds activations and how
    /// long one step holds the others up).
    fn step_tokens(&self) -> usize;
    /// A fresh, empty slot.
    fn open(&mut self) -> Result<Slot>;
    /// Frees a slot and its cache.
    fn close(&mut self, slot: Slot);
    /// Whether slots' caches can be taken out ([`BatchForward::take`]) and given back
    /// ([`BatchForward::open_from`]): what a prompt cache needs. The whole model in this
    /// process can; a distributed stage's cache lives across ranks and cannot.
    fn keeps_caches(&self) -> bool {
        false
    }
    /// A slot continuing `cache` (a prompt cache's entry, already cut to the reused prefix).
    fn open_from(&mut self, cache: KvCache) -> Result<Slot> {
        drop(cache);
        Err(InferenceError::InvalidRequest(
            "this forward cannot take a cached prefix".into(),
        ))
    }
    /// Frees a slot, handing back its cache (`None` where [`BatchForward::keeps_caches`] is
    /// false).
    fn take(&mut self, slot: Slot) -> Option<KvCache> {
        self.close(slot);
        None
    }
    /// Runs one step; returns the logits (`vocab` floats) of each part that wants them, in
    /// order. An error leaves every slot in an unknown state.
    fn step(&mut self, parts: &[Part<'_>]) -> Result<Vec<Vec<f32>>>;
}

/// Default tokens per step of a whole model in this process: a prompt chunk of this size
/// keeps a step within a few hundred milliseconds on two CPU cores.
pub const LOCAL_STEP_TOKENS: usize = 512;

/// The whole model in this process: every sequence of a step goes through one forward pass,
/// each with its own KV cache (per-sequence caches, no padding; see
/// [`crate::models::base::Attention::forward_segments`]).
pub struct LocalBatch<'a> {
    model: &'a ModelShard,
    caches: BTreeMap<Slot, KvCache>,
    next: Slot,
    max_sequences: usize,
}

impl<'a> LocalBatch<'a> {
    /// Batches of up to `max_sequences` on `model`, which must hold every layer.
    pub fn new(model: &'a ModelShard, max_sequences: usize) -> Result<LocalBatch<'a>> {
        if !(model.is_first() && model.is_last()) {
            return Err(InferenceError::InvalidRequest(
                "batching in one process needs the whole model".into(),
            ));
        }
        Ok(LocalBatch {
            model,
            caches: BTreeMap::new(),
            next: 0,
            max_sequences: max_sequences.max(1),
        })
    }
}

impl BatchForward for LocalBatch<'_> {
    fn config(&self) -> &ModelConfig {
        &self.model.config
    }

    fn max_sequences(&self) -> usize {
        self.max_sequences
    }

    fn step_tokens(&self) -> usize {
        LOCAL_STEP_TOKENS
    }

    fn open(&mut self) -> Result<Slot> {
        let slot = self.next;
        self.next += 1;
        self.caches.insert(slot, self.model.new_cache());
        Ok(slot)
    }

    fn close(&mut self, slot: Slot) {
        self.caches.remove(&slot);
    }

    fn keeps_caches(&self) -> bool {
        true
    }

    fn open_from(&mut self, cache: KvCache) -> Result<Slot> {
        let layers = self.model.new_cache().layers.len();
        if cache.layers.len() != layers {
            return Err(InferenceError::InvalidRequest(format!(
                "a cached prefix of {} layers for a shard of {layers}",
                cache.layers.len()
            )));
        }
        let slot = self.next;
        self.next += 1;
        self.caches.insert(slot, cache);
        Ok(slot)
    }

    fn take(&mut self, slot: Slot) -> Option<KvCache> {
        self.caches.remove(&slot)
    }

    fn step(&mut self, parts: &[Part<'_>]) -> Result<Vec<Vec<f32>>> {
        // Take each part's cache out of the map, in the parts' order.
        let mut caches: Vec<(Slot, KvCache)> = Vec::with_capacity(parts.len());
        for p in parts {
            let cache = self.caches.remove(&p.slot).ok_or_else(|| {
                InferenceError::InvalidRequest(format!("no sequence in slot {}", p.slot))
            })?;
            caches.push((p.slot, cache));
        }
        let result = {
            let mut batch: Vec<BatchPart<'_>> = parts
                .iter()
                .zip(caches.iter_mut())
                .map(|(p, (_, cache))| BatchPart {
                    tokens: p.tokens,
                    cache,
                    wants_logits: p.wants_logits,
                })
                .collect();
            self.model.forward_batch(&mut batch)
        };
        self.caches.extend(caches);
        match result? {
            None => Ok(Vec::new()),
            Some(logits) => rows_to_host(&logits),
        }
    }
}

/// `[k, vocab]` float32 logits as `k` host vectors (evaluated first).
pub(crate) fn rows_to_host(logits: &Array) -> Result<Vec<Vec<f32>>> {
    logits.eval()?;
    let vocab = *logits.shape().last().unwrap_or(&1) as usize;
    Ok(logits
        .as_slice::<f32>()
        .chunks(vocab.max(1))
        .map(<[f32]>::to_vec)
        .collect())
}
