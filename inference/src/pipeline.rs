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

use crate::error::{InferenceError, Result};
use crate::kv_cache::KvCache;
use crate::model::ModelShard;
use crate::ring::RingGroup;
use mlx_rs::{Array, Dtype};

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
    group: RingGroup,
}

/// Ring failures (a lost peer, a refused operation) are MLX distributed errors.
fn ring_err(e: crate::ring::RingError) -> InferenceError {
    InferenceError::Mlx(e.to_string())
}

impl PipelineStage {
    /// Joins a shard to its ring. Rank 0 must hold the embedding and the last rank the head.
    pub fn new(shard: ModelShard, group: RingGroup) -> Result<PipelineStage> {
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

    /// This stage's rank.
    pub fn rank(&self) -> usize {
        self.group.rank()
    }

    /// The shard this stage runs.
    pub fn shard(&self) -> &ModelShard {
        &self.shard
    }

    fn left(&self) -> usize {
        (self.group.rank() + self.group.size() - 1) % self.group.size()
    }

    fn right(&self) -> usize {
        (self.group.rank() + 1) % self.group.size()
    }

    fn send_header(&self, kind: Kind, seq_len: usize) -> Result<()> {
        let header = Array::from_slice(&[kind as i32, seq_len as i32], &[2]);
        self.group
            .send(&header, self.right())
            .map_err(ring_err)?
            .eval()?;
        Ok(())
    }

    fn recv_header(&self) -> Result<(Kind, usize)> {
        let header = self
            .group
            .recv(&[2], Dtype::Int32, self.left())
            .map_err(ring_err)?;
        header.eval()?;
        let values = header.as_slice::<i32>();
        Ok((Kind::from_code(values[0])?, values[1].max(0) as usize))
    }

    /// Rank 0: runs `tokens` through every stage and returns the logits of the last position
    /// (`[vocab]`, f32).
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Array> {
        self.require_rank0("forward")?;
        if tokens.is_empty() {
            return Err(InferenceError::InvalidRequest(
                "a pipeline step needs at least one token".into(),
            ));
        }
        if self.group.size() == 1 {
            let logits = self.shard.forward(
                crate::model::ShardInput::Tokens(tokens),
                &mut self.cache,
                true,
            )?;
            return Ok(logits.reshape(&[-1])?.as_dtype(Dtype::Float32)?);
        }
        self.send_header(Kind::Forward, tokens.len())?;
        let h = self.shard.embed(tokens)?;
        let h = self.shard.forward_layers(h, &mut self.cache)?;
        let h = h.as_dtype(Dtype::Float32)?;
        self.group
            .send(&h, self.right())
            .map_err(ring_err)?
            .eval()?;
        let vocab = self.shard.config.vocab_size as i32;
        let logits = self
            .group
            .recv(&[vocab], Dtype::Float32, self.left())
            .map_err(ring_err)?;
        logits.eval()?;
        Ok(logits)
    }

    /// Rank 0: clears every stage's KV cache (a new request starts).
    pub fn reset(&mut self) -> Result<()> {
        self.require_rank0("reset")?;
        self.cache = self.shard.new_cache();
        if self.group.size() > 1 {
            self.send_header(Kind::Reset, 0)?;
        }
        Ok(())
    }

    /// Rank 0: ends the serving loop of every other stage.
    pub fn stop(&mut self) -> Result<()> {
        self.require_rank0("stop")?;
        if self.group.size() > 1 {
            self.send_header(Kind::Stop, 0)?;
        }
        Ok(())
    }

    /// Ranks above 0: serve steps until rank 0 says stop. Returns the number of forward
    /// steps served.
    pub fn serve(&mut self) -> Result<usize> {
        if self.group.rank() == 0 {
            return Err(InferenceError::InvalidRequest(
                "rank 0 drives the pipeline; only the other ranks serve".into(),
            ));
        }
        let last = self.group.rank() + 1 == self.group.size();
        let hidden = self.shard.config.hidden_size as i32;
        let mut steps = 0;
        loop {
            let (kind, seq_len) = self.recv_header()?;
            if !last {
                self.send_header(kind, seq_len)?;
            }
            match kind {
                Kind::Stop => return Ok(steps),
                Kind::Reset => {
                    self.cache = self.shard.new_cache();
                    continue;
                }
                Kind::Forward => {}
            }
            let h = self
                .group
                .recv(&[1, seq_len as i32, hidden], Dtype::Float32, self.left())
                .map_err(ring_err)?;
            let h = h.as_dtype(self.shard.dtype)?;
            let h = self.shard.forward_layers(h, &mut self.cache)?;
            let out = if last {
                self.shard
                    .logits(&h, true)?
                    .reshape(&[-1])?
                    .as_dtype(Dtype::Float32)?
            } else {
                h.as_dtype(Dtype::Float32)?
            };
            self.group
                .send(&out, self.right())
                .map_err(ring_err)?
                .eval()?;
            steps += 1;
        }
    }

    fn require_rank0(&self, what: &str) -> Result<()> {
        if self.group.rank() != 0 {
            return Err(InferenceError::InvalidRequest(format!(
                "{what} is driven by rank 0, not rank {}",
                self.group.rank()
            )));
        }
        Ok(())
    }
}
