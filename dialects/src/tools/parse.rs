//! Tool calls parsed back out of generated text, as it streams, for the formats of the
//! families shoal runs:
//!
//! - **Hermes / Qwen2.5 / Qwen3**: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
//!   anywhere in the answer, one or more;
//! - **Mistral**: `[TOOL_CALLS]` followed by a JSON list of `{"name", "arguments", "id"?}`
//!   (Mistral Nemo, tokenizer v3) or by `name[CALL_ID]id[ARGS]{...}` / `name[ARGS]{...}`
//!   (Mistral Small 3.2 and later), one or more;
//! - **Llama 3.1 / 3.2 / 3.3**: an answer that *is* JSON, `{"name": ..., "parameters": {...}}`
//!   (`"arguments"` accepted too), optionally after `<|python_tag|>`, several joined by `;`.
//!
//! One parser recognises all three, so that it needs no knowledge of the model (a forwarded
//! chat's answer is parsed where the client is). A call counts only if it names one of the
//! request's tools and its arguments are an object that fits the tool's schema
//! ([`crate::tools::schema`]); anything else — malformed JSON, an unknown tool, a call cut
//! off by `max_tokens` — stays text, exactly as generated. Never an error, never a panic.
//!
//! Streaming: text is released as soon as it cannot be the start of a call (only a possible
//! marker prefix, and trailing whitespace, is held back); a call is held until it is complete
//! and checked, then released whole, so a client never sees a call that later turns out to be
//! text. Whitespace around calls is formatting and is dropped with them. When the API streams
//! arguments ([`ToolCallParser::stream_arguments`]), a Hermes call streams them as soon as its
//! name is read and offered ([`crate::tools::stream`]), and so do Mistral's and Llama's.
//!
//! A Hermes call whose JSON object is complete counts without its closing `</tool_call>`
//! when other text follows it (small models go on writing prose after the object); the text
//! after it is text.

use crate::text_scan::{held_suffix, json_value_len};
use crate::tools::json::Ordered;
use crate::tools::offered::Offered;
use crate::tools::stream::{json_arguments, object_progress, CallDelta, CallStreamer, Progress};
use crate::tools::{Tool, ToolCall};

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const MISTRAL: &str = "[TOOL_CALLS]";
const MISTRAL_ARGS: &str = "[ARGS]";
const MISTRAL_CALL_ID: &str = "[CALL_ID]";
const PYTHON_TAG: &str = "<|python_tag|>";
/// Markers that open a call anywhere in the text.
const MARKERS: [&str; 2] = [HERMES_OPEN, MISTRAL];

/// A piece of the answer: text, a complete, checked call, or a step of a call that streams
/// its arguments.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolPiece {
    Text(String),
    Call(ToolCall),
    Stream(CallDelta),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Plain text; `pending` holds at most a possible marker prefix.
    Text,
    /// Inside `<tool_call>`; `pending` starts with the marker.
    Hermes,
    /// After `[TOOL_CALLS]`; `pending` starts with the marker.
    Mistral,
    /// The answer began with JSON (or `<|python_tag|>`): Llama's calls.
    Json,
}

/// The incremental parser of one answer.
#[derive(Debug, Clone)]
pub struct ToolCallParser {
    /// The request's tools, with their schemas parsed.
    offered: Offered,
    state: State,
    pending: String,
    /// Something other than whitespace came already (Llama's JSON counts only at the start).
    started: bool,
    /// In a call attempt, the whitespace before its marker at the start of `pending`: dropped
    /// with a call (it is formatting), kept with text.
    lead: usize,
    /// A call was just released: whitespace after it is formatting too.
    after_call: bool,
    /// Whether calls stream their arguments (the API shows them as they grow).
    streaming: bool,
    streamer: CallStreamer,
}

/// How far a JSON object or array at the start of a text reaches.
#[derive(Debug, PartialEq, Eq)]
enum Scan {
    /// It ends after this many bytes.
    Complete(usize),
    /// It may still end: wait for more text.
    Incomplete,
    /// It is not an object or array.
    Invalid,
}

impl ToolCallParser {
    /// A parser for calls of `tools`.
    pub fn new(tools: &[Tool]) -> ToolCallParser {
        ToolCallParser {
            offered: Offered::new(tools),
            state: State::Text,
            pending: String::new(),
            started: false,
            lead: 0,
            after_call: false,
            streaming: false,
            streamer: CallStreamer::default(),
        }
    }

    /// Makes calls stream their arguments as they are generated (see
    /// [`crate::tools::stream`]) instead of coming whole.
    pub fn stream_arguments(&mut self, on: bool) {
        self.streaming = on;
    }

    /// Feeds the next piece of generated text; returns what can be released now.
    pub fn push(&mut self, delta: &str) -> Vec<ToolPiece> {
        self.pending.push_str(delta);
        let mut out = Vec::new();
        while self.step(&mut out, false) {}
        out
    }

    /// The end of the answer: every held piece, as a call where it is a complete one.
    pub fn finish(&mut self) -> Vec<ToolPiece> {
        let mut out = Vec::new();
        while self.step(&mut out, true) {}
        let rest = std::mem::take(&mut self.pending);
        if !(self.after_call && rest.trim().is_empty()) {
            text(&mut out, &rest);
        }
        self.state = State::Text;
        out
    }

    /// One move of the state machine; false when it needs more text (or, at the `end`, when
    /// all that can be decided is decided).
    fn step(&mut self, out: &mut Vec<ToolPiece>, end: bool) -> bool {
        match self.state {
            State::Text => self.step_text(out, end),
            State::Hermes => self.step_hermes(out, end),
            State::Mistral => self.step_mistral(out, end),
            State::Json => self.step_json(out, end),
        }
    }

    fn step_text(&mut self, out: &mut Vec<ToolPiece>, end: bool) -> bool {
        if !self.started {
            let trimmed = self.pending.trim_start();
            if trimmed.is_empty() {
                return false;
            }
            if trimmed.starts_with('{') || trimmed.starts_with(PYTHON_TAG) {
                self.started = true;
                self.state = State::Json;
                return true;
            }
            if PYTHON_TAG.starts_with(trimmed) && !end {
                return false;
            }
            self.started = true;
        }
        if self.after_call {
            let space = self.pending.len() - self.pending.trim_start().len();
            self.pending.drain(..space);
            if self.pending.is_empty() {
                return false;
            }
            self.after_call = false;
        }
        let found = MARKERS
            .iter()
            .filter_map(|m| self.pending.find(m).map(|at| (at, *m)))
            .min();
        if let Some((at, marker)) = found {
            // The whitespace before the marker stays with the attempt (see `lead`).
            let cut = self.pending[..at].trim_end().len();
            let before: String = self.pending.drain(..cut).collect();
            text(out, &before);
            self.lead = at - cut;
            self.state = if marker == HERMES_OPEN {
                State::Hermes
            } else {
                State::Mistral
            };
            return true;
        }
        // Hold a possible start of a marker, and the whitespace before it (or at the end:
        // it may come before a call).
        let cut = if end {
            self.pending.len()
        } else {
            let keep = MARKERS
                .iter()
                .map(|m| held_suffix(&self.pending, m))
                .max()
                .unwrap_or(0);
            self.pending[..self.pending.len() - keep].trim_end().len()
        };
        let now: String = self.pending.drain(..cut).collect();
        text(out, &now);
        false
    }

    fn step_hermes(&mut self, out: &mut Vec<ToolPiece>, end: bool) -> bool {
        let start = self.lead + HERMES_OPEN.len();
        let (body_end, raw_end) = match self.pending[start..].find(HERMES_CLOSE) {
            Some(at) => (start + at, start + at + HERMES_CLOSE.len()),
            None => {
                let after = &self.pending[start..];
                let space = after.len() - after.trim_start().len();
                match scan_json(&after[space..], end) {
                    Scan::Complete(len) => {
                        let object_end = start + space + len;
                        let tail = self.pending[object_end..].trim_start();
                        if !end && HERMES_CLOSE.starts_with(tail) {
                            // The closing tag may be coming.
                            self.stream_hermes(out, object_end);
                            return false;
                        }
                        // Other text follows the object: the call ends with it.
                        (object_end, object_end)
                    }
                    // A call the answer's end cut before its closing tag still counts if
                    // complete.
                    _ if end => (self.pending.len(), self.pending.len()),
                    Scan::Incomplete => {
                        self.stream_hermes(out, self.pending.len());
                        return false;
                    }
                    Scan::Invalid => return false,
                }
            }
        };
        let body = self.pending[start..body_end].trim();
        let call = Ordered::parse(body.as_bytes()).and_then(|v| self.check(&v, None));
        let progress = self.hermes_progress(body_end);
        self.release(out, raw_end, call.map(|c| vec![c]), &progress);
        true
    }

    /// The Hermes call in `pending[..body_end]` as far as it has come.
    fn hermes_progress(&self, body_end: usize) -> Vec<Progress> {
        let body = &self.pending[self.lead + HERMES_OPEN.len()..body_end];
        object_progress(body, HERMES_CLOSE).into_iter().collect()
    }

    /// Streams what the open Hermes call's arguments added, when calls stream.
    fn stream_hermes(&mut self, out: &mut Vec<ToolPiece>, body_end: usize) {
        if self.streaming {
            let progress = self.hermes_progress(body_end);
            self.stream(out, &progress);
        }
    }

    /// Streams what `progress` adds to the calls sent so far.
    fn stream(&mut self, out: &mut Vec<ToolPiece>, progress: &[Progress]) {
        let mut deltas = Vec::new();
        self.streamer.sync(progress, &self.offered, &mut deltas);
        out.extend(deltas.into_iter().map(ToolPiece::Stream));
    }

    /// Llama's call objects in `pending`: the complete ones, then the one still open at
    /// `open` (if any), as far as they have come.
    fn json_progress(
        &self,
        objects: &[std::ops::Range<usize>],
        open: Option<usize>,
    ) -> Vec<Progress> {
        objects
            .iter()
            .map(|r| &self.pending[r.clone()])
            .chain(open.map(|at| &self.pending[at..]))
            .map_while(|text| object_progress(text, ""))
            .collect()
    }

    fn step_mistral(&mut self, out: &mut Vec<ToolPiece>, end: bool) -> bool {
        match self.mistral_span(end) {
            Some((raw_end, calls)) => {
                let progress = self.mistral_progress(raw_end);
                self.release(out, raw_end, calls, &progress);
                true
            }
            None => {
                if self.streaming {
                    let progress = self.mistral_progress(self.pending.len());
                    self.stream(out, &progress);
                }
                false
            }
        }
    }

    /// The calls of the `[TOOL_CALLS]` attempt in `pending[..upto]` as far as they have come:
    /// a list (or one object) of call objects, or `name[CALL_ID]id[ARGS]{...}`.
    fn mistral_progress(&self, upto: usize) -> Vec<Progress> {
        let body = self.pending[self.lead + MISTRAL.len()..upto].trim_start();
        if let Some(mut rest) = body.strip_prefix('[') {
            let mut calls = Vec::new();
            loop {
                rest = rest.trim_start();
                let Some(call) = object_progress(rest, MISTRAL) else {
                    return calls;
                };
                let len = match scan_json(rest, false) {
                    Scan::Complete(len) => len,
                    _ => {
                        calls.push(call);
                        return calls;
                    }
                };
                calls.push(call);
                rest = rest[len..].trim_start();
                match rest.strip_prefix(',') {
                    Some(more) => rest = more,
                    None => return calls,
                }
            }
        }
        if body.starts_with('{') {
            return object_progress(body, MISTRAL).into_iter().collect();
        }
        let Some((head, args)) = body.split_once(MISTRAL_ARGS) else {
            return Vec::new();
        };
        let (name, id) = match head.split_once(MISTRAL_CALL_ID) {
            Some((name, id)) => (name, Some(id.to_string())),
            None => (head, None),
        };
        json_arguments(args, MISTRAL)
            .map(|(json, done)| Progress {
                name: name.to_string(),
                id,
                arguments: json.to_string(),
                done,
            })
            .into_iter()
            .collect()
    }

    /// How much of `pending` a `[TOOL_CALLS]` attempt spans and its calls if valid (`None`
    /// for the calls: it is text); `None` while more text is needed to tell.
    fn mistral_span(&self, end: bool) -> Option<(usize, Option<Vec<ToolCall>>)> {
        let marker_end = self.lead + MISTRAL.len();
        let after = &self.pending[marker_end..];
        let space = after.len() - after.trim_start().len();
        let body = &after[space..];
        let start = marker_end + space;
        // Not a call after all: the marker is text, and what follows is looked at afresh.
        let not_a_call = Some((marker_end, None));
        if body.is_empty() {
            return if end { not_a_call } else { None };
        }
        if body.starts_with(['[', '{']) {
            return match scan_json(body, end) {
                Scan::Incomplete => None,
                Scan::Invalid => not_a_call,
                Scan::Complete(len) => {
                    let calls = Ordered::parse(&body.as_bytes()[..len]).and_then(|v| {
                        let items = match v {
                            Ordered::Array(items) => items,
                            single => vec![single],
                        };
                        let calls: Option<Vec<ToolCall>> =
                            items.iter().map(|c| self.check(c, None)).collect();
                        calls.filter(|c| !c.is_empty())
                    });
                    Some((start + len, calls))
                }
            };
        }
        // `name[CALL_ID]id[ARGS]{...}` or `name[ARGS]{...}`.
        // Names and ids have no spaces, braces or quotes: text that has them before `[ARGS]`
        // is no call, whether `[ARGS]` came yet or not.
        let odd = |t: &str| t.contains(|c: char| c.is_whitespace() || c == '{' || c == '"');
        let Some(args_at) = body.find(MISTRAL_ARGS) else {
            return if end || odd(body) { not_a_call } else { None };
        };
        let head = &body[..args_at];
        if odd(head) {
            return not_a_call;
        }
        let (name, id) = match head.split_once(MISTRAL_CALL_ID) {
            Some((name, id)) => (name, Some(id)),
            None => (head, None),
        };
        let args = &body[args_at + MISTRAL_ARGS.len()..];
        match scan_json(args, end) {
            Scan::Incomplete => None,
            Scan::Invalid => not_a_call,
            Scan::Complete(len) => {
                let call = Ordered::parse(&args.as_bytes()[..len]).and_then(|arguments| {
                    let object = Ordered::Object(vec![
                        ("name".into(), Ordered::String(name.into())),
                        ("arguments".into(), arguments),
                    ]);
                    self.check(&object, id)
                });
                let raw_end = start + args_at + MISTRAL_ARGS.len() + len;
                Some((raw_end, call.map(|c| vec![c])))
            }
        }
    }

    /// Llama's answer-is-JSON calls: objects joined by `;`, decided once the JSON ends.
    fn step_json(&mut self, out: &mut Vec<ToolPiece>, end: bool) -> bool {
        let lead = self.pending.len() - self.pending.trim_start().len();
        let mut pos = lead;
        if self.pending[pos..].starts_with(PYTHON_TAG) {
            pos += PYTHON_TAG.len();
        }
        let mut objects = Vec::new();
        loop {
            let rest = &self.pending[pos..];
            pos += rest.len() - rest.trim_start().len();
            match scan_json(&self.pending[pos..], end) {
                Scan::Incomplete => {
                    if self.streaming {
                        let progress = self.json_progress(&objects, Some(pos));
                        self.stream(out, &progress);
                    }
                    return false;
                }
                // Calls that started streaming end before what is not JSON.
                Scan::Invalid if self.streamer.started() => break,
                // Not JSON: plain text, looked at afresh for the other formats.
                Scan::Invalid => {
                    self.state = State::Text;
                    return true;
                }
                Scan::Complete(len) => {
                    objects.push(pos..pos + len);
                    pos += len;
                }
            }
            let rest = &self.pending[pos..];
            let after = rest.trim_start();
            if after.is_empty() && !end {
                if self.streaming {
                    let progress = self.json_progress(&objects, None);
                    self.stream(out, &progress);
                }
                return false;
            }
            match after.strip_prefix(';') {
                Some(more) if !more.trim().is_empty() || !end => {
                    pos += rest.len() - after.len() + 1;
                }
                _ => break,
            }
        }
        let calls: Option<Vec<ToolCall>> = objects
            .iter()
            .map(|r| {
                Ordered::parse(self.pending[r.clone()].as_bytes())
                    .and_then(|v| self.check(&v, None))
            })
            .collect();
        let progress = self.json_progress(&objects, None);
        self.release(out, pos, calls, &progress);
        true
    }

    /// Ends a call attempt spanning `pending[..raw_end]`: its calls if it was valid, else the
    /// raw text, exactly as generated — unless its calls started streaming, which then end
    /// as `progress` (its final reading) has them. Back to plain text after it.
    fn release(
        &mut self,
        out: &mut Vec<ToolPiece>,
        raw_end: usize,
        calls: Option<Vec<ToolCall>>,
        progress: &[Progress],
    ) {
        let raw: String = self.pending.drain(..raw_end).collect();
        if self.streamer.started() {
            if calls.is_none() {
                tracing::warn!(raw = %raw, "a streamed tool call does not fit its tool's schema");
            }
            let mut deltas = Vec::new();
            self.streamer.finish(progress, &self.offered, &mut deltas);
            out.extend(deltas.into_iter().map(ToolPiece::Stream));
            self.after_call = true;
        } else {
            match calls {
                Some(calls) => {
                    out.extend(calls.into_iter().map(ToolPiece::Call));
                    self.after_call = true;
                }
                None => text(out, &raw),
            }
        }
        self.lead = 0;
        self.state = State::Text;
    }

    /// A call object `{"name": ..., "arguments" | "parameters": {...}, "id"?}`, if it names one
    /// of the tools and its arguments fit the tool's schema.
    fn check(&self, call: &Ordered, id: Option<&str>) -> Option<ToolCall> {
        let name = call.get("name")?.as_str()?;
        let own = call.get("id").and_then(Ordered::as_str);
        let arguments = call.get("arguments").or_else(|| call.get("parameters"));
        self.offered.json_call(name, arguments, id.or(own))
    }
}

pub(crate) fn text(out: &mut Vec<ToolPiece>, t: &str) {
    if t.is_empty() {
        return;
    }
    if let Some(ToolPiece::Text(last)) = out.last_mut() {
        last.push_str(t);
    } else {
        out.push(ToolPiece::Text(t.to_string()));
    }
}

/// Where a JSON object or array at the start of `s` ends (strings and escapes respected);
/// at the `end` of the answer an unfinished one is invalid.
fn scan_json(s: &str, end: bool) -> Scan {
    if !s.starts_with(['{', '[']) {
        return if s.is_empty() && !end {
            Scan::Incomplete
        } else {
            Scan::Invalid
        };
    }
    match json_value_len(s) {
        Some(len) => Scan::Complete(len),
        None if end => Scan::Invalid,
        None => Scan::Incomplete,
    }
}
