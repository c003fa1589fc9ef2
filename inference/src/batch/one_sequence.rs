//! [`OneSequence`]: one sequence at a time over anything that runs batches, as the
//! single-sequence [`Forward`] the generation loop takes. A distributed instance speaks one
//! ring protocol, the batched step ([`super::RingBatch`]); warm-up and single-request tools run
//! a sequence through it as a batch of one rather than through a second protocol.

use super::batch_forward::{BatchForward, BatchPart};
use super::slot_kv::Slot;
use crate::config::ModelConfig;
use crate::error::{InferenceError, Result};
use crate::sequence_forward::Forward;

/// One sequence in one slot of `B`; [`Forward::reset`] closes it and opens a fresh one.
pub struct OneSequence<B: BatchForward> {
    batch: B,
    slot: Slot,
}

impl<B: BatchForward> OneSequence<B> {
    /// A fresh sequence in a slot of `batch`.
    pub fn new(mut batch: B) -> Result<OneSequence<B>> {
        let slot = batch.open()?;
        Ok(OneSequence { batch, slot })
    }
}

impl<B: BatchForward> Forward for OneSequence<B> {
    fn config(&self) -> &ModelConfig {
        self.batch.config()
    }

    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(InferenceError::InvalidRequest(
                "a step needs at least one token".into(),
            ));
        }
        let part = BatchPart {
            slot: self.slot,
            tokens,
            wants_logits: true,
            images: Vec::new(),
            mrope: None,
        };
        self.batch.step(&[part])?.pop().ok_or_else(|| {
            InferenceError::InvalidRequest("the batched step returned no logits".into())
        })
    }

    fn reset(&mut self) -> Result<()> {
        self.batch.close(self.slot);
        self.slot = self.batch.open()?;
        Ok(())
    }

    fn max_chunk(&self) -> usize {
        self.batch.step_tokens()
    }
}
