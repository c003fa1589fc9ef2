//! Reading instances out of the cluster API's JSON (`GET /state`, `GET /instance/{id}`,
//! `POST /place_instance`) for the end-to-end run, the benchmarks and `shoal bench`: ids, the
//! node of each rank, and whether every rank's runner is ready. Tolerant of where the fields sit (an
//! instance's `ranks` or its `placement.ranks`; runner states as `"ready"`, `{"state": ...}`,
//! `{"status": ...}` or `{"failed": {...}}`), strict about what it needs.

use crate::runner_states::{runner_status, runners};
use placement::RunnerStatus;
use serde_json::Value;

/// An instance as the run needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceInfo {
    /// The instance id.
    pub id: String,
    /// The model it serves.
    pub model_id: String,
    /// The node of each rank, in rank order.
    pub rank_nodes: Vec<String>,
    /// Every rank has a ready (or running) runner.
    pub ready: bool,
    /// A runner failed: why.
    pub failed: Option<String>,
    /// Runner states, for progress lines.
    pub states: Vec<String>,
    /// How many runners serve.
    pub serving: usize,
}

/// The ranks of an instance or placement value, wherever it keeps them.
pub fn ranks(v: &Value) -> Option<&Vec<Value>> {
    v.get("ranks")
        .and_then(Value::as_array)
        .or_else(|| v.get("placement")?.get("ranks")?.as_array())
}

/// Reads one instance; `None` without an id.
pub fn read_instance(v: &Value, id_hint: Option<&str>) -> Option<InstanceInfo> {
    let id = ["instance_id", "id"]
        .iter()
        .find_map(|k| v.get(*k).and_then(Value::as_str))
        .or(id_hint)?
        .to_string();
    let rank_nodes: Vec<String> = ranks(v)
        .map(|list| {
            list.iter()
                .filter_map(|r| {
                    ["node", "node_id"]
                        .iter()
                        .find_map(|k| r.get(*k).and_then(Value::as_str).map(str::to_string))
                })
                .collect()
        })
        .unwrap_or_default();
    let mut states = Vec::new();
    let mut failed = None;
    let mut ready_count = 0;
    for r in runners(v) {
        match runner_status(r) {
            Some(status) => {
                if let RunnerStatus::Failed { reason } = &status {
                    failed.get_or_insert_with(|| reason.clone());
                }
                ready_count += usize::from(status.is_serving());
                states.push(status.name().to_string());
            }
            None => states.push(format!("unreadable {r}")),
        }
    }
    let ready = !rank_nodes.is_empty() && ready_count >= rank_nodes.len() && failed.is_none();
    Some(InstanceInfo {
        id,
        model_id: v
            .get("model_id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        rank_nodes,
        ready,
        failed,
        states,
        serving: ready_count,
    })
}

/// Every instance in a `/state` document (`instances` as a map by id or a list).
pub fn instances_in_state(state: &Value) -> Vec<InstanceInfo> {
    match state.get("instances") {
        Some(Value::Object(map)) => map
            .iter()
            .filter_map(|(id, v)| read_instance(v, Some(id)))
            .collect(),
        Some(Value::Array(list)) => list.iter().filter_map(|v| read_instance(v, None)).collect(),
        _ => Vec::new(),
    }
}

/// A progress description: `2/3 ready (connecting, ready, ready)`.
pub fn describe(info: &InstanceInfo) -> String {
    let ready = info.serving;
    let mut states = info.states.clone();
    states.sort();
    format!(
        "{ready}/{} ranks ready ({})",
        info.rank_nodes.len().max(info.states.len()),
        if states.is_empty() {
            "no runner yet".to_string()
        } else {
            states.join(", ")
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn instances_are_read_from_state_maps_and_lists() {
        let state = json!({"instances": {
            "i1": {"model_id": "m", "ranks": [{"node": "a"}, {"node": "b"}, {"node": "c"}],
                   "runners": {"a": {"state": "ready"}, "b": "Ready", "c": {"status": "running"}}},
            "i2": {"model_id": "m", "placement": {"ranks": [{"node_id": "a"}, {"node_id": "b"}]},
                   "runners": {"a": {"loading": {"layers_loaded": 1, "total": 9}}}}
        }});
        let list = instances_in_state(&state);
        assert_eq!(list.len(), 2);
        assert_eq!(list[0].id, "i1");
        assert_eq!(list[0].rank_nodes, vec!["a", "b", "c"]);
        assert!(list[0].ready);
        assert_eq!(list[1].rank_nodes, vec!["a", "b"]);
        assert!(!list[1].ready);
        assert_eq!(describe(&list[1]), "0/2 ranks ready (loading)");
        let listed = instances_in_state(&json!({"instances": [{"instance_id": "x", "ranks": []}]}));
        assert_eq!(listed[0].id, "x");
        assert!(!listed[0].ready, "no ranks is not ready");
    }

    #[test]
    fn failures_carry_their_reason() {
        let v = json!({"instance_id": "i", "ranks": [{"node": "a"}],
                       "runners": {"a": {"failed": {"reason": "neighbour 10.99.0.2 never came"}}}});
        let info = read_instance(&v, None).unwrap();
        assert_eq!(
            info.failed.as_deref(),
            Some("neighbour 10.99.0.2 never came")
        );
        assert!(!info.ready);
        let v = json!({"instance_id": "i", "ranks": [{"node": "a"}],
                       "runners": {"a": {"state": "failed", "reason": "oom"}}});
        assert_eq!(
            read_instance(&v, None).unwrap().failed.as_deref(),
            Some("oom")
        );
    }
}
