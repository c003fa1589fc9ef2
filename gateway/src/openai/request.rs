//! Parsing `POST /v1/chat/completions` bodies into a validated [`ChatRequest`].
//!
//! The body is read as a JSON value first and its fields are then taken one by one, so that
//! each mistake is answered with a 400 naming the field at fault (`param`), which serde's
//! derived errors do not do. Unknown fields are ignored, as OpenAI-compatible servers do.

use crate::backend::{ChatMessage, ChatRequest, RequestedSampling};
use crate::error::{echo, ApiError};
use crate::fields::{
    json_object, non_empty_array, opt_bool, opt_f32_in, opt_max_tokens, opt_u32, opt_u64,
    parse_logit_bias, parse_seed, parse_stop, reasoning_effort, required_string,
};
use crate::images::{check_request_images, image_url_part};
use crate::response_format::parse_chat_response_format;
use crate::tools::{parse_openai_tool_choice, parse_tool_calls, parse_tools, ToolShape};
use dialects::tools::json::Ordered;
use serde_json::Value;

pub use crate::fields::{MAX_STOP_STRINGS, MAX_TOP_LOGPROBS};

/// A parsed chat request plus how to answer it.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedChat {
    pub request: ChatRequest,
    /// Answer as SSE chunks.
    pub stream: bool,
    /// With `stream`, send a last chunk carrying usage (`stream_options.include_usage`).
    pub include_usage: bool,
}

/// Parses and validates a chat completion body. Never panics, whatever the bytes.
pub fn parse_chat_request(body: &[u8]) -> Result<ParsedChat, ApiError> {
    let obj = json_object(body)?;
    // The same body with its keys in order, for the JSON that reaches the prompt.
    let ordered = Ordered::parse(body);
    let model = required_string(obj.get("model"), "model")?;
    let messages = parse_messages(
        obj.get("messages"),
        ordered.as_ref().and_then(|o| o.get("messages")),
    )?;
    check_request_images(&messages)?;
    let tools = parse_tools(
        obj.get("tools"),
        ordered.as_ref().and_then(|o| o.get("tools")),
        ToolShape::Nested,
    )?;
    let tool_choice = parse_openai_tool_choice(obj.get("tool_choice"), ToolShape::Nested, &tools)?;
    let response_format = parse_chat_response_format(
        obj.get("response_format"),
        ordered.as_ref().and_then(|o| o.get("response_format")),
    )?;
    let mut reasoning_effort_value = obj.get("reasoning_effort");
    let mut effort_param = "reasoning_effort";
    let enable_thinking = match obj.get("chat_template_kwargs") {
        None | Some(Value::Null) => None,
        Some(Value::Object(kwargs)) => {
            if let Some(v) = kwargs.get("reasoning_effort") {
                reasoning_effort_value = Some(v);
                effort_param = "chat_template_kwargs.reasoning_effort";
            }
            opt_bool(kwargs, "enable_thinking")
                .map_err(|e| e.with_param("chat_template_kwargs.enable_thinking"))?
        }
        Some(_) => {
            return Err(ApiError::invalid_field(
                "chat_template_kwargs",
                "`chat_template_kwargs` must be an object",
            ))
        }
    };
    let reasoning_effort = reasoning_effort(reasoning_effort_value, effort_param)?;

    if let Some(n) = opt_u64(&obj, "n")? {
        if n != 1 {
            return Err(ApiError::invalid_field(
                "n",
                format!("`n` = {n} is not supported; only one choice (n = 1) is generated"),
            ));
        }
    }

    // The newer name wins; both are checked (at least 1, at most u32::MAX: never clamped).
    let max_tokens = match opt_max_tokens(&obj, "max_completion_tokens")? {
        Some(v) => Some(v),
        None => opt_max_tokens(&obj, "max_tokens")?,
    };

    let logprobs = opt_bool(&obj, "logprobs")?.unwrap_or(false);
    let top_logprobs = crate::fields::opt_top_logprobs(&obj)?;
    let logprobs = match (logprobs, top_logprobs) {
        (false, Some(_)) => {
            return Err(ApiError::invalid_field(
                "top_logprobs",
                "`top_logprobs` needs `logprobs: true`",
            ))
        }
        (true, k) => Some(k.unwrap_or(0)),
        (false, None) => None,
    };

    let sampling = RequestedSampling {
        max_tokens,
        temperature: opt_f32_in(&obj, "temperature", 0.0, 2.0)?,
        top_p: opt_f32_in(&obj, "top_p", 0.0, 1.0)?,
        top_k: opt_u32(&obj, "top_k")?,
        min_p: opt_f32_in(&obj, "min_p", 0.0, 1.0)?,
        seed: parse_seed(&obj)?,
        stop: parse_stop(obj.get("stop"), "stop")?,
        presence_penalty: opt_f32_in(&obj, "presence_penalty", -2.0, 2.0)?,
        frequency_penalty: opt_f32_in(&obj, "frequency_penalty", -2.0, 2.0)?,
        logprobs,
        ignore_eos: opt_bool(&obj, "ignore_eos")?.unwrap_or(false),
        logit_bias: parse_logit_bias(obj.get("logit_bias"), "logit_bias")?,
    };

    let user = match obj.get("user") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(ApiError::invalid_field("user", "`user` must be a string")),
    };
    let stream = opt_bool(&obj, "stream")?.unwrap_or(false);
    let include_usage = match obj.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(opts)) => opt_bool(opts, "include_usage")
            .map_err(|e| e.with_param("stream_options.include_usage"))?
            .unwrap_or(false),
        Some(_) => {
            return Err(ApiError::invalid_field(
                "stream_options",
                "`stream_options` must be an object",
            ))
        }
    };

    Ok(ParsedChat {
        request: ChatRequest {
            model,
            messages,
            sampling,
            user,
            tools,
            tool_choice,
            enable_thinking,
            reasoning_effort,
            response_format,
        },
        stream,
        include_usage: stream && include_usage,
    })
}

fn parse_messages(
    value: Option<&Value>,
    ordered: Option<&Ordered>,
) -> Result<Vec<ChatMessage>, ApiError> {
    non_empty_array(value, "messages")?
        .iter()
        .enumerate()
        .map(|(i, m)| parse_message(i, m, ordered.and_then(|o| o.at(i))))
        .collect()
}

fn parse_message(
    index: usize,
    value: &Value,
    ordered: Option<&Ordered>,
) -> Result<ChatMessage, ApiError> {
    let at = |field: &str| format!("messages[{index}].{field}");
    let Value::Object(m) = value else {
        return Err(ApiError::invalid_field(
            &format!("messages[{index}]"),
            "each message must be an object with `role` and `content`",
        ));
    };
    let role = match m.get("role") {
        None | Some(Value::Null) => return Err(ApiError::missing_field(&at("role"))),
        Some(Value::String(r))
            if matches!(
                r.as_str(),
                "system" | "developer" | "user" | "assistant" | "tool"
            ) =>
        {
            r.clone()
        }
        Some(_) => {
            return Err(ApiError::invalid_field(
                &at("role"),
                "`role` must be one of system, developer, user, assistant, tool",
            ))
        }
    };
    let mut images = Vec::new();
    let content = match m.get("content") {
        // An assistant turn may carry no text (for instance only tool calls).
        None | Some(Value::Null) if role == "assistant" => String::new(),
        None | Some(Value::Null) => return Err(ApiError::missing_field(&at("content"))),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                let param = format!("messages[{index}].content[{j}]");
                let part_type = part.get("type").and_then(Value::as_str);
                match (part_type, part.get("text")) {
                    (Some("text"), Some(Value::String(t))) => text.push_str(t),
                    (Some("text"), _) => {
                        return Err(ApiError::invalid_field(
                            &param,
                            "a text part needs a string `text`",
                        ))
                    }
                    (Some("image_url"), _) => images.push(image_url_part(part, &param)?),
                    (Some(other), _) => {
                        return Err(ApiError::invalid_field(
                            &param,
                            format!(
                                "content parts of type `{}` are not supported; only `text` \
                                 and `image_url`",
                                echo(other)
                            ),
                        ))
                    }
                    (None, _) => {
                        return Err(ApiError::invalid_field(
                            &param,
                            "each content part needs a `type` (`text` or `image_url`)",
                        ))
                    }
                }
            }
            text
        }
        Some(_) => {
            return Err(ApiError::invalid_field(
                &at("content"),
                "`content` must be a string or an array of text and image parts",
            ))
        }
    };
    let tool_calls = match role.as_str() {
        "assistant" => parse_tool_calls(
            m.get("tool_calls"),
            ordered.and_then(|o| o.get("tool_calls")),
            &at("tool_calls"),
            |j| format!("call{index:03}{j:02}"),
        )?,
        _ => Vec::new(),
    };
    // A tool result names the call it answers (and the tool).
    let text_field = |field: &str| -> Result<Option<String>, ApiError> {
        match m.get(field) {
            _ if role != "tool" => Ok(None),
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(ApiError::invalid_field(
                &at(field),
                format!("`{field}` must be a string"),
            )),
        }
    };
    Ok(ChatMessage {
        tool_call_id: text_field("tool_call_id")?,
        name: text_field("name")?,
        role,
        content,
        images,
        tool_calls,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn parse(v: Value) -> Result<ParsedChat, ApiError> {
        parse_chat_request(v.to_string().as_bytes())
    }

    fn minimal() -> Value {
        serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    }

    #[test]
    fn minimal_request_parses_with_defaults() {
        let p = parse(minimal()).unwrap();
        assert_eq!(p.request.model, "m");
        assert_eq!(p.request.messages[0].content, "hi");
        assert!(!p.stream);
        assert_eq!(p.request.sampling, RequestedSampling::default());
    }

    #[test]
    fn every_field_passes_through() {
        let p = parse(serde_json::json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
            ],
            "max_tokens": 5, "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.9,
            "top_k": 40, "min_p": 0.05, "seed": 42, "stop": ["x", "y"], "presence_penalty": 0.1,
            "frequency_penalty": -0.2, "logprobs": true, "top_logprobs": 3, "n": 1, "user": "u",
            "stream": true, "stream_options": {"include_usage": true}, "ignore_eos": true,
            "logit_bias": {"50256": -100, "7": 2.5}
        }))
        .unwrap();
        let s = &p.request.sampling;
        assert_eq!(s.max_tokens, Some(7));
        assert_eq!(s.temperature, Some(0.5));
        assert_eq!(s.top_p, Some(0.9));
        assert_eq!(s.top_k, Some(40));
        assert_eq!(s.min_p, Some(0.05));
        assert_eq!(s.seed, Some(42));
        assert_eq!(s.stop, vec!["x".to_string(), "y".to_string()]);
        assert_eq!(s.presence_penalty, Some(0.1));
        assert_eq!(s.frequency_penalty, Some(-0.2));
        assert_eq!(s.logprobs, Some(3));
        assert!(s.ignore_eos);
        assert_eq!(s.logit_bias, [(7, 2.5), (50256, -100.0)].into());
        assert_eq!(p.request.user.as_deref(), Some("u"));
        assert_eq!(p.request.messages[1].content, "ab");
        assert!(p.stream && p.include_usage);
    }

    #[test]
    fn ignore_eos_is_false_unless_true() {
        assert!(!parse(minimal()).unwrap().request.sampling.ignore_eos);
        for (value, expected) in [
            (Value::Null, false),
            (false.into(), false),
            (true.into(), true),
        ] {
            let mut v = minimal();
            v["ignore_eos"] = value;
            assert_eq!(parse(v).unwrap().request.sampling.ignore_eos, expected);
        }
        let mut v = minimal();
        v["ignore_eos"] = "yes".into();
        assert_eq!(parse(v).unwrap_err().param.as_deref(), Some("ignore_eos"));
    }

    #[test]
    fn logit_bias_is_checked_with_clear_errors() {
        let bias = |b: Value| {
            let mut v = minimal();
            v["logit_bias"] = b;
            parse(v)
        };
        assert!(bias(Value::Null)
            .unwrap()
            .request
            .sampling
            .logit_bias
            .is_empty());
        let edges = bias(serde_json::json!({"0": -100, "4294967295": 100.0})).unwrap();
        assert_eq!(
            edges.request.sampling.logit_bias,
            [(0, -100.0), (u32::MAX, 100.0)].into()
        );
        let refused = |b: Value, says: &str| {
            let err = bias(b.clone()).unwrap_err();
            assert_eq!(err.param.as_deref(), Some("logit_bias"), "{b}");
            assert!(err.message.contains(says), "{b}: {}", err.message);
        };
        refused(serde_json::json!([1, 2]), "must be an object");
        refused(serde_json::json!({"abc": 1}), "not \"abc\"");
        refused(serde_json::json!({"-3": 1}), "not \"-3\"");
        refused(serde_json::json!({"1.5": 1}), "token ids");
        refused(serde_json::json!({"4294967296": 1}), "token ids");
        refused(serde_json::json!({"5": 100.5}), "between -100 and 100");
        refused(serde_json::json!({"5": "1"}), "token 5");
        let many: serde_json::Map<String, Value> =
            (0..301).map(|t| (t.to_string(), Value::from(1))).collect();
        refused(Value::Object(many), "at most 300 tokens, not 301");
    }

    #[test]
    fn stop_may_be_a_string() {
        let mut v = minimal();
        v["stop"] = "END".into();
        assert_eq!(
            parse(v).unwrap().request.sampling.stop,
            vec!["END".to_string()]
        );
    }

    #[test]
    fn errors_name_their_field() {
        let cases: Vec<(Value, &str)> = vec![
            (serde_json::json!({"messages": []}), "model"),
            (serde_json::json!({"model": "m"}), "messages"),
            (
                serde_json::json!({"model": "m", "messages": []}),
                "messages",
            ),
            (
                serde_json::json!({"model": "m", "messages": [{"content": "x"}]}),
                "messages[0].role",
            ),
            (
                serde_json::json!({"model": "m", "messages": [{"role": "user"}]}),
                "messages[0].content",
            ),
            (
                serde_json::json!({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
                "messages[0].content[0].image_url",
            ),
            (
                serde_json::json!({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}]}),
                "messages[0].content[0].image_url.url",
            ),
            (
                serde_json::json!({"model": "m", "messages": [{"role": "user", "content": [{"type": "audio"}]}]}),
                "messages[0].content[0]",
            ),
            (
                {
                    let mut v = minimal();
                    v["n"] = 2.into();
                    v
                },
                "n",
            ),
            (
                {
                    let mut v = minimal();
                    v["temperature"] = 3.into();
                    v
                },
                "temperature",
            ),
            (
                {
                    let mut v = minimal();
                    v["top_p"] = "x".into();
                    v
                },
                "top_p",
            ),
            (
                {
                    let mut v = minimal();
                    v["max_tokens"] = 0.into();
                    v
                },
                "max_tokens",
            ),
            (
                {
                    let mut v = minimal();
                    v["max_tokens"] = (-1).into();
                    v
                },
                "max_tokens",
            ),
            (
                {
                    let mut v = minimal();
                    v["stop"] = 5.into();
                    v
                },
                "stop",
            ),
            (
                {
                    let mut v = minimal();
                    v["top_logprobs"] = 2.into();
                    v
                },
                "top_logprobs",
            ),
            (
                {
                    let mut v = minimal();
                    v["seed"] = 1.5.into();
                    v
                },
                "seed",
            ),
            (
                {
                    let mut v = minimal();
                    v["stream"] = "yes".into();
                    v
                },
                "stream",
            ),
        ];
        for (body, param) in cases {
            let err = parse(body.clone()).unwrap_err();
            assert_eq!(err.kind, ErrorKind::InvalidRequest, "{body}");
            assert_eq!(err.param.as_deref(), Some(param), "{body}: {}", err.message);
        }
    }

    /// A body whose unknown field is one object of 100,000 keys parses in linear time, as every
    /// API's body goes through the same two parses (`json_object`, `Ordered::parse`): the
    /// repeated-key scan of the ordered parse took 14 s for this in release, minutes here.
    #[test]
    fn an_unknown_object_of_100k_keys_parses_quickly() {
        let mut body =
            String::from(r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"extra":{"#);
        for i in 0..100_000 {
            body.push_str(&format!("\"key{i}\":{i},"));
        }
        body.push_str("\"last\":0}}");
        let started = std::time::Instant::now();
        let p = parse_chat_request(body.as_bytes()).unwrap();
        let took = started.elapsed();
        eprintln!("a chat body with 100,000 unknown keys parsed in {took:?}");
        assert_eq!(p.request.messages[0].content, "hi");
        // ~0.05 s in release, ~0.5 s in a debug build on a busy 2-core machine.
        assert!(
            took < std::time::Duration::from_secs(3),
            "100,000 keys took {took:?}"
        );
    }

    /// `tool_choice` that forces a call (`"required"`, a named function) with no `tools` is a
    /// 400 naming `tool_choice`, as OpenAI answers; it used to be ignored and answered with text.
    #[test]
    fn a_forced_call_needs_tools() {
        let tool = serde_json::json!([{"type": "function", "function": {"name": "f"}}]);
        let named = serde_json::json!({"type": "function", "function": {"name": "f"}});
        for choice in [Value::from("required"), named.clone()] {
            for tools in [None, Some(serde_json::json!([]))] {
                let mut v = minimal();
                v["tool_choice"] = choice.clone();
                if let Some(t) = &tools {
                    v["tools"] = t.clone();
                }
                let e = parse(v).unwrap_err();
                assert_eq!(e.status(), hyper::StatusCode::BAD_REQUEST, "{choice}");
                assert_eq!(e.param.as_deref(), Some("tool_choice"));
                assert_eq!(e.to_json()["error"]["type"], "invalid_request_error");
                assert!(
                    e.message
                        .contains("forces a tool call, but the request offers no `tools`"),
                    "{}",
                    e.message
                );
            }
            let mut v = minimal();
            v["tool_choice"] = choice.clone();
            v["tools"] = tool.clone();
            assert!(parse(v).unwrap().request.tool_choice != crate::tools::ToolChoice::Auto);
        }
        for choice in ["auto", "none"] {
            let mut v = minimal();
            v["tool_choice"] = choice.into();
            assert!(parse(v).is_ok(), "{choice}");
        }
    }

    /// `max_completion_tokens` and `max_tokens` beyond 32 bits (2^32, 1e12, 2^64 - 1, 2^64) are
    /// a 400 stating the bound; they used to be clamped to `u32::MAX` silently.
    #[test]
    fn max_tokens_beyond_32_bits_are_refused_not_clamped() {
        for name in ["max_completion_tokens", "max_tokens"] {
            for huge in [
                "4294967296",
                "1e12",
                "18446744073709551615",
                "18446744073709551616",
            ] {
                let body = format!(
                    r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}],"{name}":{huge}}}"#
                );
                let e = parse_chat_request(body.as_bytes()).unwrap_err();
                assert_eq!(e.status(), hyper::StatusCode::BAD_REQUEST, "{name}={huge}");
                assert_eq!(e.param.as_deref(), Some(name), "{huge}");
                assert!(
                    e.message
                        .contains(&format!("`{name}` must be at most 4294967295")),
                    "{}",
                    e.message
                );
            }
            let mut v = minimal();
            v[name] = u32::MAX.into();
            assert_eq!(
                parse(v).unwrap().request.sampling.max_tokens,
                Some(u32::MAX)
            );
            let mut v = minimal();
            v[name] = 16.0.into();
            assert_eq!(parse(v).unwrap().request.sampling.max_tokens, Some(16));
        }
        let mut v = minimal();
        v["top_k"] = 1e12.into();
        assert_eq!(parse(v).unwrap_err().param.as_deref(), Some("top_k"));
    }

    /// A 1 MB content part type comes back cut to 200 bytes and its length.
    #[test]
    fn an_unknown_part_type_is_echoed_bounded() {
        let kind = "x".repeat(1 << 20);
        let mut v = minimal();
        v["messages"][0]["content"] = serde_json::json!([{"type": kind}]);
        let e = parse(v).unwrap_err();
        assert!(e.message.len() < 400, "{} bytes", e.message.len());
        assert!(e
            .message
            .contains(&format!("`{}… (1048576 bytes in all)`", &kind[..200])));
    }

    #[test]
    fn malformed_json_is_400() {
        let err = parse_chat_request(b"{\"model\": ").unwrap_err();
        assert_eq!(err.status(), hyper::StatusCode::BAD_REQUEST);
        assert_eq!(err.code.as_deref(), Some("invalid_json"));
        assert!(parse_chat_request(b"[1,2]").is_err());
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = parse_chat_request(&bytes);
        }

        #[test]
        fn arbitrary_json_is_ok_or_400(v in arb_json()) {
            if let Err(e) = parse(v) {
                proptest::prop_assert_eq!(e.kind, ErrorKind::InvalidRequest);
            }
        }

        #[test]
        fn mutated_valid_requests_are_ok_or_400(key in "(model|messages|n|max_tokens|temperature|top_p|top_k|min_p|seed|stop|logprobs|top_logprobs|stream|stream_options|user|presence_penalty|ignore_eos|logit_bias)", v in arb_json()) {
            let mut body = minimal();
            body[key.as_str()] = v;
            if let Err(e) = parse(body) {
                proptest::prop_assert_eq!(e.kind, ErrorKind::InvalidRequest);
            }
        }
    }

    /// Arbitrary JSON, biased towards the shapes of chat requests.
    pub(crate) fn arb_json() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            "(model|messages|role|content|user|text|type|stop|[a-z]{0,6})".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map(
                    "(model|messages|role|content|text|type|n|stop|seed|stream|[a-z]{1,5})",
                    inner,
                    0..6
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }
}
