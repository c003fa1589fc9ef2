//! Pipeline parallelism over an MLX ring: rank `r` holds layers `[start_r, end_r)`.
//!
//! One step (a prefill chunk or one decoded token) flows around the ring once:
//! 1. rank 0 sends a small header `[kind, seq_len]` that every rank forwards to its right
//!    neighbour, so each rank knows what comes next and the shape of the activations;
//! 2. rank 0 embeds the tokens and runs its layers; every rank receives the activations from
//!    its left neighbour, runs its layers and sends them to its right neighbour;
//! 3. the last rank applies the final norm and head and sends the last position's logits to
//!    its right neighbour, which is rank 0 (the ring closes), where sampling happens.
//!
//! A **batched step** ([`Stage::step_batch`], [`crate::batch::RingBatch`]) is the same trip
//! with a `Batch` header: its [`StepPlan`] and tokens follow the header (an int32 message every
//! rank forwards before its activations), the activations are every sequence's new positions
//! one after another, each rank runs its layers with each sequence's own cache
//! ([`SlotCaches`]), and the last rank sends back the logits of the parts that want them
//! (`[k, vocab]`, or a one-float acknowledgement when none does).
//!
//! Only ring neighbours exchange data, as MLX's ring backend requires, and every send has a
//! matching receive of the same shape (the ring has no framing). Each rank's KV cache lives with
//! its layers; a `Reset` header clears them between requests, `Stop` ends the serving loop.
//! Returning logits costs `vocab × 4` bytes per step over the last link (196 KB for SmolLM2):
//! it keeps every sampling option on rank 0, where the request lives.

use crate::batch::{rows_to_host, SlotCaches, StepPlan, MAX_PLAN_MESSAGE};
use crate::config::ModelConfig;
use crate::error::{InferenceError, Result};
use crate::forward::{Forward, DISTRIBUTED_PREFILL_CHUNK};
use crate::kv_cache::KvCache;
use crate::models::shard::{wanted_rows, ModelShard};
use crate::ring::RingGroup;
use crate::stage::{check_step, midway, require_rank0, Stage};
use mlx_rs::{Array, Dtype};
use std::sync::Arc;

/// What the next step of the pipeline is, as the header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Forward = 0,
    Reset = 1,
    Stop = 2,
    Batch = 3,
}

impl Kind {
    fn from_code(code: i32) -> Result<Kind> {
        match code {
            0 => Ok(Kind::Forward),
            1 => Ok(Kind::Reset),
            2 => Ok(Kind::Stop),
            3 => Ok(Kind::Batch),
            other => Err(InferenceError::InvalidRequest(format!(
                "pipeline header with unknown kind {other}"
            ))),
        }
    }
}

/// One rank of a pipeline-parallel instance: its layers, its cache and its ring.
pub struct PipelineStage {
    shard: ModelShard,
    cache: KvCache,
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
        let cache = shard.new_cache();
        Ok(PipelineStage {
            shard,
            cache,
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

    /// Rank 0: one step of `tokens` through every stage; the logits of the last position
    /// (`[vocab]`, f32).
    fn step(&mut self, tokens: &[u32]) -> Result<Array> {
        // Embedding first: a bad token id fails here, before any rank hears of the step.
        let h = self.shard.embed(tokens)?;
        if self.group.size() == 1 {
            let h = self.shard.forward_layers(h, &mut self.cache)?;
            let logits = self.shard.logits(&h, true)?;
            return Ok(logits.reshape(&[-1])?.as_dtype(Dtype::Float32)?);
        }
        let right = self.right();
        let run = |stage: &mut PipelineStage| -> Result<Array> {
            stage.send_header(Kind::Forward, tokens.len())?;
            let h = stage.shard.forward_layers(h, &mut stage.cache)?;
            let h = h.as_dtype(Dtype::Float32)?;
            stage.group.send(&h, right)?.eval()?;
            let vocab = stage.shard.config.vocab_size as i32;
            // Sleep, not spin, while the other ranks compute.
            stage.group.wait_for_peer()?;
            let logits = stage.group.recv(&[vocab], Dtype::Float32, stage.left())?;
            logits.eval()?;
            Ok(logits)
        };
        let left = self.left();
        run(self).map_err(|e| {
            midway(
                &format!(
                    "pipeline step (rank 0 sends to rank {right}, hears back from rank {left})"
                ),
                e,
            )
        })
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
        let hidden = self.shard.config.hidden_size as i32;
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
        require_rank0(&self.group, "a batched step")?;
        let vocab = self.shard.config.vocab_size;
        check_step(plan, tokens, vocab)?;
        if plan.parts.is_empty() {
            return Err(InferenceError::InvalidRequest(
                "a batched step needs at least one sequence".into(),
            ));
        }
        let rows = wanted_rows(plan.shares());
        let h = self.shard.embed(tokens)?;
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
        let hidden = self.shard.config.hidden_size as i32;
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
                    Kind::Stop => return Ok(false),
                    Kind::Reset => {
                        stage.cache = stage.shard.new_cache();
                        return Ok(true);
                    }
                    Kind::Batch => {
                        stage.serve_batch(seq_len, last)?;
                        steps += 1;
                        return Ok(true);
                    }
                    Kind::Forward => {}
                }
                let h = stage
                    .group
                    .recv(&[1, seq_len as i32, hidden], Dtype::Float32, left)?;
                let h = h.as_dtype(stage.shard.dtype)?;
                let h = stage.shard.forward_layers(h, &mut stage.cache)?;
                let out = if last {
                    stage
                        .shard
                        .logits(&h, true)?
                        .reshape(&[-1])?
                        .as_dtype(Dtype::Float32)?
                } else {
                    h.as_dtype(Dtype::Float32)?
                };
                stage.group.send(&out, right)?.eval()?;
                steps += 1;
                Ok(true)
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

impl Forward for PipelineStage {
    fn config(&self) -> &ModelConfig {
        &self.shard.config
    }

    /// Rank 0: runs `tokens` through every stage and returns the logits of the last position.
    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        require_rank0(&self.group, "forward")?;
        if tokens.is_empty() {
            return Err(InferenceError::InvalidRequest(
                "a pipeline step needs at least one token".into(),
            ));
        }
        let logits = self.step(tokens)?;
        logits.eval()?;
        Ok(logits.as_slice::<f32>().to_vec())
    }

    /// Rank 0: clears every stage's KV cache (a new request starts).
    fn reset(&mut self) -> Result<()> {
        require_rank0(&self.group, "reset")?;
        self.cache = self.shard.new_cache();
        if self.group.size() > 1 {
            self.send_header(Kind::Reset, 0)
                .map_err(|e| midway("pipeline reset", e))?;
        }
        Ok(())
    }

    fn max_chunk(&self) -> usize {
        DISTRIBUTED_PREFILL_CHUNK
    }
}
