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

/// The invokes so far: each once its name is read, with its complete parameters; done at
/// `</invoke>` (or the block's end).
fn partial(text: &str, offered: &Offered, end: bool) -> Vec<Progress> {
    let mut c = Cursor::new(text);
    let mut calls = Vec::new();
    loop {
        c.skip_space();
        if !c.eat("<invoke name=") {
            return calls;
        }
        let Some(name) = quoted(&mut c) else {
            return calls;
        };
        let mut pairs = Vec::new();
        let mut done = end;
        loop {
            c.skip_space();
            if c.eat("</invoke>") {
                done = true;
                break;
            }
            if !c.eat("<parameter name=") {
                break;
            }
            let (Some(key), Some(value)) = (quoted(&mut c), c.until("</parameter>")) else {
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

fn body(text: &str, offered: &Offered) -> Option<Vec<ToolCall>> {
    let mut c = Cursor::new(text);
    let mut calls = Vec::new();
    loop {
        c.skip_space();
        if c.is_done() {
            return Some(calls);
        }
        if !c.eat("<invoke name=") {
            return None;
        }
        let name = quoted(&mut c)?;
        let mut arguments = Vec::new();
        loop {
            c.skip_space();
            if c.eat("</invoke>") {
                break;
            }
            if !c.eat("<parameter name=") {
                return None;
            }
            let key = quoted(&mut c)?;
            let value = c.until("</parameter>")?;
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
