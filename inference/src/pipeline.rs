//! Pipeline parallelism over an MLX ring: rank `r` holds layers `[start_r, end_r)`.
//!
//! Every step is a **batched step** ([`Stage::step_batch`], driven by
//! [`crate::batch::RingBatch`]; a sequence alone, as at warm-up, is a batch of one,
//! [`crate::batch::OneSequence`]), and flows around the ring once:
//! 1. rank 0 sends a small header `[kind, message length]` that every rank forwards to its
//!    right neighbour, then the step's [`StepPlan`] and tokens (an int32 message every rank
//!    forwards before its activations);
//! 2. rank 0 embeds the tokens and runs its layers over every sequence's new positions one
//!    after another, each sequence with its own cache ([`SlotCaches`]); every rank receives
//!    the activations from its left neighbour, runs its layers and sends them to its right
//!    neighbour;
//! 3. the last rank applies the final norm and head and sends back to rank 0 (the ring closes)
//!    the logits of the parts that want them (`[k, vocab]`, or a one-float acknowledgement
//!    when none does), where sampling happens.
//!
//! Only ring neighbours exchange data, as MLX's ring backend requires, and every send has a
//! matching receive of the same shape (the ring has no framing). Each rank's KV caches live
//! with its layers; the plan says which slots ended (their caches are freed) and when a new
//! batcher starts (all are), and a `Stop` header ends the serving loop. Returning logits costs
//! `vocab × 4` bytes per wanted row over the last link (196 KB for SmolLM2): it keeps every
//! sampling option on rank 0, where the request lives.

use crate::batch::{rows_to_host, SlotCaches, StepPlan, MAX_PLAN_MESSAGE};
use crate::error::{InferenceError, Result};
use crate::models::shard::{wanted_rows, ModelShard};
use crate::ring::RingGroup;
use crate::stage::{check_step, midway, require_rank0, Stage};
use mlx_rs::{Array, Dtype};
use std::sync::Arc;

/// What the next step of the pipeline is, as the header says: a batched step, or the end of
/// the serving loop. (Codes 0 and 1 were the single-sequence step and its reset, which the
/// ring no longer speaks: a sequence alone is a batch of one, [`crate::batch::OneSequence`].)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Stop = 2,
    Batch = 3,
}

impl Kind {
    fn from_code(code: i32) -> Result<Kind> {
        match code {
            2 => Ok(Kind::Stop),
            3 => Ok(Kind::Batch),
            other => Err(InferenceError::InvalidRequest(format!(
                "pipeline header with unknown kind {other}"
            ))),
        }
    }
}

/// One rank of a pipeline-parallel instance: its layers, its sequences' caches and its ring.
pub struct PipelineStage {
    shard: ModelShard,
    /// The caches of batched steps' sequences, by slot.
    slots: SlotCaches,
    group: Arc<RingGroup>,
}

/// What the last rank sends back for a batched step that wants `rows` logits.
fn returned_shape(rows: usize, vocab: usize) -> Vec<i32> {
    if rows == 0 {
        vec![1]
    } else {
        vec![rows as i32, vocab as i32]
    }
}

impl PipelineStage {
    /// Joins a shard to its ring. Rank 0 must hold the embedding and the last rank the head.
    pub fn new(shard: ModelShard, group: impl Into<Arc<RingGroup>>) -> Result<PipelineStage> {
        let group = group.into();
        let (rank, size) = (group.rank(), group.size());
        if (rank == 0) != shard.is_first() || (rank + 1 == size) != shard.is_last() {
            return Err(InferenceError::InvalidRequest(format!(
                "rank {rank} of {size} holds layers {:?}: rank 0 must hold the first layers and \
                 the last rank the final ones",
                shard.range
            )));
        }
        Ok(PipelineStage {
            shard,
            slots: SlotCaches::default(),
            group,
        })
    }

    fn left(&self) -> usize {
        (self.group.rank() + self.group.size() - 1) % self.group.size()
    }

    fn right(&self) -> usize {
        (self.group.rank() + 1) % self.group.size()
    }

    fn send_header(&self, kind: Kind, seq_len: usize) -> Result<()> {
        let header = Array::from_slice(&[kind as i32, seq_len as i32], &[2]);
        self.group.send(&header, self.right())?.eval()?;
        Ok(())
    }

    fn recv_header(&self) -> Result<(Kind, usize)> {
        let header = self.group.recv(&[2], Dtype::Int32, self.left())?;
        header.eval()?;
        let values = header.as_slice::<i32>();
        Ok((Kind::from_code(values[0])?, values[1].max(0) as usize))
    }
}

impl PipelineStage {
    /// This rank's layers over a batched step's activations, each sequence with its own cache.
    fn run_planned(&mut self, plan: &StepPlan, h: Array) -> Result<Array> {
        let (slots, shard) = (&mut self.slots, &self.shard);
        slots.with_plan(plan, shard, h, |h, segments| {
            shard.forward_layers_batch(h, segments)
        })
    }

    /// A follower's share of a batched step whose plan message is `len` ints long.
    fn serve_batch(&mut self, len: usize, last: bool) -> Result<()> {
        if !(3..=MAX_PLAN_MESSAGE).contains(&len) {
            return Err(InferenceError::Ring(format!(
                "a batched step's plan of {len} values (at most {MAX_PLAN_MESSAGE})"
            )));
        }
        let (left, right) = (self.left(), self.right());
        let message = self.group.recv(&[len as i32], Dtype::Int32, left)?;
        message.eval()?;
        if !last {
            self.group.send(&message, right)?.eval()?;
        }
        let (plan, _) = StepPlan::decode(message.as_slice::<i32>())?;
        let hidden = self.shard.activation_width() as i32;
        // The plan comes at once, the hidden state only when the ranks before this one have
        // run their layers: sleep until it is there, or MLX's receive spins a core meanwhile
        // (taking it from the rank that computes, where ranks share a machine).
        self.group.wait_for_peer()?;
        let h = self
            .group
            .recv(&[1, plan.tokens() as i32, hidden], Dtype::Float32, left)?;
        let h = self.run_planned(&plan, h.as_dtype(self.shard.dtype)?)?;
        let out = if !last {
            h.as_dtype(Dtype::Float32)?
        } else {
            let rows = wanted_rows(plan.shares());
            if rows.is_empty() {
                h.eval()?;
                Array::from_slice(&[0f32], &[1])
            } else {
                self.shard.logits_of_rows(&h, &rows)?
            }
        };
        self.group.send(&out, right)?.eval()?;
        Ok(())
    }
}

impl Stage for PipelineStage {
    fn rank(&self) -> usize {
        self.group.rank()
    }

    fn shard(&self) -> &ModelShard {
        &self.shard
    }

    /// Rank 0: ends the serving loop of every other stage.
    fn stop(&mut self) -> Result<()> {
        require_rank0(&self.group, "stop")?;
        if self.group.size() > 1 {
            self.send_header(Kind::Stop, 0)
                .map_err(|e| midway("pipeline stop", e))?;
        }
        Ok(())
    }

    fn step_batch(&mut self, plan: &StepPlan, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        self.step_batch_with_images(plan, tokens, &[])
    }

    /// Rank 0 embeds, so it alone splices the image rows; the other ranks get hidden states.
    fn step_batch_with_images(
        &mut self,
        plan: &StepPlan,
        tokens: &[u32],
        images: &[(usize, Array)],
    ) -> Result<Vec<Vec<f32>>> {
        require_rank0(&self.group, "a batched step")?;
        let vocab = self.shard.config.vocab_size;
        check_step(plan, tokens, vocab)?;
        if plan.parts.is_empty() {
            return Err(InferenceError::InvalidRequest(
                "a batched step needs at least one sequence".into(),
            ));
        }
        let rows = wanted_rows(plan.shares());
        let h = crate::vision::splice(self.shard.embed(tokens)?, images)?;
        if self.group.size() == 1 {
            let h = self.run_planned(plan, h)?;
            if rows.is_empty() {
                h.eval()?;
                return Ok(Vec::new());
            }
            return rows_to_host(&self.shard.logits_of_rows(&h, &rows)?);
        }
        let (left, right) = (self.left(), self.right());
        let run = |stage: &mut PipelineStage| -> Result<Vec<Vec<f32>>> {
            let message = plan.encode(tokens);
            stage.send_header(Kind::Batch, message.len())?;
            let message = Array::from_slice(&message, &[message.len() as i32]);
            stage.group.send(&message, right)?.eval()?;
            let h = stage.run_planned(plan, h)?.as_dtype(Dtype::Float32)?;
            stage.group.send(&h, right)?.eval()?;
            // Sleep, not spin, while the other ranks compute.
            stage.group.wait_for_peer()?;
            let back =
                stage
                    .group
                    .recv(&returned_shape(rows.len(), vocab), Dtype::Float32, left)?;
            if rows.is_empty() {
                back.eval()?;
                return Ok(Vec::new());
            }
            rows_to_host(&back)
        };
        run(self).map_err(|e| {
            midway(
                &format!(
                    "batched pipeline step (rank 0 sends to rank {right}, hears back from rank {left})"
                ),
                e,
            )
        })
    }

    /// Ranks above 0: serve steps until rank 0 says stop. Returns the number of forward
    /// steps served. An error means the ring broke (usually: a neighbour died).
    fn serve(&mut self) -> Result<usize> {
        if self.group.rank() == 0 {
            return Err(InferenceError::InvalidRequest(
                "rank 0 drives the pipeline; only the other ranks serve".into(),
            ));
        }
        let (rank, left, right) = (self.group.rank(), self.left(), self.right());
        let last = rank + 1 == self.group.size();
        let mut steps = 0;
        loop {
            // Sleep, not spin, until rank 0 starts the next step.
            self.group
                .wait_for_peer()
                .map_err(|e| midway(&format!("rank {rank} waiting for rank {left}"), e.into()))?;
            let (kind, seq_len) = self
                .recv_header()
                .map_err(|e| midway(&format!("rank {rank} waiting for rank {left}"), e))?;
            let mut step = |stage: &mut PipelineStage| -> Result<bool> {
                if !last {
                    stage.send_header(kind, seq_len)?;
                }
                match kind {
                    Kind::Stop => Ok(false),
                    Kind::Batch => {
                        stage.serve_batch(seq_len, last)?;
                        steps += 1;
                        Ok(true)
                    }
                }
            };
            let go_on = step(self).map_err(|e| {
                midway(
                    &format!("rank {rank} serving a step from rank {left} to rank {right}"),
                    e,
                )
            })?;
            if !go_on {
                return Ok(steps);
            }
        }
    }
}
