//! Phi-accrual failure detector (Hayashibara et al.): instead of a fixed timeout, each node's
//! heartbeat arrivals give a mean interval, and `phi` says how unlikely the current silence is
//! under an exponential model. A node is dead when phi passes a threshold, and alive again as
//! soon as its heartbeat advances.

use crate::proto::id::NodeId;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Tuning of the detector.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FailureDetectorConfig {
    /// Suspicion level at which a node is declared dead (8 is Cassandra's default; lower
    /// detects faster and risks false deaths).
    pub phi_threshold: f64,
    /// Number of inter-arrival intervals remembered per node.
    pub window: usize,
    /// Interval assumed before any has been measured (a pseudo-sample in every window).
    pub initial_interval_ms: u64,
    /// Measured intervals are capped here so one long pause does not blind the detector.
    pub max_interval_ms: u64,
    /// Lower bound of the mean, so bursts of arrivals do not make it trigger-happy.
    pub min_mean_ms: u64,
}

#[derive(Debug, Clone)]
struct Arrivals {
    last_ms: u64,
    intervals: VecDeque<u64>,
    sum: u64,
}

impl Arrivals {
    fn mean(&self, config: &FailureDetectorConfig) -> f64 {
        let total = self.sum + config.initial_interval_ms;
        let count = self.intervals.len() as u64 + 1;
        (total as f64 / count as f64).max(config.min_mean_ms as f64)
    }
}

/// Liveness of every remote node, from heartbeat arrivals.
#[derive(Debug, Clone)]
pub struct FailureDetector {
    config: FailureDetectorConfig,
    arrivals: BTreeMap<NodeId, Arrivals>,
    dead: BTreeSet<NodeId>,
    dead_since: BTreeMap<NodeId, u64>,
}

/// A change of liveness found by [`FailureDetector::update`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// The node's heartbeat has stopped for too long.
    Died(NodeId),
    /// A node thought dead has a new heartbeat.
    Revived(NodeId),
}

impl FailureDetector {
    /// An empty detector.
    pub fn new(config: FailureDetectorConfig) -> FailureDetector {
        FailureDetector {
            config,
            arrivals: BTreeMap::new(),
            dead: BTreeSet::new(),
            dead_since: BTreeMap::new(),
        }
    }

    /// Records that `node`'s heartbeat advanced at `now_ms`. Returns `Revived` if it was dead.
    pub fn heartbeat(&mut self, node: NodeId, now_ms: u64) -> Option<Liveness> {
        let max = self.config.max_interval_ms;
        let window = self.config.window;
        match self.arrivals.get_mut(&node) {
            Some(a) => {
                let interval = now_ms.saturating_sub(a.last_ms).min(max);
                a.last_ms = now_ms;
                a.intervals.push_back(interval);
                a.sum += interval;
                while a.intervals.len() > window {
                    a.sum -= a.intervals.pop_front().unwrap_or(0);
                }
            }
            None => {
                self.arrivals.insert(
                    node,
                    Arrivals {
                        last_ms: now_ms,
                        intervals: VecDeque::new(),
                        sum: 0,
                    },
                );
            }
        }
        self.dead_since.remove(&node);
        self.dead.remove(&node).then_some(Liveness::Revived(node))
    }

    /// Suspicion level of `node` at `now_ms` (0 right after a heartbeat, growing with silence).
    pub fn phi(&self, node: &NodeId, now_ms: u64) -> Option<f64> {
        let a = self.arrivals.get(node)?;
        let silence = now_ms.saturating_sub(a.last_ms) as f64;
        Some(silence / a.mean(&self.config) * std::f64::consts::LOG10_E)
    }

    /// Re-evaluates every node; returns the nodes that just died.
    pub fn update(&mut self, now_ms: u64) -> Vec<Liveness> {
        let mut changes = Vec::new();
        let ids: Vec<NodeId> = self.arrivals.keys().copied().collect();
        for id in ids {
            if self.dead.contains(&id) {
                continue;
            }
            if self.phi(&id, now_ms).unwrap_or(0.0) > self.config.phi_threshold {
                self.dead.insert(id);
                self.dead_since.insert(id, now_ms);
                changes.push(Liveness::Died(id));
            }
        }
        changes
    }

    /// True if `node` is known and not dead.
    pub fn is_alive(&self, node: &NodeId) -> bool {
        self.arrivals.contains_key(node) && !self.dead.contains(node)
    }

    /// Since when `node` has been dead, if it is.
    pub fn dead_since(&self, node: &NodeId) -> Option<u64> {
        self.dead_since.get(node).copied()
    }

    /// Nodes currently considered dead.
    pub fn dead_nodes(&self) -> impl Iterator<Item = &NodeId> {
        self.dead.iter()
    }

    /// Forgets `node` entirely (its records expired, or it restarted with a new generation).
    pub fn forget(&mut self, node: &NodeId) {
        self.arrivals.remove(node);
        self.dead.remove(node);
        self.dead_since.remove(node);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> FailureDetectorConfig {
        FailureDetectorConfig {
            phi_threshold: 3.0,
            window: 100,
            initial_interval_ms: 500,
            max_interval_ms: 10_000,
            min_mean_ms: 100,
        }
    }

    #[test]
    fn regular_heartbeats_stay_alive_and_silence_kills() {
        let mut fd = FailureDetector::new(config());
        let n = NodeId::from_index(1);
        for t in 0..20 {
            fd.heartbeat(n, t * 500);
            assert!(fd.update(t * 500 + 400).is_empty());
        }
        assert!(fd.is_alive(&n));
        // phi 3 at mean 500 ms is about 3.45 s of silence.
        assert!(fd.update(9_500 + 3_000).is_empty());
        assert_eq!(fd.update(9_500 + 3_600), vec![Liveness::Died(n)]);
        assert!(!fd.is_alive(&n));
        assert_eq!(fd.heartbeat(n, 14_000), Some(Liveness::Revived(n)));
        assert!(fd.is_alive(&n));
    }

    #[test]
    fn phi_grows_with_silence() {
        let mut fd = FailureDetector::new(config());
        let n = NodeId::from_index(2);
        fd.heartbeat(n, 0);
        let a = fd.phi(&n, 100).unwrap();
        let b = fd.phi(&n, 1_000).unwrap();
        assert!(a < b);
        assert!(fd.phi(&NodeId::from_index(3), 0).is_none());
    }
}
