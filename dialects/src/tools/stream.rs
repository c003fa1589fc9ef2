//! Streaming a call's arguments as the model writes them, for the APIs that can show them
//! (OpenAI chat `tool_calls[].function.arguments` deltas, Anthropic `input_json_delta`,
//! Responses `response.function_call_arguments.delta`), so that a coding agent shows a long
//! call as it grows instead of after it.
//!
//! **When a call streams.** Once its name is read and names an offered tool, and (for the
//! dialects whose arguments are JSON: Hermes/Qwen, Llama 3.1, Mistral, harmony, DeepSeek,
//! Kimi) once its arguments object has begun with `{`. The JSON dialects stream the model's
//! own text of the arguments; the XML-like ones (GLM `<arg_key>`, Qwen3-Coder
//! `<parameter=…>`, MiniMax `<parameter name=…>`) stream the JSON object built from them, one
//! argument at a time as each one closes, each typed by the tool's schema
//! ([`crate::tools::offered::typed`]).
//!
//! **A streamed call stays a call.** A client that got a call's start cannot be told that it
//! was text after all, so once a call has started streaming it ends as a call, whatever
//! follows: its arguments are what the model wrote, even when they turn out not to fit the
//! tool's schema or are cut off by `max_tokens` (logged as a warning). This is what vLLM's and
//! llama.cpp's servers do (they stream arguments once the name is parsed and never take a
//! call back), and what OpenAI documents for its own calls: the arguments "may not be valid
//! JSON" and the client validates them. Only the name is checked before anything is sent,
//! so text never turns into a call of an unknown tool. A whole answer (not streamed), and
//! Ollama's API, which has no argument deltas, keep the strict rule: a call that does not fit
//! its schema stays text.
//!
//! The parsers describe a block of calls as it grows by a list of [`Progress`] (re-read from
//! the block's text at each delta), and [`CallStreamer`] turns the growth into
//! [`CallDelta`]s: calls in order, each one's arguments only ever appended to.

use crate::text_scan::{held_suffix, json_value_len};
use crate::tools::offered::Offered;
use crate::tools::{call_id, ToolCall};

/// One step of a streamed call.
#[derive(Debug, Clone, PartialEq)]
pub enum CallDelta {
    /// A call begins: its id and (offered) name; its arguments follow.
    Start { id: String, name: String },
    /// More of the open call's arguments (JSON text).
    Arguments(String),
    /// The open call ended: the whole call, its `arguments` the concatenation of its
    /// [`CallDelta::Arguments`].
    End(ToolCall),
}

/// How far one call of a block has come, as a parser reads the block so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    pub name: String,
    /// The model's own id for the call (Kimi's `functions.NAME:IDX`), if it wrote one.
    pub id: Option<String>,
    /// The arguments' JSON text so far; a later reading only appends to it.
    pub arguments: String,
    /// The call's arguments are complete.
    pub done: bool,
}

/// A call that started streaming.
#[derive(Debug, Clone)]
struct Sent {
    call: ToolCall,
    ended: bool,
}

/// Sends the growth of a block's calls as [`CallDelta`]s (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct CallStreamer {
    sent: Vec<Sent>,
    /// A call in this block could not stream (its name is not offered): none after it does.
    blocked: bool,
}

impl CallStreamer {
    /// Whether some call of the block started streaming (the block then ends as calls).
    pub fn started(&self) -> bool {
        !self.sent.is_empty()
    }

    /// Sends what `progress` adds to what was sent: new calls (in order, each once the one
    /// before it ended) and more arguments.
    pub fn sync(&mut self, progress: &[Progress], offered: &Offered, out: &mut Vec<CallDelta>) {
        for (i, p) in progress.iter().enumerate() {
            if i == self.sent.len() {
                let after_an_open_call = self.sent.last().is_some_and(|s| !s.ended);
                if self.blocked || after_an_open_call {
                    return;
                }
                if !offered.has(&p.name) {
                    self.blocked = true;
                    return;
                }
                if !p.arguments.starts_with('{') {
                    return;
                }
                let id =
                    p.id.clone()
                        .filter(|id| !id.is_empty())
                        .unwrap_or_else(call_id);
                out.push(CallDelta::Start {
                    id: id.clone(),
                    name: p.name.clone(),
                });
                self.sent.push(Sent {
                    call: ToolCall {
                        id,
                        name: p.name.clone(),
                        arguments: String::new(),
                    },
                    ended: false,
                });
            }
            let sent = &mut self.sent[i];
            if sent.ended {
                continue;
            }
            let have = sent.call.arguments.len();
            // Readings only grow; anything else (never expected) is not sent.
            if p.arguments.len() > have
                && p.arguments.is_char_boundary(have)
                && p.arguments.starts_with(sent.call.arguments.as_str())
            {
                let more = &p.arguments[have..];
                sent.call.arguments.push_str(more);
                out.push(CallDelta::Arguments(more.to_string()));
            }
            if !p.done {
                return;
            }
            sent.ended = true;
            out.push(CallDelta::End(sent.call.clone()));
        }
    }

    /// The block ended: sends what its final reading adds, then ends every call still open
    /// (with the arguments sent so far), and gets ready for the next block.
    pub fn finish(&mut self, progress: &[Progress], offered: &Offered, out: &mut Vec<CallDelta>) {
        self.sync(progress, offered, out);
        for sent in &mut self.sent {
            if !sent.ended {
                tracing::warn!(
                    tool = %sent.call.name,
                    "a streamed tool call ended incomplete; it is sent as the model wrote it"
                );
                sent.ended = true;
                out.push(CallDelta::End(sent.call.clone()));
            }
        }
        *self = CallStreamer::default();
    }
}

/// JSON arguments at the start of `text` (after whitespace) as far as they go: the object's
/// text and whether it is complete; `None` when they do not start as an object. While it is
/// incomplete, a possible start of `end_marker` at the end is held back (it may end the call).
pub fn json_arguments<'a>(text: &'a str, end_marker: &str) -> Option<(&'a str, bool)> {
    let text = text.trim_start();
    if !text.starts_with('{') {
        return None;
    }
    match json_value_len(text) {
        Some(len) => Some((&text[..len], true)),
        None => Some((&text[..text.len() - held_suffix(text, end_marker)], false)),
    }
}

/// How far a call object `{"name": "N", "arguments": {...}, ...}` (`"parameters"` too, as
/// Llama writes it) has come: its progress once the name is read and the arguments object
/// has begun; `end_marker` as for [`json_arguments`].
pub fn object_progress(text: &str, end_marker: &str) -> Option<Progress> {
    let mut rest = text.trim_start().strip_prefix('{')?;
    let mut name: Option<String> = None;
    let mut arguments: Option<(&str, bool)> = None;
    loop {
        rest = rest.trim_start();
        let (key, after) = json_string(rest)?;
        rest = after.trim_start().strip_prefix(':')?.trim_start();
        match key.as_str() {
            "name" => {
                let (value, after) = json_string(rest)?;
                name = Some(value);
                rest = after;
            }
            "arguments" | "parameters" if rest.starts_with('{') => {
                let (args, complete) = json_arguments(rest, end_marker)?;
                arguments = Some((args, complete));
                if !complete {
                    break;
                }
                rest = &rest[args.len()..];
            }
            _ => {
                let len = match rest.as_bytes().first()? {
                    b'{' | b'[' => json_value_len(rest)?,
                    b'"' => rest.len() - json_string(rest)?.1.len(),
                    _ => rest.find([',', '}'])?,
                };
                rest = &rest[len..];
            }
        }
        rest = rest.trim_start();
        match rest.as_bytes().first() {
            Some(b',') => rest = &rest[1..],
            _ => break,
        }
    }
    let (arguments, done) = arguments?;
    Some(Progress {
        name: name?,
        id: None,
        arguments: arguments.to_string(),
        done,
    })
}

/// A complete JSON string at the start of `s`: its value and what follows it.
fn json_string(s: &str) -> Option<(String, &str)> {
    let body = s.strip_prefix('"')?;
    let mut escaped = false;
    for (i, b) in body.bytes().enumerate() {
        match b {
            _ if escaped => escaped = false,
            b'\\' => escaped = true,
            b'"' => {
                let value = serde_json::from_str(&s[..i + 2]).ok()?;
                return Some((value, &body[i + 1..]));
            }
            _ => {}
        }
    }
    None
}

/// The JSON object text of arguments written key by key (the XML-like dialects), each value
/// typed by the tool's schema: `{` and the complete pairs so far, and `}` once `done`.
pub fn pairs_json(offered: &Offered, name: &str, pairs: &[(String, String)], done: bool) -> String {
    let mut out = String::from("{");
    for (i, (key, value)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&serde_json::to_string(key).unwrap_or_default());
        out.push(':');
        out.push_str(&offered.typed_argument(name, key, value).to_text());
    }
    if done {
        out.push('}');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::block::testing::tools;

    #[test]
    fn call_objects_are_read_as_far_as_they_go() {
        let at = |t: &str| object_progress(t, "</tool_call>");
        assert_eq!(at(r#"{"name": "get_weather", "argu"#), None);
        assert_eq!(at(r#"{"name": "get_weather", "arguments": "#), None);
        let p = at(r#" {"name": "get_weather", "arguments": {"city": "Zü"#).unwrap();
        assert_eq!(
            (p.name.as_str(), p.arguments.as_str(), p.done),
            ("get_weather", r#"{"city": "Zü"#, false)
        );
        let p = at(r#"{"name": "get_weather", "arguments": {"city": "Zü"}, "id": "x"}"#).unwrap();
        assert_eq!((p.arguments.as_str(), p.done), (r#"{"city": "Zü"}"#, true));
        // Arguments before the name, Llama's `parameters`, other keys skipped.
        let p = at(r#"{"type": "function", "parameters": {"a": [1, "}"]}, "name": "f"}"#).unwrap();
        assert_eq!(
            (p.name.as_str(), p.arguments.as_str()),
            ("f", r#"{"a": [1, "}"]}"#)
        );
        // A possible start of the end marker is held back.
        let p = at(r#"{"name": "f", "arguments": {"a": "x</tool_c"#).unwrap();
        assert_eq!(p.arguments, r#"{"a": "x"#);
        // String arguments do not stream.
        assert_eq!(at(r#"{"name": "f", "arguments": "{\"a\": 1}"}"#), None);
    }

    #[test]
    fn the_streamer_sends_growth_in_order() {
        let offered = Offered::new(&tools());
        let mut s = CallStreamer::default();
        let mut out = Vec::new();
        let p = |name: &str, args: &str, done: bool| Progress {
            name: name.into(),
            id: None,
            arguments: args.into(),
            done,
        };
        s.sync(&[p("get_weather", "{\"ci", false)], &offered, &mut out);
        s.sync(
            &[p("get_weather", "{\"city\": 1", false)],
            &offered,
            &mut out,
        );
        s.sync(
            &[
                p("get_weather", "{\"city\": 1}", true),
                p("get_time", "{", false),
            ],
            &offered,
            &mut out,
        );
        s.finish(
            &[
                p("get_weather", "{\"city\": 1}", true),
                p("get_time", "{", false),
                p("launch", "{}", true),
            ],
            &offered,
            &mut out,
        );
        let kinds: Vec<String> = out
            .iter()
            .map(|d| match d {
                CallDelta::Start { name, .. } => format!("start {name}"),
                CallDelta::Arguments(a) => format!("args {a}"),
                CallDelta::End(c) => format!("end {} {}", c.name, c.arguments),
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "start get_weather",
                "args {\"ci",
                "args ty\": 1",
                "args }",
                "end get_weather {\"city\": 1}",
                "start get_time",
                "args {",
                "end get_time {",
            ]
        );
        assert!(!s.started());
    }
}
