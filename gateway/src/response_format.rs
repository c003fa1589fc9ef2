//! Structured output as each API asks for it, read into one [`ResponseFormat`]: OpenAI
//! chat's `response_format`, Responses' `text.format`, Ollama's `format`. The node that
//! renders the prompt compiles it into the engine's output constraint (llguidance), which
//! refuses a schema keyword it cannot enforce with a 400 naming it; the answer is then
//! decoded under it, so it always parses (see `text::constraint`).
//!
//! A schema keeps its keys in the order the client wrote them (its properties come out in
//! that order).

use crate::error::{echo, ApiError};
use dialects::tools::json::Ordered;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Largest schema accepted, as JSON text (the engine's own bound).
pub const MAX_SCHEMA_BYTES: usize = 64 * 1024;

/// What the answer's text must be.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    /// Any JSON object (OpenAI's `json_object`, Ollama's `"json"`).
    JsonObject,
    /// JSON valid under a schema.
    JsonSchema {
        /// The schema as JSON text, keys in the client's order.
        schema: String,
        /// The request field it came from, for errors (`response_format`, `text.format`,
        /// `format`).
        field: String,
    },
}

impl ResponseFormat {
    /// The request field that asked for it.
    pub fn field(&self) -> &str {
        match self {
            ResponseFormat::JsonObject => "response_format",
            ResponseFormat::JsonSchema { field, .. } => field,
        }
    }
}

/// A schema given at `field` (the ordered copy when the body had one) as checked JSON text:
/// an object or a boolean, at most [`MAX_SCHEMA_BYTES`].
fn schema_text(
    value: Option<&Value>,
    ordered: Option<&Ordered>,
    field: &str,
) -> Result<ResponseFormat, ApiError> {
    let schema = match value {
        Some(v @ Value::Object(_)) => v,
        Some(Value::Bool(true)) => {
            return Ok(ResponseFormat::JsonSchema {
                schema: "{}".into(),
                field: field.into(),
            })
        }
        None | Some(Value::Null) => {
            return Err(ApiError::invalid_field(
                field,
                format!("`{field}` needs a JSON Schema object"),
            ))
        }
        Some(_) => {
            return Err(ApiError::invalid_field(
                field,
                format!("`{field}` must be a JSON Schema object"),
            ))
        }
    };
    let text = match ordered {
        Some(o @ Ordered::Object(_)) => o.to_text(),
        _ => schema.to_string(),
    };
    if text.len() > MAX_SCHEMA_BYTES {
        return Err(ApiError::invalid_field(
            field,
            format!(
                "the schema is {} bytes; at most {MAX_SCHEMA_BYTES} are accepted",
                text.len()
            ),
        ));
    }
    Ok(ResponseFormat::JsonSchema {
        schema: text,
        field: field.into(),
    })
}

/// The OpenAI-shaped format object at `field` (`{"type": "text" | "json_object" |
/// "json_schema", ...}`), with `json_schema` reading the schema wherever the API keeps it.
fn typed_format(
    format: Option<&Value>,
    field: &str,
    json_schema: impl FnOnce(&Value) -> Result<ResponseFormat, ApiError>,
) -> Result<Option<ResponseFormat>, ApiError> {
    let format = match format {
        None | Some(Value::Null) => return Ok(None),
        Some(f @ Value::Object(_)) => f,
        Some(_) => {
            return Err(ApiError::invalid_field(
                field,
                format!("`{field}` must be an object such as {{\"type\": \"json_object\"}}"),
            ))
        }
    };
    let type_field = format!("{field}.type");
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(ResponseFormat::JsonObject)),
        Some("json_schema") => json_schema(format).map(Some),
        other => Err(ApiError::invalid_field(
            &type_field,
            format!(
                "`{type_field}` `{}` is not one of \"text\", \"json_object\", \"json_schema\"",
                echo(other.unwrap_or("(missing)"))
            ),
        )),
    }
}

/// OpenAI chat's `response_format`: `{"type": "text"}`, `{"type": "json_object"}` or
/// `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`. `strict` is
/// accepted either way: the schema is always enforced.
pub fn parse_chat_response_format(
    value: Option<&Value>,
    ordered: Option<&Ordered>,
) -> Result<Option<ResponseFormat>, ApiError> {
    typed_format(value, "response_format", |format| {
        let inner = format.get("json_schema");
        if !matches!(inner, Some(Value::Object(_))) {
            return Err(ApiError::invalid_field(
                "response_format.json_schema",
                "`response_format.json_schema` must be an object with `name` and `schema`",
            ));
        }
        let ordered_schema = ordered
            .and_then(|o| o.get("json_schema"))
            .and_then(|o| o.get("schema"));
        // OpenAI allows a json_schema without `schema` (any JSON); so do we.
        static ANY: Value = Value::Bool(true);
        let schema = inner.and_then(|i| i.get("schema")).unwrap_or(&ANY);
        schema_text(
            Some(schema),
            ordered_schema,
            "response_format.json_schema.schema",
        )
    })
}

/// Responses' `text.format`: `{"type": "text"}`, `{"type": "json_object"}` or
/// `{"type": "json_schema", "name", "schema", "strict"}`.
pub fn parse_text_format(
    text: Option<&Value>,
    ordered_text: Option<&Ordered>,
) -> Result<Option<ResponseFormat>, ApiError> {
    typed_format(
        text.and_then(|t| t.get("format")),
        "text.format",
        |format| {
            let ordered = ordered_text
                .and_then(|t| t.get("format"))
                .and_then(|f| f.get("schema"));
            schema_text(format.get("schema"), ordered, "text.format.schema")
        },
    )
}

/// Ollama's `format`: `"json"` (any JSON object), a JSON Schema object, or `""` (none).
pub fn parse_ollama_format(
    value: Option<&Value>,
    ordered: Option<&Ordered>,
) -> Result<Option<ResponseFormat>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) if s == "json" => Ok(Some(ResponseFormat::JsonObject)),
        Some(Value::String(s)) => Err(ApiError::invalid_field(
            "format",
            format!(
                "`format` `{}` is not \"json\" or a JSON Schema object",
                echo(s)
            ),
        )),
        Some(v) => schema_text(Some(v), ordered, "format").map(Some),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chat(v: Value) -> Result<Option<ResponseFormat>, ApiError> {
        let text = v.to_string();
        let ordered = Ordered::parse(text.as_bytes());
        parse_chat_response_format(Some(&v), ordered.as_ref())
    }

    #[test]
    fn chat_formats_read_into_one_type() {
        assert_eq!(chat(json!({"type": "text"})).unwrap(), None);
        assert_eq!(
            chat(json!({"type": "json_object"})).unwrap(),
            Some(ResponseFormat::JsonObject)
        );
        // Keys in the order written, whatever `serde_json::Value` does with them.
        let text = r#"{"type": "json_schema", "json_schema": {"name": "p", "strict": true,
            "schema": {"type": "object", "properties": {"b": {}, "a": {}}}}}"#;
        let value: Value = serde_json::from_str(text).unwrap();
        let ordered = Ordered::parse(text.as_bytes());
        let got = parse_chat_response_format(Some(&value), ordered.as_ref()).unwrap();
        match got {
            Some(ResponseFormat::JsonSchema { schema, .. }) => {
                assert!(schema.find("\"b\"").unwrap() < schema.find("\"a\"").unwrap());
            }
            other => panic!("{other:?}"),
        }
        for bad in [
            json!("json"),
            json!({"type": "yaml"}),
            json!({"type": "json_schema"}),
            json!({"type": "json_schema", "json_schema": {"schema": 3}}),
        ] {
            let e = chat(bad.clone()).unwrap_err();
            assert!(
                e.param
                    .as_deref()
                    .unwrap_or("")
                    .starts_with("response_format"),
                "{bad}: {e:?}"
            );
        }
    }

    #[test]
    fn ollama_and_responses_formats() {
        assert_eq!(
            parse_ollama_format(Some(&json!("json")), None).unwrap(),
            Some(ResponseFormat::JsonObject)
        );
        assert_eq!(parse_ollama_format(Some(&json!("")), None).unwrap(), None);
        assert!(parse_ollama_format(Some(&json!("xml")), None).is_err());
        assert!(parse_ollama_format(Some(&json!(7)), None).is_err());
        let schema = parse_ollama_format(Some(&json!({"type": "object"})), None).unwrap();
        assert_eq!(schema.unwrap().field(), "format");
        let text = json!({"format": {"type": "json_schema", "name": "x",
            "schema": {"type": "integer"}}});
        let f = parse_text_format(Some(&text), None).unwrap().unwrap();
        assert_eq!(f.field(), "text.format.schema");
        assert!(
            parse_text_format(Some(&json!({"format": {"type": "json_schema"}})), None).is_err()
        );
        let huge = json!({"type": "object", "description": "x".repeat(MAX_SCHEMA_BYTES)});
        let e = parse_ollama_format(Some(&huge), None).unwrap_err();
        assert!(e.message.contains("at most 65536"), "{e:?}");
    }
}
