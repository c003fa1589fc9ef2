//! One rank's part of a multi-rank instance: the [`Stage`] the runner drives, whatever the
//! split. Two implementations: [`PipelineStage`](crate::pipeline::PipelineStage) (each rank holds a layer range and passes
//! activations to its right neighbour) and [`TensorStage`](crate::tensor_stage::TensorStage) (each rank holds a slice of every
//! layer and the ranks all-sum partial results).
//!
//! Rank 0 holds the requests and drives every step as a batch ([`Stage::step_batch`], through
//! [`crate::batch::RingBatch`]: one ring protocol, whether one sequence runs or many); the
//! other ranks [`Stage::serve`] until rank 0 says [`Stage::stop`].

use crate::batch::StepPlan;
use crate::config::ModelConfig;
use crate::error::{InferenceError, Result};
use crate::models::shard::ModelShard;
use crate::ring::RingGroup;

/// One rank of a pipeline- or tensor-parallel instance over an MLX ring.
pub trait Stage: Send {
    /// This stage's rank.
    fn rank(&self) -> usize;

    /// The shard this stage runs (its layers, or its slice of every layer).
    fn shard(&self) -> &ModelShard;

    /// The model's configuration (context length, vocabulary).
    fn config(&self) -> &ModelConfig {
        &self.shard().config
    }

    /// Ranks above 0: serve steps until rank 0 says stop. Returns the number of forward steps
    /// served. An error means the ring broke (usually: a neighbour died).
    fn serve(&mut self) -> Result<usize>;

    /// Rank 0: ends the serving loop of every other rank.
    fn stop(&mut self) -> Result<()>;

    /// Rank 0: one batched step through every rank: `plan` says which sequences (slots) run
    /// and which ended, `tokens` are their new tokens in the plan's order. Returns the logits
    /// (`vocab` floats) of each part that wants them, in order. The plan travels with the
    /// step, so every rank runs exactly the same batch (see [`crate::batch::RingBatch`]).
    fn step_batch(&mut self, plan: &StepPlan, tokens: &[u32]) -> Result<Vec<Vec<f32>>>;

    /// Rank 0: [`Stage::step_batch`] with image rows replacing the embeddings of some of the
    /// step's positions (`(offset in tokens, [n, hidden] rows)`, see [`crate::vision`]). A
    /// pipeline splices them on rank 0, the one that embeds; a tensor ring shares them with
    /// every rank. A stage that can do neither refuses images rather than drop them.
    fn step_batch_with_images(
        &mut self,
        plan: &StepPlan,
        tokens: &[u32],
        images: &[(usize, mlx_rs::Array)],
    ) -> Result<Vec<Vec<f32>>> {
        if !images.is_empty() {
            return Err(InferenceError::InvalidRequest(
                "images need an instance whose rank 0 alone embeds the prompt (one process or \
                 a pipeline); this one splits every layer across its ranks"
                    .into(),
            ));
        }
        self.step_batch(plan, tokens)
    }
}

/// Refuses `what` on ranks other than 0, which alone drive a distributed instance.
pub(crate) fn require_rank0(group: &RingGroup, what: &str) -> Result<()> {
    if group.rank() != 0 {
        return Err(InferenceError::InvalidRequest(format!(
            "{what} is driven by rank 0, not rank {}",
            group.rank()
        )));
    }
    Ok(())
}

/// Checks, before any rank hears of a step, that `tokens` are within the vocabulary and match
/// the plan.
pub(crate) fn check_step(plan: &StepPlan, tokens: &[u32], vocab: usize) -> Result<()> {
    if plan.tokens() != tokens.len() {
        return Err(InferenceError::InvalidRequest(format!(
            "a plan of {} tokens with {} tokens",
            plan.tokens(),
            tokens.len()
        )));
    }
    if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(InferenceError::InvalidRequest(format!(
            "token id {bad} is outside the vocabulary of {vocab}"
        )));
    }
    Ok(())
}

/// Any failure in the middle of a step leaves the ranks out of step (the ring has no framing),
/// so it is a ring failure: the instance cannot go on.
pub(crate) fn midway(what: &str, e: InferenceError) -> InferenceError {
    match e {
        InferenceError::Ring(m) => InferenceError::Ring(format!("{what}: {m}")),
        other => InferenceError::Ring(format!("{what}: {other}")),
    }
}
