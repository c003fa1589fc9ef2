//! exo's cluster API, as thin handlers over the [`Backend`]: node id, state (whole or a
//! subtree), and instances (place, create, preview, get, delete).

use crate::backend::{Backend, InstanceMeta, PlaceInstanceRequest, Sharding};
use crate::error::{ApiError, ErrorKind};
use serde_json::Value;

/// `GET /state/{path}`: the subtree of `state` at a slash-separated path. Object keys match
/// segments (percent-decoded); arrays take decimal indices. An empty segment (`a//b`, a
/// trailing slash) is skipped.
pub fn state_subtree<'a>(state: &'a Value, path: &str) -> Result<&'a Value, ApiError> {
    let mut node = state;
    let mut walked = Vec::new();
    for raw in path.split('/').filter(|s| !s.is_empty()) {
        let segment = percent_decode(raw).ok_or_else(|| {
            ApiError::new(
                ErrorKind::InvalidRequest,
                format!("bad percent-encoding in path segment `{raw}`"),
            )
        })?;
        let next = match node {
            Value::Object(map) => map.get(&segment),
            Value::Array(items) => segment.parse::<usize>().ok().and_then(|i| items.get(i)),
            _ => None,
        };
        walked.push(segment);
        node = next.ok_or_else(|| {
            ApiError::new(
                ErrorKind::NotFound,
                format!(
                    "no `{}` in the state; GET /state shows what exists",
                    walked.join("/")
                ),
            )
            .with_code("state_path_not_found")
        })?;
    }
    Ok(node)
}

/// Decodes `%XX` escapes; `None` for a bad escape or a result that is not UTF-8.
pub fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3)?;
                let hex = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// The value of `name` in a query string (`a=1&b=2`), percent-decoded, `+` as space.
pub fn query_param(query: Option<&str>, name: &str) -> Result<Option<String>, ApiError> {
    for pair in query.unwrap_or("").split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key == name {
            let value = percent_decode(&value.replace('+', " ")).ok_or_else(|| {
                ApiError::invalid_field(name, format!("bad percent-encoding in `{name}`"))
            })?;
            return Ok(Some(value));
        }
    }
    Ok(None)
}

/// Parses `POST /place_instance`'s body: `{model_id, sharding?, instance_meta?, min_nodes?}`.
pub fn parse_place_instance(body: &[u8]) -> Result<PlaceInstanceRequest, ApiError> {
    let obj = json_object(body)?;
    let model_id = match obj.get("model_id") {
        None | Some(Value::Null) => return Err(ApiError::missing_field("model_id")),
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(_) => {
            return Err(ApiError::invalid_field(
                "model_id",
                "`model_id` must be a non-empty string",
            ))
        }
    };
    let sharding = match obj.get("sharding") {
        None | Some(Value::Null) => Sharding::Pipeline,
        Some(Value::String(s)) if s.eq_ignore_ascii_case("pipeline") => Sharding::Pipeline,
        Some(Value::String(s)) if s.eq_ignore_ascii_case("tensor") => Sharding::Tensor,
        Some(_) => {
            return Err(ApiError::invalid_field(
                "sharding",
                "`sharding` must be \"Pipeline\" or \"Tensor\"",
            ))
        }
    };
    let instance_meta = match obj.get("instance_meta") {
        None | Some(Value::Null) => InstanceMeta::MlxRing,
        Some(Value::String(s)) if s.eq_ignore_ascii_case("mlxring") => InstanceMeta::MlxRing,
        Some(Value::String(s)) if s.eq_ignore_ascii_case("mlxjaccl") => InstanceMeta::MlxJaccl,
        Some(_) => {
            return Err(ApiError::invalid_field(
                "instance_meta",
                "`instance_meta` must be \"MlxRing\" or \"MlxJaccl\"",
            ))
        }
    };
    let min_nodes = match obj.get("min_nodes") {
        None | Some(Value::Null) => 1,
        Some(Value::Number(n)) => match n.as_u64() {
            Some(v @ 1..=1024) => v as u32,
            _ => {
                return Err(ApiError::invalid_field(
                    "min_nodes",
                    "`min_nodes` must be an integer between 1 and 1024",
                ))
            }
        },
        Some(_) => {
            return Err(ApiError::invalid_field(
                "min_nodes",
                "`min_nodes` must be an integer between 1 and 1024",
            ))
        }
    };
    Ok(PlaceInstanceRequest {
        model_id,
        sharding,
        instance_meta,
        min_nodes,
    })
}

/// Parses `POST /instance`'s body: `{"instance": {...}}`, answering the instance object.
pub fn parse_create_instance(body: &[u8]) -> Result<Value, ApiError> {
    let mut obj = json_object(body)?;
    match obj.remove("instance") {
        None | Some(Value::Null) => Err(ApiError::missing_field("instance")),
        Some(v @ Value::Object(_)) => Ok(v),
        Some(_) => Err(ApiError::invalid_field(
            "instance",
            "`instance` must be an object (take one from GET /instance/previews)",
        )),
    }
}

fn json_object(body: &[u8]) -> Result<serde_json::Map<String, Value>, ApiError> {
    match serde_json::from_slice(body) {
        Ok(Value::Object(obj)) => Ok(obj),
        Ok(_) => Err(ApiError::new(
            ErrorKind::InvalidRequest,
            "the body must be a JSON object",
        )),
        Err(e) => Err(ApiError::new(
            ErrorKind::InvalidRequest,
            format!("the body is not valid JSON: {e}"),
        )
        .with_code("invalid_json")),
    }
}

/// `GET /instance/previews`: the backend's answer for the `model_id` in the query.
pub async fn previews(backend: &dyn Backend, query: Option<&str>) -> Result<Value, ApiError> {
    let model_id = query_param(query, "model_id")?
        .filter(|m| !m.is_empty())
        .ok_or_else(|| ApiError::missing_field("model_id"))?;
    backend.instance_previews(model_id).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn subtree_walks_objects_and_arrays() {
        let state = json!({"nodes": {"a b": {"ips": ["10.0.0.1", "10.0.0.2"]}}});
        assert_eq!(
            state_subtree(&state, "nodes/a%20b/ips/1").unwrap(),
            &json!("10.0.0.2")
        );
        assert_eq!(state_subtree(&state, "").unwrap(), &state);
        let err = state_subtree(&state, "nodes/zz").unwrap_err();
        assert_eq!(err.kind, ErrorKind::NotFound);
        assert!(err.message.contains("nodes/zz"));
        assert_eq!(
            state_subtree(&state, "nodes/%zz").unwrap_err().kind,
            ErrorKind::InvalidRequest
        );
    }

    #[test]
    fn place_instance_defaults_and_errors() {
        let p = parse_place_instance(br#"{"model_id": "m"}"#).unwrap();
        assert_eq!(p.sharding, Sharding::Pipeline);
        assert_eq!(p.instance_meta, InstanceMeta::MlxRing);
        assert_eq!(p.min_nodes, 1);
        let p = parse_place_instance(
            br#"{"model_id": "m", "sharding": "Tensor", "instance_meta": "MlxJaccl", "min_nodes": 2}"#,
        )
        .unwrap();
        assert_eq!(
            (p.sharding, p.instance_meta, p.min_nodes),
            (Sharding::Tensor, InstanceMeta::MlxJaccl, 2)
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
    fn query_param_decodes() {
        assert_eq!(
            query_param(Some("x=1&model_id=org%2Fm+1"), "model_id").unwrap(),
            Some("org/m 1".to_string())
        );
        assert_eq!(query_param(None, "model_id").unwrap(), None);
    }
}
