//! Runner states as the cluster API shows them (`GET /state`, `GET /instance/{id}`): read the
//! same way by the end-to-end run and benchmarks here and by `shoal bench`, which includes this
//! file by path (it depends on `serde_json` only). Tolerant of the shapes shoal and exo answer:
//! `"ready"`, `{"state": ...}`, `{"status": ...}` or an externally tagged `{"failed": {...}}`.

use serde_json::Value;

/// The runners of an instance value (`runners` as a map by node, or a list).
pub fn runners(instance: &Value) -> Vec<&Value> {
    match instance.get("runners") {
        Some(Value::Object(map)) => map.values().collect(),
        Some(Value::Array(list)) => list.iter().collect(),
        _ => Vec::new(),
    }
}

/// Whether a state name (as [`runner_state`] gives it) serves requests.
pub fn is_serving(state: &str) -> bool {
    state == "ready" || state == "running"
}

fn normal(state: &str) -> String {
    let s = state.to_ascii_lowercase().replace(['_', '-', ' '], "");
    s.strip_prefix("runner").map(str::to_string).unwrap_or(s)
}

/// A runner value's state name, normalised (`Ready`, `RunnerReady`, `warming_up` → `ready`,
/// `warmingup`), and its reason when it carries one.
pub fn runner_state(v: &Value) -> Option<(String, Option<String>)> {
    let reason = |v: &Value| {
        ["reason", "message", "error"]
            .iter()
            .find_map(|k| v.get(*k).and_then(Value::as_str).map(str::to_string))
    };
    match v {
        Value::String(s) => Some((normal(s), None)),
        Value::Object(map) => {
            for key in ["state", "status"] {
                match map.get(key) {
                    Some(Value::String(s)) => return Some((normal(s), reason(v))),
                    Some(inner @ Value::Object(_)) => return runner_state(inner),
                    _ => {}
                }
            }
            let (tag, inner) = map.iter().next().filter(|_| map.len() == 1)?;
            Some((normal(tag), reason(inner)))
        }
        _ => None,
    }
}
