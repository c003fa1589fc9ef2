//! The Responses API's answer shapes: the `response` object (one assistant `message` item
//! with one `output_text` part; `status: "incomplete"` with `incomplete_details.reason` when
//! `max_output_tokens` cut it) and the stream's events, in the order OpenAI sends them:
//! `response.created`, `response.in_progress`, `response.output_item.added`,
//! `response.content_part.added`, `response.output_text.delta`…, `response.output_text.done`,
//! `response.content_part.done`, `response.output_item.done`, then `response.completed` or
//! `response.incomplete`; each with its `sequence_number`.
//!
//! Log-probabilities (asked with `include: ["message.output_text.logprobs"]` and
//! `top_logprobs`) go in each `output_text` part's `logprobs` and in each
//! `response.output_text.delta` event's, one entry per token as chat completions spell them
//! ([`token_logprob_json`]); a token with no text of its own (part of a character) goes with
//! the next delta.

use crate::backend::{FinishReason, TokenLogprob, ToolCall};
use crate::error::ApiError;
use crate::generation::{sse_named, Encoder, Ending, Timings};
use crate::openai::response::token_logprob_json;
use bytes::Bytes;
use serde_json::{json, Value};

/// What every answer to one request shares.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponseMeta {
    /// `resp_...`.
    pub id: String,
    /// `msg_...`, the message item's id.
    pub item_id: String,
    /// `rs_...`, the reasoning item's id (when the model thinks).
    pub reasoning_id: String,
    pub created_at: u64,
    pub model: String,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u64>,
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
            reasoning_id: format!("rs_{suffix}"),
            created_at,
            model: model.to_string(),
            instructions: None,
            max_output_tokens: None,
            temperature: None,
            top_p: None,
        }
    }
}

/// The output items of a whole answer: a reasoning item when the model thought, the message
/// (left out when the answer is only function calls), then a `function_call` item per call.
/// `logprobs` are the answer's tokens' (empty when not asked for).
pub fn output_items(
    meta: &ResponseMeta,
    (text, reasoning): (&str, &str),
    calls: &[ToolCall],
    logprobs: &[TokenLogprob],
    ending: &Ending,
) -> Vec<Value> {
    let mut output = Vec::new();
    if !reasoning.is_empty() {
        output.push(reasoning_item(meta, Some(reasoning)));
    }
    if !text.is_empty() || calls.is_empty() {
        let logprobs: Vec<Value> = logprobs.iter().map(token_logprob_json).collect();
        output.push(message_item(&meta.item_id, (text, &logprobs), Some(ending)));
    }
    output.extend(calls.iter().map(|c| function_call_item(c, true)));
    output
}

/// The `response` object: `ending` absent while in progress (and `output` empty).
pub fn response_json(meta: &ResponseMeta, output: &[Value], ending: Option<&Ending>) -> Value {
    let (status, incomplete) = match ending {
        None => ("in_progress", Value::Null),
        Some(e) if e.finish_reason == FinishReason::Length => {
            ("incomplete", json!({"reason": "max_output_tokens"}))
        }
        Some(_) => ("completed", Value::Null),
    };
    let usage = ending.map_or(Value::Null, |e| {
        json!({
            "input_tokens": e.prompt_tokens,
            "input_tokens_details": {"cached_tokens": e.cached_tokens},
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

fn text_part(text: &str, logprobs: &[Value]) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs})
}

/// An assistant message item with its text and the text's token log-probabilities; in
/// progress (no parts yet) without an ending.
fn message_item(id: &str, (text, logprobs): (&str, &[Value]), ending: Option<&Ending>) -> Value {
    let (status, content) = match ending {
        None => ("in_progress", vec![]),
        Some(e) if e.finish_reason == FinishReason::Length => {
            ("incomplete", vec![text_part(text, logprobs)])
        }
        Some(_) => ("completed", vec![text_part(text, logprobs)]),
    };
    json!({"id": id, "type": "message", "status": status, "role": "assistant",
           "content": content})
}

/// A call as a `function_call` item (`call_id` is what the client's
/// `function_call_output` names); `done` with its arguments, else in progress and empty.
fn function_call_item(call: &ToolCall, done: bool) -> Value {
    let (status, arguments) = if done {
        ("completed", call.arguments.as_str())
    } else {
        ("in_progress", "")
    };
    json!({"id": format!("fc_{}", call.id), "type": "function_call", "status": status,
           "call_id": call.id, "name": call.name, "arguments": arguments})
}

/// The reasoning item; in progress (no content yet) without its text.
fn reasoning_item(meta: &ResponseMeta, text: Option<&str>) -> Value {
    let (status, content) = match text {
        None => ("in_progress", vec![]),
        Some(t) => (
            "completed",
            vec![json!({"type": "reasoning_text", "text": t})],
        ),
    };
    json!({"id": meta.reasoning_id, "type": "reasoning", "status": status, "summary": [],
           "content": content})
}

/// The event stream of one response.
pub struct ResponsesEncoder {
    pub meta: ResponseMeta,
    sequence: u64,
    text: String,
    reasoning: String,
    /// The reasoning item's output index while it is open.
    reasoning_open: Option<usize>,
    /// The open message item: its id and output index.
    message_at: Option<(String, usize)>,
    /// Message items opened so far (the first has the meta's id, later ones a suffix).
    messages: usize,
    /// The items closed so far, in output order, for the final `response`.
    done: Vec<Value>,
    next_index: usize,
    /// The open `function_call` item's output index and id.
    call_at: Option<(usize, String)>,
    /// The open message's token log-probabilities so far.
    logprobs: Vec<Value>,
    /// Those not sent yet (tokens without text of their own wait for the next delta).
    unsent_logprobs: Vec<Value>,
}

impl ResponsesEncoder {
    pub fn new(meta: ResponseMeta) -> ResponsesEncoder {
        ResponsesEncoder {
            meta,
            sequence: 0,
            text: String::new(),
            reasoning: String::new(),
            reasoning_open: None,
            message_at: None,
            messages: 0,
            done: Vec::new(),
            next_index: 0,
            call_at: None,
            logprobs: Vec::new(),
            unsent_logprobs: Vec::new(),
        }
    }

    /// One event, numbered.
    fn event(&mut self, kind: &str, mut body: Value) -> Bytes {
        body["type"] = json!(kind);
        body["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        sse_named(kind, &body)
    }

    fn location(&self, item_id: &str, output_index: usize) -> Value {
        json!({"item_id": item_id, "output_index": output_index, "content_index": 0})
    }

    /// Closes the reasoning item if it is open.
    fn close_reasoning(&mut self) -> Vec<Bytes> {
        let Some(index) = self.reasoning_open.take() else {
            return Vec::new();
        };
        let id = self.meta.reasoning_id.clone();
        let mut done = self.location(&id, index);
        done["text"] = json!(self.reasoning);
        let item = reasoning_item(&self.meta, Some(&self.reasoning));
        self.done.push(item.clone());
        vec![
            self.event("response.reasoning_text.done", done),
            self.event(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
            ),
        ]
    }

    /// Opens a message item (closing the reasoning first) unless one is open; returns the
    /// frames, its id and output index.
    fn message(&mut self) -> (Vec<Bytes>, String, usize) {
        if let Some((id, index)) = &self.message_at {
            return (Vec::new(), id.clone(), *index);
        }
        let mut frames = self.close_reasoning();
        let index = self.next_index;
        self.next_index += 1;
        let id = match self.messages {
            0 => self.meta.item_id.clone(),
            n => format!("{}_{n}", self.meta.item_id),
        };
        self.messages += 1;
        self.message_at = Some((id.clone(), index));
        let item = message_item(&id, ("", &[]), None);
        let mut part = self.location(&id, index);
        part["part"] = text_part("", &[]);
        frames.push(self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        ));
        frames.push(self.event("response.content_part.added", part));
        (frames, id, index)
    }

    /// Closes the open message item, if any, with the text it received.
    fn close_message(&mut self, ending: &Ending) -> Vec<Bytes> {
        let Some((id, index)) = self.message_at.take() else {
            return Vec::new();
        };
        let text = std::mem::take(&mut self.text);
        let logprobs = std::mem::take(&mut self.logprobs);
        self.unsent_logprobs.clear();
        let mut done = self.location(&id, index);
        done["text"] = json!(text);
        done["logprobs"] = json!(logprobs);
        let mut part = self.location(&id, index);
        part["part"] = text_part(&text, &logprobs);
        let item = message_item(&id, (&text, &logprobs), Some(ending));
        self.done.push(item.clone());
        vec![
            self.event("response.output_text.done", done),
            self.event("response.content_part.done", part),
            self.event(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
            ),
        ]
    }
}

/// An ending for items closed before the answer's end: they are complete.
const COMPLETE: Ending = Ending {
    finish_reason: FinishReason::Stop,
    stop_sequence: None,
    prompt_tokens: 0,
    completion_tokens: 0,
    cached_tokens: 0,
    tool_calls: 0,
};

impl Encoder for ResponsesEncoder {
    fn content_type(&self) -> &'static str {
        "text/event-stream"
    }

    fn start(&mut self, _prompt_tokens: u32) -> Vec<Bytes> {
        let response = response_json(&self.meta, &[], None);
        vec![
            self.event("response.created", json!({"response": response})),
            self.event("response.in_progress", json!({"response": response})),
        ]
    }

    fn delta(&mut self, text: &str, logprob: Option<&TokenLogprob>) -> Vec<Bytes> {
        if let Some(l) = logprob {
            let entry = token_logprob_json(l);
            self.logprobs.push(entry.clone());
            self.unsent_logprobs.push(entry);
        }
        if text.is_empty() {
            return Vec::new();
        }
        let (mut frames, id, index) = self.message();
        self.text.push_str(text);
        let mut body = self.location(&id, index);
        body["delta"] = json!(text);
        body["logprobs"] = json!(std::mem::take(&mut self.unsent_logprobs));
        frames.push(self.event("response.output_text.delta", body));
        frames
    }

    fn reasoning(&mut self, text: &str) -> Vec<Bytes> {
        let mut frames = Vec::new();
        let index = match self.reasoning_open {
            Some(index) => index,
            None => {
                let index = self.next_index;
                self.next_index += 1;
                self.reasoning_open = Some(index);
                let item = reasoning_item(&self.meta, None);
                frames.push(self.event(
                    "response.output_item.added",
                    json!({"output_index": index, "item": item}),
                ));
                index
            }
        };
        self.reasoning.push_str(text);
        let id = self.meta.reasoning_id.clone();
        let mut body = self.location(&id, index);
        body["delta"] = json!(text);
        frames.push(self.event("response.reasoning_text.delta", body));
        frames
    }

    fn tool_call_start(&mut self, _index: usize, id: &str, name: &str) -> Vec<Bytes> {
        let mut frames = self.close_reasoning();
        frames.extend(self.close_message(&COMPLETE));
        let index = self.next_index;
        self.next_index += 1;
        self.call_at = Some((index, format!("fc_{id}")));
        let call = ToolCall {
            id: id.to_string(),
            name: name.to_string(),
            arguments: String::new(),
        };
        frames.push(self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": function_call_item(&call, false)}),
        ));
        frames
    }

    fn tool_call_arguments(&mut self, _index: usize, fragment: &str) -> Vec<Bytes> {
        let Some((index, item_id)) = self.call_at.clone() else {
            return Vec::new();
        };
        vec![self.event(
            "response.function_call_arguments.delta",
            json!({"item_id": item_id, "output_index": index, "delta": fragment}),
        )]
    }

    fn tool_call_end(&mut self, _index: usize, call: &ToolCall) -> Vec<Bytes> {
        let Some((index, item_id)) = self.call_at.take() else {
            return Vec::new();
        };
        let item = function_call_item(call, true);
        self.done.push(item.clone());
        vec![
            self.event(
                "response.function_call_arguments.done",
                json!({"item_id": item_id, "output_index": index, "name": call.name,
                       "arguments": call.arguments}),
            ),
            self.event(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
            ),
        ]
    }

    fn finish(&mut self, ending: &Ending, _timings: &Timings) -> Vec<Bytes> {
        let mut frames = Vec::new();
        // Every response has its message unless it only called functions.
        if self.message_at.is_some() || ending.tool_calls == 0 {
            let (opened, _, _) = self.message();
            frames = opened;
        }
        frames.extend(self.close_reasoning());
        frames.extend(self.close_message(ending));
        let response = response_json(&self.meta, &self.done, Some(ending));
        let last = if ending.finish_reason == FinishReason::Length {
            "response.incomplete"
        } else {
            "response.completed"
        };
        frames.push(self.event(last, json!({"response": response})));
        frames
    }

    fn fail(&mut self, error: &ApiError) -> Vec<Bytes> {
        let mut body = error.to_json();
        body["message"] = json!(error.client_message());
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
            cached_tokens: 4,
            tool_calls: 0,
        };
        let output = output_items(&meta, ("abc", ""), &[], &[], &ending);
        let r = response_json(&meta, &output, Some(&ending));
        assert_eq!(r["status"], "incomplete");
        assert_eq!(r["incomplete_details"]["reason"], "max_output_tokens");
        assert_eq!(r["output"][0]["content"][0]["text"], "abc");
        assert_eq!(r["usage"]["total_tokens"], 8);
        assert_eq!(r["usage"]["input_tokens_details"]["cached_tokens"], 4);
    }

    #[test]
    fn deltas_carry_their_tokens_logprobs_and_the_part_all_of_them() {
        let mut e = ResponsesEncoder::new(ResponseMeta::new("m"));
        let token = |text: &str, bytes: Vec<u8>| TokenLogprob {
            token: text.into(),
            logprob: -0.5,
            top: vec![(text.into(), -0.5), ("x".into(), -2.0)],
            bytes: vec![bytes.clone(), bytes, b"x".to_vec()],
        };
        let mut frames = e.start(3);
        // "€" split over two tokens: the first has no text and waits for the second's delta.
        frames.extend(e.delta("", Some(&token("\u{FFFD}", vec![0xe2]))));
        frames.extend(e.delta("€", Some(&token("\u{FFFD}", vec![0x82, 0xac]))));
        let now = tokio::time::Instant::now();
        let t = Timings {
            received: now,
            accepted: now,
            first_token: None,
            ended: now,
        };
        frames.extend(e.finish(&COMPLETE, &t));
        let events: Vec<Value> = frames
            .iter()
            .filter_map(|f| {
                let text = String::from_utf8_lossy(f).to_string();
                let data = text.lines().find_map(|l| l.strip_prefix("data: "))?;
                serde_json::from_str(data).ok()
            })
            .collect();
        let of = |kind: &str| events.iter().find(|e| e["type"] == kind).unwrap().clone();
        let delta = of("response.output_text.delta");
        let logprobs = delta["logprobs"].as_array().unwrap();
        assert_eq!(logprobs.len(), 2, "{delta}");
        assert_eq!(logprobs[0]["bytes"], json!([0xe2]));
        assert_eq!(logprobs[1]["bytes"], json!([0x82, 0xac]));
        assert_eq!(logprobs[1]["top_logprobs"][1]["token"], "x");
        let done = of("response.output_text.done");
        assert_eq!(done["logprobs"].as_array().unwrap().len(), 2);
        let completed = of("response.completed");
        let part = &completed["response"]["output"][0]["content"][0];
        assert_eq!(part["logprobs"].as_array().unwrap().len(), 2, "{part}");
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
            cached_tokens: 0,
            tool_calls: 0,
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
