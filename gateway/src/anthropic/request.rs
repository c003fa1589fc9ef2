//! Parsing Anthropic Messages bodies (`POST /v1/messages`, `/v1/messages/count_tokens`) into
//! the gateway's [`ChatRequest`]: `system` (a string or text blocks) becomes the first
//! message, content blocks are flattened to text (tool use and results as the chat
//! template's `assistant`/`tool` turns), `stop_sequences` are the gateway's stop strings.
//! Each mistake is a 400 naming its field.

use crate::backend::{ChatMessage, ChatRequest, RequestedSampling, ToolCall};
use crate::error::{echo, ApiError};
use crate::fields::{
    json_object, non_empty_array, opt_bool, opt_f32_in, opt_max_tokens, opt_u32, parse_stop,
    required_string,
};
use crate::images::{check_request_images, image_from_base64, image_from_url, ChatImage};
use crate::tools::{arguments_text, parse_anthropic_tool_choice, parse_tools, ToolShape};
use dialects::tools::json::Ordered;
use serde_json::Value;

/// A parsed Messages request plus how to answer it.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedMessages {
    pub request: ChatRequest,
    pub stream: bool,
}

/// Parses `POST /v1/messages`; `max_tokens` is required there, not for `count_tokens`
/// (`counting`). Never panics, whatever the bytes.
pub fn parse_messages_request(body: &[u8], counting: bool) -> Result<ParsedMessages, ApiError> {
    let obj = json_object(body)?;
    // The same body with its keys in order, for the JSON that reaches the prompt.
    let ordered = Ordered::parse(body);
    let ordered_at = |key: &str| ordered.as_ref().and_then(|o| o.get(key));
    let model = required_string(obj.get("model"), "model")?;
    let max_tokens = match opt_max_tokens(&obj, "max_tokens")? {
        None if counting => None,
        None => return Err(ApiError::missing_field("max_tokens")),
        n => n,
    };
    let mut messages = parse_system(obj.get("system"))?;
    messages.extend(parse_turns(obj.get("messages"), ordered_at("messages"))?);
    check_request_images(&messages)?;
    let tools = parse_tools(obj.get("tools"), ordered_at("tools"), ToolShape::Anthropic)?;
    let tool_choice = parse_anthropic_tool_choice(obj.get("tool_choice"), &tools)?;
    let enable_thinking = parse_thinking(obj.get("thinking"))?;
    let user = match obj.get("metadata") {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) => match m.get("user_id") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => {
                return Err(ApiError::invalid_field(
                    "metadata.user_id",
                    "`metadata.user_id` must be a string",
                ))
            }
        },
        Some(_) => {
            return Err(ApiError::invalid_field(
                "metadata",
                "`metadata` must be an object",
            ))
        }
    };
    let sampling = RequestedSampling {
        max_tokens,
        // Anthropic's range is 0..1; the engine's is wider, so 1 stays 1.
        temperature: opt_f32_in(&obj, "temperature", 0.0, 1.0)?,
        top_p: opt_f32_in(&obj, "top_p", 0.0, 1.0)?,
        top_k: opt_u32(&obj, "top_k")?,
        stop: parse_stop(obj.get("stop_sequences"), "stop_sequences")?,
        ..RequestedSampling::default()
    };
    let stream = opt_bool(&obj, "stream")?.unwrap_or(false);
    Ok(ParsedMessages {
        request: ChatRequest {
            model,
            messages,
            sampling,
            user,
            tools,
            tool_choice,
            enable_thinking,
            reasoning_effort: None,
            response_format: None,
        },
        stream,
    })
}

/// `system`: a string, or an array of text blocks.
fn parse_system(value: Option<&Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let text = match value {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(blocks)) => {
            let mut text = String::new();
            for (i, block) in blocks.iter().enumerate() {
                let at = format!("system[{i}]");
                match (block.get("type").and_then(Value::as_str), block.get("text")) {
                    (Some("text"), Some(Value::String(t))) => {
                        if !text.is_empty() {
                            text.push('\n');
                        }
                        text.push_str(t);
                    }
                    _ => {
                        return Err(ApiError::invalid_field(
                            &at,
                            "`system` blocks must be `{\"type\": \"text\", \"text\": ...}`",
                        ))
                    }
                }
            }
            text
        }
        Some(_) => {
            return Err(ApiError::invalid_field(
                "system",
                "`system` must be a string or an array of text blocks",
            ))
        }
    };
    Ok(vec![ChatMessage {
        role: "system".into(),
        content: text,
        ..ChatMessage::default()
    }])
}

fn parse_turns(
    value: Option<&Value>,
    ordered: Option<&Ordered>,
) -> Result<Vec<ChatMessage>, ApiError> {
    let list = non_empty_array(value, "messages")?;
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        parse_turn(i, m, ordered.and_then(|o| o.at(i)), &mut out)?;
    }
    Ok(out)
}

/// One turn; its `tool_use` blocks become the assistant turn's calls, its tool results
/// `tool` messages of their own, in order.
fn parse_turn(
    index: usize,
    value: &Value,
    ordered: Option<&Ordered>,
    out: &mut Vec<ChatMessage>,
) -> Result<(), ApiError> {
    let at = |field: &str| format!("messages[{index}].{field}");
    let Value::Object(m) = value else {
        return Err(ApiError::invalid_field(
            &format!("messages[{index}]"),
            "each message must be an object with `role` and `content`",
        ));
    };
    let role = match m.get("role").and_then(Value::as_str) {
        Some(r @ ("user" | "assistant")) => r.to_string(),
        None if m.get("role").is_none_or(Value::is_null) => {
            return Err(ApiError::missing_field(&at("role")))
        }
        _ => {
            return Err(ApiError::invalid_field(
                &at("role"),
                "`role` must be `user` or `assistant` (the system prompt goes in `system`)",
            ))
        }
    };
    let blocks = match m.get("content") {
        None | Some(Value::Null) => return Err(ApiError::missing_field(&at("content"))),
        Some(Value::String(s)) => {
            out.push(ChatMessage::new(&role, s.clone()));
            return Ok(());
        }
        Some(Value::Array(blocks)) => blocks,
        Some(_) => {
            return Err(ApiError::invalid_field(
                &at("content"),
                "`content` must be a string or an array of content blocks",
            ))
        }
    };
    let mut text = String::new();
    let mut calls = Vec::new();
    let mut images = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        let param = format!("messages[{index}].content[{j}]");
        let kind = block.get("type").and_then(Value::as_str);
        match kind {
            Some("text") => match block.get("text") {
                Some(Value::String(t)) => text.push_str(t),
                _ => {
                    return Err(ApiError::invalid_field(
                        &param,
                        "a text block needs a string `text`",
                    ))
                }
            },
            Some("tool_use") => {
                let name = block.get("name").and_then(Value::as_str).ok_or_else(|| {
                    ApiError::invalid_field(&param, "a tool_use block needs a string `name`")
                })?;
                let id = match block.get("id") {
                    Some(Value::String(id)) if !id.is_empty() => id.clone(),
                    _ => format!("toolu{index:02}{j:02}"),
                };
                let input = block.get("input");
                if input.is_some_and(|i| !(i.is_object() || i.is_null())) {
                    return Err(ApiError::invalid_field(
                        &format!("{param}.input"),
                        "a tool_use block's `input` must be an object",
                    ));
                }
                let ordered_input = ordered
                    .and_then(|o| o.get("content"))
                    .and_then(|c| c.at(j))
                    .and_then(|b| b.get("input"));
                calls.push(ToolCall {
                    id,
                    name: name.to_string(),
                    arguments: arguments_text(input, ordered_input),
                });
            }
            Some("image") => images.push(image_block(block, &param)?),
            Some("tool_result") => {
                if !text.is_empty() || !calls.is_empty() || !images.is_empty() {
                    out.push(ChatMessage {
                        tool_calls: std::mem::take(&mut calls),
                        images: std::mem::take(&mut images),
                        ..ChatMessage::new(&role, std::mem::take(&mut text))
                    });
                }
                let tool_call_id = block.get("tool_use_id").and_then(Value::as_str);
                // The tool's name, from the call it answers, for templates that print it.
                let name = out
                    .iter()
                    .rev()
                    .flat_map(|m| &m.tool_calls)
                    .find(|c| Some(c.id.as_str()) == tool_call_id)
                    .map(|c| c.name.clone());
                out.push(ChatMessage {
                    tool_call_id: tool_call_id.map(str::to_string),
                    name,
                    ..ChatMessage::new("tool", tool_result_text(block.get("content"), &param)?)
                });
            }
            // Thinking a client sends back is the model's own; the template drops it.
            Some("thinking" | "redacted_thinking") => {}
            Some(other @ ("document" | "search_result")) => {
                return Err(ApiError::invalid_field(
                    &param,
                    format!(
                        "`{other}` blocks are not supported: the models shoal serves read text \
                         and images; send the content as text"
                    ),
                ))
            }
            Some(other) => {
                return Err(ApiError::invalid_field(
                    &param,
                    format!(
                        "unknown content block type `{}`; send text, tool_use, tool_result \
                         or thinking blocks",
                        echo(other)
                    ),
                ))
            }
            None => {
                return Err(ApiError::invalid_field(
                    &param,
                    "each content block needs a `type`",
                ))
            }
        }
    }
    if !text.is_empty()
        || !calls.is_empty()
        || !images.is_empty()
        || out.last().is_none_or(|m| m.role != "tool")
    {
        out.push(ChatMessage {
            tool_calls: calls,
            images,
            ..ChatMessage::new(&role, text)
        });
    }
    Ok(())
}

/// An `image` block: `{"type": "image", "source": {"type": "base64", "media_type":
/// "image/png", "data": "..."}}`. A `url` source is refused (this node fetches nothing).
fn image_block(block: &Value, param: &str) -> Result<ChatImage, ApiError> {
    let source = block.get("source");
    match source.and_then(|s| s.get("type")).and_then(Value::as_str) {
        Some("base64") => {}
        Some("url") => {
            let url = source.and_then(|s| s.get("url")).and_then(Value::as_str);
            return image_from_url(url.unwrap_or("http:"), &format!("{param}.source.url"));
        }
        _ => {
            return Err(ApiError::invalid_field(
                &format!("{param}.source"),
                "an image block needs a `source` of type `base64` with `media_type` and `data`",
            ))
        }
    }
    let media_type = source
        .and_then(|s| s.get("media_type"))
        .and_then(Value::as_str);
    if !matches!(
        media_type,
        Some("image/png" | "image/jpeg" | "image/webp" | "image/gif")
    ) {
        return Err(ApiError::invalid_field(
            &format!("{param}.source.media_type"),
            "`media_type` must be image/png, image/jpeg, image/webp or image/gif",
        )
        .with_code("invalid_image"));
    }
    match source.and_then(|s| s.get("data")) {
        Some(Value::String(data)) => image_from_base64(data, &format!("{param}.source.data")),
        _ => Err(ApiError::invalid_field(
            &format!("{param}.source.data"),
            "an image source needs its base64 `data`",
        )),
    }
}

/// A tool result's `content`: a string or text blocks.
fn tool_result_text(value: Option<&Value>, param: &str) -> Result<String, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(blocks)) => {
            let mut text = String::new();
            for block in blocks {
                match (block.get("type").and_then(Value::as_str), block.get("text")) {
                    (Some("text"), Some(Value::String(t))) => text.push_str(t),
                    _ => {
                        return Err(ApiError::invalid_field(
                            &format!("{param}.content"),
                            "tool results must be text",
                        ))
                    }
                }
            }
            Ok(text)
        }
        Some(_) => Err(ApiError::invalid_field(
            &format!("{param}.content"),
            "a tool result's `content` must be a string or text blocks",
        )),
    }
}

/// `thinking`, as the template's switch: on for `enabled`, off for `disabled`, the model's
/// default for `adaptive`.
/// Smallest `thinking.budget_tokens` accepted: Anthropic's own minimum.
pub const MIN_THINKING_BUDGET: u32 = 1024;

/// `thinking`: on, off, or the model's default (`adaptive`). shoal does not cut thinking at
/// `budget_tokens` (`max_tokens` bounds the whole answer), but a budget no client of
/// Anthropic's API could send (-1, 0, 2^64) is a 400, as there, not a silent success.
fn parse_thinking(value: Option<&Value>) -> Result<Option<bool>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(t)) if t.get("type").and_then(Value::as_str) == Some("enabled") => {
            match crate::fields::opt_u32(t, "budget_tokens") {
                Ok(None) => Ok(Some(true)),
                Ok(Some(n)) if n >= MIN_THINKING_BUDGET => Ok(Some(true)),
                _ => Err(ApiError::invalid_field(
                    "thinking.budget_tokens",
                    format!(
                        "`thinking.budget_tokens` must be an integer from {MIN_THINKING_BUDGET} \
                         to {} (Anthropic's bounds); shoal does not stop thinking at the \
                         budget, `max_tokens` bounds the whole answer",
                        u32::MAX
                    ),
                )),
            }
        }
        Some(Value::Object(t)) if t.get("type").and_then(Value::as_str) == Some("disabled") => {
            Ok(Some(false))
        }
        Some(Value::Object(t)) if t.get("type").and_then(Value::as_str) == Some("adaptive") => {
            Ok(None)
        }
        Some(_) => Err(ApiError::invalid_field(
            "thinking",
            "`thinking` must be `{\"type\": \"enabled\", \"budget_tokens\": N}` or \
             `{\"type\": \"disabled\"}`",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<ParsedMessages, ApiError> {
        parse_messages_request(v.to_string().as_bytes(), false)
    }

    /// `tool_choice` of type `any` or `tool` with no `tools` is a 400 naming `tool_choice`, as
    /// Anthropic answers; `any` used to be ignored and answered with text.
    #[test]
    fn a_forced_call_needs_tools() {
        let base = || json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
        for choice in [json!({"type": "any"}), json!({"type": "tool", "name": "f"})] {
            for tools in [None, Some(json!([]))] {
                let mut v = base();
                v["tool_choice"] = choice.clone();
                if let Some(t) = &tools {
                    v["tools"] = t.clone();
                }
                let e = parse(v).unwrap_err();
                assert_eq!(e.status(), hyper::StatusCode::BAD_REQUEST, "{choice}");
                assert_eq!(e.param.as_deref(), Some("tool_choice"));
                assert!(
                    e.message.contains(
                        "of type `any` or `tool` forces a tool call, but the \
                                        request offers no `tools`"
                    ),
                    "{}",
                    e.message
                );
            }
            let mut v = base();
            v["tool_choice"] = choice.clone();
            v["tools"] = json!([{"name": "f", "input_schema": {"type": "object"}}]);
            assert!(parse(v).is_ok(), "{choice}");
        }
        for choice in [json!({"type": "auto"}), json!({"type": "none"})] {
            let mut v = base();
            v["tool_choice"] = choice.clone();
            assert!(parse(v).is_ok(), "{choice}");
        }
    }

    /// `thinking.budget_tokens` below Anthropic's 1024, negative, fractional, beyond 32 bits or
    /// not a number is a 400 naming it; -1 used to be accepted.
    #[test]
    fn thinking_budget_is_bounded() {
        let with = |budget: &str| {
            let body = format!(
                r#"{{"model":"m","max_tokens":5,"messages":[{{"role":"user","content":"hi"}}],"thinking":{{"type":"enabled","budget_tokens":{budget}}}}}"#
            );
            parse_messages_request(body.as_bytes(), false)
        };
        for bad in [
            "-1",
            "0",
            "1023",
            "1024.5",
            "4294967296",
            "18446744073709551616",
            "\"1024\"",
        ] {
            let e = with(bad).unwrap_err();
            assert_eq!(e.status(), hyper::StatusCode::BAD_REQUEST, "{bad}");
            assert_eq!(e.param.as_deref(), Some("thinking.budget_tokens"), "{bad}");
            assert!(
                e.message
                    .contains("must be an integer from 1024 to 4294967295"),
                "{}",
                e.message
            );
        }
        for good in ["1024", "4294967295", "null"] {
            assert_eq!(
                with(good).unwrap().request.enable_thinking,
                Some(true),
                "{good}"
            );
        }
    }

    #[test]
    fn system_blocks_and_fields() {
        let p = parse(json!({
            "model": "m", "max_tokens": 9, "stream": true,
            "system": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "stop_sequences": ["X"], "temperature": 0.5, "top_p": 0.9, "top_k": 5,
            "metadata": {"user_id": "u"}, "thinking": {"type": "disabled"}
        }))
        .unwrap();
        assert!(p.stream);
        let r = &p.request;
        assert_eq!(r.messages[0].role, "system");
        assert_eq!(r.messages[0].content, "a\nb");
        assert_eq!(r.messages[1].content, "hi");
        assert_eq!(r.sampling.max_tokens, Some(9));
        assert_eq!(r.sampling.stop, vec!["X".to_string()]);
        assert_eq!(r.sampling.top_k, Some(5));
        assert_eq!(r.user.as_deref(), Some("u"));
    }

    #[test]
    fn tool_results_become_tool_turns() {
        let p = parse(json!({
            "model": "m", "max_tokens": 9,
            "messages": [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "w", "input": {"c": "Paris"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]}
            ]
        }))
        .unwrap();
        let roles: Vec<&str> = p.request.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["user", "assistant", "tool"]);
        assert_eq!(p.request.messages[2].content, "sunny");
    }

    #[test]
    fn errors_name_their_field() {
        let ok =
            json!({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]});
        let cases: Vec<(&str, Value, &str)> = vec![
            ("max_tokens", Value::Null, "max_tokens"),
            ("max_tokens", json!(0), "max_tokens"),
            ("model", Value::Null, "model"),
            ("messages", json!([]), "messages"),
            (
                "messages",
                json!([{"role": "system", "content": "x"}]),
                "messages[0].role",
            ),
            (
                "messages",
                json!([{"role": "user", "content": [{"type": "image", "source": {}}]}]),
                "messages[0].content[0].source",
            ),
            (
                "messages",
                json!([{"role": "user", "content": [{"type": "image", "source": {
                    "type": "base64", "media_type": "image/bmp", "data": "Qk0="}}]}]),
                "messages[0].content[0].source.media_type",
            ),
            (
                "messages",
                json!([{"role": "user", "content": [{"type": "image", "source": {
                    "type": "base64", "media_type": "image/png", "data": "aGk="}}]}]),
                "messages[0].content[0].source.data",
            ),
            (
                "messages",
                json!([{"role": "user", "content": [{"type": "document"}]}]),
                "messages[0].content[0]",
            ),
            ("system", json!(5), "system"),
            ("stop_sequences", json!([1]), "stop_sequences"),
            ("temperature", json!(1.5), "temperature"),
            ("tools", json!([{}]), "tools[0].name"),
            ("tool_choice", json!("auto"), "tool_choice"),
            ("thinking", json!(true), "thinking"),
        ];
        for (key, v, param) in cases {
            let mut body = ok.clone();
            if v.is_null() {
                body.as_object_mut().unwrap().remove(key);
            } else {
                body[key] = v;
            }
            let e = parse(body.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
        }
        let mut counting = ok.clone();
        counting.as_object_mut().unwrap().remove("max_tokens");
        assert!(parse_messages_request(counting.to_string().as_bytes(), true).is_ok());
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = parse_messages_request(&bytes, false);
        }
    }
}
