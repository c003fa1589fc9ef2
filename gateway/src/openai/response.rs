//! OpenAI's response shapes: `chat.completion`, `chat.completion.chunk` and the model list.
//! Built as JSON values with absent fields omitted rather than null (clients broke on nulls
//! in exo).

use crate::backend::{FinishReason, ModelInfo, TokenLogprob, ToolCall};
use serde_json::{json, Map, Value};

/// Identity shared by every chunk of one completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompletionMeta {
    /// `chatcmpl-...`, unique per node process.
    pub id: String,
    /// Unix seconds when the request was accepted.
    pub created: u64,
    /// The model as the client named it.
    pub model: String,
}

impl CompletionMeta {
    /// A fresh id and the current time.
    pub fn new(model: &str) -> CompletionMeta {
        let (suffix, created) = crate::ids::unique();
        CompletionMeta {
            id: format!("chatcmpl-{suffix}"),
            created,
            model: model.to_string(),
        }
    }
}

/// Token counts of one completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    /// Of `prompt_tokens`, those the engine's prompt cache held.
    pub cached_tokens: u32,
}

impl Usage {
    /// OpenAI's `usage` object.
    pub fn to_json(self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens.saturating_add(self.completion_tokens),
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        })
    }
}

/// The `logprobs` object of a choice: `{"content": [...]}`.
pub fn logprobs_json(tokens: &[TokenLogprob]) -> Value {
    let content: Vec<Value> = tokens.iter().map(token_logprob_json).collect();
    json!({ "content": content })
}

/// One token's entry, as chat completions' `logprobs.content[]` and the Responses API's
/// `output_text.logprobs[]` both spell it: `{token, logprob, bytes, top_logprobs: [{token,
/// logprob, bytes}]}`, `bytes` being what the token stands for (see
/// [`TokenLogprob::bytes`]).
pub fn token_logprob_json(t: &TokenLogprob) -> Value {
    let top: Vec<Value> = t
        .top
        .iter()
        .enumerate()
        .map(|(i, (token, logprob))| {
            json!({"token": token, "logprob": logprob, "bytes": t.top_bytes(i)})
        })
        .collect();
    json!({
        "token": t.token,
        "logprob": t.logprob,
        "bytes": t.token_bytes(),
        "top_logprobs": top,
    })
}

/// OpenAI's finish reason: `tool_calls` when the answer ended after calling tools.
pub fn finish_reason_str(finish_reason: FinishReason, tool_calls: usize) -> &'static str {
    match finish_reason {
        FinishReason::Stop if tool_calls > 0 => "tool_calls",
        other => other.as_str(),
    }
}

/// A call as a message's `tool_calls` item: `{"id", "type": "function", "function": {"name",
/// "arguments"}}` (`index` too in a streamed delta).
pub fn tool_call_json(call: &ToolCall, index: Option<usize>) -> Value {
    let mut item = json!({
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    });
    if let Some(i) = index {
        item["index"] = json!(i);
    }
    item
}

/// A streamed call's first delta: `{index, id, type, function: {name, arguments: ""}}`, as
/// OpenAI starts one.
pub fn tool_call_start_json(index: usize, id: &str, name: &str) -> Value {
    json!({"index": index, "id": id, "type": "function",
           "function": {"name": name, "arguments": ""}})
}

/// A streamed call's later delta: `{index, function: {arguments: FRAGMENT}}`.
pub fn tool_call_arguments_json(index: usize, fragment: &str) -> Value {
    json!({"index": index, "function": {"arguments": fragment}})
}

/// What a whole answer says besides its text.
#[derive(Debug, Clone, Copy)]
pub struct AnswerParts<'a> {
    pub text: &'a str,
    pub reasoning: &'a str,
    pub tool_calls: &'a [ToolCall],
}

/// A whole non-streaming answer (`chat.completion`).
pub fn completion_json(
    meta: &CompletionMeta,
    answer: AnswerParts<'_>,
    finish_reason: FinishReason,
    logprobs: Option<&[TokenLogprob]>,
    usage: Usage,
) -> Value {
    let mut choice = Map::new();
    choice.insert("index".into(), json!(0));
    // With calls and no text, `content` is null, as OpenAI answers.
    let content = match (answer.text, answer.tool_calls) {
        ("", [_, ..]) => Value::Null,
        (text, _) => json!(text),
    };
    let mut message = json!({"role": "assistant", "content": content});
    if !answer.reasoning.is_empty() {
        message["reasoning_content"] = json!(answer.reasoning);
    }
    if !answer.tool_calls.is_empty() {
        let calls: Vec<Value> = answer
            .tool_calls
            .iter()
            .map(|c| tool_call_json(c, None))
            .collect();
        message["tool_calls"] = json!(calls);
    }
    choice.insert("message".into(), message);
    if let Some(lp) = logprobs {
        choice.insert("logprobs".into(), logprobs_json(lp));
    }
    choice.insert(
        "finish_reason".into(),
        json!(finish_reason_str(finish_reason, answer.tool_calls.len())),
    );
    json!({
        "id": meta.id,
        "object": "chat.completion",
        "created": meta.created,
        "model": meta.model,
        "choices": [choice],
        "usage": usage.to_json(),
    })
}

/// What one streamed chunk carries.
#[derive(Debug, Clone, Default)]
pub struct ChunkDelta<'a> {
    /// Only in the first chunk.
    pub role: bool,
    pub content: Option<&'a str>,
    /// The model's thinking (`reasoning_content`, as DeepSeek's and vLLM's APIs name it).
    pub reasoning: Option<&'a str>,
    pub logprobs: Option<&'a [TokenLogprob]>,
    /// One streamed call's item (`tool_calls: [ITEM]`): a whole call, a call's start or a
    /// piece of its arguments ([`tool_call_json`], [`tool_call_start_json`],
    /// [`tool_call_arguments_json`]).
    pub tool_call: Option<Value>,
    /// OpenAI's spelling ([`finish_reason_str`]).
    pub finish_reason: Option<&'static str>,
}

/// One `chat.completion.chunk` with a single choice.
pub fn chunk_json(meta: &CompletionMeta, delta: ChunkDelta<'_>) -> Value {
    let mut d = Map::new();
    if delta.role {
        d.insert("role".into(), json!("assistant"));
    }
    if let Some(content) = delta.content {
        d.insert("content".into(), json!(content));
    }
    if let Some(reasoning) = delta.reasoning {
        d.insert("reasoning_content".into(), json!(reasoning));
    }
    if let Some(item) = delta.tool_call {
        d.insert("tool_calls".into(), json!([item]));
    }
    let mut choice = Map::new();
    choice.insert("index".into(), json!(0));
    choice.insert("delta".into(), Value::Object(d));
    if let Some(lp) = delta.logprobs {
        choice.insert("logprobs".into(), logprobs_json(lp));
    }
    if let Some(reason) = delta.finish_reason {
        choice.insert("finish_reason".into(), json!(reason));
    }
    json!({
        "id": meta.id,
        "object": "chat.completion.chunk",
        "created": meta.created,
        "model": meta.model,
        "choices": [choice],
    })
}

/// The last chunk when `stream_options.include_usage` is set: no choices, only usage.
pub fn usage_chunk_json(meta: &CompletionMeta, usage: Usage) -> Value {
    json!({
        "id": meta.id,
        "object": "chat.completion.chunk",
        "created": meta.created,
        "model": meta.model,
        "choices": [],
        "usage": usage.to_json(),
    })
}

/// `GET /v1/models`.
pub fn models_json(models: &[ModelInfo]) -> Value {
    let data: Vec<Value> = models
        .iter()
        .map(|m| {
            let mut entry = json!({
                "id": m.id,
                "object": "model",
                "created": m.created,
                "owned_by": m.owned_by,
                "ready": m.ready,
            });
            if let Some(shape) = &m.shape {
                entry["shape"] = json!(shape);
            }
            entry
        })
        .collect();
    json!({ "object": "list", "data": data })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique() {
        assert_ne!(CompletionMeta::new("m").id, CompletionMeta::new("m").id);
    }

    #[test]
    fn chunk_omits_absent_fields() {
        let meta = CompletionMeta::new("m");
        let c = chunk_json(
            &meta,
            ChunkDelta {
                content: Some("x"),
                ..Default::default()
            },
        );
        assert_eq!(c["object"], "chat.completion.chunk");
        let choice = &c["choices"][0];
        assert_eq!(choice["delta"], json!({"content": "x"}));
        assert!(choice.get("finish_reason").is_none());
        assert!(choice.get("logprobs").is_none());
        assert!(c.get("usage").is_none());
    }

    #[test]
    fn completion_has_usage_totals() {
        let meta = CompletionMeta::new("m");
        let c = completion_json(
            &meta,
            AnswerParts {
                text: "hi",
                reasoning: "",
                tool_calls: &[],
            },
            FinishReason::Length,
            None,
            Usage {
                prompt_tokens: 3,
                completion_tokens: 2,
                cached_tokens: 1,
            },
        );
        assert_eq!(c["usage"]["total_tokens"], 5);
        assert_eq!(c["usage"]["prompt_tokens_details"]["cached_tokens"], 1);
        assert_eq!(c["choices"][0]["finish_reason"], "length");
        assert_eq!(c["choices"][0]["message"]["content"], "hi");
    }
}
