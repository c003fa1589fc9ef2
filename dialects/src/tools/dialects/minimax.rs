//! MiniMax M2's calls, as its template renders earlier ones: one block of `invoke`s, each
//! value bare (`tojson` for anything but a string), typed by the tool's schema
//! ([`crate::tools::offered::typed`]):
//!
//! ```text
//! <minimax:tool_call>
//! <invoke name="get_weather">
//! <parameter name="city">Zürich</parameter>
//! </invoke>
//! </minimax:tool_call>
//! ```

use crate::tools::block::{Cursor, Grammar};
use crate::tools::offered::Offered;
use crate::tools::stream::{pairs_json, Progress};
use crate::tools::ToolCall;

/// The dialect's block.
pub static GRAMMAR: Grammar = Grammar {
    open: "<minimax:tool_call>",
    close: "</minimax:tool_call>",
    body,
    partial,
};

/// MiniMax M2's tags (DeepSeek's DSML writes the same shape with its own, see `dsml.rs`).
const TAGS: Invokes = Invokes {
    invoke: "<invoke name=",
    invoke_end: "</invoke>",
    parameter: "<parameter name=",
    name: quoted,
    parameter_body: |c| Some((quoted(c)?, c.until("</parameter>")?)),
};

fn partial(text: &str, offered: &Offered, end: bool) -> Vec<Progress> {
    invokes_so_far(&TAGS, text, offered, end)
}

fn body(text: &str, offered: &Offered) -> Option<Vec<ToolCall>> {
    invokes_whole(&TAGS, text, offered)
}

/// A block of `invoke`s of named parameters: its tags, and how a name and a parameter (after
/// its opening tag, up to its closing one) are read.
pub(super) struct Invokes {
    pub invoke: &'static str,
    pub invoke_end: &'static str,
    pub parameter: &'static str,
    pub name: for<'a> fn(&mut Cursor<'a>) -> Option<&'a str>,
    pub parameter_body: for<'a> fn(&mut Cursor<'a>) -> Option<(&'a str, &'a str)>,
}

/// The invokes so far: each once its name is read, with its complete parameters; done at
/// its closing tag (or the block's end).
pub(super) fn invokes_so_far(
    f: &Invokes,
    text: &str,
    offered: &Offered,
    end: bool,
) -> Vec<Progress> {
    let mut c = Cursor::new(text);
    let mut calls = Vec::new();
    loop {
        c.skip_space();
        if !c.eat(f.invoke) {
            return calls;
        }
        let Some(name) = (f.name)(&mut c) else {
            return calls;
        };
        let mut pairs = Vec::new();
        let mut done = end;
        loop {
            c.skip_space();
            if c.eat(f.invoke_end) {
                done = true;
                break;
            }
            if !c.eat(f.parameter) {
                break;
            }
            let Some((key, value)) = (f.parameter_body)(&mut c) else {
                break;
            };
            pairs.push((key.to_string(), value.to_string()));
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

/// The calls of a whole block, each checked against the offered tools.
pub(super) fn invokes_whole(f: &Invokes, text: &str, offered: &Offered) -> Option<Vec<ToolCall>> {
    let mut c = Cursor::new(text);
    let mut calls = Vec::new();
    loop {
        c.skip_space();
        if c.is_done() {
            return Some(calls);
        }
        if !c.eat(f.invoke) {
            return None;
        }
        let name = (f.name)(&mut c)?;
        let mut arguments = Vec::new();
        loop {
            c.skip_space();
            if c.eat(f.invoke_end) {
                break;
            }
            if !c.eat(f.parameter) {
                return None;
            }
            let (key, value) = (f.parameter_body)(&mut c)?;
            arguments.push((key.to_string(), value.to_string()));
        }
        calls.push(offered.text_call(name, &arguments, None)?);
    }
}

/// `"NAME">` (quotes optional), the name.
fn quoted<'a>(c: &mut Cursor<'a>) -> Option<&'a str> {
    let raw = c.until(">")?.trim();
    let name = raw
        .strip_prefix('"')
        .and_then(|r| r.strip_suffix('"'))
        .unwrap_or(raw);
    (!name.is_empty() && !name.contains(['"', '<'])).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::GRAMMAR;
    use crate::tools::block::testing::{every_split, p};

    #[test]
    fn invokes_typed_by_schema() {
        let text = "I'll look.\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Zürich</parameter>\n<parameter name=\"days\">2</parameter>\n</invoke>\n<invoke name=\"get_time\">\n</invoke>\n</minimax:tool_call>";
        assert_eq!(
            every_split(&GRAMMAR, text),
            [
                p("text", "I'll look."),
                p("get_weather", r#"{"city":"Zürich","days":2}"#),
                p("get_time", "{}"),
            ]
        );
    }

    #[test]
    fn malformed_calls_stay_text() {
        for text in [
            "<minimax:tool_call>\n<invoke name=\"launch\">\n</invoke>\n</minimax:tool_call>",
            // One bad invoke spoils the block: all of it stays text.
            "<minimax:tool_call>\n<invoke name=\"get_time\">\n</invoke>\n<invoke name=\"get_weather\">\n</invoke>\n</minimax:tool_call>",
            "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Zür",
            "<minimax:tool_call>{}</minimax:tool_call>",
        ] {
            assert_eq!(every_split(&GRAMMAR, text), [p("text", text)], "{text}");
        }
    }
}
