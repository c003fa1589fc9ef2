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
//! Only ring neighbours exchange data, as MLX's ring backend requires, and every send has a
//! matching receive of the same shape (the ring has no framing). Each rank's KV cache lives with
//! its layers; a `Reset` header clears them between requests, `Stop` ends the serving loop.
//! Returning logits costs `vocab × 4` bytes per step over the last link (196 KB for SmolLM2):
//! it keeps every sampling option on rank 0, where the request lives.

use crate::config::ModelConfig;
use crate::error::{InferenceError, Result};
use crate::forward::{Forward, DISTRIBUTED_PREFILL_CHUNK};
use crate::kv_cache::KvCache;
use crate::models::shard::ModelShard;
use crate::ring::RingGroup;
use crate::stage::{midway, require_rank0, Stage};
use mlx_rs::{Array, Dtype};
use std::sync::Arc;

/// What the next step of the pipeline is, as the header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Forward = 0,
    Reset = 1,
    Stop = 2,
}

impl Kind {
    fn from_code(code: i32) -> Result<Kind> {
        match code {
            0 => Ok(Kind::Forward),
            1 => Ok(Kind::Reset),
            2 => Ok(Kind::Stop),
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
    group: Arc<RingGroup>,
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
