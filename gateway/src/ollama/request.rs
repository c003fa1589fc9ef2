//! Parsing Ollama's `/api/chat` and `/api/generate` bodies into the gateway's
//! [`ChatRequest`]. `options` carries the sampling settings (`num_predict`, `temperature`,
//! `top_p`, `top_k`, `min_p`, `seed`, `stop`, the penalties); options shoal has no use for
//! (`num_gpu`, ...) are ignored, as Ollama ignores unknown ones, and `num_ctx` is only checked
//! to be a context some model could have ([`MAX_NUM_CTX`]). Streaming is the
//! default, as in Ollama. Each mistake is a 400 naming its field.

use crate::backend::{ChatMessage, ChatRequest, RequestedSampling, ToolCall};
use crate::error::{echo, ApiError};
use crate::fields::{
    json_object, non_empty_array, opt_bool, opt_f32_in, opt_u32, parse_seed, parse_stop,
    reasoning_effort, required_string,
};
use crate::images::{check_request_images, image_from_base64, ChatImage};
use crate::response_format::parse_ollama_format;
use crate::tools::{parse_tool_calls, parse_tools, ToolShape};
use dialects::tools::json::Ordered;
use serde_json::{Map, Value};

/// A parsed chat or generate request.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedOllama {
    pub request: ChatRequest,
    pub stream: bool,
    /// The model as the client named it (answers echo it).
    pub model: String,
    /// `/api/generate` with an empty prompt: Ollama's "load the model" call.
    pub load_only: bool,
}

/// Which endpoint the body is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Generate,
}

/// The model shoal should look up for an Ollama name: Ollama's default tag `:latest` is
/// dropped (`default:latest` is `default`).
pub fn model_name(name: &str) -> &str {
    name.strip_suffix(":latest").unwrap_or(name)
}

/// Parses a body for `endpoint`. Never panics, whatever the bytes.
pub fn parse_ollama_request(body: &[u8], endpoint: Endpoint) -> Result<ParsedOllama, ApiError> {
    let obj = json_object(body)?;
    // The same body with its keys in order, for the JSON that reaches the prompt.
    let ordered = Ordered::parse(body);
    let ordered_at = |key: &str| ordered.as_ref().and_then(|o| o.get(key));
    let model = required_model(&obj)?;
    let (messages, load_only) = match endpoint {
        Endpoint::Chat => (
            parse_messages(obj.get("messages"), ordered_at("messages"))?,
            false,
        ),
        Endpoint::Generate => parse_generate(&obj)?,
    };
    check_request_images(&messages)?;
    let tools = match endpoint {
        Endpoint::Chat => parse_tools(obj.get("tools"), ordered_at("tools"), ToolShape::Nested)?,
        Endpoint::Generate => Vec::new(),
    };
    // `think`: a boolean, or (for models with levels) "low" | "medium" | "high", all on.
    let enable_thinking = match obj.get("think") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(Value::String(level)) if matches!(level.as_str(), "low" | "medium" | "high") => {
            Some(true)
        }
        Some(_) => {
            return Err(ApiError::invalid_field(
                "think",
                "`think` must be true, false, \"low\", \"medium\" or \"high\"",
            ))
        }
    };
    // A level is gpt-oss's reasoning effort too.
    let reasoning_effort = match obj.get("think") {
        Some(level @ Value::String(_)) => reasoning_effort(Some(level), "think")?,
        _ => None,
    };
    let response_format = parse_ollama_format(
        obj.get("format"),
        ordered.as_ref().and_then(|o| o.get("format")),
    )?;
    let options = match obj.get("options") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(o)) => o.clone(),
        Some(_) => {
            return Err(ApiError::invalid_field(
                "options",
                "`options` must be an object",
            ))
        }
    };
    let mut sampling = parse_options(&options)?;
    sampling.logprobs = parse_logprobs(&obj)?;
    let stream = opt_bool(&obj, "stream")?.unwrap_or(true);
    Ok(ParsedOllama {
        request: ChatRequest {
            model: model_name(&model).to_string(),
            messages,
            sampling,
            tools,
            enable_thinking,
            reasoning_effort,
            response_format,
            ..ChatRequest::default()
        },
        stream,
        model,
        load_only,
    })
}

/// `model` (or the older `name`), a non-empty string.
pub fn required_model(obj: &Map<String, Value>) -> Result<String, ApiError> {
    required_string(obj.get("model").or_else(|| obj.get("name")), "model")
}

fn parse_generate(obj: &Map<String, Value>) -> Result<(Vec<ChatMessage>, bool), ApiError> {
    for field in ["suffix", "template"] {
        if obj
            .get(field)
            .is_some_and(|v| !v.is_null() && v.as_str() != Some(""))
        {
            return Err(ApiError::invalid_field(
                field,
                format!("`{field}` is not supported: shoal renders the model's own chat template"),
            ));
        }
    }
    if opt_bool(obj, "raw")?.unwrap_or(false) {
        return Err(ApiError::invalid_field(
            "raw",
            "`raw` prompts are not supported: shoal renders the model's own chat template; \
             send the prompt without `raw`",
        ));
    }
    let images = parse_images(obj.get("images"), "images")?;
    let text = |name: &str| -> Result<String, ApiError> {
        match obj.get(name) {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(_) => Err(ApiError::invalid_field(
                name,
                format!("`{name}` must be a string"),
            )),
        }
    };
    let prompt = text("prompt")?;
    let system = text("system")?;
    let mut messages = Vec::new();
    if !system.is_empty() {
        messages.push(ChatMessage {
            role: "system".into(),
            content: system,
            ..ChatMessage::default()
        });
    }
    let load_only = prompt.is_empty() && images.is_empty();
    messages.push(ChatMessage {
        role: "user".into(),
        content: prompt,
        images,
        ..ChatMessage::default()
    });
    Ok((messages, load_only))
}

/// Ollama's `images`: a list of base64-encoded files (no data URL prefix).
fn parse_images(value: Option<&Value>, param: &str) -> Result<Vec<ChatImage>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(list)) => list
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let at = format!("{param}[{i}]");
                match item {
                    Value::String(data) => image_from_base64(data, &at),
                    _ => Err(ApiError::invalid_field(
                        &at,
                        "each image must be a base64 string",
                    )),
                }
            })
            .collect(),
        Some(_) => Err(ApiError::invalid_field(
            param,
            "`images` must be an array of base64 strings",
        )),
    }
}

fn parse_messages(
    value: Option<&Value>,
    ordered: Option<&Ordered>,
) -> Result<Vec<ChatMessage>, ApiError> {
    let list = non_empty_array(value, "messages")?;
    let mut out = Vec::with_capacity(list.len());
    // Ollama's calls carry no ids: each gets one from its place, and each tool result takes
    // the id of the next call not yet answered.
    let mut unanswered: std::collections::VecDeque<ToolCall> = Default::default();
    for (i, m) in list.iter().enumerate() {
        let at = |f: &str| format!("messages[{i}].{f}");
        let Value::Object(m) = m else {
            return Err(ApiError::invalid_field(
                &format!("messages[{i}]"),
                "each message must be an object with `role` and `content`",
            ));
        };
        let role = match m.get("role").and_then(Value::as_str) {
            Some(r @ ("system" | "user" | "assistant" | "tool")) => r.to_string(),
            _ if m.get("role").is_none_or(Value::is_null) => {
                return Err(ApiError::missing_field(&at("role")))
            }
            _ => {
                return Err(ApiError::invalid_field(
                    &at("role"),
                    "`role` must be one of system, user, assistant, tool",
                ))
            }
        };
        let images = parse_images(m.get("images"), &at("images"))?;
        let content = match m.get("content") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(_) => {
                return Err(ApiError::invalid_field(
                    &at("content"),
                    "`content` must be a string",
                ))
            }
        };
        let tool_calls = match role.as_str() {
            "assistant" => parse_tool_calls(
                m.get("tool_calls"),
                ordered
                    .and_then(|o| o.at(i))
                    .and_then(|o| o.get("tool_calls")),
                &at("tool_calls"),
                |j| format!("call{i:03}{j:02}"),
            )?,
            _ => Vec::new(),
        };
        let mut message = ChatMessage {
            tool_calls,
            images,
            ..ChatMessage::new(&role, content)
        };
        if role == "assistant" {
            unanswered = message.tool_calls.iter().cloned().collect();
        }
        if role == "tool" {
            let answered = unanswered.pop_front();
            message.name = match m.get("tool_name") {
                Some(Value::String(name)) => Some(name.clone()),
                _ => answered.as_ref().map(|c| c.name.clone()),
            };
            message.tool_call_id = answered.map(|c| c.id);
        }
        out.push(message);
    }
    Ok(out)
}

/// Ollama's `logprobs: true` with `top_logprobs` (0 to 20) alternatives per token; asking
/// for alternatives asks for log-probabilities too.
fn parse_logprobs(obj: &Map<String, Value>) -> Result<Option<u32>, ApiError> {
    let asked = opt_bool(obj, "logprobs")?.unwrap_or(false);
    let top = crate::fields::opt_top_logprobs(obj)?.unwrap_or(0);
    Ok((asked || top > 0).then_some(top))
}

/// Largest `options.num_ctx` accepted: 2^24 tokens (16 M), beyond any model's context today.
pub const MAX_NUM_CTX: u32 = 1 << 24;

/// `options`, with errors naming `options.FIELD`.
fn parse_options(o: &Map<String, Value>) -> Result<RequestedSampling, ApiError> {
    let named = |e: ApiError| match e.param.clone() {
        Some(p) => e.with_param(format!("options.{p}")),
        None => e,
    };
    let max_tokens = match o.get("num_predict") {
        None | Some(Value::Null) => None,
        // -1: no limit, -2: fill the context; both are the context's limit here.
        Some(Value::Number(n)) if n.as_i64().is_some_and(|v| v < 0) => None,
        Some(_) => match opt_u32(o, "num_predict").map_err(named)? {
            Some(0) | None => {
                return Err(ApiError::invalid_field(
                    "options.num_predict",
                    "`num_predict` must be at least 1 (or -1 for no limit)",
                ))
            }
            n => n,
        },
    };
    // shoal does not size a context per request (an instance's is the model's), so `num_ctx`
    // changes nothing; a value no model could have is still a mistake worth a 400, not a
    // silent success (1e12 was accepted).
    match o.get("num_ctx") {
        None | Some(Value::Null) => {}
        Some(Value::Number(n))
            if n.as_f64().is_some_and(|f| {
                f.fract() == 0.0 && (1.0..=f64::from(MAX_NUM_CTX)).contains(&f)
            }) => {}
        Some(other) => {
            return Err(ApiError::invalid_field(
                "options.num_ctx",
                format!(
                    "`num_ctx` must be an integer between 1 and {MAX_NUM_CTX}, not {}; shoal \
                     uses the model's own context whatever it is, so it may be left out",
                    echo(&other.to_string())
                ),
            ));
        }
    }
    Ok(RequestedSampling {
        max_tokens,
        temperature: opt_f32_in(o, "temperature", 0.0, 2.0).map_err(named)?,
        top_p: opt_f32_in(o, "top_p", 0.0, 1.0).map_err(named)?,
        top_k: opt_u32(o, "top_k").map_err(named)?,
        min_p: opt_f32_in(o, "min_p", 0.0, 1.0).map_err(named)?,
        seed: parse_seed(o).map_err(named)?,
        stop: parse_stop(o.get("stop"), "stop").map_err(named)?,
        presence_penalty: opt_f32_in(o, "presence_penalty", -2.0, 2.0).map_err(named)?,
        frequency_penalty: opt_f32_in(o, "frequency_penalty", -2.0, 2.0).map_err(named)?,
        ..RequestedSampling::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value, e: Endpoint) -> Result<ParsedOllama, ApiError> {
        parse_ollama_request(v.to_string().as_bytes(), e)
    }

    #[test]
    fn chat_with_options() {
        let p = parse(
            json!({"model": "default:latest", "messages": [{"role": "user", "content": "hi"}],
                   "options": {"num_predict": 5, "temperature": 0.5, "top_p": 0.9, "top_k": 3,
                               "seed": 7, "stop": ["x"], "num_ctx": 4096}}),
            Endpoint::Chat,
        )
        .unwrap();
        assert!(p.stream);
        assert_eq!(p.model, "default:latest");
        assert_eq!(p.request.model, "default");
        let s = &p.request.sampling;
        assert_eq!(
            (s.max_tokens, s.temperature, s.top_k, s.seed),
            (Some(5), Some(0.5), Some(3), Some(7))
        );
        assert_eq!(s.stop, vec!["x".to_string()]);
        let p = parse(
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                   "options": {"num_predict": -1}, "stream": false}),
            Endpoint::Chat,
        )
        .unwrap();
        assert_eq!((p.request.sampling.max_tokens, p.stream), (None, false));
    }

    /// `options.num_ctx` beyond any model's context (1e12, 2^24 + 1) or 0 is a 400 naming it
    /// and stating the bound (1e12 used to be accepted); `num_predict` beyond 32 bits too.
    #[test]
    fn num_ctx_and_num_predict_are_bounded() {
        let with = |options: Value| {
            parse(
                json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                       "options": options}),
                Endpoint::Chat,
            )
        };
        for bad in [
            json!(1e12),
            json!(MAX_NUM_CTX + 1),
            json!(0),
            json!(-1),
            json!(8192.5),
        ] {
            let e = with(json!({"num_ctx": bad})).unwrap_err();
            assert_eq!(e.status(), hyper::StatusCode::BAD_REQUEST, "{bad}");
            assert_eq!(e.param.as_deref(), Some("options.num_ctx"), "{bad}");
        }
        for (bad, shown) in [
            (json!(1e12), "1000000000000.0"),
            (json!(MAX_NUM_CTX + 1), "16777217"),
        ] {
            let e = with(json!({"num_ctx": bad})).unwrap_err();
            assert!(
                e.message
                    .contains(&format!("an integer between 1 and 16777216, not {shown}")),
                "{}",
                e.message
            );
        }
        assert!(with(json!({"num_ctx": MAX_NUM_CTX})).is_ok());
        let e = with(json!({"num_predict": 1e12})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("options.num_predict"));
        assert!(e.message.contains("at most 4294967295"), "{}", e.message);
        let p = with(json!({"num_predict": u32::MAX})).unwrap();
        assert_eq!(p.request.sampling.max_tokens, Some(u32::MAX));
    }

    #[test]
    fn generate_with_system_and_load_only() {
        let p = parse(
            json!({"model": "m", "prompt": "hi", "system": "s"}),
            Endpoint::Generate,
        )
        .unwrap();
        assert_eq!(p.request.messages.len(), 2);
        assert!(!p.load_only);
        assert!(
            parse(json!({"model": "m"}), Endpoint::Generate)
                .unwrap()
                .load_only
        );
    }

    #[test]
    fn logprobs_and_their_alternatives() {
        let asked = |extra: Value| {
            let mut body = json!({"model": "m", "prompt": "x"});
            body.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            parse(body, Endpoint::Generate)
                .map(|p| p.request.sampling.logprobs)
                .map_err(|e| e.param)
        };
        assert_eq!(asked(json!({})), Ok(None));
        assert_eq!(asked(json!({"logprobs": true})), Ok(Some(0)));
        assert_eq!(
            asked(json!({"logprobs": true, "top_logprobs": 4})),
            Ok(Some(4))
        );
        assert_eq!(asked(json!({"top_logprobs": 2})), Ok(Some(2)));
        assert_eq!(asked(json!({"logprobs": false})), Ok(None));
        assert_eq!(
            asked(json!({"logprobs": true, "top_logprobs": 21})),
            Err(Some("top_logprobs".into()))
        );
        assert_eq!(
            asked(json!({"logprobs": "yes"})),
            Err(Some("logprobs".into()))
        );
    }

    #[test]
    fn errors_name_their_field() {
        let cases = [
            (json!({"messages": []}), Endpoint::Chat, "model"),
            (json!({"model": "m"}), Endpoint::Chat, "messages"),
            (
                json!({"model": "m", "messages": [{"role": "x", "content": ""}]}),
                Endpoint::Chat,
                "messages[0].role",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "", "images": ["aGk="]}]}),
                Endpoint::Chat,
                "messages[0].images[0]",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "", "images": "aGk="}]}),
                Endpoint::Chat,
                "messages[0].images",
            ),
            (
                json!({"model": "m", "prompt": "x", "images": [5]}),
                Endpoint::Generate,
                "images[0]",
            ),
            (
                json!({"model": "m", "prompt": "x", "options": {"temperature": "hot"}}),
                Endpoint::Generate,
                "options.temperature",
            ),
            (
                json!({"model": "m", "prompt": "x", "options": {"num_predict": 0}}),
                Endpoint::Generate,
                "options.num_predict",
            ),
            (
                json!({"model": "m", "prompt": "x", "raw": true}),
                Endpoint::Generate,
                "raw",
            ),
            (
                json!({"model": "m", "prompt": "x", "format": "xml"}),
                Endpoint::Generate,
                "format",
            ),
            (
                json!({"model": "m", "prompt": "x", "options": 3}),
                Endpoint::Generate,
                "options",
            ),
        ];
        for (body, endpoint, param) in cases {
            let e = parse(body.clone(), endpoint).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
        }
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = parse_ollama_request(&bytes, Endpoint::Chat);
            let _ = parse_ollama_request(&bytes, Endpoint::Generate);
        }
    }
}
