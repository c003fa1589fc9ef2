//! Many requests at once: continuous batching ([`Batcher`]) over whatever runs the model
//! ([`BatchForward`]: the whole model in this process batches any number of sequences in one
//! pass; rank 0 of a distributed instance batches across its ranks, [`RingBatch`], each step's
//! [`StepPlan`] travelling with it).
//!
//! **Layout of a batched step.** Sequences of different lengths are not padded: their new
//! positions are laid one after another in a single `[1, total, hidden]` activation, and the
//! weight matrices (the memory-bound part of decoding) are applied once to all of them.
//! Decoding sequences keep their caches as rows of shared buffers ([`crate::kv_rows`]), so
//! RoPE, the cache write and attention run once per layer for all of them, each row at its own
//! position and masked to its own columns; a sequence in prefill runs them against its own
//! cache ([`SlotKv`] decides which is where). Each sequence attends to exactly what it would
//! alone.
//!
//! **Prompt cache** ([`PromptCache`]): the states of ended requests, so that the next turn
//! of a chat or another request with the same system prompt skips that prefill.

mod batch_forward;
mod batcher;

pub(crate) use batch_forward::rows_to_host;
pub use batch_forward::{BatchForward, BatchPart, LocalBatch, LOCAL_STEP_TOKENS};
pub use batcher::{BatchEvent, BatchLimits, BatchStats, Batcher};

mod limits;
pub use limits::{batch_limits_of, DEFAULT_MAX_SEQUENCES, KV_BUDGET_ENV, MAX_SEQUENCES_ENV};

mod ring_plan;
pub use ring_plan::{
    PlannedPart, SlotCaches, StepPlan, MAX_PLAN_MESSAGE, MAX_PLAN_SEQUENCES, MAX_PLAN_TOKENS,
};

mod ring_batch;
pub use ring_batch::RingBatch;

mod one_sequence;
pub use one_sequence::OneSequence;

mod slot_kv;
pub use slot_kv::{Slot, SlotKv};

mod prompt_cache;
pub use prompt_cache::{prompt_cache_tokens, Hit, PromptCache, PROMPT_CACHE_ENV};
