//! DeepSeek V3.2's and V4's calls (DSML), as their templates render earlier ones: one block of
//! `invoke`s, each parameter saying whether its value is a string (`string="true"`, the text
//! as it is) or JSON (`string="false"`), typed by the tool's schema
//! ([`crate::tools::offered::typed`]). V3.2 names the block `function_calls`, V4 `tool_calls`:
//!
//! ```text
//! <｜DSML｜function_calls>
//! <｜DSML｜invoke name="get_weather">
//! <｜DSML｜parameter name="city" string="true">Zürich</｜DSML｜parameter>
//! <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
//! </｜DSML｜invoke>
//! </｜DSML｜function_calls>
//! ```

use super::minimax::{invokes_so_far, invokes_whole, Invokes};
use crate::tools::block::{Cursor, Grammar};
use crate::tools::offered::Offered;
use crate::tools::stream::Progress;
use crate::tools::ToolCall;

/// The marker every DSML tag carries.
pub const DSML: &str = "｜DSML｜";

/// DeepSeek V3.2's block.
pub static GRAMMAR_V32: Grammar = Grammar {
    open: "<｜DSML｜function_calls>",
    close: "</｜DSML｜function_calls>",
    body,
    partial,
};

/// DeepSeek V4's block.
pub static GRAMMAR_V4: Grammar = Grammar {
    open: "<｜DSML｜tool_calls>",
    close: "</｜DSML｜tool_calls>",
    body,
    partial,
};

const INVOKE: &str = "<｜DSML｜invoke name=";
const INVOKE_END: &str = "</｜DSML｜invoke>";
const PARAMETER: &str = "<｜DSML｜parameter name=";
const PARAMETER_END: &str = "</｜DSML｜parameter>";

/// One parameter after its opening `<｜DSML｜parameter name=`: `"KEY" string="…">VALUE`
/// up to the closing tag; `None` while it is incomplete or malformed.
fn parameter<'a>(c: &mut Cursor<'a>) -> Option<(&'a str, &'a str)> {
    let attributes = c.until(">")?;
    let (key, rest) = attributes.trim().strip_prefix('"')?.split_once('"')?;
    let kind = rest.trim();
    if !(kind.is_empty() || kind == "string=\"true\"" || kind == "string=\"false\"") {
        return None;
    }
    if key.is_empty() || key.contains('<') {
        return None;
    }
    Some((key, c.until(PARAMETER_END)?))
}

/// `"NAME">`, the name.
fn invoked<'a>(c: &mut Cursor<'a>) -> Option<&'a str> {
    let raw = c.until(">")?.trim();
    let name = raw.strip_prefix('"')?.strip_suffix('"')?;
    (!name.is_empty() && !name.contains(['"', '<'])).then_some(name)
}

/// DSML's tags, read as MiniMax M2's invokes are.
const TAGS: Invokes = Invokes {
    invoke: INVOKE,
    invoke_end: INVOKE_END,
    parameter: PARAMETER,
    name: invoked,
    parameter_body: parameter,
};

fn partial(text: &str, offered: &Offered, end: bool) -> Vec<Progress> {
    invokes_so_far(&TAGS, text, offered, end)
}

fn body(text: &str, offered: &Offered) -> Option<Vec<ToolCall>> {
    invokes_whole(&TAGS, text, offered)
}

#[cfg(test)]
mod tests {
    use super::{GRAMMAR_V32, GRAMMAR_V4};
    use crate::tools::block::testing::{every_split, p};

    #[test]
    fn invokes_typed_by_schema_in_both_blocks() {
        for (grammar, block) in [
            (&GRAMMAR_V32, "function_calls"),
            (&GRAMMAR_V4, "tool_calls"),
        ] {
            let text = format!(
                "I'll look.\n\n<｜DSML｜{block}>\n<｜DSML｜invoke name=\"get_weather\">\n\
                 <｜DSML｜parameter name=\"city\" string=\"true\">Zürich</｜DSML｜parameter>\n\
                 <｜DSML｜parameter name=\"days\" string=\"false\">2</｜DSML｜parameter>\n\
                 </｜DSML｜invoke>\n<｜DSML｜invoke name=\"get_time\">\n</｜DSML｜invoke>\n\
                 </｜DSML｜{block}>"
            );
            assert_eq!(
                every_split(grammar, &text),
                [
                    p("text", "I'll look."),
                    p("get_weather", r#"{"city":"Zürich","days":2}"#),
                    p("get_time", "{}"),
                ],
                "{block}"
            );
        }
    }

    #[test]
    fn malformed_invokes_stay_text() {
        for text in [
            // An unknown tool, an unquoted name, a kind that is neither, a required parameter
            // missing, a cut-off value.
            "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"launch\">\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
            "<｜DSML｜function_calls>\n<｜DSML｜invoke name=get_time>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
            "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_time\">\n<｜DSML｜parameter name=\"zone\" string=\"maybe\">x</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
            "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
            "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">Zür",
        ] {
            assert_eq!(every_split(&GRAMMAR_V32, text), [p("text", text)], "{text}");
        }
    }
}
