//! A runner's batch limits, from its environment (the node passes its `--max-sequences` and
//! `--kv-budget-mb` flags down as these variables).

use super::BatchLimits;
use crate::config::ModelConfig;
use crate::memory::KvBudget;
use crate::weights::WeightFormat;

/// Sequences one instance decodes together at most (`--max-sequences`).
pub const MAX_SEQUENCES_ENV: &str = "SHOAL_MAX_SEQUENCES";
/// The KV-cache budget of one instance in MiB (`--kv-budget-mb`).
pub const KV_BUDGET_ENV: &str = "SHOAL_KV_BUDGET_MB";
/// The default of [`MAX_SEQUENCES_ENV`] (mlx-lm's server decodes 32 at once by default).
pub const DEFAULT_MAX_SEQUENCES: usize = 32;

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
