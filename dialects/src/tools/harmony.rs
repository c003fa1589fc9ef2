//! gpt-oss's harmony format: the answer is a run of messages, each a header, `<|message|>`,
//! the body and an end token. The prompt ends with `<|start|>assistant`, so the output starts
//! with the first message's header:
//!
//! ```text
//! <|channel|>analysis<|message|>The user wants the weather.<|end|>
//! <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Zürich"}<|call|>
//! ```
//!
//! - `analysis` is the reasoning; `final` is the answer's text; `commentary` without a
//!   recipient is a preamble the user sees (text too);
//! - a message with a recipient `to=functions.NAME` (in the header before or after the
//!   channel, as the template itself writes `to=` before it) is a call with JSON arguments,
//!   which counts as the other dialects' calls do (offered, fits its schema) and stays text
//!   otherwise;
//! - `<|call|>` and `<|return|>` end generation (they are gpt-oss's end tokens), so the last
//!   message usually ends with the output itself; anything after them is left out.
//!
//! When the API streams arguments ([`HarmonyParser::stream_arguments`]), a call to an offered
//! tool streams its JSON arguments as they come ([`crate::tools::stream`]).
//!
//! Output that does not start as a harmony message is text. Reasoning is released as it
//! streams; the APIs put reasoning before the answer, so an `analysis` message that comes after
//! text or a call was released is left out of the answer.

use crate::answer_part::AnswerPart;
use crate::text_scan::held_suffix;
use crate::tools::json::Ordered;
use crate::tools::offered::Offered;
use crate::tools::stream::{json_arguments, CallStreamer, Progress};
use crate::tools::Tool;

const START: &str = "<|start|>";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
const CONSTRAIN: &str = "<|constrain|>";
/// Tokens that end a message's body.
const ENDS: [&str; 4] = ["<|end|>", "<|call|>", "<|return|>", START];
/// A header longer than this without `<|message|>` is not one.
const MAX_HEADER: usize = 512;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Body {
    Reasoning,
    Text,
    /// A call of this recipient: held whole; `raw` keeps its header as generated.
    Call {
        name: String,
        raw: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// A message's header, up to `<|message|>`.
    Header,
    Body(Body),
    /// After a message's end: whitespace, then `<|start|>` and the role.
    Between,
    /// Not harmony (or no longer): everything is text.
    Plain,
    /// `<|call|>` or `<|return|>` ended the turn: whatever the model writes after it (a
    /// tool's result it imagines, when the engine does not stop there) is no part of the
    /// answer.
    Done,
}

/// The incremental parser of one harmony answer.
#[derive(Debug, Clone)]
pub struct HarmonyParser {
    offered: Offered,
    state: State,
    pending: String,
    /// Text or a call was released: later reasoning is left out.
    answered: bool,
    /// Whether calls stream their arguments.
    streaming: bool,
    streamer: CallStreamer,
}

impl HarmonyParser {
    /// A parser of an answer whose calls may name `tools`.
    pub fn new(tools: &[Tool]) -> HarmonyParser {
        HarmonyParser {
            offered: Offered::new(tools),
            state: State::Header,
            pending: String::new(),
            answered: false,
            streaming: false,
            streamer: CallStreamer::default(),
        }
    }

    /// Makes calls stream their arguments as they are generated instead of coming whole.
    pub fn stream_arguments(&mut self, on: bool) {
        self.streaming = on;
    }

    /// The open call's arguments as far as `content` has them.
    fn progress(name: &str, content: &str, done: bool) -> Vec<Progress> {
        json_arguments(content, "")
            .map(|(json, complete)| Progress {
                name: name.to_string(),
                id: None,
                arguments: json.to_string(),
                done: done && complete,
            })
            .into_iter()
            .collect()
    }

    /// Streams what the open call's `progress` adds; at its `end`, ends it.
    fn sync(&mut self, out: &mut Vec<AnswerPart>, progress: &[Progress], end: bool) {
        let mut deltas = Vec::new();
        if end {
            self.streamer.finish(progress, &self.offered, &mut deltas);
        } else {
            self.streamer.sync(progress, &self.offered, &mut deltas);
        }
        if !deltas.is_empty() {
            self.answered = true;
        }
        out.extend(deltas.into_iter().map(AnswerPart::Stream));
    }

    /// Feeds the next piece of generated text; returns what can be released now.
    pub fn push(&mut self, delta: &str) -> Vec<AnswerPart> {
        self.pending.push_str(delta);
        let mut out = Vec::new();
        while self.step(&mut out, false) {}
        out
    }

    /// The end of the answer: every held piece.
    pub fn finish(&mut self) -> Vec<AnswerPart> {
        let mut out = Vec::new();
        while self.step(&mut out, true) {}
        let rest = std::mem::take(&mut self.pending);
        if !rest.trim().is_empty() {
            self.emit(&mut out, AnswerPart::Text(rest));
        }
        out
    }

    fn step(&mut self, out: &mut Vec<AnswerPart>, end: bool) -> bool {
        match self.state.clone() {
            State::Header => self.step_header(end),
            State::Body(body) => self.step_body(out, body, end),
            State::Between => self.step_between(end),
            State::Plain => {
                let text = std::mem::take(&mut self.pending);
                self.emit(out, AnswerPart::Text(text));
                false
            }
            State::Done => {
                self.pending.clear();
                false
            }
        }
    }

    fn step_header(&mut self, end: bool) -> bool {
        let trimmed = self.pending.trim_start();
        if let Some(rest) = trimmed.strip_prefix(START) {
            self.pending = rest.to_string();
            return self.strip_role(end);
        }
        let Some(at) = self.pending.find(MESSAGE) else {
            let plausible = [CHANNEL, "to=", CONSTRAIN, START]
                .iter()
                .any(|m| trimmed.starts_with(m) || m.starts_with(trimmed));
            if !plausible || self.pending.len() > MAX_HEADER || end {
                self.state = State::Plain;
                return true;
            }
            return false;
        };
        let header = &self.pending[..at];
        let starts_well = [CHANNEL, "to=", CONSTRAIN]
            .iter()
            .any(|m| header.trim_start().starts_with(m));
        if !starts_well || ENDS.iter().any(|e| header.contains(e)) {
            self.state = State::Plain;
            return true;
        }
        let channel = word_after(header, CHANNEL);
        let recipient = word_after(header, "to=");
        let body = match (recipient, channel) {
            (Some(to), _) => Body::Call {
                name: to.strip_prefix("functions.").unwrap_or(to).to_string(),
                raw: self.pending[..at + MESSAGE.len()].to_string(),
            },
            (None, Some("analysis")) => Body::Reasoning,
            (None, _) => Body::Text,
        };
        self.pending.drain(..at + MESSAGE.len());
        self.state = State::Body(body);
        true
    }

    /// After `<|start|>`: the role (`assistant`), then a header.
    fn strip_role(&mut self, end: bool) -> bool {
        const ROLE: &str = "assistant";
        if self.pending.len() < ROLE.len() && ROLE.starts_with(self.pending.as_str()) && !end {
            // Wait for the role; put the start back so that this is decided again.
            self.pending.insert_str(0, START);
            return false;
        }
        if let Some(rest) = self.pending.strip_prefix(ROLE) {
            self.pending = rest.to_string();
        }
        self.state = State::Header;
        true
    }

    fn step_body(&mut self, out: &mut Vec<AnswerPart>, body: Body, end: bool) -> bool {
        let found = ENDS
            .iter()
            .filter_map(|e| self.pending.find(e).map(|at| (at, *e)))
            .min();
        let (content_end, next) = match found {
            Some((at, marker)) => (at, Some((at + marker.len(), marker))),
            None if end => (self.pending.len(), None),
            None => {
                if let Body::Call { name, .. } = &body {
                    if self.streaming {
                        let keep = ENDS
                            .iter()
                            .map(|e| held_suffix(&self.pending, e))
                            .max()
                            .unwrap_or(0);
                        let content = &self.pending[..self.pending.len() - keep];
                        let progress = Self::progress(name, content, false);
                        self.sync(out, &progress, false);
                    }
                    return false;
                }
                // Release all but a possible start of an end token.
                let keep = ENDS
                    .iter()
                    .map(|e| held_suffix(&self.pending, e))
                    .max()
                    .unwrap_or(0);
                let now: String = self.pending.drain(..self.pending.len() - keep).collect();
                self.body_text(out, &body, now);
                return false;
            }
        };
        let content: String = self.pending[..content_end].to_string();
        let raw_end = next.map_or(content_end, |(after, _)| after);
        match &body {
            Body::Call { name, .. } if self.streamer.started() => {
                let progress = Self::progress(name, &content, true);
                self.sync(out, &progress, true);
            }
            Body::Call { name, raw } => {
                let call = Ordered::parse(content.trim().as_bytes())
                    .and_then(|args| self.offered.json_call(name, Some(&args), None));
                match call {
                    Some(call) => self.emit(out, AnswerPart::Call(call)),
                    None => {
                        let text = format!("{raw}{}", &self.pending[..raw_end]);
                        self.emit(out, AnswerPart::Text(text));
                    }
                }
            }
            _ => self.body_text(out, &body, content),
        }
        self.pending.drain(..raw_end);
        self.state = match next {
            Some((_, START)) => {
                self.pending.insert_str(0, START);
                State::Header
            }
            Some((_, "<|call|>" | "<|return|>")) => State::Done,
            Some(_) => State::Between,
            None => State::Header,
        };
        true
    }

    fn body_text(&mut self, out: &mut Vec<AnswerPart>, body: &Body, text: String) {
        match body {
            Body::Reasoning => self.emit(out, AnswerPart::Reasoning(text)),
            _ => self.emit(out, AnswerPart::Text(text)),
        }
    }

    fn step_between(&mut self, end: bool) -> bool {
        let trimmed = self.pending.trim_start();
        if trimmed.starts_with(START) {
            self.state = State::Header;
            return true;
        }
        if trimmed.is_empty() || (START.starts_with(trimmed) && !end) {
            return false;
        }
        self.state = State::Plain;
        true
    }

    /// Sends a part, merging text with text and reasoning with reasoning; reasoning after
    /// the answer began is left out.
    fn emit(&mut self, out: &mut Vec<AnswerPart>, part: AnswerPart) {
        match (&part, out.last_mut()) {
            (AnswerPart::Text(t) | AnswerPart::Reasoning(t), _) if t.is_empty() => {}
            (AnswerPart::Reasoning(_), _) if self.answered => {}
            (AnswerPart::Text(t), Some(AnswerPart::Text(last))) => last.push_str(t),
            (AnswerPart::Reasoning(t), Some(AnswerPart::Reasoning(last))) => last.push_str(t),
            _ => {
                self.answered |= !matches!(part, AnswerPart::Reasoning(_));
                out.push(part);
            }
        }
    }
}

/// The word after `marker` in a header (up to whitespace or the next token).
fn word_after<'a>(header: &'a str, marker: &str) -> Option<&'a str> {
    let at = header.find(marker)?;
    let rest = &header[at + marker.len()..];
    let end = rest
        .find(|c: char| c.is_whitespace() || c == '<')
        .unwrap_or(rest.len());
    Some(&rest[..end]).filter(|w| !w.is_empty())
}
