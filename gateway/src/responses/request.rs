//! Parsing OpenAI Responses bodies (`POST /v1/responses`) into the gateway's [`ChatRequest`]:
//! `instructions` becomes the system message, `input` (a string, or message,
//! `function_call` and `function_call_output` items) the conversation, `max_output_tokens`
//! the token limit. shoal's Responses API is stateless: `previous_response_id` and
//! `conversation` are refused with a 400 saying to send the whole conversation. Each mistake
//! is a 400 naming its field.

use crate::backend::{ChatMessage, ChatRequest, RequestedSampling, ToolCall};
use crate::error::{echo, ApiError};
use crate::fields::{
    json_object, non_empty_array, opt_bool, opt_f32_in, opt_max_tokens, parse_seed,
    reasoning_effort, required_string,
};
use crate::images::{check_request_images, image_from_url, ChatImage};
use crate::response_format::parse_text_format;
use crate::tools::{arguments_text, parse_openai_tool_choice, parse_tools, ToolShape};
use dialects::tools::json::Ordered;
use serde_json::{Map, Value};

/// A parsed Responses request plus what the answer echoes.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedResponses {
    pub request: ChatRequest,
    pub stream: bool,
    pub instructions: Option<String>,
    /// `max_output_tokens` as asked (at most `u32::MAX`: a larger one is refused, not
    /// clamped); the response echoes this.
    pub max_output_tokens: Option<u64>,
}

/// Parses a body. Never panics, whatever the bytes.
pub fn parse_responses_request(body: &[u8]) -> Result<ParsedResponses, ApiError> {
    let obj = json_object(body)?;
    // The same body with its keys in order, for the JSON that reaches the prompt.
    let ordered = Ordered::parse(body);
    let ordered_at = |key: &str| ordered.as_ref().and_then(|o| o.get(key));
    let model = required_string(obj.get("model"), "model")?;
    for field in ["previous_response_id", "conversation"] {
        if obj.get(field).is_some_and(|v| !v.is_null()) {
            return Err(ApiError::invalid_field(
                field,
                format!(
                    "`{field}` is not supported: shoal's Responses API keeps no state between \
                     requests; send the whole conversation in `input`"
                ),
            )
            .with_code("unsupported_parameter"));
        }
    }
    if opt_bool(&obj, "background")?.unwrap_or(false) {
        return Err(ApiError::invalid_field(
            "background",
            "background responses are not supported; stream the response instead",
        ));
    }
    let instructions = match obj.get("instructions") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => {
            return Err(ApiError::invalid_field(
                "instructions",
                "`instructions` must be a string",
            ))
        }
    };
    let mut messages = Vec::new();
    if let Some(text) = &instructions {
        messages.push(ChatMessage {
            role: "system".into(),
            content: text.clone(),
            ..ChatMessage::default()
        });
    }
    messages.extend(parse_input(obj.get("input"), ordered_at("input"))?);
    check_request_images(&messages)?;
    let tools = parse_tools(obj.get("tools"), ordered_at("tools"), ToolShape::Flat)?;
    let tool_choice = parse_openai_tool_choice(obj.get("tool_choice"), ToolShape::Flat, &tools)?;
    let response_format = parse_text_format(
        obj.get("text"),
        ordered.as_ref().and_then(|o| o.get("text")),
    )?;
    let max_tokens = opt_max_tokens(&obj, "max_output_tokens")?;
    let sampling = RequestedSampling {
        max_tokens,
        temperature: opt_f32_in(&obj, "temperature", 0.0, 2.0)?,
        top_p: opt_f32_in(&obj, "top_p", 0.0, 1.0)?,
        seed: parse_seed(&obj)?,
        logprobs: parse_logprobs(&obj)?,
        ..RequestedSampling::default()
    };
    let reasoning_effort = match obj.get("reasoning") {
        None | Some(Value::Null) => None,
        Some(Value::Object(r)) => reasoning_effort(r.get("effort"), "reasoning.effort")?,
        Some(_) => {
            return Err(ApiError::invalid_field(
                "reasoning",
                "`reasoning` must be an object",
            ))
        }
    };
    let user = match obj.get("user").or_else(|| obj.get("safety_identifier")) {
        Some(Value::String(s)) => Some(s.clone()),
        _ => None,
    };
    Ok(ParsedResponses {
        request: ChatRequest {
            model,
            messages,
            sampling,
            user,
            tools,
            tool_choice,
            enable_thinking: None,
            reasoning_effort,
            response_format,
        },
        stream: opt_bool(&obj, "stream")?.unwrap_or(false),
        instructions,
        max_output_tokens: max_tokens.map(u64::from),
    })
}

/// What OpenAI's `include` asks for to get each output text's token log-probabilities.
pub const INCLUDE_LOGPROBS: &str = "message.output_text.logprobs";

/// Log-probabilities: asked for with `include: ["message.output_text.logprobs"]` (or by
/// asking for alternatives), with `top_logprobs` (0 to 20) alternatives per token.
fn parse_logprobs(obj: &Map<String, Value>) -> Result<Option<u32>, ApiError> {
    let included = match obj.get("include") {
        None | Some(Value::Null) => false,
        Some(Value::Array(items)) => {
            let mut included = false;
            for item in items {
                match item.as_str() {
                    Some(name) => included |= name == INCLUDE_LOGPROBS,
                    None => {
                        return Err(ApiError::invalid_field(
                            "include",
                            "`include` must be an array of strings",
                        ))
                    }
                }
            }
            included
        }
        Some(_) => {
            return Err(ApiError::invalid_field(
                "include",
                "`include` must be an array of strings",
            ))
        }
    };
    let top = crate::fields::opt_top_logprobs(obj)?.unwrap_or(0);
    Ok((included || top > 0).then_some(top))
}

fn parse_input(
    value: Option<&Value>,
    ordered: Option<&Ordered>,
) -> Result<Vec<ChatMessage>, ApiError> {
    let items = match value {
        Some(Value::String(s)) => {
            return Ok(vec![ChatMessage {
                role: "user".into(),
                content: s.clone(),
                ..ChatMessage::default()
            }])
        }
        other => non_empty_array(other, "input")?,
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let Value::Object(item) = item else {
            return Err(ApiError::invalid_field(
                &at,
                "each input item must be an object",
            ));
        };
        let kind = item.get("type").and_then(Value::as_str);
        match kind {
            None | Some("message") => out.push(parse_message(&at, item)?),
            Some("function_call") => {
                let name = item.get("name").and_then(Value::as_str).ok_or_else(|| {
                    ApiError::invalid_field(&at, "a function_call needs a string `name`")
                })?;
                let id = match item.get("call_id").or_else(|| item.get("id")) {
                    Some(Value::String(id)) if !id.is_empty() => id.clone(),
                    _ => format!("call{i:05}"),
                };
                let arguments = item.get("arguments");
                if arguments.is_some_and(|a| !(a.is_string() || a.is_null())) {
                    return Err(ApiError::invalid_field(
                        &format!("{at}.arguments"),
                        "a function_call's `arguments` must be JSON text",
                    ));
                }
                let ordered_args = ordered
                    .and_then(|o| o.at(i))
                    .and_then(|o| o.get("arguments"));
                let call = ToolCall {
                    id,
                    name: name.to_string(),
                    arguments: arguments_text(arguments, ordered_args),
                };
                // Calls in a row (and right after the assistant's text) are one turn.
                match out.last_mut() {
                    Some(last) if last.role == "assistant" => last.tool_calls.push(call),
                    _ => out.push(ChatMessage {
                        tool_calls: vec![call],
                        ..ChatMessage::new("assistant", "")
                    }),
                }
            }
            Some("function_call_output") => {
                let output = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v @ Value::Array(_)) => {
                        let output_at = format!("{at}.output");
                        let (text, images) = content_parts(&output_at, v)?;
                        if !images.is_empty() {
                            return Err(ApiError::invalid_field(
                                &output_at,
                                "images in a function_call_output are not supported; send them \
                                 in a user message",
                            ));
                        }
                        text
                    }
                    _ => {
                        return Err(ApiError::invalid_field(
                            &format!("{at}.output"),
                            "a function_call_output needs a string `output`",
                        ))
                    }
                };
                let call_id = item.get("call_id").and_then(Value::as_str);
                let name = out
                    .iter()
                    .rev()
                    .flat_map(|m| &m.tool_calls)
                    .find(|c| Some(c.id.as_str()) == call_id)
                    .map(|c| c.name.clone());
                out.push(ChatMessage {
                    tool_call_id: call_id.map(str::to_string),
                    name,
                    ..ChatMessage::new("tool", output)
                });
            }
            // Earlier reasoning is the model's own; the template drops it.
            Some("reasoning") => {}
            Some(other) => {
                return Err(ApiError::invalid_field(
                    &format!("{at}.type"),
                    format!(
                        "input items of type `{}` are not supported; use message, \
                         function_call or function_call_output",
                        echo(other)
                    ),
                ))
            }
        }
    }
    Ok(out)
}

fn parse_message(at: &str, item: &Map<String, Value>) -> Result<ChatMessage, ApiError> {
    let role = match item.get("role").and_then(Value::as_str) {
        Some(r @ ("user" | "assistant" | "system" | "developer")) => r.to_string(),
        _ => {
            return Err(ApiError::invalid_field(
                &format!("{at}.role"),
                "`role` must be one of user, assistant, system, developer",
            ))
        }
    };
    let (content, images) = match item.get("content") {
        Some(Value::String(s)) => (s.clone(), Vec::new()),
        Some(v @ Value::Array(_)) => content_parts(&format!("{at}.content"), v)?,
        _ => {
            return Err(ApiError::invalid_field(
                &format!("{at}.content"),
                "`content` must be a string or an array of text and image parts",
            ))
        }
    };
    Ok(ChatMessage {
        images,
        ..ChatMessage::new(&role, content)
    })
}

/// Text parts (`input_text`, `output_text`), concatenated, and `input_image` parts
/// (`{"type": "input_image", "image_url": "data:..."}`; `detail` is accepted and ignored).
fn content_parts(at: &str, value: &Value) -> Result<(String, Vec<ChatImage>), ApiError> {
    let mut text = String::new();
    let mut images = Vec::new();
    for (j, part) in value.as_array().into_iter().flatten().enumerate() {
        let param = format!("{at}[{j}]");
        match (part.get("type").and_then(Value::as_str), part.get("text")) {
            (Some("input_text" | "output_text" | "text"), Some(Value::String(t))) => {
                text.push_str(t)
            }
            (Some("input_image"), _) => match part.get("image_url") {
                Some(Value::String(url)) => {
                    images.push(image_from_url(url, &format!("{param}.image_url"))?)
                }
                _ if part.get("file_id").is_some_and(|f| !f.is_null()) => {
                    return Err(ApiError::invalid_field(
                        &format!("{param}.file_id"),
                        "`file_id` images are not supported: shoal keeps no files; send the \
                         image as a data URL in `image_url`",
                    ))
                }
                _ => {
                    return Err(ApiError::invalid_field(
                        &format!("{param}.image_url"),
                        "an input_image part needs a string `image_url` (a data URL)",
                    ))
                }
            },
            (Some(kind @ ("input_file" | "input_audio")), _) => {
                return Err(ApiError::invalid_field(
                    &param,
                    format!(
                        "`{kind}` parts are not supported: the models shoal serves read text \
                         and images"
                    ),
                ))
            }
            _ => {
                return Err(ApiError::invalid_field(
                    &param,
                    "each part must be `{\"type\": \"input_text\", \"text\": ...}` or \
                     `{\"type\": \"input_image\", \"image_url\": ...}`",
                ))
            }
        }
    }
    Ok((text, images))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<ParsedResponses, ApiError> {
        parse_responses_request(v.to_string().as_bytes())
    }

    /// The largest `max_output_tokens` is echoed as asked; one that does not fit 32 bits is a
    /// 400 stating the bound (it used to be clamped to `u32::MAX` silently).
    #[test]
    fn max_output_tokens_is_echoed_as_asked_within_its_bound() {
        let p = parse(json!({"model": "m", "input": "x", "max_output_tokens": u32::MAX})).unwrap();
        assert_eq!(p.max_output_tokens, Some(u64::from(u32::MAX)));
        assert_eq!(p.request.sampling.max_tokens, Some(u32::MAX));
        for huge in [json!(1_000_000_000_000u64), json!(1e12), json!(u64::MAX)] {
            let e =
                parse(json!({"model": "m", "input": "x", "max_output_tokens": huge})).unwrap_err();
            assert_eq!(e.status(), hyper::StatusCode::BAD_REQUEST, "{huge}");
            assert_eq!(e.param.as_deref(), Some("max_output_tokens"));
            assert!(e.message.contains("at most 4294967295"), "{}", e.message);
        }
    }

    /// `tool_choice: "required"` or a named function with no `tools` is a 400 naming
    /// `tool_choice`, as in chat completions.
    #[test]
    fn a_forced_call_needs_tools() {
        for choice in [json!("required"), json!({"type": "function", "name": "f"})] {
            let e = parse(json!({"model": "m", "input": "x", "tool_choice": choice.clone()}))
                .unwrap_err();
            assert_eq!(e.status(), hyper::StatusCode::BAD_REQUEST, "{choice}");
            assert_eq!(e.param.as_deref(), Some("tool_choice"));
            assert!(e.message.contains("offers no `tools`"), "{}", e.message);
            let tools = json!([{"type": "function", "name": "f"}]);
            assert!(parse(
                json!({"model": "m", "input": "x", "tool_choice": choice, "tools": tools})
            )
            .is_ok());
        }
    }

    #[test]
    fn items_and_instructions() {
        let p = parse(json!({
            "model": "m", "instructions": "be brief", "max_output_tokens": 5, "stream": true,
            "input": [
                {"role": "user", "content": "weather?"},
                {"type": "function_call", "call_id": "c", "name": "w", "arguments": "{\"city\":\"Paris\"}"},
                {"type": "function_call_output", "call_id": "c", "output": "sunny"},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "and?"}]}
            ]
        }))
        .unwrap();
        let roles: Vec<&str> = p.request.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
        let call = &p.request.messages[2].tool_calls[0];
        assert_eq!(
            (
                call.id.as_str(),
                call.name.as_str(),
                call.arguments.as_str()
            ),
            ("c", "w", r#"{"city":"Paris"}"#)
        );
        let result = &p.request.messages[3];
        assert_eq!(
            (
                result.tool_call_id.as_deref(),
                result.name.as_deref(),
                result.content.as_str()
            ),
            (Some("c"), Some("w"), "sunny")
        );
        assert_eq!(p.request.sampling.max_tokens, Some(5));
        assert!(p.stream);
    }

    #[test]
    fn logprobs_are_included_or_asked_with_alternatives() {
        let asked = |extra: Value| {
            let mut body = json!({"model": "m", "input": "x"});
            body.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            parse(body).unwrap().request.sampling.logprobs
        };
        assert_eq!(asked(json!({})), None);
        assert_eq!(
            asked(json!({"include": ["reasoning.encrypted_content"]})),
            None
        );
        assert_eq!(asked(json!({"include": [INCLUDE_LOGPROBS]})), Some(0));
        assert_eq!(
            asked(json!({"include": [INCLUDE_LOGPROBS], "top_logprobs": 5})),
            Some(5)
        );
        assert_eq!(asked(json!({"top_logprobs": 3})), Some(3));
        assert_eq!(asked(json!({"top_logprobs": 0})), None);
    }

    #[test]
    fn errors_name_their_field() {
        let cases = [
            (json!({"input": "x"}), "model"),
            (json!({"model": "m"}), "input"),
            (
                json!({"model": "m", "input": "x", "previous_response_id": "resp_1"}),
                "previous_response_id",
            ),
            (
                json!({"model": "m", "input": "x", "max_output_tokens": 0}),
                "max_output_tokens",
            ),
            (
                json!({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image"}]}]}),
                "input[0].content[0].image_url",
            ),
            (
                json!({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]}),
                "input[0].content[0].file_id",
            ),
            (
                json!({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]}),
                "input[0].content[0].image_url",
            ),
            (
                json!({"model": "m", "input": [{"role": "user", "content": [{"type": "input_file"}]}]}),
                "input[0].content[0]",
            ),
            (
                json!({"model": "m", "input": "x", "tools": [{"type": "web_search"}]}),
                "tools[0]",
            ),
            (
                json!({"model": "m", "input": "x", "temperature": 9}),
                "temperature",
            ),
            (
                json!({"model": "m", "input": "x", "text": {"format": {"type": "json_schema"}}}),
                "text.format.schema",
            ),
            (
                json!({"model": "m", "input": "x", "top_logprobs": 21}),
                "top_logprobs",
            ),
            (
                json!({"model": "m", "input": "x", "include": "all"}),
                "include",
            ),
        ];
        for (body, param) in cases {
            let e = parse(body.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
        }
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = parse_responses_request(&bytes);
        }
    }
}
