//! What the batcher runs a step on: [`BatchForward`], with the whole model in this process
//! ([`LocalBatch`], any number of sequences in one pass); rank 0 of a distributed instance
//! implements it too ([`super::RingBatch`]).

use super::slot_kv::{Slot, SlotKv};
use crate::config::ModelConfig;
use crate::error::{InferenceError, Result};
use crate::kv_cache::KvCache;
use crate::models::shard::{wanted_rows, ModelShard};
use crate::mrope::MropeSpans;
use mlx_rs::Array;
use std::sync::Arc;

/// One sequence's share of a step.
pub struct BatchPart<'a> {
    /// Its slot.
    pub slot: Slot,
    /// Its new tokens.
    pub tokens: &'a [u32],
    /// Whether the logits of its last new position are wanted.
    pub wants_logits: bool,
    /// Image rows replacing the embeddings of some of its new positions: `(offset in
    /// tokens, [n, hidden] rows)`, in order (see [`crate::vision`]); empty for text.
    pub images: Vec<(usize, Array)>,
    /// Its images' M-RoPE spans, for a model whose image tokens take M-RoPE positions
    /// (Qwen3.5, [`crate::mrope`]): set on its cache for every step, prefill and decode.
    pub mrope: Option<Arc<MropeSpans>>,
}

/// The image rows of `parts` as offsets into the step's tokens, all parts laid end to end.
pub(crate) fn step_images(parts: &[BatchPart<'_>]) -> Vec<(usize, Array)> {
    let mut at = 0;
    let mut runs = Vec::new();
    for p in parts {
        runs.extend(p.images.iter().map(|(o, rows)| (at + o, rows.clone())));
        at += p.tokens.len();
    }
    runs
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
    fn step(&mut self, parts: &[BatchPart<'_>]) -> Result<Vec<Vec<f32>>>;
}

/// Default tokens per step of a whole model in this process: a prompt chunk of this size
/// keeps a step within a few hundred milliseconds on two CPU cores.
pub const LOCAL_STEP_TOKENS: usize = 512;

/// The whole model in this process: every sequence of a step goes through one forward pass,
/// decoding ones in the shared rows, others with their own caches ([`SlotKv`]).
pub struct LocalBatch<'a> {
    model: &'a ModelShard,
    slots: SlotKv,
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
            slots: SlotKv::new(model.new_cache().layers.len()),
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
        self.slots.insert(slot, self.model.new_cache());
        Ok(slot)
    }

    fn close(&mut self, slot: Slot) {
        self.slots.close(slot);
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
        self.slots.insert(slot, cache);
        Ok(slot)
    }

    fn take(&mut self, slot: Slot) -> Option<KvCache> {
        match self.slots.take(slot) {
            Ok(cache) => cache,
            Err(e) => {
                tracing::warn!(%e, "taking a slot's cache failed; dropping every slot");
                self.slots.clear();
                None
            }
        }
    }

    fn step(&mut self, parts: &[BatchPart<'_>]) -> Result<Vec<Vec<f32>>> {
        if let Some(p) = parts.iter().find(|p| !self.slots.contains(p.slot)) {
            return Err(InferenceError::InvalidRequest(format!(
                "no sequence in slot {}",
                p.slot
            )));
        }
        for p in parts {
            self.slots.set_mrope(p.slot, p.mrope.clone())?;
        }
        let layout: Vec<(Slot, usize)> = parts.iter().map(|p| (p.slot, p.tokens.len())).collect();
        let tokens: Vec<u32> = parts
            .iter()
            .flat_map(|p| p.tokens.iter().copied())
            .collect();
        let model = self.model;
        let h = crate::vision::splice(model.embed(&tokens)?, &step_images(parts))?;
        let h = self.slots.forward(&layout, h, |h, segments| {
            model.forward_layers_batch(h, segments)
        })?;
        let rows = wanted_rows(parts.iter().map(|p| (p.tokens.len(), p.wants_logits)));
        if rows.is_empty() {
            // Nothing to read, but the caches must still be computed (they depend on `h`).
            h.eval()?;
            return Ok(Vec::new());
        }
        rows_to_host(&model.logits_of_rows(&h, &rows)?)
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
