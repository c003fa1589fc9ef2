//! Kimi K2's calls (K2 Instruct and K2 Thinking): a section of calls, each with its id
//! `functions.NAME:IDX` (the name and the call's index in the conversation) and JSON
//! arguments, all in Kimi's own special tokens:
//!
//! ```text
//! <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Zürich"}<|tool_call_end|><|tool_calls_section_end|>
//! ```
//!
//! The id is kept as the call's id: the template writes it back as it was (`## Return of
//! functions.get_weather:0`), which is what the model expects to read.

use crate::tools::block::{Cursor, Grammar};
use crate::tools::json::Ordered;
use crate::tools::offered::Offered;
use crate::tools::stream::{json_arguments, Progress};
use crate::tools::ToolCall;

const CALL_END: &str = "<|tool_call_end|>";

/// The dialect's block.
pub static GRAMMAR: Grammar = Grammar {
    open: "<|tool_calls_section_begin|>",
    close: "<|tool_calls_section_end|>",
    body,
    partial,
};

/// The calls so far: each once its id is read and its arguments object began.
fn partial(text: &str, _offered: &Offered, end: bool) -> Vec<Progress> {
    let mut c = Cursor::new(text);
    let mut calls = Vec::new();
    loop {
        c.skip_space();
        if !c.eat("<|tool_call_begin|>") {
            return calls;
        }
        let Some(id) = c.until("<|tool_call_argument_begin|>").map(str::trim) else {
            return calls;
        };
        let (arguments, closed) = match c.until(CALL_END) {
            Some(arguments) => (arguments, true),
            None => (c.rest(), false),
        };
        let Some((json, complete)) = json_arguments(arguments, CALL_END) else {
            return calls;
        };
        let done = complete && (closed || end);
        calls.push(Progress {
            name: name_of(id).to_string(),
            id: Some(id.to_string()),
            arguments: json.to_string(),
            done,
        });
        if !closed {
            return calls;
        }
    }
}

/// The name in an id `functions.NAME:IDX` (a bare `NAME:IDX` or `NAME` too).
fn name_of(id: &str) -> &str {
    let head = id.strip_prefix("functions.").unwrap_or(id);
    match head.rsplit_once(':') {
        Some((name, index)) if index.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => head,
    }
}

fn body(text: &str, offered: &Offered) -> Option<Vec<ToolCall>> {
    let mut c = Cursor::new(text);
    let mut calls = Vec::new();
    loop {
        c.skip_space();
        if c.is_done() {
            return Some(calls);
        }
        if !c.eat("<|tool_call_begin|>") {
            return None;
        }
        let id = c.until("<|tool_call_argument_begin|>")?.trim();
        let arguments = c.until(CALL_END)?;
        let arguments = Ordered::parse(arguments.trim().as_bytes())?;
        let name = name_of(id);
        calls.push(offered.json_call(name, Some(&arguments), Some(id))?);
    }
}

#[cfg(test)]
mod tests {
    use super::GRAMMAR;
    use crate::tools::block::testing::{every_split, p, run_with};
    use crate::tools::parse::ToolPiece;

    #[test]
    fn a_section_of_calls_keeps_their_ids() {
        let text = "Checking both.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Zürich\", \"days\": 2}<|tool_call_end|><|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>";
        assert_eq!(
            every_split(&GRAMMAR, text),
            [
                p("text", "Checking both."),
                p("get_weather", r#"{"city":"Zürich","days":2}"#),
                p("get_time", "{}"),
            ]
        );
        // Whole and streamed, the calls keep the model's ids.
        for stream in [false, true] {
            let ids: Vec<String> = run_with(&GRAMMAR, &[text], stream)
                .into_iter()
                .filter_map(|piece| match piece {
                    ToolPiece::Call(c) => Some(c.id),
                    _ => None,
                })
                .collect();
            assert_eq!(ids, ["functions.get_weather:0", "functions.get_time:1"]);
        }
    }

    #[test]
    fn malformed_calls_stay_text() {
        for text in [
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.launch:0<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>",
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": <|tool_call_end|><|tool_calls_section_end|>",
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"town\": \"x\"}<|tool_call_end|><|tool_calls_section_end|>",
            "<|tool_calls_section_begin|>get_time<|tool_calls_section_end|>",
        ] {
            assert_eq!(every_split(&GRAMMAR, text), [p("text", text)], "{text}");
        }
    }
}
