//! Reading a node's `/state` document: which nodes it holds alive, which links it verified,
//! whether several nodes agree. The one reader of that document for the tests and
//! `cargo xtask` (runners and instances: [`crate::runner_states`], [`crate::instances`]).

use serde_json::Value;

/// The id of the node that answered with this `/state` document.
pub fn node_id(state: &Value) -> String {
    state["node_id"].as_str().unwrap_or_default().to_string()
}

/// Whether this `/state` holds `subject` alive (`None`: not in its liveness).
pub fn is_alive(state: &Value, subject: &str) -> Option<bool> {
    state["liveness"][subject]["alive"].as_bool()
}

/// The ids `/state` shows alive: `liveness.<id>.alive`, else every key of `nodes`.
pub fn alive_nodes(state: &Value) -> Vec<String> {
    let nodes: Vec<String> = match &state["nodes"] {
        Value::Object(map) => map.keys().cloned().collect(),
        Value::Array(list) => list
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    };
    match state["liveness"].as_object() {
        Some(live) => nodes
            .into_iter()
            .filter(|id| live.get(id).is_none_or(|l| l["alive"] != false))
            .collect(),
        None => nodes,
    }
}

/// The verified links in a `/state` document: (from, to) for every `edge/<to>/<ip>` record
/// that node `from` wrote.
pub fn verified_edges(state: &Value) -> std::collections::BTreeSet<(String, String)> {
    let mut out = std::collections::BTreeSet::new();
    if let Some(nodes) = state["nodes"].as_object() {
        for (from, node) in nodes {
            if let Some(records) = node["records"].as_object() {
                for key in records.keys() {
                    if let Some(to) = key.strip_prefix("edge/").and_then(|r| r.split('/').next()) {
                        out.insert((from.clone(), to.to_string()));
                    }
                }
            }
        }
    }
    out
}

/// Whether `states` (one per node) are one picture of a cluster of `expected` nodes: the same
/// digest everywhere, exactly `expected` nodes listed, and each of them alive in every state's
/// liveness (a node missing there is not yet known alive).
pub fn agreed(states: &[Value], expected: usize) -> bool {
    let Some(digest) = states.first().and_then(|s| s["digest"].as_str()) else {
        return false;
    };
    states.iter().all(|state| {
        state["digest"].as_str() == Some(digest)
            && state["nodes"].as_object().is_some_and(|listed| {
                listed.len() == expected
                    && listed
                        .keys()
                        .all(|id| state["liveness"][id]["alive"].as_bool() == Some(true))
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn alive_nodes_reads_liveness_when_present() {
        let state = json!({"nodes": {"a": {}, "b": {}, "c": {}},
                           "liveness": {"a": {"alive": true}, "b": {"alive": false}}});
        assert_eq!(alive_nodes(&state), vec!["a", "c"]);
        assert_eq!(alive_nodes(&json!({"nodes": ["x", "y"]})), vec!["x", "y"]);
        assert!(alive_nodes(&json!({})).is_empty());
    }

    #[test]
    fn agreement_needs_one_digest_the_count_and_everyone_alive() {
        let one = json!({"digest": "d1", "nodes": {"a": {}, "b": {}},
                         "liveness": {"a": {"alive": true}, "b": {"alive": true}}});
        assert!(agreed(&[one.clone(), one.clone()], 2));
        assert!(!agreed(&[one.clone(), one.clone()], 3));
        let mut other = one.clone();
        other["digest"] = json!("d2");
        assert!(!agreed(&[one.clone(), other], 2));
        let mut unknown = one.clone();
        unknown["liveness"] = json!({"a": {"alive": true}});
        assert!(!agreed(&[unknown], 2));
        assert!(!agreed(&[], 0));
    }

    #[test]
    fn edges_are_read_from_each_author_records() {
        let state = json!({"nodes": {
            "a": {"records": {"edge/b/10.99.0.2": {}, "profile": {}}},
            "b": {"records": {"edge/a/10.99.0.1": {}, "edge/a/10.100.0.1": {}}},
            "c": {}
        }});
        let edges = verified_edges(&state);
        let pairs: Vec<(&str, &str)> = edges
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        assert_eq!(pairs, vec![("a", "b"), ("b", "a")]);
    }
}
