//! The Responses API's answer shapes: the `response` object (one assistant `message` item
//! with one `output_text` part; `status: "incomplete"` with `incomplete_details.reason` when
//! `max_output_tokens` cut it) and the stream's events, in the order OpenAI sends them:
//! `response.created`, `response.in_progress`, `response.output_item.added`,
//! `response.content_part.added`, `response.output_text.delta`…, `response.output_text.done`,
//! `response.content_part.done`, `response.output_item.done`, then `response.completed` or
//! `response.incomplete`; each with its `sequence_number`.

use crate::backend::{FinishReason, TokenLogprob};
use crate::error::ApiError;
use crate::generation::{sse_named, Encoder, Ending, Timings};
use bytes::Bytes;
use serde_json::{json, Value};

/// What every answer to one request shares.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponseMeta {
    /// `resp_...`.
    pub id: String,
    /// `msg_...`, the one output item's id.
    pub item_id: String,
    pub created_at: u64,
    pub model: String,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
}

impl ResponseMeta {
    /// Fresh ids and the current time.
    pub fn new(model: &str) -> ResponseMeta {
        let (suffix, created_at) = crate::ids::unique();
        ResponseMeta {
            id: format!("resp_{suffix}"),
            item_id: format!("msg_{suffix}"),
            created_at,
            model: model.to_string(),
            instructions: None,
            max_output_tokens: None,
            temperature: None,
            top_p: None,
        }
    }
}

/// The `response` object: `ending` absent while in progress.
pub fn response_json(meta: &ResponseMeta, text: Option<&str>, ending: Option<&Ending>) -> Value {
    let (status, incomplete) = match ending {
        None => ("in_progress", Value::Null),
        Some(e) if e.finish_reason == FinishReason::Length => {
            ("incomplete", json!({"reason": "max_output_tokens"}))
        }
        Some(_) => ("completed", Value::Null),
    };
    let output: Vec<Value> = match (text, ending) {
        (Some(text), Some(e)) => vec![message_item(meta, text, Some(e))],
        _ => Vec::new(),
    };
    let usage = ending.map_or(Value::Null, |e| {
        json!({
            "input_tokens": e.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": e.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": e.prompt_tokens.saturating_add(e.completion_tokens),
        })
    });
    json!({
        "id": meta.id,
        "object": "response",
        "created_at": meta.created_at,
        "status": status,
        "error": null,
        "incomplete_details": incomplete,
        "instructions": meta.instructions,
        "max_output_tokens": meta.max_output_tokens,
        "model": meta.model,
        "output": output,
        "parallel_tool_calls": true,
        "previous_response_id": null,
        "store": false,
        "temperature": meta.temperature,
        "top_p": meta.top_p,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "truncation": "disabled",
        "usage": usage,
        "metadata": {},
    })
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// The assistant message item; in progress (no parts yet) without an ending.
fn message_item(meta: &ResponseMeta, text: &str, ending: Option<&Ending>) -> Value {
    let (status, content) = match ending {
        None => ("in_progress", vec![]),
        Some(e) if e.finish_reason == FinishReason::Length => ("incomplete", vec![text_part(text)]),
        Some(_) => ("completed", vec![text_part(text)]),
    };
    json!({"id": meta.item_id, "type": "message", "status": status, "role": "assistant",
           "content": content})
}

/// The event stream of one response.
pub struct ResponsesEncoder {
    pub meta: ResponseMeta,
    sequence: u64,
    text: String,
}

impl ResponsesEncoder {
    pub fn new(meta: ResponseMeta) -> ResponsesEncoder {
        ResponsesEncoder {
            meta,
            sequence: 0,
            text: String::new(),
        }
    }

    /// One event, numbered.
    fn event(&mut self, kind: &str, mut body: Value) -> Bytes {
        body["type"] = json!(kind);
        body["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        sse_named(kind, &body)
    }

    fn part_location(&self) -> Value {
        json!({"item_id": self.meta.item_id, "output_index": 0, "content_index": 0})
    }
}

impl Encoder for ResponsesEncoder {
    fn content_type(&self) -> &'static str {
        "text/event-stream"
    }

    fn start(&mut self, _prompt_tokens: u32) -> Vec<Bytes> {
        let response = response_json(&self.meta, None, None);
        let item = message_item(&self.meta, "", None);
        let mut part = self.part_location();
        part["part"] = text_part("");
        vec![
            self.event("response.created", json!({"response": response})),
            self.event("response.in_progress", json!({"response": response})),
            self.event(
                "response.output_item.added",
                json!({"output_index": 0, "item": item}),
            ),
            self.event("response.content_part.added", part),
        ]
    }

    fn delta(&mut self, text: &str, _logprob: Option<&TokenLogprob>) -> Vec<Bytes> {
        if text.is_empty() {
            return Vec::new();
        }
        self.text.push_str(text);
        let mut body = self.part_location();
        body["delta"] = json!(text);
        body["logprobs"] = json!([]);
        vec![self.event("response.output_text.delta", body)]
    }

    fn finish(&mut self, ending: &Ending, _timings: &Timings) -> Vec<Bytes> {
        let text = std::mem::take(&mut self.text);
        let mut done = self.part_location();
        done["text"] = json!(text);
        done["logprobs"] = json!([]);
        let mut part = self.part_location();
        part["part"] = text_part(&text);
        let item = message_item(&self.meta, &text, Some(ending));
        let response = response_json(&self.meta, Some(&text), Some(ending));
        let last = if ending.finish_reason == FinishReason::Length {
            "response.incomplete"
        } else {
            "response.completed"
        };
        vec![
            self.event("response.output_text.done", done),
            self.event("response.content_part.done", part),
            self.event(
                "response.output_item.done",
                json!({"output_index": 0, "item": item}),
            ),
            self.event(last, json!({"response": response})),
        ]
    }

    fn fail(&mut self, error: &ApiError) -> Vec<Bytes> {
        let mut body = error.to_json();
        body["message"] = json!(error.message);
        body["code"] = json!(error.code);
        vec![self.event("error", body)]
    }

    fn keep_alive(&self) -> Option<Bytes> {
        Some(Bytes::from_static(b": keep-alive\n\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incomplete_when_cut_by_the_limit() {
        let meta = ResponseMeta::new("m");
        let ending = Ending {
            finish_reason: FinishReason::Length,
            stop_sequence: None,
            prompt_tokens: 5,
            completion_tokens: 3,
        };
        let r = response_json(&meta, Some("abc"), Some(&ending));
        assert_eq!(r["status"], "incomplete");
        assert_eq!(r["incomplete_details"]["reason"], "max_output_tokens");
        assert_eq!(r["output"][0]["content"][0]["text"], "abc");
        assert_eq!(r["usage"]["total_tokens"], 8);
    }

    #[test]
    fn events_are_numbered_in_order() {
        let mut e = ResponsesEncoder::new(ResponseMeta::new("m"));
        let mut frames = e.start(3);
        frames.extend(e.delta("hi", None));
        let now = tokio::time::Instant::now();
        let t = Timings {
            received: now,
            accepted: now,
            first_token: None,
            ended: now,
        };
        let ending = Ending {
            finish_reason: FinishReason::Stop,
            stop_sequence: None,
            prompt_tokens: 3,
            completion_tokens: 1,
        };
        frames.extend(e.finish(&ending, &t));
        let names: Vec<String> = frames
            .iter()
            .map(|f| {
                let text = String::from_utf8_lossy(f).to_string();
                text.lines().next().unwrap_or("").replace("event: ", "")
            })
            .collect();
        assert_eq!(
            names,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed"
            ]
        );
        let last = String::from_utf8_lossy(&frames[8]).to_string();
        assert!(last.contains("\"sequence_number\":8"), "{last}");
    }
}
