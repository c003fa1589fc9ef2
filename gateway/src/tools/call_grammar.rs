//! Forced calls under a grammar: after the opening that [`super::forced`] appends to the
//! prompt, the rest of the call (which function, for `required` with several; the arguments
//! under that function's JSON Schema; the call's close) is decoded under a Lark grammar in
//! llguidance's dialect, so the answer is a call whose arguments validate. Only families
//! whose call is Hermes' `<tool_call>{json}</tool_call>` (Hermes, Qwen2.5, Qwen3, and
//! templates that show no call format, such as SmolLM2's) have one yet; the others keep the
//! opening alone.

use super::forced::Opener;
use super::json::Ordered;
use super::{Tool, ToolChoice};

/// Where the grammar takes over from the opening: for a named call, just before its
/// arguments (the opening's `{` is then left to the grammar).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallGrammar {
    /// The grammar (llguidance's Lark).
    pub lark: String,
    /// The opening must stop before the arguments' `{`.
    pub without_brace: bool,
}

/// A Lark string literal of `text` (JSON's escapes, which Lark's strings read the same).
fn literal(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_else(|_| "\"\"".into())
}

/// `parameters` as a schema for `%json`, with the layout the template's `tojson` writes
/// (`", "` and `": "`, no other whitespace), keys in the client's order; any object when
/// the tool gave no schema (or one that is not an object).
fn arguments_schema(parameters: Option<&str>) -> String {
    let layout = Ordered::Object(vec![
        ("whitespace_flexible".into(), Ordered::Bool(false)),
        ("item_separator".into(), Ordered::String(", ".into())),
        ("key_separator".into(), Ordered::String(": ".into())),
    ]);
    let mut schema = match parameters.and_then(|p| Ordered::parse(p.as_bytes())) {
        Some(Ordered::Object(entries)) if !entries.is_empty() => entries,
        _ => vec![("type".into(), Ordered::String("object".into()))],
    };
    schema.retain(|(k, _)| k != "x-guidance");
    schema.push(("x-guidance".into(), layout));
    Ordered::Object(schema).to_text()
}

/// The grammar of the rest of a forced call for a model of this `opener`, when `choice`
/// (`required` or a named function, after a single offered tool was made the named one)
/// forces one and the family has a grammar.
pub fn call_grammar(opener: Opener, choice: &ToolChoice, offered: &[&Tool]) -> Option<CallGrammar> {
    if opener != Opener::Hermes {
        return None;
    }
    const CLOSE: &str = "}\n</tool_call>";
    match choice {
        ToolChoice::Function(name) => {
            let tool = offered.iter().find(|t| &t.name == name)?;
            let lark = format!(
                "start: args {}\nargs: %json {}\n",
                literal(CLOSE),
                arguments_schema(tool.parameters.as_deref())
            );
            Some(CallGrammar {
                lark,
                without_brace: true,
            })
        }
        ToolChoice::Required if !offered.is_empty() => {
            let mut lark = String::from("start: ");
            let names: Vec<String> = (0..offered.len()).map(|i| format!("call_{i}")).collect();
            lark.push_str(&names.join(" | "));
            lark.push('\n');
            for (i, tool) in offered.iter().enumerate() {
                let head = format!("{}\", \"arguments\": ", tool.name);
                lark.push_str(&format!(
                    "call_{i}: {} args_{i} {}\nargs_{i}: %json {}\n",
                    literal(&head),
                    literal(CLOSE),
                    arguments_schema(tool.parameters.as_deref())
                ));
            }
            Some(CallGrammar {
                lark,
                without_brace: false,
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, parameters: Option<&str>) -> Tool {
        Tool {
            name: name.into(),
            description: None,
            parameters: parameters.map(str::to_owned),
        }
    }

    #[test]
    fn a_named_call_grammar_holds_the_tool_schema_in_its_key_order() {
        let t = tool(
            "get_weather",
            Some(r#"{"type": "object", "properties": {"z": {}, "a": {}}}"#),
        );
        let g = call_grammar(
            Opener::Hermes,
            &ToolChoice::Function("get_weather".into()),
            &[&t],
        )
        .unwrap();
        assert!(g.without_brace);
        assert!(
            g.lark
                .starts_with("start: args \"}\\n</tool_call>\"\nargs: %json {"),
            "{}",
            g.lark
        );
        assert!(g.lark.find("\"z\"").unwrap() < g.lark.find("\"a\"").unwrap());
        assert!(
            g.lark.contains("\"whitespace_flexible\":false"),
            "{}",
            g.lark
        );
        assert_eq!(
            call_grammar(Opener::Llama, &ToolChoice::Required, &[&t]),
            None
        );
        assert_eq!(call_grammar(Opener::Hermes, &ToolChoice::Auto, &[&t]), None);
    }

    #[test]
    fn required_offers_every_tool_by_name() {
        let a = tool("a", None);
        let b = tool("say \"hi\"", Some("[]"));
        let g = call_grammar(Opener::Hermes, &ToolChoice::Required, &[&a, &b]).unwrap();
        assert!(!g.without_brace);
        assert!(g.lark.starts_with("start: call_0 | call_1\n"), "{}", g.lark);
        assert!(
            g.lark
                .contains(r#"call_1: "say \"hi\"\", \"arguments\": " args_1"#),
            "{}",
            g.lark
        );
        assert!(
            g.lark.contains(r#"args_1: %json {"type":"object""#),
            "{}",
            g.lark
        );
    }
}
