//! [`RunnerStatus`] as the runner protocol and the HTTP API spell it: an object tagged by
//! `state`, `{"state": "ready"}`, `{"state": "loading", "done": 3, "total": 30}`,
//! `{"state": "failed", "reason": "..."}`.
//!
//! The replicated state stores the same type in its own (externally tagged) form, which
//! binary formats can carry too; this module is the second *spelling*, not a second type.
//! Use it as `#[serde(with = "wire::runner_status")]`, or [`to_json`] for a JSON value.

use placement::RunnerStatus;
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serializer};

/// Serializes `status` tagged by `state` (`done`/`total` for loading, `reason` for failed).
pub fn serialize<S: Serializer>(status: &RunnerStatus, s: S) -> Result<S::Ok, S::Error> {
    let mut map = s.serialize_map(None)?;
    map.serialize_entry("state", status.name())?;
    match status {
        RunnerStatus::Loading {
            layers_loaded,
            total,
        } => {
            map.serialize_entry("done", layers_loaded)?;
            map.serialize_entry("total", total)?;
        }
        RunnerStatus::Failed { reason } => map.serialize_entry("reason", reason)?,
        _ => {}
    }
    map.end()
}

/// The fields any spelling may carry; which are required depends on `state`.
#[derive(Deserialize)]
struct Fields {
    state: String,
    done: Option<u32>,
    total: Option<u32>,
    reason: Option<String>,
}

/// Reads the tagged form; an unknown `state` or a missing field of its variant is an error.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<RunnerStatus, D::Error> {
    use serde::de::Error;
    let f = Fields::deserialize(d)?;
    let missing = |field: &'static str| D::Error::missing_field(field);
    Ok(match f.state.as_str() {
        "idle" => RunnerStatus::Idle,
        "connecting" => RunnerStatus::Connecting,
        "connected" => RunnerStatus::Connected,
        "loading" => RunnerStatus::Loading {
            layers_loaded: f.done.ok_or_else(|| missing("done"))?,
            total: f.total.ok_or_else(|| missing("total"))?,
        },
        "loaded" => RunnerStatus::Loaded,
        "warming_up" => RunnerStatus::WarmingUp,
        "ready" => RunnerStatus::Ready,
        "running" => RunnerStatus::Running,
        "shutting_down" => RunnerStatus::ShuttingDown,
        "shutdown" => RunnerStatus::Shutdown,
        "failed" => RunnerStatus::Failed {
            reason: f.reason.ok_or_else(|| missing("reason"))?,
        },
        other => {
            return Err(D::Error::unknown_variant(
                other,
                &[
                    "idle",
                    "connecting",
                    "connected",
                    "loading",
                    "loaded",
                    "warming_up",
                    "ready",
                    "running",
                    "shutting_down",
                    "shutdown",
                    "failed",
                ],
            ))
        }
    })
}

/// `status` as a JSON value in the tagged form (what `GET /instance/{id}` shows per rank).
pub fn to_json(status: &RunnerStatus) -> serde_json::Value {
    serialize(status, serde_json::value::Serializer).unwrap_or(serde_json::Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Holder(#[serde(with = "super")] RunnerStatus);

    #[test]
    fn every_status_has_its_tagged_spelling_and_reads_back() {
        let cases = [
            (RunnerStatus::Idle, json!({"state": "idle"})),
            (RunnerStatus::Connecting, json!({"state": "connecting"})),
            (RunnerStatus::Connected, json!({"state": "connected"})),
            (
                RunnerStatus::Loading {
                    layers_loaded: 3,
                    total: 30,
                },
                json!({"state": "loading", "done": 3, "total": 30}),
            ),
            (RunnerStatus::Loaded, json!({"state": "loaded"})),
            (RunnerStatus::WarmingUp, json!({"state": "warming_up"})),
            (RunnerStatus::Ready, json!({"state": "ready"})),
            (RunnerStatus::Running, json!({"state": "running"})),
            (
                RunnerStatus::ShuttingDown,
                json!({"state": "shutting_down"}),
            ),
            (RunnerStatus::Shutdown, json!({"state": "shutdown"})),
            (
                RunnerStatus::Failed { reason: "x".into() },
                json!({"state": "failed", "reason": "x"}),
            ),
        ];
        for (status, spelled) in cases {
            assert_eq!(to_json(&status), spelled);
            let text = serde_json::to_string(&Holder(status.clone())).unwrap();
            assert_eq!(serde_json::from_str::<Holder>(&text).unwrap().0, status);
        }
        assert_eq!(
            serde_json::to_string(&Holder(RunnerStatus::Loading {
                layers_loaded: 1,
                total: 2
            }))
            .unwrap(),
            r#"{"state":"loading","done":1,"total":2}"#
        );
    }

    #[test]
    fn unknown_or_incomplete_states_are_refused() {
        for bad in [
            json!({"state": "exploded"}),
            json!({"state": "loading", "done": 1}),
            json!({"state": "failed"}),
            json!({"done": 1}),
            json!("ready"),
        ] {
            assert!(
                serde_json::from_value::<Holder>(bad.clone()).is_err(),
                "{bad}"
            );
        }
    }
}
