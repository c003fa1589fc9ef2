//! Batching across ranks: what a batched step is, as rank 0 decides it and every other rank
//! learns it ([`StepPlan`], carried with the step itself), the per-slot caches each rank keeps
//! ([`SlotCaches`]); [`super::RingBatch`], rank 0's side of it, is in `ring_batch.rs`.
//!
//! Which sequences are in a step, and which ended, travels in the step's own message, so the
//! ranks can never disagree on a batch: a rank runs exactly what the plan in front of the
//! activations says (exo deadlocked where ranks decided batches each on their own). Slots are
//! small numbers rank 0 reuses (the lowest free one), so a plan stays a few integers per
//! sequence, exact in the f32 a tensor-parallel broadcast carries.

use super::slot_kv::Slot;
use super::slot_kv::SlotKv;
use crate::error::{InferenceError, Result};
use crate::kv_rows::StepKv;
use crate::models::shard::ModelShard;
use crate::mrope::{ImageSpan, MropeSpans};
use mlx_rs::Array;
use std::collections::BTreeSet;
use std::sync::Arc;

/// The most sequences one plan may name: a follower refuses a plan past it (a corrupt or
/// hostile message never makes it allocate without bound).
pub const MAX_PLAN_SEQUENCES: usize = 1024;

/// The most tokens one plan may carry, all sequences together.
pub const MAX_PLAN_TOKENS: usize = 16 * 1024;

/// The most image spans one plan may carry, all sequences together ([`StepPlan::mrope`]).
pub const MAX_PLAN_SPANS: usize = 256;

/// The longest encoded plan a rank accepts ([`StepPlan::encode`] at the limits above: four
/// counts, every slot closed, every part's three values, every sequence's spans, every
/// token): a header announcing more is refused before anything is allocated for it.
pub const MAX_PLAN_MESSAGE: usize =
    4 + 6 * MAX_PLAN_SEQUENCES + 3 * MAX_PLAN_SPANS + MAX_PLAN_TOKENS;

/// Values in a plan stay below this: a tensor-parallel broadcast carries them as f32, exact
/// up to 2^24.
const MAX_PLAN_VALUE: i64 = 1 << 24;

/// One sequence's share of a planned step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedPart {
    /// Its slot (its KV cache on every rank).
    pub slot: u32,
    /// How many new tokens it has in this step (at least one).
    pub len: u32,
    /// Whether rank 0 needs the logits of its last new position.
    pub wants_logits: bool,
}

/// What one batched step runs, as rank 0 decided it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StepPlan {
    /// Forget every slot first (the first step of a new batcher: slots of an earlier one are
    /// stale).
    pub reset: bool,
    /// Slots that ended since the last step: their caches are freed before this step runs.
    pub closed: Vec<u32>,
    /// The sequences of this step, in the order of their tokens.
    pub parts: Vec<PlannedPart>,
    /// The M-RoPE image spans of the parts whose sequences have images (Qwen3.5,
    /// [`crate::mrope`]), by slot: every rank's attention places those positions by them.
    pub mrope: Vec<(u32, Arc<MropeSpans>)>,
}

impl StepPlan {
    /// Total new tokens of the step.
    pub fn tokens(&self) -> usize {
        self.parts.iter().map(|p| p.len as usize).sum()
    }

    /// `(new tokens, wants logits)` of each part, in order.
    pub fn shares(&self) -> impl Iterator<Item = (usize, bool)> + '_ {
        self.parts.iter().map(|p| (p.len as usize, p.wants_logits))
    }

    /// How many parts want logits (the rows the last rank hands back).
    pub fn wanted(&self) -> usize {
        self.parts.iter().filter(|p| p.wants_logits).count()
    }

    /// The plan and the step's tokens as one message: `[reset, closed count, closed...,
    /// part count, (slot, len, wants)..., span-sequence count, (slot, span count, (start,
    /// rows, cols)...)..., tokens...]`.
    pub fn encode(&self, tokens: &[u32]) -> Vec<i32> {
        let mut out =
            Vec::with_capacity(4 + self.closed.len() + 3 * self.parts.len() + tokens.len());
        out.push(self.reset as i32);
        out.push(self.closed.len() as i32);
        out.extend(self.closed.iter().map(|&s| s as i32));
        out.push(self.parts.len() as i32);
        for p in &self.parts {
            out.extend([p.slot as i32, p.len as i32, p.wants_logits as i32]);
        }
        out.push(self.mrope.len() as i32);
        for (slot, spans) in &self.mrope {
            out.extend([*slot as i32, spans.spans().len() as i32]);
            for s in spans.spans() {
                out.extend([s.start as i32, s.rows as i32, s.cols as i32]);
            }
        }
        out.extend(tokens.iter().map(|&t| t as i32));
        out
    }

    /// The M-RoPE spans of `slot`'s sequence in this step, if it has images.
    pub fn mrope_of(&self, slot: u32) -> Option<Arc<MropeSpans>> {
        self.mrope
            .iter()
            .find(|(s, _)| *s == slot)
            .map(|(_, spans)| spans.clone())
    }

    /// Reads a message of [`StepPlan::encode`]: the plan and the step's tokens. Anything
    /// inconsistent (counts that do not add up, a slot twice, an empty part, values out of
    /// range, more than [`MAX_PLAN_SEQUENCES`] or [`MAX_PLAN_TOKENS`]) is an error, never a
    /// panic or a large allocation.
    pub fn decode(message: &[i32]) -> Result<(StepPlan, Vec<u32>)> {
        let bad = |what: &str| InferenceError::Ring(format!("batched step plan: {what}"));
        let mut at = 0usize;
        let mut next = |what: &str| -> Result<i64> {
            let v = *message
                .get(at)
                .ok_or_else(|| bad(&format!("ends before {what}")))?;
            at += 1;
            let v = i64::from(v);
            if !(0..MAX_PLAN_VALUE).contains(&v) {
                return Err(bad(&format!("{what} {v} is out of range")));
            }
            Ok(v)
        };
        let reset = match next("the reset flag")? {
            0 => false,
            1 => true,
            other => return Err(bad(&format!("reset flag {other}"))),
        };
        let closed_count = next("the closed count")? as usize;
        if closed_count > MAX_PLAN_SEQUENCES {
            return Err(bad(&format!("{closed_count} closed slots")));
        }
        let mut closed = Vec::with_capacity(closed_count);
        for _ in 0..closed_count {
            closed.push(next("a closed slot")? as u32);
        }
        let part_count = next("the part count")? as usize;
        if part_count > MAX_PLAN_SEQUENCES {
            return Err(bad(&format!("{part_count} sequences")));
        }
        let mut parts = Vec::with_capacity(part_count);
        let mut seen = BTreeSet::new();
        for _ in 0..part_count {
            let slot = next("a slot")? as u32;
            let len = next("a part's length")? as u32;
            let wants_logits = match next("a part's logits flag")? {
                0 => false,
                1 => true,
                other => return Err(bad(&format!("logits flag {other}"))),
            };
            if len == 0 {
                return Err(bad(&format!("slot {slot} has no tokens")));
            }
            if !seen.insert(slot) {
                return Err(bad(&format!("slot {slot} appears twice")));
            }
            parts.push(PlannedPart {
                slot,
                len,
                wants_logits,
            });
        }
        let span_sequences = next("the span-sequence count")? as usize;
        if span_sequences > part_count {
            return Err(bad(&format!("spans for {span_sequences} sequences")));
        }
        let mut mrope = Vec::with_capacity(span_sequences);
        let mut span_total = 0;
        for _ in 0..span_sequences {
            let slot = next("a span slot")? as u32;
            let count = next("a span count")? as usize;
            span_total += count;
            if span_total > MAX_PLAN_SPANS {
                return Err(bad(&format!("more than {MAX_PLAN_SPANS} image spans")));
            }
            let mut spans = Vec::with_capacity(count);
            for _ in 0..count {
                spans.push(ImageSpan {
                    start: next("a span's start")? as usize,
                    rows: next("a span's rows")? as usize,
                    cols: next("a span's columns")? as usize,
                });
            }
            if !seen.contains(&slot) || mrope.iter().any(|(s, _)| *s == slot) {
                return Err(bad(&format!(
                    "spans for slot {slot}, not one part of the step"
                )));
            }
            let spans = MropeSpans::new(spans).map_err(|e| bad(&e.to_string()))?;
            mrope.push((slot, Arc::new(spans)));
        }
        let plan = StepPlan {
            reset,
            closed,
            parts,
            mrope,
        };
        let total = plan.tokens();
        if total > MAX_PLAN_TOKENS {
            return Err(bad(&format!("{total} tokens")));
        }
        let rest = &message[at.min(message.len())..];
        if rest.len() != total {
            return Err(bad(&format!(
                "the parts have {total} tokens but {} follow",
                rest.len()
            )));
        }
        if let Some(bad_token) = rest
            .iter()
            .find(|&&t| i64::from(t) < 0 || i64::from(t) >= MAX_PLAN_VALUE)
        {
            return Err(bad(&format!("token {bad_token} is out of range")));
        }
        let tokens = rest.iter().map(|&t| t as u32).collect();
        Ok((plan, tokens))
    }
}

/// One rank's KV caches of a batched instance, by slot.
#[derive(Default)]
pub struct SlotCaches {
    /// Built for the shard at the first step.
    slots: Option<SlotKv>,
}

impl SlotCaches {
    /// Runs `run` (the shard's layers) over `h`, the activations of `plan`'s parts in order,
    /// after applying its reset and closed slots; a slot seen for the first time starts with a
    /// fresh cache of `shard`. Decoding sequences share the rows ([`SlotKv`]), laid out the same
    /// way on every rank, since every rank follows the same plans.
    pub fn with_plan(
        &mut self,
        plan: &StepPlan,
        shard: &ModelShard,
        h: Array,
        run: impl FnOnce(Array, &mut [StepKv<'_>]) -> Result<Array>,
    ) -> Result<Array> {
        let slots = self
            .slots
            .get_or_insert_with(|| SlotKv::new(shard.new_cache().layers.len()));
        if plan.reset {
            slots.clear();
        }
        for &slot in &plan.closed {
            slots.close(Slot::from(slot));
        }
        for p in &plan.parts {
            slots.set_mrope(Slot::from(p.slot), plan.mrope_of(p.slot))?;
        }
        let parts: Vec<(Slot, usize)> = plan
            .parts
            .iter()
            .map(|p| (Slot::from(p.slot), p.len as usize))
            .collect();
        slots.forward(&parts, h, run)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_plan_reads_back_as_written() {
        let plan = StepPlan {
            reset: true,
            closed: vec![3, 1],
            parts: vec![
                PlannedPart {
                    slot: 0,
                    len: 5,
                    wants_logits: true,
                },
                PlannedPart {
                    slot: 2,
                    len: 1,
                    wants_logits: false,
                },
            ],
            mrope: vec![(
                2,
                Arc::new(
                    MropeSpans::new(vec![ImageSpan {
                        start: 4,
                        rows: 2,
                        cols: 3,
                    }])
                    .unwrap(),
                ),
            )],
        };
        let tokens = [10, 11, 12, 13, 14, 99];
        let message = plan.encode(&tokens);
        assert_eq!(message[..3], [1, 2, 3]);
        assert_eq!(message[11..16], [1, 2, 1, 4, 2]);
        assert_eq!(StepPlan::decode(&message).unwrap(), (plan, tokens.to_vec()));
    }

    #[test]
    fn inconsistent_plans_are_refused_with_what_is_wrong() {
        let cases: [(&[i32], &str); 9] = [
            (&[], "ends before the reset flag"),
            (
                &[0, 0, 1, 4, 2, 1, 0],
                "the parts have 2 tokens but 0 follow",
            ),
            (
                &[0, 0, 2, 4, 1, 1, 4, 1, 1, 0, 7, 7],
                "slot 4 appears twice",
            ),
            (&[0, 0, 1, 4, 0, 1, 0], "slot 4 has no tokens"),
            (&[0, 0, 5000, 0], "5000 sequences"),
            (&[0, -3], "the closed count -3 is out of range"),
            (&[0, 0, 1, 4, 1, 1, 1, 5, 0, 7], "spans for slot 5"),
            (
                &[0, 0, 1, 4, 1, 1, 1, 4, 300, 7],
                "more than 256 image spans",
            ),
            (
                &[0, 0, 1, 4, 1, 1, 1, 4, 2, 0, 2, 2, 1, 1, 1, 7],
                "image spans overlap",
            ),
        ];
        for (message, want) in cases {
            let e = StepPlan::decode(message).unwrap_err().to_string();
            assert!(e.contains(want), "{message:?}: {e}");
        }
    }

    proptest! {
        /// Any message decodes to a plan or an error, never a panic; a plan it accepts is
        /// bounded and re-encodes to the same message.
        #[test]
        fn any_message_decodes_or_is_refused(message in prop::collection::vec(-2i32..40, 0..64)) {
            if let Ok((plan, tokens)) = StepPlan::decode(&message) {
                prop_assert!(plan.parts.len() <= MAX_PLAN_SEQUENCES);
                prop_assert_eq!(plan.tokens(), tokens.len());
                prop_assert_eq!(plan.encode(&tokens), message);
            }
        }
    }
}
