//! Qwen3-Coder's calls, as its template renders an earlier one (and its system prompt asks
//! for them):
//!
//! ```text
//! <tool_call>
//! <function=get_weather>
//! <parameter=city>
//! Zürich
//! </parameter>
//! </function>
//! </tool_call>
//! ```
//!
//! Each value is written bare (`tojson` for objects and arrays), between one line break after
//! `<parameter=K>` and one before `</parameter>`, which are formatting; values are typed by
//! the tool's schema ([`crate::tools::offered::typed`]). A block may hold several functions.

use crate::tools::block::{Cursor, Grammar};
use crate::tools::offered::Offered;
use crate::tools::stream::{pairs_json, Progress};
use crate::tools::ToolCall;

/// The dialect's block.
pub static GRAMMAR: Grammar = Grammar {
    open: "<tool_call>",
    close: "</tool_call>",
    body,
    partial,
};

/// The functions so far: each once its name is read, with its complete parameters; done at
/// `</function>` (or the block's end).
fn partial(text: &str, offered: &Offered, end: bool) -> Vec<Progress> {
    let mut c = Cursor::new(text);
    let mut calls = Vec::new();
    loop {
        c.skip_space();
        if !c.eat("<function=") {
            return calls;
        }
        let Some(name) = c.until(">").map(str::trim) else {
            return calls;
        };
        let mut pairs = Vec::new();
        let mut done = end;
        loop {
            c.skip_space();
            if c.eat("</function>") {
                done = true;
                break;
            }
            if !c.eat("<parameter=") {
                break;
            }
            let (Some(key), Some(value)) = (c.until(">"), c.until("</parameter>")) else {
                break;
            };
            let value = value.strip_prefix('\n').unwrap_or(value);
            let value = value.strip_suffix('\n').unwrap_or(value);
            pairs.push((key.trim().to_string(), value.to_string()));
        }
        calls.push(Progress {
            name: name.to_string(),
            id: None,
            arguments: pairs_json(offered, name, &pairs, done),
            done,
        });
        if !done {
            return calls;
        }
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
        if !c.eat("<function=") {
            return None;
        }
        let name = c.until(">")?.trim();
        let mut arguments = Vec::new();
        loop {
            c.skip_space();
            if c.eat("</function>") {
                break;
            }
            // The answer's end may cut the closing tags of the last function.
            if c.is_done() {
                break;
            }
            if !c.eat("<parameter=") {
                return None;
            }
            let key = c.until(">")?.trim();
            let value = c.until("</parameter>")?;
            let value = value.strip_prefix('\n').unwrap_or(value);
            let value = value.strip_suffix('\n').unwrap_or(value);
            arguments.push((key.to_string(), value.to_string()));
        }
        if name.is_empty() || name.contains(['<', '\n']) {
            return None;
        }
        calls.push(offered.text_call(name, &arguments, None)?);
    }
}

#[cfg(test)]
mod tests {
    use super::GRAMMAR;
    use crate::tools::block::testing::{every_split, p};

    #[test]
    fn calls_typed_by_schema_between_text() {
        let text = "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nZürich\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>\nDone.";
        assert_eq!(
            every_split(&GRAMMAR, text),
            [
                p("text", "Let me check."),
                p("get_weather", r#"{"city":"Zürich","days":3}"#),
                p("get_time", "{}"),
                p("text", "Done."),
            ]
        );
        // Several lines of a value stay as written, inner line breaks included.
        let text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew\nYork\n</parameter>\n</function>";
        assert_eq!(
            every_split(&GRAMMAR, text),
            [p("get_weather", r#"{"city":"New\nYork"}"#)]
        );
    }

    #[test]
    fn malformed_calls_stay_text() {
        for text in [
            // Unknown tool, a value the schema refuses, a broken tag, a cut-off value.
            "<tool_call>\n<function=launch>\n</function>\n</tool_call>",
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nX\n</parameter>\n<parameter=days>\nmany\n</parameter>\n</function>\n</tool_call>",
            "<tool_call>\n<function get_weather>\n</function>\n</tool_call>",
            "a <tool_call>\n<function=get_weather>\n<parameter=city>\nZür",
            "<tool_call>{\"name\": \"get_time\"}</tool_call>",
        ] {
            assert_eq!(every_split(&GRAMMAR, text), [p("text", text)], "{text}");
        }
    }
}
