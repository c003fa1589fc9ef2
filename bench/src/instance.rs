//! Reading the cluster API's JSON for the bench: which placement previews to measure, the id of
//! a created instance, and whether every rank of it is ready. The readers accept the shapes
//! shoal answers and exo's equivalents (runner states as `"ready"`, `{"state": "ready"}`,
//! `{"status": ...}` or an externally tagged `{"failed": {"reason": ...}}`), so a field that
//! moves does not break the bench silently: anything unreadable is an error naming it.

use kit::instances::ranks;
use kit::runner_states::{runner_status, runners};
use placement::RunnerStatus;
use serde_json::Value;

/// How the user asked to shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ShardingChoice {
    Pipeline,
    Tensor,
    Both,
}

impl ShardingChoice {
    /// Whether a preview's sharding (any case) is wanted.
    pub fn accepts(self, sharding: &str) -> bool {
        match self {
            ShardingChoice::Both => true,
            ShardingChoice::Pipeline => sharding.eq_ignore_ascii_case("pipeline"),
            ShardingChoice::Tensor => sharding.eq_ignore_ascii_case("tensor"),
        }
    }
}

/// A placement preview the bench will measure.
#[derive(Debug, Clone, PartialEq)]
pub struct Preview {
    /// `pipeline` or `tensor` (lower case).
    pub sharding: String,
    /// Nodes it spans.
    pub nodes: usize,
    /// What to send as `POST /instance {"instance": ...}`.
    pub instance: Value,
}

/// The number of ranks in an instance or placement value, wherever it keeps them.
fn rank_count(v: &Value) -> Option<usize> {
    ranks(v).map(Vec::len)
}

/// The previews of `GET /instance/previews` that can be placed, are wanted, and span
/// `min..=max` nodes, sorted by sharding then nodes; also how many were skipped for an error.
pub fn select_previews(
    answer: &Value,
    sharding: ShardingChoice,
    min_nodes: usize,
    max_nodes: usize,
) -> Result<(Vec<Preview>, Vec<String>), String> {
    let list = answer
        .get("previews")
        .unwrap_or(answer)
        .as_array()
        .ok_or("GET /instance/previews answered no `previews` list")?;
    let mut chosen = Vec::new();
    let mut impossible = Vec::new();
    for (i, p) in list.iter().enumerate() {
        let instance = p.get("instance").filter(|v| v.is_object()).unwrap_or(p);
        let kind = p
            .get("sharding")
            .or_else(|| instance.get("sharding"))
            .and_then(Value::as_str)
            .unwrap_or("pipeline")
            .to_ascii_lowercase();
        // The placement's ranks say how many nodes it really spans; `node_count` (exo's
        // field, a minimum) only when there is no placement.
        let nodes = rank_count(p).or_else(|| rank_count(instance)).or_else(|| {
            ["node_count", "nodes"]
                .iter()
                .find_map(|k| p.get(*k).and_then(Value::as_u64).map(|n| n as usize))
        });
        let error = p.get("error").filter(|e| !e.is_null());
        let Some(nodes) = nodes else {
            if error.is_none() {
                return Err(format!(
                    "preview {i} says neither how many nodes it spans nor why it cannot be placed: {p}"
                ));
            }
            continue;
        };
        if !sharding.accepts(&kind) || !(min_nodes..=max_nodes).contains(&nodes) {
            continue;
        }
        if let Some(error) = error {
            let why = error
                .as_str()
                .or_else(|| error.get("message").and_then(Value::as_str))
                .map_or_else(|| error.to_string(), str::to_string);
            impossible.push((kind, nodes, why));
            continue;
        }
        chosen.push(Preview {
            sharding: kind,
            nodes,
            instance: instance.clone(),
        });
    }
    chosen.sort_by(|a, b| (&a.sharding, a.nodes).cmp(&(&b.sharding, b.nodes)));
    // Several backends may offer the same sharding and size (ring, JACCL): measure each
    // shape once, the first offered.
    chosen.dedup_by(|b, a| a.sharding == b.sharding && a.nodes == b.nodes);
    // Why a shape cannot be placed matters only when no other backend can place it.
    impossible.retain(|(kind, nodes, _)| {
        !chosen
            .iter()
            .any(|c| &c.sharding == kind && c.nodes == *nodes)
    });
    let mut impossible: Vec<String> = impossible
        .into_iter()
        .map(|(kind, nodes, why)| format!("{kind} on {nodes} node(s): {why}"))
        .collect();
    impossible.dedup();
    Ok((chosen, impossible))
}

/// The id in `POST /instance`'s answer (or in the instance value itself).
pub fn instance_id(answer: &Value) -> Option<String> {
    let direct = |v: &Value| {
        ["instance_id", "id"]
            .iter()
            .find_map(|k| v.get(*k).and_then(Value::as_str).map(str::to_string))
    };
    direct(answer).or_else(|| direct(answer.get("instance")?))
}

/// Where an instance stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// Every rank's runner is ready (or already serving).
    Ready,
    /// Still starting; the text lists the ranks' states.
    Waiting(String),
    /// A runner failed; the text says why.
    Failed(String),
}

/// Reads `GET /instance/{id}`: ready when there is a ready runner for every rank.
pub fn readiness(instance: &Value) -> Readiness {
    let runners = runners(instance);
    let expected = rank_count(instance).unwrap_or(1).max(1);
    let mut states = Vec::new();
    let mut ready = 0;
    for runner in &runners {
        match runner_status(runner) {
            Some(RunnerStatus::Failed { reason }) => return Readiness::Failed(reason),
            Some(status) => {
                ready += usize::from(status.is_serving());
                states.push(status.name().to_string());
            }
            None => states.push(format!("unreadable {runner}")),
        }
    }
    if ready >= expected {
        return Readiness::Ready;
    }
    let mut shown = states.clone();
    shown.sort();
    let missing = expected.saturating_sub(states.len());
    if missing > 0 {
        shown.push(format!("{missing} not started"));
    }
    Readiness::Waiting(format!(
        "{ready}/{expected} ranks ready ({})",
        shown.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn previews_are_filtered_sorted_and_deduplicated() {
        let answer = json!({"previews": [
            {"sharding": "Tensor", "node_count": 2, "instance": {"model_id": "m", "x": 1}},
            {"sharding": "pipeline", "node_count": 3, "placement": {"ranks": [1, 2, 3]}},
            {"sharding": "pipeline", "node_count": 1},
            {"sharding": "Pipeline", "node_count": 1, "instance_meta": "MlxJaccl"},
            {"sharding": "Tensor", "node_count": 3, "placement": null,
             "error": {"code": "indivisible", "message": "9 heads do not split over 3"}},
            {"sharding": "Tensor", "node_count": 4, "error": "only 3 nodes"},
            {"sharding": "Tensor", "node_count": 2, "error": "MlxJaccl needs Thunderbolt 5"},
            {"sharding": "pipeline", "placement": {"ranks": [1, 2]}},
            {"sharding": "pipeline", "node_count": 1, "placement": {"ranks": [1, 2, 3, 4]}},
        ]});
        let (chosen, impossible) = select_previews(&answer, ShardingChoice::Both, 1, 3).unwrap();
        let shapes: Vec<(&str, usize)> = chosen
            .iter()
            .map(|p| (p.sharding.as_str(), p.nodes))
            .collect();
        assert_eq!(
            shapes,
            vec![
                ("pipeline", 1),
                ("pipeline", 2),
                ("pipeline", 3),
                ("tensor", 2)
            ]
        );
        assert_eq!(chosen[3].instance, json!({"model_id": "m", "x": 1}));
        assert_eq!(impossible.len(), 1, "{impossible:?}");
        assert_eq!(
            impossible[0],
            "tensor on 3 node(s): 9 heads do not split over 3"
        );

        let (chosen, _) = select_previews(&answer, ShardingChoice::Pipeline, 2, 2).unwrap();
        assert_eq!(chosen.len(), 1);
        assert_eq!(chosen[0].nodes, 2);
        let (chosen, _) = select_previews(&answer, ShardingChoice::Tensor, 1, 8).unwrap();
        assert_eq!(chosen.len(), 1);
    }

    #[test]
    fn unreadable_previews_are_errors() {
        assert!(select_previews(&json!({"x": 1}), ShardingChoice::Both, 1, 1).is_err());
        let no_size = json!([{"sharding": "pipeline"}]);
        assert!(select_previews(&no_size, ShardingChoice::Both, 1, 1)
            .unwrap_err()
            .contains("preview 0"));
    }

    #[test]
    fn ids_come_from_the_answer_or_its_instance() {
        assert_eq!(
            instance_id(&json!({"instance_id": "a"})).as_deref(),
            Some("a")
        );
        assert_eq!(
            instance_id(&json!({"instance": {"id": "b"}})).as_deref(),
            Some("b")
        );
        assert_eq!(instance_id(&json!({"message": "ok"})), None);
    }

    #[test]
    fn readiness_needs_a_ready_runner_per_rank() {
        let three = json!([{}, {}, {}]);
        let inst = |runners: Value| json!({"ranks": three, "runners": runners});
        assert_eq!(
            readiness(&inst(
                json!({"a": {"state": "ready"}, "b": "Ready", "c": {"status": "running"}})
            )),
            Readiness::Ready
        );
        match readiness(&inst(
            json!({"a": {"state": "ready"}, "b": {"loading": {"layers_loaded": 3, "total": 10}}}),
        )) {
            Readiness::Waiting(text) => {
                assert!(text.starts_with("1/3 ranks ready"), "{text}");
                assert!(
                    text.contains("loading") && text.contains("1 not started"),
                    "{text}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            readiness(&inst(
                json!({"a": {"failed": {"reason": "rank 2 never came"}}})
            )),
            Readiness::Failed("rank 2 never came".into())
        );
        assert_eq!(
            readiness(&inst(json!({"a": {"state": "failed", "reason": "oom"}}))),
            Readiness::Failed("oom".into())
        );
        assert_eq!(
            readiness(&json!({"runners": {"a": {"epoch": 0, "rank": 0, "status": "RunnerReady"}}})),
            Readiness::Ready
        );
        assert!(matches!(readiness(&json!({})), Readiness::Waiting(_)));
    }
}
