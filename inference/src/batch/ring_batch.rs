//! [`RingBatch`]: rank 0 of a multi-rank instance as a [`BatchForward`] over its [`Stage`],
//! each step's [`StepPlan`] (see `ring_plan.rs`) travelling with the step. Its own file so that
//! the plan, which every [`Stage`] reads, does not depend on the stage.

use super::batch_forward::{step_images, BatchForward, BatchPart};
use super::ring_plan::{PlannedPart, StepPlan, MAX_PLAN_SEQUENCES};
use super::slot_kv::Slot;
use crate::config::ModelConfig;
use crate::error::{InferenceError, Result};
use crate::sequence_forward::DISTRIBUTED_PREFILL_CHUNK;
use crate::stage::Stage;
use std::collections::BTreeSet;

/// Rank 0 of a multi-rank instance as a [`BatchForward`]: every step runs all its sequences
/// through every rank at once, its plan travelling with it (see the module docs).
pub struct RingBatch<'a> {
    stage: &'a mut dyn Stage,
    open: BTreeSet<u32>,
    closed: Vec<u32>,
    reset: bool,
    max_sequences: usize,
}

impl<'a> RingBatch<'a> {
    /// Batches of up to `max_sequences` (at most [`MAX_PLAN_SEQUENCES`]) over rank 0's
    /// `stage`. Its first step tells every rank to forget slots of an earlier batcher.
    pub fn new(stage: &'a mut dyn Stage, max_sequences: usize) -> RingBatch<'a> {
        RingBatch {
            stage,
            open: BTreeSet::new(),
            closed: Vec::new(),
            reset: true,
            max_sequences: max_sequences.clamp(1, MAX_PLAN_SEQUENCES),
        }
    }
}

impl BatchForward for RingBatch<'_> {
    fn config(&self) -> &ModelConfig {
        self.stage.config()
    }

    fn max_sequences(&self) -> usize {
        self.max_sequences
    }

    fn step_tokens(&self) -> usize {
        DISTRIBUTED_PREFILL_CHUNK
    }

    fn open(&mut self) -> Result<Slot> {
        let slot = (0u32..)
            .find(|s| !self.open.contains(s))
            .unwrap_or_default();
        if self.open.len() >= self.max_sequences {
            return Err(InferenceError::InvalidRequest(format!(
                "this instance runs at most {} sequences at once",
                self.max_sequences
            )));
        }
        self.open.insert(slot);
        Ok(Slot::from(slot))
    }

    fn close(&mut self, slot: Slot) {
        if let Ok(slot) = u32::try_from(slot) {
            if self.open.remove(&slot) {
                self.closed.push(slot);
            }
        }
    }

    fn step(&mut self, parts: &[BatchPart<'_>]) -> Result<Vec<Vec<f32>>> {
        if parts.is_empty() {
            // Closed slots wait for the next step that runs something.
            return Ok(Vec::new());
        }
        let mut planned = Vec::with_capacity(parts.len());
        let mut mrope = Vec::new();
        let mut tokens = Vec::new();
        for p in parts {
            let slot = u32::try_from(p.slot)
                .ok()
                .filter(|s| self.open.contains(s))
                .ok_or_else(|| {
                    InferenceError::InvalidRequest(format!("no sequence in slot {}", p.slot))
                })?;
            if p.tokens.is_empty() {
                return Err(InferenceError::InvalidRequest(format!(
                    "slot {slot} has no tokens in this step"
                )));
            }
            if let Some(spans) = &p.mrope {
                mrope.push((slot, spans.clone()));
            }
            planned.push(PlannedPart {
                slot,
                len: p.tokens.len() as u32,
                wants_logits: p.wants_logits,
            });
            tokens.extend_from_slice(p.tokens);
        }
        let plan = StepPlan {
            reset: self.reset,
            closed: std::mem::take(&mut self.closed),
            parts: planned,
            mrope,
        };
        self.reset = false;
        self.stage
            .step_batch_with_images(&plan, &tokens, &step_images(parts))
    }
}
