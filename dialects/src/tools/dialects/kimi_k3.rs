//! Kimi K3's calls (its "XTML", as mlx-lm's `tool_parsers/kimi_k3.py` reads them): a `tools`
//! section of `call`s, each naming its tool in an attribute, its arguments typed one by one
//! (`type="string"` as written, any other type as JSON, falling back to the text) or given
//! whole as one JSON object, all between Kimi's `<|open|>`, `<|sep|>` and `<|close|>` tokens:
//!
//! ```text
//! <|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|><|open|>argument key="city" type="string"<|sep|>Zürich<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>
//! <|open|>tools<|sep|><|open|>call tool="get_weather"<|sep|><|open|>json type="object"<|sep|>{"city": "Zürich"}<|close|>json<|sep|><|close|>call<|sep|><|close|>tools<|sep|>
//! ```
//!
//! Attribute values escape `"` as `&quot;` and `&` as `&amp;`. It differs from Kimi K2's
//! `<|tool_calls_section_begin|>` sections ([`super::kimi`]) in every token.

use crate::tools::block::{Cursor, Grammar};
use crate::tools::json::Ordered;
use crate::tools::offered::Offered;
use crate::tools::stream::Progress;
use crate::tools::ToolCall;

const SEP: &str = "<|sep|>";
const CALL_END: &str = "<|close|>call<|sep|>";

/// The dialect's block.
pub static GRAMMAR: Grammar = Grammar {
    open: "<|open|>tools<|sep|>",
    close: "<|close|>tools<|sep|>",
    body,
    partial,
};

/// The attributes of a tag (`key="value"` pairs, unescaped), in order.
fn attributes(text: &str) -> Option<Vec<(&str, String)>> {
    let mut out = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"")?;
        let (value, after) = after.split_once('"')?;
        let key = key.trim();
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return None;
        }
        out.push((key, value.replace("&quot;", "\"").replace("&amp;", "&")));
        rest = after.trim_start();
    }
    Some(out)
}

fn attribute<'a>(attrs: &'a [(&str, String)], key: &str) -> Option<&'a str> {
    attrs
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v.as_str())
}

/// One call's body (between its `<|sep|>` and `<|close|>call<|sep|>`): its arguments, `None`
/// when malformed.
fn arguments(body: &str) -> Option<Ordered> {
    let mut c = Cursor::new(body);
    c.skip_space();
    if c.eat("<|open|>json") {
        attributes(c.until(SEP)?)?;
        let value = Ordered::parse(c.until("<|close|>json<|sep|>")?.trim().as_bytes())?;
        c.skip_space();
        return match value {
            Ordered::Object(_) if c.is_done() => Some(value),
            _ => None,
        };
    }
    let mut members: Vec<(String, Ordered)> = Vec::new();
    loop {
        c.skip_space();
        if c.is_done() {
            return Some(Ordered::Object(members));
        }
        if !c.eat("<|open|>argument") {
            return None;
        }
        let attrs = attributes(c.until(SEP)?)?;
        let key = attribute(&attrs, "key")?.to_string();
        let raw = c.until("<|close|>argument<|sep|>")?;
        let value = match attribute(&attrs, "type").unwrap_or("string") {
            "string" => Ordered::String(raw.to_string()),
            _ => Ordered::parse(raw.trim().as_bytes()).unwrap_or(Ordered::String(raw.to_string())),
        };
        members.retain(|(k, _)| *k != key);
        members.push((key, value));
    }
}

/// The whole calls of a section body, in order, and whether the body held nothing else.
fn calls(text: &str) -> (Vec<(String, Option<Ordered>)>, bool) {
    let mut c = Cursor::new(text);
    let mut out = Vec::new();
    loop {
        c.skip_space();
        if c.is_done() {
            return (out, true);
        }
        if !c.eat("<|open|>call") {
            return (out, false);
        }
        let Some(attrs) = c.until(SEP).and_then(attributes) else {
            return (out, false);
        };
        let Some(body) = c.until(CALL_END) else {
            return (out, false);
        };
        match attribute(&attrs, "tool").filter(|n| !n.is_empty()) {
            Some(name) => out.push((name.to_string(), arguments(body))),
            None => return (out, false),
        }
    }
}

/// The calls so far: each once it is whole.
fn partial(text: &str, offered: &Offered, _end: bool) -> Vec<Progress> {
    let (calls, _) = calls(text);
    calls
        .into_iter()
        .map_while(|(name, arguments)| {
            let call = offered.json_call(&name, Some(&arguments?), None)?;
            Some(Progress {
                name,
                id: None,
                arguments: call.arguments,
                done: true,
            })
        })
        .collect()
}

fn body(text: &str, offered: &Offered) -> Option<Vec<ToolCall>> {
    let (calls, complete) = calls(text);
    if !complete {
        return None;
    }
    calls
        .into_iter()
        .map(|(name, arguments)| offered.json_call(&name, Some(&arguments?), None))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::GRAMMAR;
    use crate::tools::block::testing::{every_split, p};

    #[test]
    fn typed_arguments_and_json_objects() {
        let text = "Checking.<|open|>tools<|sep|>\n<|open|>call tool=\"get_weather\" index=\"1\"<|sep|>\n<|open|>argument key=\"city\" type=\"string\"<|sep|>Zürich<|close|>argument<|sep|>\n<|open|>argument key=\"days\" type=\"integer\"<|sep|>2<|close|>argument<|sep|>\n<|close|>call<|sep|>\n<|open|>call tool=\"get_weather\" index=\"2\"<|sep|><|open|>json type=\"object\"<|sep|>{\"city\": \"Bern\", \"days\": 3}<|close|>json<|sep|><|close|>call<|sep|>\n<|close|>tools<|sep|>";
        assert_eq!(
            every_split(&GRAMMAR, text),
            [
                p("text", "Checking."),
                p("get_weather", r#"{"city":"Zürich","days":2}"#),
                p("get_weather", r#"{"city":"Bern","days":3}"#),
            ]
        );
    }

    #[test]
    fn a_string_typed_number_stays_a_string_and_attributes_unescape() {
        let args = super::arguments(
            "<|open|>argument key=\"a&quot;b\" type=\"string\"<|sep|>42<|close|>argument<|sep|>\
             <|open|>argument key=\"n\" type=\"number\"<|sep|>not json<|close|>argument<|sep|>",
        )
        .unwrap();
        assert_eq!(args.to_text(), r#"{"a\"b":"42","n":"not json"}"#);
    }

    #[test]
    fn malformed_calls_stay_text() {
        for text in [
            // A tool not offered.
            "<|open|>tools<|sep|><|open|>call tool=\"launch\"<|sep|><|close|>call<|sep|><|close|>tools<|sep|>",
            // An argument the tool does not take.
            "<|open|>tools<|sep|><|open|>call tool=\"get_weather\"<|sep|><|open|>argument key=\"town\" type=\"string\"<|sep|>x<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>",
            // No tool name.
            "<|open|>tools<|sep|><|open|>call index=\"1\"<|sep|><|close|>call<|sep|><|close|>tools<|sep|>",
            // A JSON block that is not an object.
            "<|open|>tools<|sep|><|open|>call tool=\"get_weather\"<|sep|><|open|>json type=\"object\"<|sep|>[1]<|close|>json<|sep|><|close|>call<|sep|><|close|>tools<|sep|>",
            // Cut off inside a call.
            "<|open|>tools<|sep|><|open|>call tool=\"get_weather\"<|sep|><|open|>argument key=\"city\" type=\"string\"<|sep|>Zür",
        ] {
            assert_eq!(every_split(&GRAMMAR, text), [p("text", text)], "{text}");
        }
    }
}
