//! [`RunnerSettings`]: the node's settings for its runners, built once from its flags and handed
//! to each runner's supervisor as a value. The supervisor takes its batch bound, queue and step
//! deadline from it; the runner process gets its own share (fast synchronisation, the batch
//! limits, the prompt cache) in its environment ([`RunnerSettings::env`]), which is how
//! `shoal runner` reads them. No setting is written as a string and parsed back on the node.

use std::time::Duration;

/// The default of `--max-queue`: requests that may wait beyond one runner's batch.
pub const DEFAULT_MAX_QUEUE: usize = 64;
/// The default of `--step-timeout`, in seconds: far above one decode step or prompt chunk of
/// any model this runs, so only a real hang ends a runner.
pub const DEFAULT_STEP_TIMEOUT_S: usize = 60;

/// The node's settings for its runners (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerSettings {
    /// Ask MLX for fast synchronisation (`--fast-synch` and not `--no-fast-synch`).
    pub fast_synch: bool,
    /// Requests one runner decodes together at most (`--max-sequences`, at least 1).
    pub max_sequences: usize,
    /// Requests that may wait for room in one runner's batch (`--max-queue`).
    pub max_queue: usize,
    /// How long a runner may go without finishing a step while it has requests before it
    /// is taken for hung (`--step-timeout`, at least 1 s).
    pub step_timeout: Duration,
    /// One runner's KV-cache budget in MiB (`--kv-budget-mb`; the runner's default if none).
    pub kv_budget_mb: Option<u64>,
    /// Positions of the prompt cache (`--prompt-cache-tokens`; the runner's default if none).
    pub prompt_cache_tokens: Option<usize>,
}

impl Default for RunnerSettings {
    /// The flags' defaults.
    fn default() -> RunnerSettings {
        RunnerSettings {
            fast_synch: false,
            max_sequences: wire::runner::env::DEFAULT_MAX_SEQUENCES,
            max_queue: DEFAULT_MAX_QUEUE,
            step_timeout: Duration::from_secs(DEFAULT_STEP_TIMEOUT_S as u64),
            kv_budget_mb: None,
            prompt_cache_tokens: None,
        }
    }
}

impl RunnerSettings {
    /// Requests one runner takes at once at most: its batch plus its queue (past it the
    /// supervisor refuses).
    pub fn capacity(&self) -> usize {
        self.max_sequences.max(1) + self.max_queue
    }

    /// The runner process's share, as the environment `shoal runner` reads.
    pub fn env(&self) -> Vec<(String, String)> {
        let mut env = vec![
            (
                wire::runner::env::FAST_SYNCH_ENV.to_string(),
                self.fast_synch.to_string(),
            ),
            (
                wire::runner::env::MAX_SEQUENCES_ENV.to_string(),
                self.max_sequences.max(1).to_string(),
            ),
        ];
        if let Some(mb) = self.kv_budget_mb {
            env.push((wire::runner::env::KV_BUDGET_ENV.to_string(), mb.to_string()));
        }
        if let Some(tokens) = self.prompt_cache_tokens {
            env.push((
                wire::runner::env::PROMPT_CACHE_ENV.to_string(),
                tokens.to_string(),
            ));
        }
        env
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runner_gets_its_share_in_its_environment() {
        let settings = RunnerSettings {
            fast_synch: true,
            max_sequences: 0,
            kv_budget_mb: Some(512),
            ..RunnerSettings::default()
        };
        assert_eq!(settings.capacity(), 1 + DEFAULT_MAX_QUEUE);
        let env = settings.env();
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("SHOAL_FAST_SYNCH"), Some("true"));
        assert_eq!(get("SHOAL_MAX_SEQUENCES"), Some("1"));
        assert_eq!(get("SHOAL_KV_BUDGET_MB"), Some("512"));
        assert_eq!(get("SHOAL_PROMPT_CACHE_TOKENS"), None);
    }
}
