//! Runner states as the cluster API shows them (`GET /state`, `GET /instance/{id}`), read into
//! placement's [`RunnerStatus`], the one runner-status type, by the end-to-end run, the
//! benchmarks and `shoal bench`. Tolerant of the shapes shoal and exo answer: `"ready"`,
//! `{"state": "loading", "done": 3, "total": 9}`, `{"status": "RunnerReady"}` or the
//! externally tagged `{"failed": {"reason": ...}}` that `RunnerStatus` serializes to.

use placement::RunnerStatus;
use serde_json::Value;

/// The runners of an instance value (`runners` as a map by node, or a list).
pub fn runners(instance: &Value) -> Vec<&Value> {
    match instance.get("runners") {
        Some(Value::Object(map)) => map.values().collect(),
        Some(Value::Array(list)) => list.iter().collect(),
        _ => Vec::new(),
    }
}

/// `Ready`, `RunnerReady`, `warming_up`, `Warming-Up` → `ready`, `warmingup`.
fn normal(state: &str) -> String {
    let s = state.to_ascii_lowercase().replace(['_', '-', ' '], "");
    s.strip_prefix("runner").map(str::to_string).unwrap_or(s)
}

fn count(v: &Value, keys: &[&str]) -> u32 {
    keys.iter()
        .find_map(|k| v.get(*k).and_then(Value::as_u64))
        .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX))
}

/// The status named `state`, with the fields of `v` (the loading counts, the failure reason).
fn status_named(state: &str, v: &Value) -> Option<RunnerStatus> {
    Some(match normal(state).as_str() {
        "idle" => RunnerStatus::Idle,
        "connecting" => RunnerStatus::Connecting,
        "connected" => RunnerStatus::Connected,
        "loading" => RunnerStatus::Loading {
            layers_loaded: count(v, &["layers_loaded", "done"]),
            total: count(v, &["total", "total_layers"]),
        },
        "loaded" => RunnerStatus::Loaded,
        "warmingup" => RunnerStatus::WarmingUp,
        "ready" => RunnerStatus::Ready,
        "running" => RunnerStatus::Running,
        "shuttingdown" => RunnerStatus::ShuttingDown,
        "shutdown" => RunnerStatus::Shutdown,
        "failed" => RunnerStatus::Failed {
            reason: ["reason", "message", "error"]
                .iter()
                .find_map(|k| v.get(*k).and_then(Value::as_str).map(str::to_string))
                .unwrap_or_else(|| v.to_string()),
        },
        _ => return None,
    })
}

/// A runner value's status; `None` when it is in no shape known.
pub fn runner_status(v: &Value) -> Option<RunnerStatus> {
    match v {
        Value::String(s) => status_named(s, v),
        Value::Object(map) => {
            for key in ["state", "status"] {
                match map.get(key) {
                    Some(Value::String(s)) => return status_named(s, v),
                    Some(inner @ Value::Object(_)) => return runner_status(inner),
                    _ => {}
                }
            }
            let (tag, inner) = map.iter().next().filter(|_| map.len() == 1)?;
            status_named(tag, inner)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_shape_reads_into_the_one_status_type() {
        let cases = [
            (json!("ready"), RunnerStatus::Ready),
            (json!("RunnerReady"), RunnerStatus::Ready),
            (json!({"state": "warming_up"}), RunnerStatus::WarmingUp),
            (
                json!({"status": "RunnerWarmingUp"}),
                RunnerStatus::WarmingUp,
            ),
            (
                json!({"epoch": 0, "status": {"state": "running"}}),
                RunnerStatus::Running,
            ),
            (
                json!({"state": "loading", "done": 3, "total": 9}),
                RunnerStatus::Loading {
                    layers_loaded: 3,
                    total: 9,
                },
            ),
            (
                json!({"state": "failed", "reason": "oom"}),
                RunnerStatus::Failed {
                    reason: "oom".into(),
                },
            ),
        ];
        for (value, expected) in cases {
            assert_eq!(runner_status(&value), Some(expected), "{value}");
        }
        assert_eq!(runner_status(&json!({"state": "dancing"})), None);
        assert_eq!(runner_status(&json!(7)), None);
    }

    #[test]
    fn the_serialized_status_reads_back_as_itself() {
        for status in [
            RunnerStatus::Idle,
            RunnerStatus::Loading {
                layers_loaded: 1,
                total: 30,
            },
            RunnerStatus::ShuttingDown,
            RunnerStatus::Failed {
                reason: "rank 2 never came".into(),
            },
        ] {
            let value = serde_json::to_value(&status).unwrap();
            assert_eq!(runner_status(&value), Some(status.clone()), "{value}");
            assert!(!status.is_serving());
        }
        assert!(RunnerStatus::Running.is_serving());
        assert_eq!(RunnerStatus::WarmingUp.name(), "warming_up");
    }
}
