//! GLM-4.5/4.6/4.7's calls, as their templates render an earlier one: the name right after
//! `<tool_call>`, then key and value pairs, on lines of their own (4.5, 4.6) or run together
//! (4.7):
//!
//! ```text
//! <tool_call>get_weather
//! <arg_key>city</arg_key>
//! <arg_value>Zürich</arg_value>
//! </tool_call>
//! ```
//!
//! Values are written bare (`tojson` for anything but a string) and typed by the tool's
//! schema ([`crate::tools::offered::typed`]). One call per block.

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

/// The call so far: its name once a tag or line break ends it, and its complete pairs.
fn partial(text: &str, offered: &Offered, end: bool) -> Vec<Progress> {
    let text = text.trim_start();
    let Some(at) = text.find(['<', '\n']) else {
        return Vec::new();
    };
    let name = text[..at].trim();
    if name.is_empty() || name.contains(['{', '"']) {
        return Vec::new();
    }
    let mut c = Cursor::new(&text[at..]);
    let mut pairs = Vec::new();
    loop {
        c.skip_space();
        if !c.eat("<arg_key>") {
            break;
        }
        let Some(key) = c.until("</arg_key>") else {
            break;
        };
        c.skip_space();
        if !c.eat("<arg_value>") {
            break;
        }
        let Some(value) = c.until("</arg_value>") else {
            break;
        };
        pairs.push((key.trim().to_string(), value.to_string()));
    }
    vec![Progress {
        name: name.to_string(),
        id: None,
        arguments: pairs_json(offered, name, &pairs, end),
        done: end,
    }]
}

fn body(text: &str, offered: &Offered) -> Option<Vec<ToolCall>> {
    let (name, rest) = match text.find('<') {
        Some(at) => (&text[..at], &text[at..]),
        None => (text, ""),
    };
    let name = name.trim();
    if name.is_empty() || name.contains(['{', '"', '\n']) {
        return None;
    }
    let mut c = Cursor::new(rest);
    let mut arguments = Vec::new();
    loop {
        c.skip_space();
        if c.is_done() {
            break;
        }
        if !c.eat("<arg_key>") {
            return None;
        }
        let key = c.until("</arg_key>")?.trim();
        c.skip_space();
        if !c.eat("<arg_value>") {
            return None;
        }
        let value = c.until("</arg_value>")?;
        arguments.push((key.to_string(), value.to_string()));
    }
    Some(vec![offered.text_call(name, &arguments, None)?])
}

#[cfg(test)]
mod tests {
    use super::GRAMMAR;
    use crate::tools::block::testing::{every_split, p};

    #[test]
    fn glm_4_6_and_4_7_calls() {
        // GLM-4.6 (line by line), after a thought the reasoning splitter took away.
        let text = "Checking.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Zürich</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>";
        assert_eq!(
            every_split(&GRAMMAR, text),
            [
                p("text", "Checking."),
                p("get_weather", r#"{"city":"Zürich","days":3}"#)
            ]
        );
        // GLM-4.7 (run together), two calls, text after.
        let text = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>unit</arg_key><arg_value>celsius</arg_value></tool_call><tool_call>get_time</tool_call> ok";
        assert_eq!(
            every_split(&GRAMMAR, text),
            [
                p("get_weather", r#"{"city":"Paris","unit":"celsius"}"#),
                p("get_time", "{}"),
                p("text", "ok"),
            ]
        );
    }

    #[test]
    fn malformed_calls_stay_text() {
        for text in [
            "<tool_call>launch<arg_key>x</arg_key><arg_value>1</arg_value></tool_call>",
            "<tool_call>get_weather<arg_key>city</arg_key></tool_call>",
            "<tool_call>get_weather<arg_key>unit</arg_key><arg_value>kelvin</arg_value></tool_call>",
            "<tool_call>{\"name\": \"get_time\"}</tool_call>",
            "<tool_call></tool_call>",
        ] {
            assert_eq!(every_split(&GRAMMAR, text), [p("text", text)], "{text}");
        }
    }
}
