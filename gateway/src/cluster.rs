//! exo's cluster API, as thin handlers over the [`Backend`]: node id, state (whole or a
//! subtree), and instances (place, create, preview, get, delete). The bodies and answers are
//! typed in [`crate::exo`].

use crate::backend::Backend;
use crate::error::{echo, ApiError, ErrorKind};
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
                format!("bad percent-encoding in path segment `{}`", echo(raw)),
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
                    echo(&walked.join("/"))
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
    fn query_param_decodes() {
        assert_eq!(
            query_param(Some("x=1&model_id=org%2Fm+1"), "model_id").unwrap(),
            Some("org/m 1".to_string())
        );
        assert_eq!(query_param(None, "model_id").unwrap(), None);
    }
}
