//! exo's cluster API shapes, typed: the bodies of `POST /place_instance` and `POST /instance`
//! (one parser for exo's fields), and the instance, rank and preview objects the node answers
//! with.
//!
//! exo spells the placement crate's enums its own way: `sharding` is `"Pipeline"` or
//! `"Tensor"`, `instance_meta` is `"MlxRing"` or `"MlxJaccl"` (its `InstanceMeta` enum).
//! The gateway reads them case-insensitively and ignoring `_` (`"mlx_ring"` is `MlxRing`), and
//! refuses anything else: the placement crate's own spellings (`"ring"`, `"jaccl"`) are not
//! exo's, and a client that sends them would fail against exo, so shoal refuses them too
//! (see `/work/shared/notes/exo-reference.md`, "HTTP API").
//!
//! The types are the placement crate's ([`Sharding`], [`CollectiveBackend`], [`Placement`],
//! [`RunnerStatus`]); only their spelling at this API lives here.

use crate::error::ApiError;
use crate::fields::{json_object, required_string};
use placement::{CollectiveBackend, ModelCard, PlaceError, Placement, RunnerStatus, Sharding};
use serde::{Serialize, Serializer};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// The most nodes an instance may ask for.
pub const MAX_NODES: u64 = 1024;

/// exo's name of a sharding.
pub fn sharding_name(s: Sharding) -> &'static str {
    match s {
        Sharding::Pipeline => "Pipeline",
        Sharding::Tensor => "Tensor",
    }
}

/// exo's name of a collective backend (its `instance_meta`).
pub fn instance_meta_name(b: CollectiveBackend) -> &'static str {
    match b {
        CollectiveBackend::Ring => "MlxRing",
        CollectiveBackend::Jaccl => "MlxJaccl",
    }
}

fn exo_sharding<S: Serializer>(s: &Sharding, ser: S) -> Result<S::Ok, S::Error> {
    ser.serialize_str(sharding_name(*s))
}

fn exo_meta<S: Serializer>(b: &CollectiveBackend, ser: S) -> Result<S::Ok, S::Error> {
    ser.serialize_str(instance_meta_name(*b))
}

fn tagged_status<S: Serializer>(status: &RunnerStatus, ser: S) -> Result<S::Ok, S::Error> {
    wire::runner_status::serialize(status, ser)
}

fn tagged_status_opt<S: Serializer>(
    status: &Option<RunnerStatus>,
    ser: S,
) -> Result<S::Ok, S::Error> {
    match status {
        Some(s) => wire::runner_status::serialize(s, ser),
        None => ser.serialize_none(),
    }
}

fn tagged_status_map<S: Serializer>(
    map: &BTreeMap<String, RunnerStatus>,
    ser: S,
) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct Tagged<'a>(#[serde(serialize_with = "tagged_status")] &'a RunnerStatus);
    ser.collect_map(map.iter().map(|(k, v)| (k, Tagged(v))))
}

/// `sharding`: absent or null is `Pipeline`.
pub fn parse_sharding(v: Option<&Value>) -> Result<Sharding, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(Sharding::Pipeline),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("pipeline") => Ok(Sharding::Pipeline),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("tensor") => Ok(Sharding::Tensor),
        Some(_) => Err(ApiError::invalid_field(
            "sharding",
            "`sharding` must be \"Pipeline\" or \"Tensor\"",
        )),
    }
}

/// `instance_meta`: absent or null is `MlxRing`; exo's names only (see the module docs).
pub fn parse_instance_meta(v: Option<&Value>) -> Result<CollectiveBackend, ApiError> {
    let name = match v {
        None | Some(Value::Null) => return Ok(CollectiveBackend::Ring),
        Some(Value::String(s)) => s.to_ascii_lowercase().replace('_', ""),
        Some(_) => String::new(),
    };
    match name.as_str() {
        "mlxring" => Ok(CollectiveBackend::Ring),
        "mlxjaccl" => Ok(CollectiveBackend::Jaccl),
        _ => Err(ApiError::invalid_field(
            "instance_meta",
            "`instance_meta` must be \"MlxRing\" or \"MlxJaccl\"",
        )),
    }
}

/// A node count (`min_nodes`, `node_count`): absent or null is 1.
fn parse_count(name: &str, v: Option<&Value>) -> Result<u32, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(1),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(c @ 1..=MAX_NODES) => Ok(c as u32),
            _ => Err(count_error(name)),
        },
        Some(_) => Err(count_error(name)),
    }
}

fn count_error(name: &str) -> ApiError {
    ApiError::invalid_field(
        name,
        format!("`{name}` must be an integer between 1 and {MAX_NODES}"),
    )
}

/// A list of node ids; `None` when absent or null.
fn parse_node_list(name: &str, v: Option<&Value>) -> Result<Option<Vec<String>>, ApiError> {
    let bad = || ApiError::invalid_field(name, format!("`{name}` must be a list of node ids"));
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => items
            .iter()
            .map(|n| n.as_str().map(str::to_string).ok_or_else(bad))
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(_) => Err(bad()),
    }
}

/// `POST /place_instance`'s body, validated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlaceInstanceRequest {
    /// The model to place (a name `GET /v1/models` lists, or a Hugging Face id).
    pub model_id: String,
    /// Default: `Pipeline`.
    #[serde(serialize_with = "exo_sharding")]
    pub sharding: Sharding,
    /// Default: `MlxRing`.
    #[serde(serialize_with = "exo_meta")]
    pub instance_meta: CollectiveBackend,
    /// At least this many nodes (default 1).
    pub min_nodes: u32,
}

/// `POST /instance`'s instance object (typically one taken from `GET /instance/previews`),
/// validated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CreateInstanceRequest {
    /// The id the object carries, if any (shoal's node makes its own ids).
    pub instance_id: Option<String>,
    /// `model_id`, else `model`.
    pub model_id: String,
    /// Default: `Pipeline`.
    #[serde(serialize_with = "exo_sharding")]
    pub sharding: Sharding,
    /// Default: `MlxRing`.
    #[serde(serialize_with = "exo_meta")]
    pub instance_meta: CollectiveBackend,
    /// `min_nodes`, else `node_count` (a preview's), else 1.
    pub min_nodes: u32,
    /// `required_nodes`, else the nodes of the object's `placement.ranks` (a preview's), else
    /// none.
    pub required_nodes: Vec<String>,
}

/// Parses `POST /place_instance`'s body: `{model_id, sharding?, instance_meta?, min_nodes?}`.
pub fn parse_place_instance(body: &[u8]) -> Result<PlaceInstanceRequest, ApiError> {
    let obj = json_object(body)?;
    let model_id = required_string(obj.get("model_id"), "model_id")?;
    Ok(PlaceInstanceRequest {
        model_id,
        sharding: parse_sharding(obj.get("sharding"))?,
        instance_meta: parse_instance_meta(obj.get("instance_meta"))?,
        min_nodes: parse_count("min_nodes", obj.get("min_nodes"))?,
    })
}

/// Parses `POST /instance`'s body: `{"instance": {...}}`.
pub fn parse_create_instance(body: &[u8]) -> Result<CreateInstanceRequest, ApiError> {
    let mut obj = json_object(body)?;
    let instance = match obj.remove("instance") {
        None | Some(Value::Null) => return Err(ApiError::missing_field("instance")),
        Some(Value::Object(o)) => o,
        Some(_) => {
            return Err(ApiError::invalid_field(
                "instance",
                "`instance` must be an object (take one from GET /instance/previews)",
            ))
        }
    };
    instance_object(&instance)
}

/// Reads an instance object's fields (see [`CreateInstanceRequest`]).
fn instance_object(v: &Map<String, Value>) -> Result<CreateInstanceRequest, ApiError> {
    let text = |name: &str| v.get(name).and_then(Value::as_str).map(str::to_string);
    let model_id = text("model_id")
        .or_else(|| text("model"))
        .ok_or_else(|| ApiError::missing_field("model_id"))?;
    let sharding = parse_sharding(v.get("sharding"))?;
    let instance_meta = parse_instance_meta(v.get("instance_meta"))?;
    let min_nodes = match v.get("min_nodes").filter(|n| !n.is_null()) {
        Some(n) => parse_count("min_nodes", Some(n))?,
        None => parse_count("node_count", v.get("node_count"))?,
    };
    let required_nodes = match parse_node_list("required_nodes", v.get("required_nodes"))? {
        Some(list) => list,
        None => v
            .get("placement")
            .and_then(|p| p.get("ranks"))
            .and_then(Value::as_array)
            .map(|ranks| {
                ranks
                    .iter()
                    .filter_map(|r| r.get("node").and_then(Value::as_str).map(str::to_string))
                    .collect()
            })
            .unwrap_or_default(),
    };
    Ok(CreateInstanceRequest {
        instance_id: text("instance_id"),
        model_id,
        sharding,
        instance_meta,
        min_nodes,
        required_nodes,
    })
}

/// Why there is no placement: the placement crate's stable code and its message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlacementError {
    /// E.g. `no_ring_with_enough_memory`.
    pub code: String,
    /// For a person.
    pub message: String,
}

impl From<&PlaceError> for PlacementError {
    fn from(e: &PlaceError) -> PlacementError {
        PlacementError {
            code: e.code().to_string(),
            message: e.message(),
        }
    }
}

/// A placement as the API shows it: the placement or why there is none (the other `null`).
pub fn placement_or_error(
    placement: Result<&Placement, &PlaceError>,
) -> (Option<Placement>, Option<PlacementError>) {
    match placement {
        Ok(p) => (Some(p.clone()), None),
        Err(e) => (None, Some(e.into())),
    }
}

/// Where an instance stands, as `status` says (placement's type: `control` decides it).
pub use placement::InstanceStatus;

/// One rank of an instance, as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rank {
    /// Its index.
    pub rank: usize,
    /// The node that runs it.
    pub node: String,
    /// First layer.
    pub start_layer: u32,
    /// One past the last layer.
    pub end_layer: u32,
    /// Its runner's status, once its node reported one.
    #[serde(serialize_with = "tagged_status_opt")]
    pub runner: Option<RunnerStatus>,
    /// Requests queued on its runner, once reported.
    pub queued_requests: Option<usize>,
    /// The download of its files on its node (that node's `download/<model>/<part>` record:
    /// bytes done and total, rate, ETA, file, source, state), once one started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub download: Option<Value>,
}

/// An instance as `GET /instance/{id}` (and `GET /state`'s `instances`) show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Instance {
    /// Its id.
    pub instance_id: String,
    /// The model's id.
    pub model_id: String,
    /// The model as the intent names it.
    pub model: String,
    /// Where this node finds the model.
    pub model_path: String,
    /// How it is split.
    #[serde(serialize_with = "exo_sharding")]
    pub sharding: Sharding,
    /// How its nodes talk.
    #[serde(serialize_with = "exo_meta")]
    pub instance_meta: CollectiveBackend,
    /// At least this many nodes.
    pub min_nodes: u32,
    /// The node that created it.
    pub created_by: String,
    /// Bumped each time it is placed anew (a rank's node died).
    pub epoch: u32,
    /// Nodes left out of its placement (they died).
    pub excluded: Vec<String>,
    /// Where it stands.
    pub status: InstanceStatus,
    /// Why it failed, if it did.
    pub failure: Option<String>,
    /// Its placement, if it has one.
    pub placement: Option<Placement>,
    /// Why it has none.
    pub error: Option<PlacementError>,
    /// Its ranks (empty without a placement).
    pub ranks: Vec<Rank>,
    /// Each node's runner status, by node.
    #[serde(serialize_with = "tagged_status_map")]
    pub runners: BTreeMap<String, RunnerStatus>,
    /// This node's runner process for it, if any.
    pub runner_pid: Option<u32>,
    /// Requests queued on rank 0.
    pub queued_requests: Option<usize>,
}

/// A node's memory, as the previews list it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeMemory {
    /// The node.
    pub node: String,
    /// Free memory, in bytes.
    pub ram_available: u64,
    /// Total memory, in bytes.
    pub ram_total: u64,
}

/// One combination of `GET /instance/previews`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Preview {
    /// The model's id.
    pub model_id: String,
    /// How it would be split.
    #[serde(serialize_with = "exo_sharding")]
    pub sharding: Sharding,
    /// How its nodes would talk.
    #[serde(serialize_with = "exo_meta")]
    pub instance_meta: CollectiveBackend,
    /// At least this many nodes.
    pub node_count: usize,
    /// The placement, if possible.
    pub placement: Option<Placement>,
    /// Why not.
    pub error: Option<PlacementError>,
}

/// `GET /instance/previews?model_id=`'s answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InstancePreviews {
    /// The model's id.
    pub model_id: String,
    /// The model as placement sees it.
    pub model: ModelCard,
    /// Its family, parameters and experts (as `GET /v1/models` shows them once the model has
    /// an instance): the dashboard names them beside the previews.
    pub shape: crate::backend::ModelShape,
    /// The live nodes' memory.
    pub nodes: Vec<NodeMemory>,
    /// Every sharding × backend × node count.
    pub previews: Vec<Preview>,
}

/// An answer as the JSON value the [`crate::Backend`] returns.
pub fn to_value(answer: &impl Serialize) -> Result<Value, ApiError> {
    serde_json::to_value(answer).map_err(|e| ApiError::internal(format!("encoding: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn create(instance: Value) -> Result<CreateInstanceRequest, ApiError> {
        parse_create_instance(json!({ "instance": instance }).to_string().as_bytes())
    }

    #[test]
    fn place_instance_defaults_and_errors() {
        let p = parse_place_instance(br#"{"model_id": "m"}"#).unwrap();
        assert_eq!(p.sharding, Sharding::Pipeline);
        assert_eq!(p.instance_meta, CollectiveBackend::Ring);
        assert_eq!(p.min_nodes, 1);
        let p = parse_place_instance(
            br#"{"model_id": "m", "sharding": "Tensor", "instance_meta": "MlxJaccl", "min_nodes": 2}"#,
        )
        .unwrap();
        assert_eq!(
            (p.sharding, p.instance_meta, p.min_nodes),
            (Sharding::Tensor, CollectiveBackend::Jaccl, 2)
        );
        for (body, param) in [
            (&br#"{}"#[..], "model_id"),
            (br#"{"model_id": "m", "sharding": "x"}"#, "sharding"),
            (br#"{"model_id": "m", "min_nodes": 0}"#, "min_nodes"),
        ] {
            assert_eq!(
                parse_place_instance(body).unwrap_err().param.as_deref(),
                Some(param)
            );
        }
    }

    #[test]
    fn instance_meta_takes_exos_names_only() {
        for (name, want) in [
            ("MlxRing", CollectiveBackend::Ring),
            ("mlxring", CollectiveBackend::Ring),
            ("mlx_ring", CollectiveBackend::Ring),
            ("MlxJaccl", CollectiveBackend::Jaccl),
            ("MLX_JACCL", CollectiveBackend::Jaccl),
        ] {
            assert_eq!(parse_instance_meta(Some(&json!(name))).unwrap(), want);
        }
        for bad in [json!("ring"), json!("jaccl"), json!("x"), json!(1)] {
            let e = parse_instance_meta(Some(&bad)).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("instance_meta"), "{bad}");
        }
        assert_eq!(parse_instance_meta(None).unwrap(), CollectiveBackend::Ring);
        // The same parser serves both endpoints.
        let e = parse_place_instance(br#"{"model_id": "m", "instance_meta": "ring"}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("instance_meta"));
        let e = create(json!({"model_id": "m", "instance_meta": "ring"})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("instance_meta"));
    }

    #[test]
    fn instance_objects_name_their_nodes_by_list_or_by_preview() {
        let v = create(json!({"model_id": "default", "required_nodes": ["a"]})).unwrap();
        assert_eq!(v.required_nodes, vec!["a".to_string()]);
        let v = create(
            json!({"model_id": "default", "placement": {"ranks": [{"node": "b"}, {"node": "c"}]}}),
        )
        .unwrap();
        assert_eq!(v.required_nodes, vec!["b".to_string(), "c".to_string()]);
        let e = create(json!({"model_id": "default", "required_nodes": "a"})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("required_nodes"));
        let v = create(json!({"model_id": "default", "sharding": "Tensor"})).unwrap();
        assert_eq!(v.sharding, Sharding::Tensor);
        let v = create(json!({"model_id": "default", "instance_meta": "mlx_ring"})).unwrap();
        assert_eq!(v.instance_meta, CollectiveBackend::Ring);
        assert!(create(json!({"model_id": "default", "instance_meta": "x"})).is_err());
    }

    #[test]
    fn instance_objects_read_a_preview() {
        let v = create(json!({
            "instance_id": "preview-1", "model": "org/m", "sharding": "Pipeline",
            "instance_meta": "MlxRing", "node_count": 2,
        }))
        .unwrap();
        assert_eq!(
            v,
            CreateInstanceRequest {
                instance_id: Some("preview-1".into()),
                model_id: "org/m".into(),
                sharding: Sharding::Pipeline,
                instance_meta: CollectiveBackend::Ring,
                min_nodes: 2,
                required_nodes: vec![],
            }
        );
        assert_eq!(
            create(json!({"sharding": "Tensor"}))
                .unwrap_err()
                .param
                .as_deref(),
            Some("model_id")
        );
        assert_eq!(
            create(json!({"model_id": "m", "node_count": 0}))
                .unwrap_err()
                .param
                .as_deref(),
            Some("node_count")
        );
    }

    #[test]
    fn answers_spell_exos_names_and_tagged_runner_states() {
        let rank = Rank {
            rank: 0,
            node: "a".into(),
            start_layer: 0,
            end_layer: 30,
            runner: Some(RunnerStatus::Loading {
                layers_loaded: 3,
                total: 30,
            }),
            queued_requests: Some(0),
            download: None,
        };
        assert_eq!(
            to_value(&rank).unwrap(),
            json!({"rank": 0, "node": "a", "start_layer": 0, "end_layer": 30,
                   "runner": {"state": "loading", "done": 3, "total": 30}, "queued_requests": 0})
        );
        let request = PlaceInstanceRequest {
            model_id: "m".into(),
            sharding: Sharding::Tensor,
            instance_meta: CollectiveBackend::Jaccl,
            min_nodes: 2,
        };
        assert_eq!(
            to_value(&request).unwrap(),
            json!({"model_id": "m", "sharding": "Tensor", "instance_meta": "MlxJaccl", "min_nodes": 2})
        );
        assert_eq!(
            to_value(&InstanceStatus::Unplaceable).unwrap(),
            json!("unplaceable")
        );
    }
}
