//! Reading a node's `/state` document: which nodes it holds alive, which links it verified.

use serde_json::Value;

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
