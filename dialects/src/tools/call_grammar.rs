//! Forced calls under a grammar: after the opening that [`super::forced`] appends to the
//! prompt, the rest of the call (which function, for `required` with several; the arguments
//! under that function's JSON Schema; the call's close) is decoded under a Lark grammar in
//! llguidance's dialect, so the answer is a call whose arguments validate. Every family whose
//! arguments are one JSON object has one: Hermes (Qwen2.5, Qwen3, templates that show no call
//! format), Llama 3.x, Mistral Nemo's list, Kimi K2, DeepSeek V3.1 and V3/R1's fenced form, and
//! gpt-oss's harmony. The XML families (Qwen3-Coder, GLM, MiniMax) write each argument in its
//! own tags: their grammar holds the schema's properties in its order (the required ones
//! always, the others optional), a string's value as text without `<` (the parsers end a value
//! at the first tag; Qwen3-Coder's also without a line break, which ends its value), any other
//! value as JSON under the property's schema; MiniMax M3's and DeepSeek DSML's the same in
//! their tags. Mistral's `[ARGS]` and Gemma 4's notation keep the opening alone.
//!
//! A family's fixed text around the arguments holds control tokens (`<|tool_call_end|>`,
//! harmony's `<|channel|>`): those are written as rules `ctl_N: "TOKEN"` on lines of their
//! own, and the runner, which knows the tokenizer, makes each the special token itself (by
//! id) where its vocabulary has it as one, and leaves it text where the token is ordinary
//! (`text::constraint::resolve_controls`).

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
    let schema = match parameters.and_then(|p| Ordered::parse(p.as_bytes())) {
        Some(Ordered::Object(entries)) if !entries.is_empty() => Ordered::Object(entries),
        _ => Ordered::Object(vec![("type".into(), Ordered::String("object".into()))]),
    };
    arguments_schema_of(schema)
}

/// `schema` (an object, else any JSON value) with the compact layout of [`arguments_schema`].
fn arguments_schema_of(schema: Ordered) -> String {
    let layout = Ordered::Object(vec![
        ("whitespace_flexible".into(), Ordered::Bool(false)),
        ("item_separator".into(), Ordered::String(", ".into())),
        ("key_separator".into(), Ordered::String(": ".into())),
    ]);
    let mut schema = match schema {
        Ordered::Object(entries) => entries,
        _ => Vec::new(),
    };
    schema.retain(|(k, _)| k != "x-guidance");
    schema.push(("x-guidance".into(), layout));
    Ordered::Object(schema).to_text()
}

/// A piece of a call's fixed text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Piece {
    Text(String),
    /// A control token of the family (special in its published tokenizer, or not).
    Control(&'static str),
    /// A Lark terminal written as it is (Kimi's call index under `auto`, which counts calls
    /// the grammar cannot see).
    Pattern(&'static str),
}

pub(super) fn text(t: impl Into<String>) -> Piece {
    Piece::Text(t.into())
}

/// The fixed text of a call of `name` after the `required` opening (`Opener::required`) up
/// to its arguments, and after the arguments to the call's end (the family's end-of-turn
/// token, where that ends a call, is the model's). `None` for the families without a grammar.
/// `index`: the call's place among the conversation's calls (Kimi's ids), any when `None`.
fn call_text(opener: Opener, name: &str, index: Option<usize>) -> Option<(Vec<Piece>, Vec<Piece>)> {
    use Piece::Control;
    const DEEPSEEK_END: [Piece; 2] = [
        Control("<｜tool▁call▁end｜>"),
        Control("<｜tool▁calls▁end｜>"),
    ];
    Some(match opener {
        Opener::Hermes => (
            vec![text(format!("{name}\", \"arguments\": "))],
            vec![text("}\n"), Control("</tool_call>")],
        ),
        Opener::Llama => (
            vec![text(format!("{name}\", \"parameters\": "))],
            vec![text("}")],
        ),
        Opener::MistralList => (
            vec![text(format!("{name}\", \"arguments\": "))],
            vec![text("}]")],
        ),
        Opener::Kimi => (
            match index {
                Some(index) => vec![
                    text(format!("{name}:{index}")),
                    Control("<|tool_call_argument_begin|>"),
                ],
                None => vec![
                    text(format!("{name}:")),
                    Piece::Pattern("/[0-9]+/"),
                    Control("<|tool_call_argument_begin|>"),
                ],
            },
            vec![
                Control("<|tool_call_end|>"),
                Control("<|tool_calls_section_end|>"),
            ],
        ),
        Opener::DeepSeek => (
            vec![text(name), Control("<｜tool▁sep｜>")],
            DEEPSEEK_END.to_vec(),
        ),
        Opener::DeepSeekFenced => {
            let mut close = vec![text("\n```")];
            close.extend(DEEPSEEK_END);
            (vec![text(format!("{name}\n```json\n"))], close)
        }
        Opener::Harmony => (
            vec![
                text(name),
                Control("<|channel|>"),
                text("commentary json"),
                Control("<|message|>"),
            ],
            Vec::new(),
        ),
        // Mistral's newer templates (Small 3.2, Magistral): `[TOOL_CALLS]NAME[ARGS]{…}`, each
        // call after its own marker, nothing after the arguments but the end of turn.
        Opener::MistralArgs => (vec![text(name), Control("[ARGS]")], Vec::new()),
        Opener::Qwen3Coder
        | Opener::Glm
        | Opener::MiniMax
        | Opener::Dsml
        | Opener::DsmlV4
        | Opener::Gemma4
        | Opener::MiniMaxM3
        | Opener::KimiK3 => return None,
    })
}

/// An XML family's call: the text after the `required` opening up to the arguments, around
/// each argument (before its value, given the key; after it), after the arguments, and the
/// regular expression of a string value.
struct XmlCall {
    head: Vec<Piece>,
    /// Given the key and whether the value is text.
    key: fn(&str, bool) -> Vec<Piece>,
    /// Given the key.
    after_value: fn(&str) -> Vec<Piece>,
    close: Vec<Piece>,
    text_value: &'static str,
}

fn xml_call(opener: Opener, name: &str) -> Option<XmlCall> {
    use Piece::Control;
    Some(match opener {
        Opener::Qwen3Coder => XmlCall {
            head: vec![text(format!("{name}>\n"))],
            key: |k, _| vec![text(format!("<parameter={k}>\n"))],
            after_value: |_| vec![text("\n</parameter>\n")],
            close: vec![text("</function>\n"), Control("</tool_call>")],
            text_value: r"/[^<\n]*/",
        },
        Opener::Glm => XmlCall {
            head: vec![text(name)],
            key: |k, _| {
                vec![
                    text("\n"),
                    Control("<arg_key>"),
                    text(k),
                    Control("</arg_key>"),
                    text("\n"),
                    Control("<arg_value>"),
                ]
            },
            after_value: |_| vec![Control("</arg_value>")],
            close: vec![text("\n"), Control("</tool_call>")],
            text_value: r"/[^<]*/",
        },
        Opener::MiniMax => XmlCall {
            head: vec![text(format!("{name}\">\n"))],
            key: |k, _| vec![text(format!("<parameter name=\"{k}\">"))],
            after_value: |_| vec![text("</parameter>\n")],
            close: vec![text("</invoke>\n"), Control("</minimax:tool_call>")],
            text_value: r"/[^<]*/",
        },
        Opener::MiniMaxM3 => XmlCall {
            head: vec![text(format!("{name}\">"))],
            key: |k, _| vec![Control("]<]minimax[>["), text(format!("<{k}>"))],
            after_value: |k| vec![Control("]<]minimax[>["), text(format!("</{k}>"))],
            close: vec![
                Control("]<]minimax[>["),
                text("</invoke>\n"),
                Control("]<]minimax[>["),
                text("</tool_call>"),
            ],
            text_value: r"/[^<\]]*/",
        },
        Opener::Dsml | Opener::DsmlV4 => XmlCall {
            head: vec![text(format!("{name}\">\n"))],
            key: |k, is_text| {
                vec![text(format!(
                    "<｜DSML｜parameter name=\"{k}\" string=\"{is_text}\">"
                ))]
            },
            after_value: |_| vec![text("</｜DSML｜parameter>\n")],
            close: vec![text(if opener == Opener::Dsml {
                "</｜DSML｜invoke>\n</｜DSML｜function_calls>"
            } else {
                "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
            })],
            text_value: r"/[^<]*/",
        },
        _ => return None,
    })
}

/// Whether a property of `schema` is written as text in the XML families: a string, or of no
/// stated type (the parser reads text that is not JSON as a string).
fn text_valued(schema: &Ordered) -> bool {
    match schema.get("type") {
        Some(Ordered::String(kind)) => kind == "string",
        Some(Ordered::Array(kinds)) => kinds
            .iter()
            .any(|k| matches!(k, Ordered::String(s) if s == "string")),
        _ => true,
    }
}

/// The arguments of an XML call of a tool with `parameters`, as rules named `{rule}_N`, and
/// the sequence that writes them.
fn xml_arguments(
    call: &XmlCall,
    parameters: Option<&str>,
    rule: &str,
    writer: &mut Writer,
    rules: &mut String,
) -> String {
    let schema = parameters.and_then(|p| Ordered::parse(p.as_bytes()));
    let required: Vec<&str> = match schema.as_ref().and_then(|s| s.get("required")) {
        Some(Ordered::Array(keys)) => keys
            .iter()
            .filter_map(|k| match k {
                Ordered::String(k) => Some(k.as_str()),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    let properties = match schema.as_ref().and_then(|s| s.get("properties")) {
        Some(Ordered::Object(entries)) => entries.clone(),
        _ => Vec::new(),
    };
    let mut sequence = Vec::new();
    for (i, (key, property)) in properties.iter().enumerate() {
        let is_text = text_valued(property);
        let value = if is_text {
            call.text_value.to_string()
        } else {
            let mut property = property.clone();
            if let Ordered::Object(entries) = &mut property {
                entries.retain(|(k, _)| k != "x-guidance");
            }
            let schema = arguments_schema_of(property);
            rules.push_str(&format!("{rule}_{i}_value: %json {schema}\n"));
            format!("{rule}_{i}_value")
        };
        let open = writer.pieces(&(call.key)(key, is_text));
        let after = writer.pieces(&(call.after_value)(key));
        rules.push_str(&format!("{rule}_{i}: {open} {value} {after}\n"));
        sequence.push(if required.contains(&key.as_str()) {
            format!("{rule}_{i}")
        } else {
            format!("{rule}_{i}?")
        });
    }
    sequence.join(" ")
}

/// Writes grammar rules: each piece as a literal or a `ctl_N` rule (added to `controls`).
#[derive(Default)]
pub(super) struct Writer {
    controls: Vec<&'static str>,
}

impl Writer {
    pub(super) fn pieces(&mut self, pieces: &[Piece]) -> String {
        let items: Vec<String> = pieces
            .iter()
            .map(|p| match p {
                Piece::Text(t) => literal(t),
                Piece::Pattern(p) => p.to_string(),
                Piece::Control(c) => {
                    let at = self
                        .controls
                        .iter()
                        .position(|x| x == c)
                        .unwrap_or_else(|| {
                            self.controls.push(c);
                            self.controls.len() - 1
                        });
                    format!("ctl_{at}")
                }
            })
            .collect();
        items.join(" ")
    }

    /// The `ctl_N: "TOKEN"` rules, each on its own line.
    pub(super) fn control_rules(&self) -> String {
        self.controls
            .iter()
            .enumerate()
            .map(|(i, c)| format!("ctl_{i}: {}\n", literal(c)))
            .collect()
    }
}

/// The grammar of the rest of a forced call for a model of this `opener`, when `choice`
/// (`required` or a named function, after a single offered tool was made the named one)
/// forces one and the family has a grammar. `index`: the call's place among the
/// conversation's calls (Kimi's ids count them).
pub fn call_grammar(
    opener: Opener,
    choice: &ToolChoice,
    offered: &[&Tool],
    index: usize,
) -> Option<CallGrammar> {
    let mut writer = Writer::default();
    if let ToolChoice::Required = choice {
        let rules = required_rules(opener, offered, Some(index), &mut writer)?;
        return Some(CallGrammar {
            lark: format!("start: {rules}{}", writer.control_rules()),
            without_brace: false,
        });
    }
    if xml_call(opener, "").is_some() {
        return xml_grammar(opener, choice, offered, &mut writer);
    }
    match choice {
        ToolChoice::Function(name) => {
            let tool = offered.iter().find(|t| &t.name == name)?;
            let (_, close) = call_text(opener, name, Some(index))?;
            let close = writer.pieces(&close);
            let start = [String::from("args"), close]
                .into_iter()
                .filter(|p| !p.is_empty())
                .collect::<Vec<_>>()
                .join(" ");
            let lark = format!(
                "start: {start}\nargs: %json {}\n{}",
                arguments_schema(tool.parameters.as_deref()),
                writer.control_rules()
            );
            Some(CallGrammar {
                lark,
                without_brace: true,
            })
        }
        _ => None,
    }
}

/// The rest of a call after the family's `required` opening, one of `offered` (at least one):
/// the alternatives (`call_0 | call_1 …`) on the first line, then their rules; the control
/// rules are left in `writer`. `index`: as [`call_text`]'s. `None` for the families without
/// a grammar.
pub(super) fn required_rules(
    opener: Opener,
    offered: &[&Tool],
    index: Option<usize>,
    writer: &mut Writer,
) -> Option<String> {
    if offered.is_empty() {
        return None;
    }
    let names: Vec<String> = (0..offered.len()).map(|i| format!("call_{i}")).collect();
    let mut lark = format!("{}\n", names.join(" | "));
    if xml_call(opener, "").is_some() {
        for (i, tool) in offered.iter().enumerate() {
            let call = xml_call(opener, &tool.name)?;
            let rule = format!("arg_{i}");
            let mut rules = String::new();
            let arguments =
                xml_arguments(&call, tool.parameters.as_deref(), &rule, writer, &mut rules);
            let (head, close) = (writer.pieces(&call.head), writer.pieces(&call.close));
            lark.push_str(&rules);
            lark.push_str(&format!("call_{i}: {head} {arguments} {close}\n"));
        }
        return Some(lark);
    }
    for (i, tool) in offered.iter().enumerate() {
        let (head, close) = call_text(opener, &tool.name, index)?;
        let (head, close) = (writer.pieces(&head), writer.pieces(&close));
        lark.push_str(&format!(
            "call_{i}: {head} args_{i} {close}\nargs_{i}: %json {}\n",
            arguments_schema(tool.parameters.as_deref())
        ));
    }
    Some(lark)
}

/// [`call_grammar`] of a named function for the XML families: the arguments are tags, not
/// one JSON object.
fn xml_grammar(
    opener: Opener,
    choice: &ToolChoice,
    offered: &[&Tool],
    writer: &mut Writer,
) -> Option<CallGrammar> {
    let mut rules = String::new();
    let start = match choice {
        ToolChoice::Function(name) => {
            let tool = offered.iter().find(|t| &t.name == name)?;
            let call = xml_call(opener, name)?;
            let arguments =
                xml_arguments(&call, tool.parameters.as_deref(), "arg", writer, &mut rules);
            let close = writer.pieces(&call.close);
            format!("start: {arguments} {close}\n")
        }
        _ => return None,
    };
    Some(CallGrammar {
        lark: format!("{start}{rules}{}", writer.control_rules()),
        without_brace: false,
    })
}

#[cfg(test)]
#[path = "call_grammar_tests.rs"]
mod tests;
