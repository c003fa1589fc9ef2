//! Tensor-parallel serving over an MLX ring: every rank holds a slice of every layer
//! ([`ModelShard::into_tensor_parallel`]) and all ranks run each step together, because every
//! layer all-sums its partial results over the ring.
//!
//! Rank 0 holds the requests; the other ranks learn what to run from it (one of the two
//! [`Stage`]s: rank 0 drives `step_batch`/`stop`, the others `serve`). Every step is a
//! **batched step** ([`crate::batch::RingBatch`]; a sequence alone, as at warm-up, is a batch
//! of one, [`crate::batch::OneSequence`]):
//! 1. a header `[kind, count, first value]` is all-summed, rank 0 contributing the values and
//!    the others zeros, so every rank learns the step's kind and the length of its message;
//! 2. the message (the step's [`StepPlan`] and tokens) is all-summed the same way;
//! 3. every rank runs all the plan's sequences in one pass over its slice, each with its own
//!    cache ([`SlotCaches`]) (the layers' all-sums pair up because every rank runs the same
//!    operations in the same order); rank 0 keeps the logits of the parts that want them, the
//!    others only evaluate the hidden states (the head is whole on every rank, the logits are
//!    the same everywhere, so they need not be computed twice).

use crate::batch::{rows_to_host, SlotCaches, StepPlan, MAX_PLAN_MESSAGE};
use crate::error::{InferenceError, Result};
use crate::models::shard::{wanted_rows, ModelShard};
use crate::ring::RingGroup;
use crate::stage::{check_step, midway, require_rank0, Stage};
use mlx_rs::Array;
use std::sync::Arc;

/// What the next step is, as the header says. Codes start at 1 so that an all-zero header
/// (nothing summed in from rank 0) is never mistaken for a step.
/// (Codes 1 and 2 were the single-sequence step and its reset, which the ring no longer
/// speaks.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Stop = 3,
    Batch = 4,
}

impl Kind {
    fn from_code(code: i32) -> Result<Kind> {
        match code {
            3 => Ok(Kind::Stop),
            4 => Ok(Kind::Batch),
            other => Err(InferenceError::Ring(format!(
                "tensor-parallel header with unknown kind {other}"
            ))),
        }
    }
}

/// One rank of a tensor-parallel instance: its slice of the model, its sequences' caches and
/// its ring.
pub struct TensorStage {
    shard: ModelShard,
    /// The caches of batched steps' sequences, by slot.
    slots: SlotCaches,
    group: Arc<RingGroup>,
}

impl TensorStage {
    /// A rank's slice (from [`ModelShard::into_tensor_parallel`] over the same `group`).
    pub fn new(shard: ModelShard, group: Arc<RingGroup>) -> Result<TensorStage> {
        if !(shard.is_first() && shard.is_last()) {
            return Err(InferenceError::InvalidRequest(format!(
                "a tensor-parallel rank holds every layer, not {:?}",
                shard.range
            )));
        }
        Ok(TensorStage {
            shard,
            slots: SlotCaches::default(),
            group,
        })
    }

    /// Sums `values` over the ring (rank 0 brings the content, the others zeros of the same
    /// shape) and returns the result on the host. Carried as f32, which every backend sums
    /// and which holds integers below 2^24 exactly (token ids, counts, kinds).
    fn broadcast(&self, values: &[i32]) -> Result<Vec<i32>> {
        let floats: Vec<f32> = values.iter().map(|&v| v as f32).collect();
        let x = Array::from_slice(&floats, &[floats.len() as i32]);
        let sum = self.group.all_sum(&x)?;
        sum.eval()?;
        Ok(sum.as_slice::<f32>().iter().map(|&v| v as i32).collect())
    }

    /// Rank 0 says, and every rank learns, what the next step is and its payload (a batched
    /// step's plan message). A payload of one value rides in the header; a longer one is
    /// all-summed after it.
    fn header(&self, kind: Kind, payload: &[i32]) -> Result<(Kind, Vec<i32>)> {
        let mine = if self.group.rank() == 0 {
            [
                kind as i32,
                payload.len() as i32,
                payload.first().copied().unwrap_or(0),
            ]
        } else {
            [0; 3]
        };
        let header = self.broadcast(&mine)?;
        let kind = Kind::from_code(header[0])?;
        let count = header[1].max(0) as usize;
        if count > MAX_PLAN_MESSAGE {
            return Err(InferenceError::Ring(format!(
                "a step header announces {count} values (at most {MAX_PLAN_MESSAGE})"
            )));
        }
        let payload = match (kind, count) {
            (Kind::Batch, 1) => vec![header[2]],
            (Kind::Batch, n) => {
                let mine: Vec<i32> = if self.group.rank() == 0 {
                    payload.to_vec()
                } else {
                    vec![0; n]
                };
                self.broadcast(&mine)?
            }
            _ => Vec::new(),
        };
        Ok((kind, payload))
    }

    /// A batched step on this rank's slice: every sequence of `plan` in one pass; rank 0
    /// gets the wanted logits as host rows.
    fn run_batch(&mut self, plan: &StepPlan, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        let h = self.shard.embed(tokens)?;
        let (slots, shard) = (&mut self.slots, &self.shard);
        let h = slots.with_plan(plan, shard, h, |h, segments| {
            shard.forward_layers_batch(h, segments)
        })?;
        let rows = wanted_rows(plan.shares());
        if self.group.rank() != 0 || rows.is_empty() {
            h.eval()?;
            return Ok(Vec::new());
        }
        rows_to_host(&self.shard.logits_of_rows(&h, &rows)?)
    }
}

impl Stage for TensorStage {
    fn rank(&self) -> usize {
        self.group.rank()
    }

    fn shard(&self) -> &ModelShard {
        &self.shard
    }

    /// Rank 0: ends the serving loop of every other rank. Blocks until they all take part
    /// (a rank that is not serving yet holds it up; callers bound the wait).
    fn stop(&mut self) -> Result<()> {
        require_rank0(&self.group, "stop")?;
        if self.group.size() > 1 {
            self.header(Kind::Stop, &[])
                .map_err(|e| midway("tensor-parallel stop", e))?;
        }
        Ok(())
    }

    fn step_batch(&mut self, plan: &StepPlan, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        require_rank0(&self.group, "a batched step")?;
        check_step(plan, tokens, self.shard.config.vocab_size)?;
        if plan.parts.is_empty() {
            return Err(InferenceError::InvalidRequest(
                "a batched step needs at least one sequence".into(),
            ));
        }
        let step = |stage: &mut TensorStage| -> Result<Vec<Vec<f32>>> {
            if stage.group.size() > 1 {
                stage.header(Kind::Batch, &plan.encode(tokens))?;
            }
            stage.run_batch(plan, tokens)
        };
        step(self).map_err(|e| midway("batched tensor-parallel step", e))
    }

    /// Ranks above 0: run every step rank 0 runs until it says stop. Returns the number of
    /// forward steps served. An error means the ring broke (usually: a rank died).
    fn serve(&mut self) -> Result<usize> {
        let rank = self.group.rank();
        if rank == 0 {
            return Err(InferenceError::InvalidRequest(
                "rank 0 drives the tensor-parallel instance; only the other ranks serve".into(),
            ));
        }
        let mut steps = 0;
        loop {
            // Sleep, not spin, until rank 0 starts the next step.
            self.group
                .wait_for_peer()
                .map_err(|e| midway(&format!("rank {rank} waiting for the next step"), e.into()))?;
            let (kind, payload) = self
                .header(Kind::Stop, &[])
                .map_err(|e| midway(&format!("rank {rank} waiting for the next step"), e))?;
            match kind {
                Kind::Stop => return Ok(steps),
                Kind::Batch => {
                    let step = |stage: &mut TensorStage| -> Result<()> {
                        let (plan, tokens) = StepPlan::decode(&payload)?;
                        stage.run_batch(&plan, &tokens).map(|_| ())
                    };
                    step(self)
                        .map_err(|e| midway(&format!("rank {rank} running a batched step"), e))?;
                    steps += 1;
                }
            }
        }
    }
}
