//! DeepSeek's calls: V3.1 (and V3.2's chat form) as its template renders an earlier one,
//!
//! ```text
//! <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Zürich"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>
//! ```
//!
//! and V3 / R1's older form, the type before the separator and the arguments in a JSON
//! fence after the name:
//!
//! ```text
//! <｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
//! ```json
//! {"city": "Zürich"}
//! ```<｜tool▁call▁end｜>
//! ```
//!
//! V3.1's thinking switch is the template's (`thinking`); in thinking mode the prompt ends
//! with `<think>`, so the answer starts in reasoning ([`crate::reasoning`]).

use crate::tools::block::{Cursor, Grammar};
use crate::tools::json::Ordered;
use crate::tools::offered::Offered;
use crate::tools::stream::{json_arguments, Progress};
use crate::tools::ToolCall;

const CALL_END: &str = "<｜tool▁call▁end｜>";

/// The dialect's block.
pub static GRAMMAR: Grammar = Grammar {
    open: "<｜tool▁calls▁begin｜>",
    close: "<｜tool▁calls▁end｜>",
    body,
    partial,
};

/// The calls so far: each once its name is read and its arguments object began (V3's
/// after its JSON fence).
fn partial(text: &str, _offered: &Offered, end: bool) -> Vec<Progress> {
    let mut c = Cursor::new(text);
    let mut calls = Vec::new();
    loop {
        c.skip_space();
        if !c.eat("<｜tool▁call▁begin｜>") {
            return calls;
        }
        let Some(head) = c.until("<｜tool▁sep｜>").map(str::trim) else {
            return calls;
        };
        let (rest, closed) = match c.until(CALL_END) {
            Some(rest) => (rest, true),
            None => (c.rest(), false),
        };
        let (name, arguments) = if head == "function" {
            let Some((name, fenced)) = rest.split_once('\n') else {
                return calls;
            };
            let Some(json) = fenced.trim_start().strip_prefix("```json") else {
                return calls;
            };
            (name.trim(), json)
        } else {
            (head, rest)
        };
        let Some((json, complete)) = json_arguments(arguments, CALL_END) else {
            return calls;
        };
        let done = complete && (closed || end);
        calls.push(Progress {
            name: name.to_string(),
            id: None,
            arguments: json.to_string(),
            done,
        });
        if !closed {
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
        if !c.eat("<｜tool▁call▁begin｜>") {
            return None;
        }
        let head = c.until("<｜tool▁sep｜>")?.trim();
        let rest = c.until(CALL_END)?;
        let (name, arguments) = if head == "function" {
            // V3: `NAME\n```json\n{...}\n````.
            let (name, fenced) = rest.split_once('\n')?;
            let json = fenced.trim().strip_prefix("```json")?.strip_suffix("```")?;
            (name.trim(), json)
        } else {
            (head, rest)
        };
        let arguments = Ordered::parse(arguments.trim().as_bytes())?;
        calls.push(offered.json_call(name, Some(&arguments), None)?);
    }
}

#[cfg(test)]
mod tests {
    use super::GRAMMAR;
    use crate::tools::block::testing::{every_split, p};

    #[test]
    fn v3_1_and_v3_calls() {
        let text = "Let me see.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Zürich\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        assert_eq!(
            every_split(&GRAMMAR, text),
            [
                p("text", "Let me see."),
                p("get_weather", r#"{"city":"Zürich"}"#),
                p("get_time", "{}"),
            ]
        );
        let text = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\", \"days\": 1}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        assert_eq!(
            every_split(&GRAMMAR, text),
            [p("get_weather", r#"{"city":"Paris","days":1}"#)]
        );
    }

    #[test]
    fn malformed_calls_stay_text() {
        for text in [
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>launch<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": 3}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\"",
            "<｜tool▁calls▁begin｜>get_time<｜tool▁calls▁end｜>",
        ] {
            assert_eq!(every_split(&GRAMMAR, text), [p("text", text)], "{text}");
        }
    }
}
