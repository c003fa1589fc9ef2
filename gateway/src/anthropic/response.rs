//! Anthropic's answer shapes: the `message` object and the stream's events (`message_start`,
//! `content_block_start`, `ping`, `content_block_delta` with `text_delta`,
//! `content_block_stop`, `message_delta` with the stop reason and usage, `message_stop`).

use crate::backend::{FinishReason, TokenLogprob, ToolCall};
use crate::error::ApiError;
use crate::generation::{sse_named, Encoder, Ending, Timings};
use bytes::Bytes;
use serde_json::{json, Value};

/// A fresh `msg_...` id, unique per node process.
pub fn message_id() -> String {
    format!("msg_{}", crate::ids::unique().0)
}

/// Anthropic's `stop_reason`.
pub fn stop_reason(ending: &Ending) -> &'static str {
    match (ending.finish_reason, &ending.stop_sequence) {
        (FinishReason::Length, _) => "max_tokens",
        (FinishReason::Stop, Some(_)) => "stop_sequence",
        (FinishReason::Stop, None) if ending.tool_calls > 0 => "tool_use",
        (FinishReason::Stop, None) => "end_turn",
    }
}

/// A call's arguments as the object `input` holds (an object even if the text is not one).
fn input_json(call: &ToolCall) -> Value {
    serde_json::from_str::<Value>(&call.arguments)
        .ok()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}))
}

/// The whole `message`: a `thinking` block first when the model thought, the text block
/// (left out when the answer is only tool calls), then a `tool_use` block per call.
pub fn message_json(
    id: &str,
    model: &str,
    (text, thinking): (&str, &str),
    tool_calls: &[ToolCall],
    ending: &Ending,
) -> Value {
    let mut content = Vec::new();
    if !thinking.is_empty() {
        content.push(json!({"type": "thinking", "thinking": thinking, "signature": ""}));
    }
    if !text.is_empty() || tool_calls.is_empty() {
        content.push(json!({"type": "text", "text": text}));
    }
    for call in tool_calls {
        content.push(json!({"type": "tool_use", "id": call.id, "name": call.name, "input": input_json(call)}));
    }
    json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(ending),
        "stop_sequence": ending.stop_sequence,
        "usage": usage_json(ending),
    })
}

/// The `usage` of a finished message. `input_tokens` counts the whole prompt (as
/// `count_tokens` does); `cache_read_input_tokens`, the part of it the engine's prompt cache
/// held (the cache needs no `cache_control` and is never written on request, so
/// `cache_creation_input_tokens` is 0).
fn usage_json(ending: &Ending) -> Value {
    json!({
        "input_tokens": ending.prompt_tokens,
        "output_tokens": ending.completion_tokens,
        "cache_read_input_tokens": ending.cached_tokens,
        "cache_creation_input_tokens": 0,
    })
}

/// Anthropic's error body, `{"type": "error", "error": {"type", "message"}}`.
pub fn error_json(e: &ApiError) -> Value {
    use crate::error::ErrorKind::*;
    let kind = match e.kind {
        InvalidRequest | MethodNotAllowed | Conflict | RequestTimeout => "invalid_request_error",
        Unauthorized => "authentication_error",
        Forbidden => "permission_error",
        NotFound => "not_found_error",
        PayloadTooLarge => "request_too_large",
        Unavailable => "overloaded_error",
        Busy => "rate_limit_error",
        Internal => "api_error",
    };
    json!({"type": "error", "error": {"type": kind, "message": e.client_message()}})
}

/// The stream of one message: a `thinking` block when the model thinks, then a text block,
/// and a `tool_use` block per call (its `input` streamed as `input_json_delta`s). Blocks
/// open when their first delta comes, so their indexes follow the output.
pub struct MessagesEncoder {
    id: String,
    model: String,
    /// The open block: its index and whether it is the thinking block.
    open: Option<(usize, bool)>,
    /// The open `tool_use` block's index.
    tool_open: Option<usize>,
    next_index: usize,
    /// Tool calls sent.
    calls: usize,
}

impl MessagesEncoder {
    pub fn new(id: String, model: String) -> MessagesEncoder {
        MessagesEncoder {
            id,
            model,
            open: None,
            tool_open: None,
            next_index: 0,
            calls: 0,
        }
    }

    /// Makes the open block the thinking one or the text one, closing the other; returns
    /// the frames and the block's index.
    fn block(&mut self, thinking: bool) -> (Vec<Bytes>, usize) {
        let mut frames: Vec<Bytes> = self.tool_open.take().map(block_stop).into_iter().collect();
        if let Some((index, kind)) = self.open {
            if kind == thinking {
                return (frames, index);
            }
            frames.push(block_stop(index));
        }
        let index = self.next_index;
        self.next_index += 1;
        self.open = Some((index, thinking));
        let block = if thinking {
            json!({"type": "thinking", "thinking": "", "signature": ""})
        } else {
            json!({"type": "text", "text": ""})
        };
        frames.push(sse_named(
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": block}),
        ));
        (frames, index)
    }
}

fn block_stop(index: usize) -> Bytes {
    sse_named(
        "content_block_stop",
        &json!({"type": "content_block_stop", "index": index}),
    )
}

impl Encoder for MessagesEncoder {
    fn content_type(&self) -> &'static str {
        "text/event-stream"
    }

    fn start(&mut self, prompt_tokens: u32) -> Vec<Bytes> {
        let message = json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": null,
            "stop_sequence": null,
            "usage": {"input_tokens": prompt_tokens, "output_tokens": 0},
        });
        vec![
            sse_named(
                "message_start",
                &json!({"type": "message_start", "message": message}),
            ),
            ping(),
        ]
    }

    fn delta(&mut self, text: &str, _logprob: Option<&TokenLogprob>) -> Vec<Bytes> {
        if text.is_empty() {
            return Vec::new();
        }
        let (mut frames, index) = self.block(false);
        frames.push(sse_named(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": index,
                    "delta": {"type": "text_delta", "text": text}}),
        ));
        frames
    }

    fn reasoning(&mut self, text: &str) -> Vec<Bytes> {
        let (mut frames, index) = self.block(true);
        frames.push(sse_named(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": index,
                    "delta": {"type": "thinking_delta", "thinking": text}}),
        ));
        frames
    }

    fn tool_call_start(&mut self, _index: usize, id: &str, name: &str) -> Vec<Bytes> {
        let mut frames: Vec<Bytes> = self
            .open
            .take()
            .map(|(i, _)| i)
            .into_iter()
            .chain(self.tool_open.take())
            .map(block_stop)
            .collect();
        let index = self.next_index;
        self.next_index += 1;
        self.calls += 1;
        self.tool_open = Some(index);
        let block = json!({"type": "tool_use", "id": id, "name": name, "input": {}});
        frames.push(sse_named(
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": block}),
        ));
        frames
    }

    fn tool_call_arguments(&mut self, _index: usize, fragment: &str) -> Vec<Bytes> {
        let Some(index) = self.tool_open else {
            return Vec::new();
        };
        vec![sse_named(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": fragment}}),
        )]
    }

    fn tool_call_end(&mut self, _index: usize, _call: &ToolCall) -> Vec<Bytes> {
        self.tool_open.take().map(block_stop).into_iter().collect()
    }

    fn finish(&mut self, ending: &Ending, _timings: &Timings) -> Vec<Bytes> {
        // Every message has its text block, empty if nothing was said, unless it called tools.
        let mut frames: Vec<Bytes> = self.tool_open.take().map(block_stop).into_iter().collect();
        if self.calls == 0 || self.open.is_some() {
            let (opened, index) = self.block(false);
            frames.extend(opened);
            frames.push(block_stop(index));
        }
        frames.push(sse_named(
            "message_delta",
            &json!({
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason(ending), "stop_sequence": ending.stop_sequence},
                "usage": usage_json(ending),
            }),
        ));
        frames.push(sse_named("message_stop", &json!({"type": "message_stop"})));
        frames
    }

    fn fail(&mut self, error: &ApiError) -> Vec<Bytes> {
        vec![sse_named("error", &error_json(error))]
    }

    fn keep_alive(&self) -> Option<Bytes> {
        Some(ping())
    }
}

fn ping() -> Bytes {
    sse_named("ping", &json!({"type": "ping"}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ending(reason: FinishReason, stop: Option<&str>) -> Ending {
        Ending {
            finish_reason: reason,
            stop_sequence: stop.map(str::to_string),
            prompt_tokens: 3,
            completion_tokens: 2,
            cached_tokens: 2,
            tool_calls: 0,
        }
    }

    #[test]
    fn stop_reasons() {
        assert_eq!(
            stop_reason(&ending(FinishReason::Length, None)),
            "max_tokens"
        );
        assert_eq!(stop_reason(&ending(FinishReason::Stop, None)), "end_turn");
        let m = message_json(
            "msg_1",
            "m",
            ("hi", "hmm"),
            &[],
            &ending(FinishReason::Stop, Some("X")),
        );
        assert_eq!(m["content"][0]["thinking"], "hmm");
        assert_eq!(m["content"][1]["text"], "hi");
        assert_eq!(m["stop_reason"], "stop_sequence");
        assert_eq!(m["stop_sequence"], "X");
        assert_eq!(m["usage"]["input_tokens"], 3);
        assert_eq!(m["usage"]["cache_read_input_tokens"], 2);
        assert_eq!(m["usage"]["cache_creation_input_tokens"], 0);
    }

    #[test]
    fn errors_have_anthropic_types() {
        let e = error_json(&ApiError::model_not_found("x", &[]));
        assert_eq!(e["type"], "error");
        assert_eq!(e["error"]["type"], "not_found_error");
        let e = error_json(&ApiError::missing_field("max_tokens"));
        assert_eq!(e["error"]["type"], "invalid_request_error");
        assert!(e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_tokens"));
    }
}
