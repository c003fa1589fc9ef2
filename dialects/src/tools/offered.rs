//! The tools a request offers, as every dialect's parser checks a call against them: a call
//! counts only if it names one of them and its arguments fit the tool's JSON Schema
//! ([`crate::tools::schema`]). Dialects that write arguments as JSON go through
//! [`Offered::json_call`]; the XML-like dialects (GLM, Qwen3-Coder, MiniMax) write each
//! argument as bare text, and [`Offered::text_call`] types it by the tool's schema (a
//! `number` parameter written `42` becomes the number 42), as the templates wrote it
//! (`tojson` for anything that is not a string).

use crate::tools::json::Ordered;
use crate::tools::{call_id, schema, Tool, ToolCall};
use serde_json::Value;

/// The offered tools, their schemas parsed.
#[derive(Debug, Clone, Default)]
pub struct Offered {
    tools: Vec<(String, Option<Value>)>,
}

impl Offered {
    /// The checker for `tools`.
    pub fn new(tools: &[Tool]) -> Offered {
        Offered {
            tools: tools
                .iter()
                .map(|t| {
                    let schema = t
                        .parameters
                        .as_deref()
                        .and_then(|p| serde_json::from_str(p).ok());
                    (t.name.clone(), schema)
                })
                .collect(),
        }
    }

    pub(crate) fn schema(&self, name: &str) -> Option<Option<&Value>> {
        self.tools
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, s)| s.as_ref())
    }

    /// Whether `name` is one of the tools.
    pub fn has(&self, name: &str) -> bool {
        self.schema(name).is_some()
    }

    /// An argument of a call of `name` written as text, typed by its parameter's schema
    /// ([`typed`]).
    pub fn typed_argument(&self, name: &str, key: &str, value: &str) -> Ordered {
        let property = self
            .schema(name)
            .flatten()
            .and_then(|s| s.get("properties"))
            .and_then(|p| p.get(key));
        typed(value, property)
    }

    /// A call of `name` with JSON `arguments` (absent or null: none; a JSON string holding
    /// the object is read as the object), if `name` is offered and the arguments are an
    /// object that fits its schema. `id`: the model's own id, else a fresh one.
    pub fn json_call(
        &self,
        name: &str,
        arguments: Option<&Ordered>,
        id: Option<&str>,
    ) -> Option<ToolCall> {
        let arguments = match arguments {
            None | Some(Ordered::Null) => Ordered::Object(Vec::new()),
            // Some models write the arguments as a JSON string.
            Some(Ordered::String(s)) => Ordered::parse(s.as_bytes())?,
            Some(other) => other.clone(),
        };
        self.finish(name, arguments, id)
    }

    /// A call of `name` whose arguments were written as text, key by key: each value typed
    /// by the parameter's schema ([`typed`]), then checked as [`Offered::json_call`] does.
    pub fn text_call(
        &self,
        name: &str,
        arguments: &[(String, String)],
        id: Option<&str>,
    ) -> Option<ToolCall> {
        let schema = self.schema(name)?;
        let properties = schema.and_then(|s| s.get("properties"));
        let object = arguments
            .iter()
            .map(|(k, v)| (k.clone(), typed(v, properties.and_then(|p| p.get(k)))))
            .collect();
        self.finish(name, Ordered::Object(object), id)
    }

    fn finish(&self, name: &str, arguments: Ordered, id: Option<&str>) -> Option<ToolCall> {
        let schema = self.schema(name)?;
        if !matches!(arguments, Ordered::Object(_)) {
            return None;
        }
        let text = arguments.to_text();
        if let Some(schema) = schema {
            let value: Value = serde_json::from_str(&text).ok()?;
            if !schema::fits(&value, schema) {
                return None;
            }
        }
        Some(ToolCall {
            id: id
                .filter(|id| !id.is_empty())
                .map_or_else(call_id, str::to_string),
            name: name.to_string(),
            arguments: text,
        })
    }
}

/// An argument written as text, typed by its parameter's schema: a `string` stays as
/// written; `integer`, `number`, `boolean`, `null`, `object` and `array` are read as that
/// JSON type when the text is one (else it stays a string, and the schema check refuses the
/// call). Without a type, text that is JSON other than a string is read as JSON, since the
/// templates write everything but strings with `tojson`.
pub fn typed(text: &str, schema: Option<&Value>) -> Ordered {
    let kinds: Vec<&str> = match schema.and_then(|s| s.get("type")) {
        Some(Value::String(k)) => vec![k.as_str()],
        Some(Value::Array(ks)) => ks.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    let json = || Ordered::parse(text.trim().as_bytes());
    if kinds.is_empty() {
        return match json() {
            Some(v) if !matches!(v, Ordered::String(_)) => v,
            _ => Ordered::String(text.to_string()),
        };
    }
    // Other types first: `["integer", "string"]` reads `42` as a number.
    for kind in kinds.iter().filter(|k| **k != "string") {
        let fits = match (kind, json()) {
            (&"integer", Some(Ordered::Number(n))) if n.is_i64() || n.is_u64() => Some(n),
            (&"number", Some(Ordered::Number(n))) => Some(n),
            _ => None,
        };
        if let Some(n) = fits {
            return Ordered::Number(n);
        }
        let lower = text.trim().to_ascii_lowercase();
        match *kind {
            "boolean" if lower == "true" || lower == "false" => {
                return Ordered::Bool(lower == "true")
            }
            "null" if lower == "null" || lower == "none" => return Ordered::Null,
            "object" | "array" => match json() {
                Some(v @ Ordered::Object(_)) if *kind == "object" => return v,
                Some(v @ Ordered::Array(_)) if *kind == "array" => return v,
                _ => {}
            },
            _ => {}
        }
    }
    Ordered::String(text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tools() -> Vec<Tool> {
        vec![Tool {
            name: "f".into(),
            description: None,
            parameters: Some(
                json!({"type": "object", "properties": {
                    "s": {"type": "string"}, "i": {"type": "integer"}, "n": {"type": "number"},
                    "b": {"type": "boolean"}, "o": {"type": "object"}, "a": {"type": "array"},
                    "opt": {"type": ["integer", "null"]}},
                    "required": ["s"]})
                .to_string(),
            ),
            strict: false,
        }]
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn text_arguments_take_their_schema_types() {
        let offered = Offered::new(&tools());
        let call = offered
            .text_call(
                "f",
                &pairs(&[
                    ("s", "42"),
                    ("i", " 7 "),
                    ("n", "2.5"),
                    ("b", "True"),
                    ("o", "{\"k\": [1]}"),
                    ("a", "[1, \"x\"]"),
                    ("opt", "null"),
                    ("extra", "3"),
                ]),
                Some("id1"),
            )
            .unwrap();
        assert_eq!(
            call.arguments,
            r#"{"s":"42","i":7,"n":2.5,"b":true,"o":{"k":[1]},"a":[1,"x"],"opt":null,"extra":3}"#
        );
        assert_eq!(call.id, "id1");
    }

    #[test]
    fn calls_that_do_not_fit_are_refused() {
        let offered = Offered::new(&tools());
        // Not an integer: stays a string, which the schema refuses.
        assert!(offered
            .text_call("f", &pairs(&[("s", "x"), ("i", "seven")]), None)
            .is_none());
        // A required argument missing; an unknown tool.
        assert!(offered
            .text_call("f", &pairs(&[("i", "1")]), None)
            .is_none());
        assert!(offered
            .text_call("g", &pairs(&[("s", "x")]), None)
            .is_none());
        assert!(offered
            .json_call("f", Some(&Ordered::Array(Vec::new())), None)
            .is_none());
        let args = Ordered::String("{\"s\": \"x\"}".into());
        let call = offered.json_call("f", Some(&args), None).unwrap();
        assert_eq!(call.arguments, r#"{"s":"x"}"#);
        assert_eq!(call.id.len(), 9);
    }
}
