//! Gemma 4's calls, as its template renders earlier ones: one call per block, its arguments in
//! Gemma's own notation — keys bare, strings between `<|"|>` tokens, numbers and booleans
//! bare, objects `{…}` and lists `[…]` nested — read into JSON and checked against the tool's
//! schema:
//!
//! ```text
//! <|tool_call>call:get_weather{city:<|"|>Zürich<|"|>,days:3}<tool_call|>
//! ```

use crate::tools::block::{Cursor, Grammar};
use crate::tools::json::Ordered;
use crate::tools::offered::Offered;
use crate::tools::stream::Progress;
use crate::tools::ToolCall;

/// The dialect's block.
pub static GRAMMAR: Grammar = Grammar {
    open: "<|tool_call>",
    close: "<tool_call|>",
    body,
    partial,
};

/// Gemma's string delimiter (a token of its own).
const QUOTE: &str = "<|\"|>";

/// Nesting deeper than this is refused (a hostile answer cannot recurse without bound).
const MAX_DEPTH: usize = 32;

/// A value of Gemma's notation at the start of `text`, and what follows it.
fn value(text: &str, depth: usize) -> Option<(Ordered, &str)> {
    if depth > MAX_DEPTH {
        return None;
    }
    let text = text.trim_start();
    if let Some(rest) = text.strip_prefix(QUOTE) {
        let end = rest.find(QUOTE)?;
        return Some((
            Ordered::String(rest[..end].to_string()),
            &rest[end + QUOTE.len()..],
        ));
    }
    if let Some(rest) = text.strip_prefix('{') {
        return object(rest, depth + 1);
    }
    if let Some(mut rest) = text.strip_prefix('[') {
        let mut items = Vec::new();
        if let Some(after) = rest.trim_start().strip_prefix(']') {
            return Some((Ordered::Array(items), after));
        }
        loop {
            let (item, after) = value(rest, depth + 1)?;
            items.push(item);
            let after = after.trim_start();
            if let Some(after) = after.strip_prefix(',') {
                rest = after;
            } else {
                return Some((Ordered::Array(items), after.strip_prefix(']')?));
            }
        }
    }
    // A bare scalar, up to the next delimiter.
    let end = text.find([',', '}', ']']).unwrap_or(text.len());
    let bare = text[..end].trim();
    let scalar = match bare {
        "" => return None,
        "None" | "null" => Ordered::Null,
        _ => match Ordered::parse(bare.as_bytes()) {
            Some(v @ (Ordered::Number(_) | Ordered::Bool(_) | Ordered::Null)) => v,
            _ => Ordered::String(bare.to_string()),
        },
    };
    Some((scalar, &text[end..]))
}

/// An object's members after its `{`, and what follows its `}`. Keys are bare or quoted.
fn object(mut rest: &str, depth: usize) -> Option<(Ordered, &str)> {
    let mut members = Vec::new();
    if let Some(after) = rest.trim_start().strip_prefix('}') {
        return Some((Ordered::Object(members), after));
    }
    loop {
        let text = rest.trim_start();
        let (key, after) = match text.strip_prefix(QUOTE) {
            Some(quoted) => {
                let end = quoted.find(QUOTE)?;
                let after = quoted[end + QUOTE.len()..].trim_start().strip_prefix(':')?;
                (quoted[..end].to_string(), after)
            }
            None => {
                let (key, after) = text.split_once(':')?;
                let key = key.trim();
                if key.is_empty() || key.contains(['{', '}', ',', '<', '[', ']']) {
                    return None;
                }
                (key.to_string(), after)
            }
        };
        let (v, after) = value(after, depth)?;
        members.retain(|(k, _): &(String, Ordered)| k != &key);
        members.push((key, v));
        let after = after.trim_start();
        if let Some(after) = after.strip_prefix(',') {
            rest = after;
        } else {
            return Some((Ordered::Object(members), after.strip_prefix('}')?));
        }
    }
}

/// A block's `call:NAME{…}`: the name and the arguments, with nothing after them.
fn call(text: &str) -> Option<(&str, Ordered)> {
    let mut c = Cursor::new(text);
    c.skip_space();
    if !c.eat("call:") {
        return None;
    }
    let rest = c.rest();
    let open = rest.find('{')?;
    let name = rest[..open].trim();
    if name.is_empty() || name.contains(['<', '\n', ' ']) {
        return None;
    }
    let (arguments, after) = object(&rest[open + 1..], 1)?;
    after.trim().is_empty().then_some((name, arguments))
}

/// The call so far: once its name is read, and done when its arguments are whole.
fn partial(text: &str, offered: &Offered, end: bool) -> Vec<Progress> {
    let Some(rest) = text.trim_start().strip_prefix("call:") else {
        return Vec::new();
    };
    let Some(open) = rest.find('{') else {
        return Vec::new();
    };
    let name = rest[..open].trim();
    if name.is_empty() {
        return Vec::new();
    }
    let whole =
        call(text).and_then(|(name, arguments)| offered.json_call(name, Some(&arguments), None));
    vec![Progress {
        name: name.to_string(),
        id: None,
        arguments: whole.map(|c| c.arguments).unwrap_or_default(),
        done: end && call(text).is_some(),
    }]
}

fn body(text: &str, offered: &Offered) -> Option<Vec<ToolCall>> {
    let (name, arguments) = call(text)?;
    Some(vec![offered.json_call(name, Some(&arguments), None)?])
}

#[cfg(test)]
mod tests {
    use super::GRAMMAR;
    use crate::tools::block::testing::{every_split, p};

    #[test]
    fn calls_in_gemmas_notation_become_json() {
        let text = "Let me look.<|tool_call>call:get_weather{city:<|\"|>Zürich, CH<|\"|>,days:3}<tool_call|><|tool_call>call:get_time{}<tool_call|>";
        assert_eq!(
            every_split(&GRAMMAR, text),
            [
                p("text", "Let me look."),
                p("get_weather", r#"{"city":"Zürich, CH","days":3}"#),
                p("get_time", "{}"),
            ]
        );
    }

    #[test]
    fn nested_values_and_bare_scalars() {
        let (v, rest) = super::value(
            "{a:[1,<|\"|>x<|\"|>,{b:true}],c:None,d:-2.5e3,e:plain words}!",
            0,
        )
        .unwrap();
        assert_eq!(rest, "!");
        assert_eq!(
            v.to_text(),
            r#"{"a":[1,"x",{"b":true}],"c":null,"d":-2500.0,"e":"plain words"}"#
        );
        // Too deep, unclosed, a key with a brace: refused.
        assert!(super::value(&"[".repeat(40), 0).is_none());
        assert!(super::value("{a:<|\"|>open", 0).is_none());
        assert!(super::value("{a{b:1}", 0).is_none());
    }

    #[test]
    fn malformed_calls_stay_text() {
        for text in [
            "<|tool_call>call:launch{}<tool_call|>",
            "<|tool_call>call:get_weather{days:3}<tool_call|>",
            "<|tool_call>get_weather{city:<|\"|>x<|\"|>}<tool_call|>",
            "<|tool_call>call:get_weather{city:<|\"|>x<|\"|>} and more<tool_call|>",
            "<|tool_call>call:get_weather{city:<|\"|>Zür",
        ] {
            assert_eq!(every_split(&GRAMMAR, text), [p("text", text)], "{text}");
        }
    }
}
