//! The incremental parser shared by the dialects whose calls sit in a block between an open
//! and a close marker (GLM's and Qwen3-Coder's `<tool_call>…</tool_call>`, MiniMax's
//! `<minimax:tool_call>…</minimax:tool_call>`, Kimi's and DeepSeek's call sections). Each
//! dialect is a [`Grammar`]: its two markers and a function that reads a complete block's body
//! into calls (one file per dialect).
//!
//! Streaming works as for the common formats ([`crate::tools::parse`]): text is released as
//! soon as it cannot be the start of the open marker; a block is held until it is closed (or
//! the answer ends) and checked, then released as calls, or as the text it was if any call in
//! it is malformed, names no offered tool or does not fit its schema. Whitespace around calls
//! is formatting and goes with them.
//!
//! When the API streams arguments ([`BlockParser::stream_arguments`]), each grammar also reads
//! a block as far as it has come ([`Grammar::partial`]) and its calls stream as they grow
//! ([`crate::tools::stream`]).

use crate::text_scan::held_suffix;
use crate::tools::offered::Offered;
use crate::tools::parse::{text, ToolPiece};
use crate::tools::stream::{CallStreamer, Progress};
use crate::tools::{Tool, ToolCall};

/// A block dialect.
#[derive(Debug)]
pub struct Grammar {
    /// Opens a block of calls.
    pub open: &'static str,
    /// Closes it.
    pub close: &'static str,
    /// The calls of a complete block's body (between the markers), each checked against the
    /// offered tools; `None` (or none at all) when the block is not a valid call.
    pub body: fn(&str, &Offered) -> Option<Vec<ToolCall>>,
    /// The calls of a block's body so far (`end`: the block is closed), as far as each has
    /// come: what streams (see [`crate::tools::stream`]).
    pub partial: fn(&str, &Offered, bool) -> Vec<Progress>,
}

/// The incremental parser of one answer in a block dialect.
#[derive(Debug, Clone)]
pub struct BlockParser {
    grammar: &'static Grammar,
    offered: Offered,
    pending: String,
    /// Inside a block: `pending` holds `lead` bytes of whitespace, then the open marker.
    in_block: bool,
    lead: usize,
    /// A block was just released as calls: whitespace after it is formatting.
    after_call: bool,
    /// Whether calls stream their arguments.
    streaming: bool,
    streamer: CallStreamer,
}

impl BlockParser {
    /// A parser of `grammar`'s calls of `tools`.
    pub fn new(grammar: &'static Grammar, tools: &[Tool]) -> BlockParser {
        BlockParser {
            grammar,
            offered: Offered::new(tools),
            pending: String::new(),
            in_block: false,
            lead: 0,
            after_call: false,
            streaming: false,
            streamer: CallStreamer::default(),
        }
    }

    /// Makes calls stream their arguments as they are generated instead of coming whole.
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

    /// The end of the answer: every held piece (an unclosed block counts if complete).
    pub fn finish(&mut self) -> Vec<ToolPiece> {
        let mut out = Vec::new();
        while self.step(&mut out, true) {}
        let rest = std::mem::take(&mut self.pending);
        if !(self.after_call && rest.trim().is_empty()) {
            text(&mut out, &rest);
        }
        self.in_block = false;
        out
    }

    fn step(&mut self, out: &mut Vec<ToolPiece>, end: bool) -> bool {
        if self.in_block {
            return self.step_block(out, end);
        }
        if self.after_call {
            let space = self.pending.len() - self.pending.trim_start().len();
            self.pending.drain(..space);
            if self.pending.is_empty() {
                return false;
            }
            self.after_call = false;
        }
        let open = self.grammar.open;
        if let Some(at) = self.pending.find(open) {
            // The whitespace before the marker stays with the attempt.
            let cut = self.pending[..at].trim_end().len();
            let before: String = self.pending.drain(..cut).collect();
            text(out, &before);
            self.lead = at - cut;
            self.in_block = true;
            return true;
        }
        // Hold a possible start of the marker and the whitespace before it.
        let cut = if end {
            self.pending.len()
        } else {
            let keep = held_suffix(&self.pending, open);
            self.pending[..self.pending.len() - keep].trim_end().len()
        };
        let now: String = self.pending.drain(..cut).collect();
        text(out, &now);
        false
    }

    fn step_block(&mut self, out: &mut Vec<ToolPiece>, end: bool) -> bool {
        let start = self.lead + self.grammar.open.len();
        let close = self.grammar.close;
        let (body_end, raw_end) = match self.pending[start..].find(close) {
            Some(at) => (start + at, start + at + close.len()),
            None if end => (self.pending.len(), self.pending.len()),
            None => {
                if self.streaming {
                    // All but a possible start of the closing marker.
                    let body_end = self.pending.len() - held_suffix(&self.pending, close);
                    let body = &self.pending[start..body_end.max(start)];
                    let progress = (self.grammar.partial)(body, &self.offered, false);
                    self.sync(out, &progress, false);
                }
                return false;
            }
        };
        let body = &self.pending[start..body_end];
        let calls = (self.grammar.body)(body, &self.offered).filter(|calls| !calls.is_empty());
        if self.streamer.started() {
            let progress = (self.grammar.partial)(body, &self.offered, true);
            if calls.is_none() {
                tracing::warn!(block = %body, "a streamed tool call does not fit its tool's schema");
            }
            self.sync(out, &progress, true);
            self.pending.drain(..raw_end);
            self.after_call = true;
        } else {
            let raw: String = self.pending.drain(..raw_end).collect();
            match calls {
                Some(calls) => {
                    out.extend(calls.into_iter().map(ToolPiece::Call));
                    self.after_call = true;
                }
                None => text(out, &raw),
            }
        }
        self.lead = 0;
        self.in_block = false;
        true
    }

    /// Streams what `progress` adds; at the block's `end`, ends its calls.
    fn sync(&mut self, out: &mut Vec<ToolPiece>, progress: &[Progress], end: bool) {
        let mut deltas = Vec::new();
        if end {
            self.streamer.finish(progress, &self.offered, &mut deltas);
        } else {
            self.streamer.sync(progress, &self.offered, &mut deltas);
        }
        out.extend(deltas.into_iter().map(ToolPiece::Stream));
    }
}

/// A reader over a block's body, for the dialects' grammars.
#[derive(Debug, Clone, Copy)]
pub struct Cursor<'a> {
    rest: &'a str,
}

impl<'a> Cursor<'a> {
    /// A reader at the start of `text`.
    pub fn new(text: &'a str) -> Cursor<'a> {
        Cursor { rest: text }
    }

    /// Skips whitespace.
    pub fn skip_space(&mut self) {
        self.rest = self.rest.trim_start();
    }

    /// Consumes `literal` if the text goes on with it.
    pub fn eat(&mut self, literal: &str) -> bool {
        match self.rest.strip_prefix(literal) {
            Some(rest) => {
                self.rest = rest;
                true
            }
            None => false,
        }
    }

    /// The text up to `literal`, consuming both; `None` (nothing consumed) if it never comes.
    pub fn until(&mut self, literal: &str) -> Option<&'a str> {
        let at = self.rest.find(literal)?;
        let before = &self.rest[..at];
        self.rest = &self.rest[at + literal.len()..];
        Some(before)
    }

    /// Whether only whitespace is left.
    pub fn is_done(&self) -> bool {
        self.rest.trim().is_empty()
    }

    /// What is left.
    pub fn rest(&self) -> &'a str {
        self.rest
    }
}

/// Test helpers shared by the dialects' tests: a parser fed whole, split at every char
/// boundary, and char by char must give the same pieces.
#[cfg(test)]
pub mod testing {
    use super::*;
    use serde_json::json;

    /// `get_weather(city: string, unit?: "celsius" | "fahrenheit", days?: integer)` and
    /// `get_time()` (no schema).
    pub fn tools() -> Vec<Tool> {
        vec![
            Tool {
                name: "get_weather".into(),
                description: Some("Weather in a city".into()),
                parameters: Some(
                    json!({"type": "object", "properties": {
                        "city": {"type": "string"},
                        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                        "days": {"type": "integer"}},
                        "required": ["city"]})
                    .to_string(),
                ),
                strict: false,
            },
            Tool {
                name: "get_time".into(),
                description: None,
                parameters: None,
                strict: false,
            },
        ]
    }

    /// A piece as (name or "text", arguments or text), ids left out.
    pub fn shape(piece: &ToolPiece) -> (String, String) {
        match piece {
            ToolPiece::Text(t) => ("text".into(), t.clone()),
            ToolPiece::Call(c) => (c.name.clone(), c.arguments.clone()),
            ToolPiece::Stream(d) => ("stream".into(), format!("{d:?}")),
        }
    }

    /// The pieces of `deltas`, adjacent texts merged; with `stream`, calls stream their
    /// arguments and are put back together here ([`assemble`]).
    pub fn run_with(grammar: &'static Grammar, deltas: &[&str], stream: bool) -> Vec<ToolPiece> {
        let mut p = BlockParser::new(grammar, &tools());
        p.stream_arguments(stream);
        let mut pieces: Vec<ToolPiece> = deltas.iter().flat_map(|d| p.push(d)).collect();
        pieces.extend(p.finish());
        assemble(pieces)
    }

    /// The pieces of `deltas`, adjacent texts merged.
    pub fn run(grammar: &'static Grammar, deltas: &[&str]) -> Vec<ToolPiece> {
        run_with(grammar, deltas, false)
    }

    /// Pieces with adjacent texts merged and each streamed call put back together as one
    /// call (its arguments normalized), checking that its end holds exactly the arguments
    /// its deltas carried.
    pub fn assemble(pieces: Vec<ToolPiece>) -> Vec<ToolPiece> {
        use crate::tools::json::Ordered;
        use crate::tools::stream::CallDelta;
        let mut merged: Vec<ToolPiece> = Vec::new();
        let mut open: Option<String> = None;
        for piece in pieces {
            let piece = match piece {
                ToolPiece::Stream(CallDelta::Start { .. }) => {
                    assert!(open.is_none(), "a call started inside another");
                    open = Some(String::new());
                    continue;
                }
                ToolPiece::Stream(CallDelta::Arguments(a)) => {
                    open.as_mut()
                        .expect("arguments outside a call")
                        .push_str(&a);
                    continue;
                }
                ToolPiece::Stream(CallDelta::End(mut call)) => {
                    let sent = open.take().expect("an end outside a call");
                    assert_eq!(call.arguments, sent, "the end's arguments are the deltas'");
                    if let Some(v) = Ordered::parse(sent.as_bytes()) {
                        call.arguments = v.to_text();
                    }
                    ToolPiece::Call(call)
                }
                other => other,
            };
            match (merged.last_mut(), piece) {
                (Some(ToolPiece::Text(a)), ToolPiece::Text(b)) => a.push_str(&b),
                (_, piece) => merged.push(piece),
            }
        }
        assert!(open.is_none(), "a streamed call never ended");
        merged
    }

    /// `text` parsed whole, split in two at every char boundary and char by char: the same
    /// pieces every time. When every call attempt in it is valid, streaming the arguments
    /// gives the same calls, however split. Returns the shapes.
    pub fn every_split(grammar: &'static Grammar, text: &str) -> Vec<(String, String)> {
        let shapes = |p: Vec<ToolPiece>| p.iter().map(shape).collect::<Vec<_>>();
        let whole = shapes(run(grammar, &[text]));
        let valid = !whole
            .iter()
            .any(|(k, t)| k == "text" && t.contains(grammar.open));
        let modes: &[bool] = if valid { &[false, true] } else { &[false] };
        for &stream in modes {
            for (i, _) in text.char_indices().skip(1) {
                let split = shapes(run_with(grammar, &[&text[..i], &text[i..]], stream));
                assert_eq!(split, whole, "split at {i} of {text:?}, streamed: {stream}");
            }
            let chars: Vec<String> = text.chars().map(String::from).collect();
            let chars: Vec<&str> = chars.iter().map(String::as_str).collect();
            assert_eq!(
                shapes(run_with(grammar, &chars, stream)),
                whole,
                "char by char: {text:?}, streamed: {stream}"
            );
        }
        whole
    }

    /// A (kind, text) pair for assertions.
    pub fn p(kind: &str, text: &str) -> (String, String) {
        (kind.to_string(), text.to_string())
    }
}
