//! Tool calling at the APIs: each API's spelling of the tools a request offers, its
//! `tool_choice` and the calls of earlier assistant turns (carried in [`crate::ChatMessage`]),
//! read into the `dialects` crate's types ([`Tool`], [`ToolChoice`], [`ToolCall`]), and a
//! `tool_choice` forced on the prompt ([`forced_call`]). The calls parsed back out of the
//! answer (`dialects::tools::parse`) each API then writes in its own shape (`tool_calls`,
//! `tool_use` blocks, `function_call` items, Ollama's `message.tool_calls`).

pub mod forced_call;

/// The request's tool types, from the dialects that parse and force their calls.
pub use dialects::tools::{Tool, ToolCall, ToolChoice};

use crate::error::{echo, ApiError};
use dialects::tools::json::Ordered;
use serde_json::Value;

/// The JSON text of `value`, keys in the order the body wrote them when `ordered` (the same
/// value, parsed order-preserving) is at hand.
pub fn json_text(value: &Value, ordered: Option<&Ordered>) -> String {
    ordered.map_or_else(|| value.to_string(), Ordered::to_text)
}

/// A call's `arguments` as sent: a JSON string (OpenAI) or an object (Ollama, Anthropic's
/// `input`), as JSON text in order; a string that is not JSON stays as it is.
pub fn arguments_text(value: Option<&Value>, ordered: Option<&Ordered>) -> String {
    match value {
        None | Some(Value::Null) => "{}".into(),
        Some(Value::String(s)) => {
            Ordered::parse(s.as_bytes()).map_or_else(|| s.clone(), |o| o.to_text())
        }
        Some(v) => json_text(v, ordered),
    }
}

/// How an API spells its tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolShape {
    /// `{"type": "function", "function": {"name", "description", "parameters"}}` (chat
    /// completions, Ollama).
    Nested,
    /// `{"type": "function", "name", "description", "parameters"}` (Responses).
    Flat,
    /// `{"name", "description", "input_schema"}` (Anthropic).
    Anthropic,
}

/// Parses a request's `tools`; `ordered` is the same array parsed order-preserving.
pub fn parse_tools(
    value: Option<&Value>,
    ordered: Option<&Ordered>,
    shape: ToolShape,
) -> Result<Vec<Tool>, ApiError> {
    let list = match value {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(ApiError::invalid_field("tools", "`tools` must be an array")),
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, tool) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        let ordered = ordered.and_then(|o| o.at(i));
        let kind = tool.get("type").and_then(Value::as_str);
        let (body, ordered_body, schema_key) = match shape {
            ToolShape::Nested => {
                if kind.is_some_and(|k| k != "function") {
                    return Err(ApiError::invalid_field(
                        &format!("{at}.type"),
                        "only `function` tools are supported",
                    ));
                }
                (
                    tool.get("function"),
                    ordered.and_then(|o| o.get("function")),
                    "parameters",
                )
            }
            ToolShape::Flat => {
                if kind != Some("function") {
                    return Err(ApiError::invalid_field(
                        &at,
                        "only function tools (`{\"type\": \"function\", \"name\": ...}`) are \
                         supported; shoal has no hosted tools",
                    ));
                }
                (Some(tool), ordered, "parameters")
            }
            ToolShape::Anthropic => (Some(tool), ordered, "input_schema"),
        };
        let Some(Value::Object(f)) = body else {
            return Err(ApiError::invalid_field(
                &format!("{at}.function"),
                "each tool needs a `function` object with a `name`",
            ));
        };
        let name = match f.get("name") {
            Some(Value::String(n)) if !n.is_empty() => n.clone(),
            _ => {
                let param = if shape == ToolShape::Nested {
                    format!("{at}.function.name")
                } else {
                    format!("{at}.name")
                };
                return Err(ApiError::invalid_field(
                    &param,
                    "each tool needs a string `name`",
                ));
            }
        };
        let description = match f.get("description") {
            None | Some(Value::Null) => None,
            Some(Value::String(d)) => Some(d.clone()),
            Some(_) => {
                return Err(ApiError::invalid_field(
                    &format!("{at}.description"),
                    "`description` must be a string",
                ))
            }
        };
        let parameters = match f.get(schema_key) {
            None | Some(Value::Null) => None,
            Some(schema @ Value::Object(_)) => Some(json_text(
                schema,
                ordered_body.and_then(|o| o.get(schema_key)),
            )),
            Some(_) => {
                return Err(ApiError::invalid_field(
                    &format!("{at}.{schema_key}"),
                    format!("`{schema_key}` must be a JSON Schema object"),
                ))
            }
        };
        let strict = match f.get("strict") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                let param = if shape == ToolShape::Nested {
                    format!("{at}.function.strict")
                } else {
                    format!("{at}.strict")
                };
                return Err(ApiError::invalid_field(
                    &param,
                    "`strict` must be a boolean",
                ));
            }
        };
        out.push(Tool {
            name,
            description,
            parameters,
            strict,
        });
    }
    Ok(out)
}

/// OpenAI's `tool_choice` (chat completions with `Nested` names, Responses with `Flat`):
/// `"none" | "auto" | "required"` or a named function.
pub fn parse_openai_tool_choice(
    value: Option<&Value>,
    shape: ToolShape,
    tools: &[Tool],
) -> Result<ToolChoice, ApiError> {
    let bad = || {
        ApiError::invalid_field(
            "tool_choice",
            "`tool_choice` must be \"none\", \"auto\", \"required\" or a function \
             (`{\"type\": \"function\", ...}`)",
        )
    };
    let choice = match value {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            _ => return Err(bad()),
        },
        Some(Value::Object(c)) if c.get("type").and_then(Value::as_str) == Some("function") => {
            let name = match shape {
                ToolShape::Nested => c.get("function").and_then(|f| f.get("name")),
                _ => c.get("name"),
            };
            match name.and_then(Value::as_str) {
                Some(n) => ToolChoice::Function(n.to_string()),
                None => return Err(bad()),
            }
        }
        Some(_) => return Err(bad()),
    };
    check_choice(choice, tools, "\"required\" or a named function")
}

/// Anthropic's `tool_choice`: `{"type": "auto" | "any" | "tool" | "none", "name"?}`.
pub fn parse_anthropic_tool_choice(
    value: Option<&Value>,
    tools: &[Tool],
) -> Result<ToolChoice, ApiError> {
    let choice = match value {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::Object(c)) => match c.get("type").and_then(Value::as_str) {
            Some("auto") => ToolChoice::Auto,
            Some("any") => ToolChoice::Required,
            Some("none") => ToolChoice::None,
            Some("tool") => match c.get("name").and_then(Value::as_str) {
                Some(n) => ToolChoice::Function(n.to_string()),
                None => {
                    return Err(ApiError::invalid_field(
                        "tool_choice.name",
                        "`tool_choice` of type `tool` needs the tool's `name`",
                    ))
                }
            },
            _ => return Err(anthropic_choice_error()),
        },
        Some(_) => return Err(anthropic_choice_error()),
    };
    check_choice(choice, tools, "of type `any` or `tool`")
}

fn anthropic_choice_error() -> ApiError {
    ApiError::invalid_field(
        "tool_choice",
        "`tool_choice` must be an object with `type` auto, any, tool or none",
    )
}

/// A choice that forces a call (`spelled` as the API writes it) needs tools to call, as
/// OpenAI and Anthropic both answer 400 without them (silently answering with text would
/// break a client that relies on getting a call); a named function must be one of the tools.
fn check_choice(choice: ToolChoice, tools: &[Tool], spelled: &str) -> Result<ToolChoice, ApiError> {
    let forces = matches!(choice, ToolChoice::Required | ToolChoice::Function(_));
    if forces && tools.is_empty() {
        return Err(ApiError::invalid_field(
            "tool_choice",
            format!(
                "`tool_choice` {spelled} forces a tool call, but the request offers no `tools`; \
                 list the functions the model may call in `tools`, or leave `tool_choice` out"
            ),
        ));
    }
    if let ToolChoice::Function(name) = &choice {
        if !tools.iter().any(|t| &t.name == name) {
            return Err(ApiError::invalid_field(
                "tool_choice",
                format!(
                    "`tool_choice` names `{}`, which is not among `tools`; name one of \
                     the tools, or add it to `tools`",
                    echo(name)
                ),
            ));
        }
    }
    Ok(choice)
}

/// An assistant turn's `tool_calls` as OpenAI (`{"id", "type": "function", "function":
/// {"name", "arguments": "<JSON text>"}}`) and Ollama (`{"function": {"name", "arguments":
/// {...}}}`) send them back; `ordered` is the same list parsed order-preserving. A call
/// without an id gets `fallback_id(j)` (deterministic, so that the same conversation
/// renders the same prompt).
pub fn parse_tool_calls(
    value: Option<&Value>,
    ordered: Option<&Ordered>,
    at: &str,
    fallback_id: impl Fn(usize) -> String,
) -> Result<Vec<ToolCall>, ApiError> {
    let list = match value {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(_) => {
            return Err(ApiError::invalid_field(
                at,
                "`tool_calls` must be an array of calls",
            ))
        }
    };
    let mut out = Vec::with_capacity(list.len());
    for (j, call) in list.iter().enumerate() {
        let param = format!("{at}[{j}]");
        let function = call.get("function");
        let name = function.and_then(|f| f.get("name")).and_then(Value::as_str);
        let Some(name) = name else {
            return Err(ApiError::invalid_field(
                &format!("{param}.function.name"),
                "each tool call needs `function.name`",
            ));
        };
        let arguments = function.and_then(|f| f.get("arguments"));
        if arguments.is_some_and(|a| !(a.is_string() || a.is_object() || a.is_null())) {
            return Err(ApiError::invalid_field(
                &format!("{param}.function.arguments"),
                "`arguments` must be JSON text or an object",
            ));
        }
        let ordered_args = ordered
            .and_then(|o| o.at(j))
            .and_then(|c| c.get("function"))
            .and_then(|f| f.get("arguments"));
        let id = match call.get("id") {
            Some(Value::String(id)) if !id.is_empty() => id.clone(),
            _ => fallback_id(j),
        };
        out.push(ToolCall {
            id,
            name: name.to_string(),
            arguments: arguments_text(arguments, ordered_args),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strict_is_read_in_each_shape_and_a_non_boolean_is_refused() {
        let schema = json!({"type": "object"});
        let nested = json!([{"type": "function", "function": {"name": "a", "parameters": schema, "strict": true}}]);
        let flat = json!([{"type": "function", "name": "a", "parameters": schema, "strict": true}]);
        let anthropic = json!([{"name": "a", "input_schema": schema, "strict": true}]);
        for (tools, shape) in [
            (&nested, ToolShape::Nested),
            (&flat, ToolShape::Flat),
            (&anthropic, ToolShape::Anthropic),
        ] {
            let parsed = parse_tools(Some(tools), None, shape).unwrap();
            assert!(parsed[0].strict, "{tools}");
        }
        let plain = json!([{"type": "function", "function": {"name": "a"}}]);
        assert!(!parse_tools(Some(&plain), None, ToolShape::Nested).unwrap()[0].strict);
        let bad = json!([{"type": "function", "function": {"name": "a", "strict": "yes"}}]);
        let e = parse_tools(Some(&bad), None, ToolShape::Nested).unwrap_err();
        assert_eq!(
            e.param.as_deref(),
            Some("tools[0].function.strict"),
            "{}",
            e.message
        );
        assert!(e.message.contains("boolean"), "{}", e.message);
    }
}
