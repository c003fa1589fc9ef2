//! MiniMax M3's calls, as its template renders earlier ones: every tag behind M3's namespace
//! marker `]<]minimax[>[`, each argument an element named by its key, objects nested as
//! elements, lists as `<item>`s, scalars as text typed by the tool's schema
//! ([`crate::tools::offered::typed`]):
//!
//! ```text
//! ]<]minimax[>[<tool_call>
//! ]<]minimax[>[<invoke name="get_weather">]<]minimax[>[<city>Zürich]<]minimax[>[</city>]<]minimax[>[<days>3]<]minimax[>[</days>]<]minimax[>[</invoke>
//! ]<]minimax[>[</tool_call>
//! ```

use crate::tools::block::{Cursor, Grammar};
use crate::tools::json::Ordered;
use crate::tools::offered::{typed, Offered};
use crate::tools::stream::Progress;
use crate::tools::ToolCall;
use serde_json::Value;

/// M3's namespace marker, before every tag.
pub const NS: &str = "]<]minimax[>[";

/// The dialect's block.
pub static GRAMMAR: Grammar = Grammar {
    open: "]<]minimax[>[<tool_call>",
    close: "]<]minimax[>[</tool_call>",
    body,
    partial,
};

/// Nesting deeper than this is refused.
const MAX_DEPTH: usize = 32;

/// The content of an element up to its closing tag `</name>` (the marker removed from the
/// body beforehand): nested elements (an object, or a list of `item`s) or text, typed by
/// `schema`. Returns the value and what follows the closing tag.
fn content<'a>(
    text: &'a str,
    name: &str,
    schema: Option<&Value>,
    depth: usize,
) -> Option<(Ordered, &'a str)> {
    if depth > MAX_DEPTH {
        return None;
    }
    let close = format!("</{name}>");
    // An invoke without arguments.
    if name == "invoke" {
        if let Some(after) = text.trim_start().strip_prefix(close.as_str()) {
            return Some((Ordered::Object(Vec::new()), after));
        }
    }
    if !text.trim_start().starts_with('<') || text.starts_with(&close) {
        let end = text.find(&close)?;
        let raw = &text[..end];
        if raw.contains('<') {
            return None;
        }
        return Some((typed(raw, schema), &text[end + close.len()..]));
    }
    let mut rest = text.trim_start();
    let mut members: Vec<(String, Ordered)> = Vec::new();
    let mut items = Vec::new();
    loop {
        if let Some(after) = rest.strip_prefix(close.as_str()) {
            let value = if items.is_empty() || !members.is_empty() {
                Ordered::Object(members)
            } else {
                Ordered::Array(items)
            };
            return Some((value, after));
        }
        let open = rest.strip_prefix('<')?;
        let (key, after) = open.split_once('>')?;
        if key.is_empty() || key.starts_with('/') || key.contains(['<', ' ', '"']) {
            return None;
        }
        let child_schema = if key == "item" {
            schema.and_then(|s| s.get("items"))
        } else {
            schema
                .and_then(|s| s.get("properties"))
                .and_then(|p| p.get(key))
        };
        let (value, after) = content(after, key, child_schema, depth + 1)?;
        if key == "item" {
            items.push(value);
        } else {
            members.retain(|(k, _)| k != key);
            members.push((key.to_string(), value));
        }
        rest = after.trim_start();
    }
}

/// The invokes of a body with the markers removed; each with its arguments, `None` when one
/// is malformed. `complete`: the invokes whose closing tag came (a trailing open one is left
/// out).
fn invokes<'a>(text: &'a str, offered: &Offered) -> (Vec<(&'a str, Ordered)>, bool) {
    let mut c = Cursor::new(text);
    let mut calls = Vec::new();
    loop {
        c.skip_space();
        if c.is_done() {
            return (calls, true);
        }
        if !c.eat("<invoke name=\"") {
            return (calls, false);
        }
        let Some(name) = c
            .until("\">")
            .filter(|n| !n.is_empty() && !n.contains(['"', '<']))
        else {
            return (calls, false);
        };
        let schema = offered.schema(name).flatten();
        let Some((arguments, after)) = content(c.rest(), "invoke", schema, 1) else {
            return (calls, false);
        };
        calls.push((name, arguments));
        c = Cursor::new(after);
    }
}

/// The body with M3's namespace markers removed.
fn unmarked(text: &str) -> String {
    text.replace(NS, "")
}

/// The calls so far: each once its invoke is whole.
fn partial(text: &str, offered: &Offered, _end: bool) -> Vec<Progress> {
    let body = unmarked(text);
    let (calls, _) = invokes(&body, offered);
    calls
        .into_iter()
        .map(|(name, arguments)| Progress {
            name: name.to_string(),
            id: None,
            arguments: offered
                .json_call(name, Some(&arguments), None)
                .map(|c| c.arguments)
                .unwrap_or_default(),
            done: true,
        })
        .collect()
}

fn body(text: &str, offered: &Offered) -> Option<Vec<ToolCall>> {
    let body = unmarked(text);
    let (calls, complete) = invokes(&body, offered);
    if !complete {
        return None;
    }
    calls
        .into_iter()
        .map(|(name, arguments)| offered.json_call(name, Some(&arguments), None))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::GRAMMAR;
    use crate::tools::block::testing::{every_split, p};

    #[test]
    fn invokes_typed_by_schema() {
        let text = "I'll look.]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name=\"get_weather\">]<]minimax[>[<city>Zürich]<]minimax[>[</city>]<]minimax[>[<days>2]<]minimax[>[</days>]<]minimax[>[</invoke>\n]<]minimax[>[<invoke name=\"get_time\">]<]minimax[>[</invoke>\n]<]minimax[>[</tool_call>";
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
    fn nested_objects_and_lists() {
        let body = "<invoke name=\"f\"><place><city>Bern</city><zip>3000</zip></place><tags><item>a</item><item>b</item></tags></invoke>";
        let (v, rest) =
            super::content(&body["<invoke name=\"f\">".len()..], "invoke", None, 1).unwrap();
        assert_eq!(rest, "");
        assert_eq!(
            v.to_text(),
            r#"{"place":{"city":"Bern","zip":3000},"tags":["a","b"]}"#
        );
    }

    #[test]
    fn malformed_calls_stay_text() {
        for text in [
            "]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name=\"launch\">]<]minimax[>[</invoke>\n]<]minimax[>[</tool_call>",
            "]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name=\"get_weather\">]<]minimax[>[<days>2]<]minimax[>[</days>]<]minimax[>[</invoke>\n]<]minimax[>[</tool_call>",
            "]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name=\"get_weather\">]<]minimax[>[<city>Zür",
            "]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name=\"get_weather\">]<]minimax[>[<city>Zürich]<]minimax[>[</town>]<]minimax[>[</invoke>\n]<]minimax[>[</tool_call>",
        ] {
            assert_eq!(every_split(&GRAMMAR, text), [p("text", text)], "{text}");
        }
    }
}
