//! A runner's batch limits, from its environment (the node passes its `--max-sequences` and
//! `--kv-budget-mb` flags down as these variables).

use super::BatchLimits;
use crate::config::ModelConfig;
use crate::memory::KvBudget;
use crate::weights::WeightFormat;

pub use wire::runner::env::{DEFAULT_MAX_SEQUENCES, KV_BUDGET_ENV, MAX_SEQUENCES_ENV};

/// The limits of a runner of `config`: [`MAX_SEQUENCES_ENV`] (default
/// [`DEFAULT_MAX_SEQUENCES`]) and [`KV_BUDGET_ENV`] (default: [`KvBudget::new`], at most a
/// quarter of the free memory), counted in the runner's default representation.
pub fn batch_limits_of(config: &ModelConfig) -> BatchLimits {
    let read = |name: &str| -> Option<u64> {
        std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
    };
    let max_sequences = read(MAX_SEQUENCES_ENV)
        .map_or(DEFAULT_MAX_SEQUENCES, |n| n as usize)
        .max(1);
    let budget = KvBudget::new(
        config,
        WeightFormat::default_for_backend(),
        read(KV_BUDGET_ENV),
    );
    BatchLimits {
        max_sequences,
        kv_tokens: budget.tokens,
    }
}
