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
//!
//! **Images** (issue 47): every rank embeds the prompt, but only rank 0 holds the vision tower
//! (the other ranks never see the request, only its plan). A step with image positions is
//! announced as [`Kind::BatchImages`]: its message starts with the image runs (`[runs, at,
//! len, ...]`), and after it rank 0's image rows are all-summed as f32 (the other ranks
//! contributing zeros, so every rank gets rank 0's rows exactly), and every rank splices the
//! same rows into its embeddings ([`crate::vision::splice`]). The layers' all-sums then see
//! the same inputs as one process would.

use crate::batch::{rows_to_host, SlotCaches, StepPlan, MAX_PLAN_MESSAGE};
use crate::error::{InferenceError, Result};
use crate::models::shard::{wanted_rows, ModelShard};
use crate::ring::RingGroup;
use crate::stage::{check_step, midway, require_rank0, Stage};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{ops, Array, Dtype};
use std::sync::Arc;

/// What the next step is, as the header says. Codes start at 1 so that an all-zero header
/// (nothing summed in from rank 0) is never mistaken for a step.
/// (Codes 1 and 2 were the single-sequence step and its reset, which the ring no longer
/// speaks.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Stop = 3,
    Batch = 4,
    /// A batched step with image rows: its message is the image runs, then the plan.
    BatchImages = 5,
}

impl Kind {
    fn from_code(code: i32) -> Result<Kind> {
        match code {
            3 => Ok(Kind::Stop),
            4 => Ok(Kind::Batch),
            5 => Ok(Kind::BatchImages),
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
        if count > MAX_STEP_MESSAGE {
            return Err(InferenceError::Ring(format!(
                "a step header announces {count} values (at most {MAX_STEP_MESSAGE})"
            )));
        }
        let payload = match (kind, count) {
            (Kind::Batch | Kind::BatchImages, 1) => vec![header[2]],
            (Kind::Batch | Kind::BatchImages, n) => {
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

    /// Every rank gets rank 0's image rows (`images` there; `runs`, their offsets and
    /// lengths, everywhere) as `(offset, [len, hidden])` runs to splice: rank 0 all-sums its
    /// rows as f32, the others zeros of the same shape, so the sum is rank 0's rows exactly.
    fn share_images(
        &self,
        runs: &[(usize, usize)],
        images: &[(usize, Array)],
        hidden: i32,
    ) -> Result<Vec<(usize, Array)>> {
        let total: usize = runs.iter().map(|&(_, len)| len).sum();
        let mine = if self.group.rank() == 0 {
            let rows: Vec<Array> = images
                .iter()
                .map(|(_, rows)| rows.as_dtype(Dtype::Float32))
                .collect::<std::result::Result<_, _>>()?;
            ops::concatenate(&rows, 0)?
        } else {
            ops::zeros::<f32>(&[total as i32, hidden])?
        };
        if mine.shape() != [total as i32, hidden] {
            return Err(InferenceError::InvalidRequest(format!(
                "image rows of shape {:?} for runs of {total} positions of {hidden}",
                mine.shape()
            )));
        }
        let rows = self.group.all_sum(&mine)?;
        let mut at = 0i32;
        Ok(runs
            .iter()
            .map(|&(offset, len)| {
                let run = rows.index(at..at + len as i32);
                at += len as i32;
                (offset, run)
            })
            .collect())
    }

    /// A batched step on this rank's slice: every sequence of `plan` in one pass, with image
    /// rows spliced at `runs` (rank 0 brings them in `images`, see [`Self::share_images`]);
    /// rank 0 gets the wanted logits as host rows.
    fn run_batch(
        &mut self,
        plan: &StepPlan,
        tokens: &[u32],
        runs: &[(usize, usize)],
        images: &[(usize, Array)],
    ) -> Result<Vec<Vec<f32>>> {
        let mut h = self.shard.embed(tokens)?;
        if !runs.is_empty() {
            let hidden = h.shape()[2];
            h = crate::vision::splice(h, &self.share_images(runs, images, hidden)?)?;
        }
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
            stage.run_batch(plan, tokens, &[], &[])
        };
        step(self).map_err(|e| midway("batched tensor-parallel step", e))
    }

    /// Rank 0 holds the tower and made `images`; every rank splices them (see the module
    /// docs). Refused before any rank hears of the step when the runs do not fit it.
    fn step_batch_with_images(
        &mut self,
        plan: &StepPlan,
        tokens: &[u32],
        images: &[(usize, Array)],
    ) -> Result<Vec<Vec<f32>>> {
        if images.is_empty() {
            return self.step_batch(plan, tokens);
        }
        require_rank0(&self.group, "a batched step")?;
        check_step(plan, tokens, self.shard.config.vocab_size)?;
        let hidden = self.shard.config.hidden_size as i32;
        if plan.parts.is_empty() || images.iter().any(|(_, rows)| rows.shape()[1..] != [hidden]) {
            return Err(InferenceError::InvalidRequest(format!(
                "a batched step with images needs a sequence and rows of {hidden} values"
            )));
        }
        let runs: Vec<(usize, usize)> = images
            .iter()
            .map(|(at, rows)| (*at, rows.shape()[0].max(0) as usize))
            .collect();
        let mut message = encode_runs(&runs);
        decode_runs(&message, tokens.len())?;
        message.extend(plan.encode(tokens));
        let step = |stage: &mut TensorStage| -> Result<Vec<Vec<f32>>> {
            if stage.group.size() > 1 {
                stage.header(Kind::BatchImages, &message)?;
            }
            stage.run_batch(plan, tokens, &runs, images)
        };
        step(self).map_err(|e| midway("batched tensor-parallel step with images", e))
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
                Kind::Batch | Kind::BatchImages => {
                    let step = |stage: &mut TensorStage| -> Result<()> {
                        let (runs, plan) = if kind == Kind::BatchImages {
                            let count = payload.first().copied().unwrap_or(0).max(0) as usize;
                            let split = (1 + 2 * count).min(payload.len());
                            (payload[..split].to_vec(), &payload[split..])
                        } else {
                            (Vec::new(), &payload[..])
                        };
                        let (plan, tokens) = StepPlan::decode(plan)?;
                        let runs = if runs.is_empty() {
                            Vec::new()
                        } else {
                            decode_runs(&runs, tokens.len())?
                        };
                        stage.run_batch(&plan, &tokens, &runs, &[]).map(|_| ())
                    };
                    step(self)
                        .map_err(|e| midway(&format!("rank {rank} running a batched step"), e))?;
                    steps += 1;
                }
            }
        }
    }
}

/// The most image runs one step may carry (each covers one position at least).
const MAX_IMAGE_RUNS: usize = crate::batch::MAX_PLAN_TOKENS;

/// The longest step message a rank accepts: a plan ([`MAX_PLAN_MESSAGE`]) after the most
/// image runs.
const MAX_STEP_MESSAGE: usize = MAX_PLAN_MESSAGE + 1 + 2 * MAX_IMAGE_RUNS;

/// A step's image runs as a message: `[runs, at, len, at, len, ...]`.
fn encode_runs(runs: &[(usize, usize)]) -> Vec<i32> {
    let mut out = Vec::with_capacity(1 + 2 * runs.len());
    out.push(runs.len() as i32);
    for &(at, len) in runs {
        out.extend([at as i32, len as i32]);
    }
    out
}

/// The image runs of a message of [`encode_runs`] for a step of `tokens` positions: in order,
/// not overlapping, each non-empty and within the step, at most [`MAX_IMAGE_RUNS`]; anything
/// else is an error, never a panic or a large allocation.
fn decode_runs(message: &[i32], tokens: usize) -> Result<Vec<(usize, usize)>> {
    let bad = |what: String| InferenceError::Ring(format!("a step's image runs: {what}"));
    let count =
        usize::try_from(*message.first().unwrap_or(&-1)).map_err(|_| bad("no count".into()))?;
    if count == 0 || count > MAX_IMAGE_RUNS || message.len() != 1 + 2 * count {
        return Err(bad(format!("{count} runs in {} values", message.len())));
    }
    let mut end = 0usize;
    let mut runs = Vec::with_capacity(count);
    for pair in message[1..].chunks_exact(2) {
        let (at, len) = (usize::try_from(pair[0]), usize::try_from(pair[1]));
        let (Ok(at), Ok(len)) = (at, len) else {
            return Err(bad(format!("a negative run {pair:?}")));
        };
        if len == 0 || at < end || at + len > tokens {
            return Err(bad(format!(
                "run {at}..{} after {end} in a step of {tokens}",
                at + len
            )));
        }
        end = at + len;
        runs.push((at, len));
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_runs_round_trip_and_bad_ones_are_refused() {
        let runs = [(2, 4), (6, 1), (9, 3)];
        assert_eq!(decode_runs(&encode_runs(&runs), 12).unwrap(), runs);
        // Past the step, overlapping, empty, negative, a wrong count: refused.
        assert!(decode_runs(&encode_runs(&runs), 11).is_err());
        assert!(decode_runs(&encode_runs(&[(2, 4), (5, 1)]), 12).is_err());
        assert!(decode_runs(&encode_runs(&[(2, 0)]), 12).is_err());
        assert!(decode_runs(&[1, -1, 2], 12).is_err());
        assert!(decode_runs(&[2, 0, 1], 12).is_err());
        assert!(decode_runs(&[], 12).is_err());
        assert!(decode_runs(&[i32::MAX, 0, 1], 12).is_err());
    }
}
