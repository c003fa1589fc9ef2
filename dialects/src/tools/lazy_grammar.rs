//! `strict` tools under `tool_choice: "auto"`: the model may answer in prose or call, and a
//! call it opens is decoded under a grammar from its first token on, so its arguments fit
//! the tool's schema as OpenAI's and Anthropic's `strict: true` promise. The grammar is
//! *lazy*: free text, until the family's call marker; then the rest of the `required`
//! opening, one of the offered calls ([`super::call_grammar::required_rules`]), and free text
//! again (more calls may follow).
//!
//! The gateway does not hold the vocabulary, so the marker's first token is written on a line
//! of its own, `lazy_start: "TOKEN" REST`, and the runner
//! (`text::constraint::resolve_lazy_start`) writes the start rule that fits: where the
//! vocabulary has TOKEN as one special token, free text is any token but it (so a thinking
//! model's `</think>` and other control tokens stay possible), and the call begins with it;
//! where TOKEN is text, free text is text, and a call begins the moment the text ends with
//! TOKEN (llguidance's lazy lexeme, which commits at its first match).
//!
//! Families without one: harmony (its answers are control-token channels; a call is a
//! channel's recipient), MiniMax M3 (its marker opens its thinking tags too) and Gemma 4's
//! notation (no call grammar). Their strict calls are checked against
//! the schema after the fact, as every call is.

use super::call_grammar::{required_rules, text, Piece, Writer};
use super::forced::Opener;
use super::Tool;

/// The first token of a call's marker, and the rest of the family's `required` opening.
fn opening(opener: Opener) -> Option<(&'static str, Vec<Piece>)> {
    use Piece::Control;
    Some(match opener {
        Opener::Hermes => ("<tool_call>", vec![text("\n{\"name\": \"")]),
        Opener::Llama => ("{\"name\": \"", Vec::new()),
        Opener::MistralList => ("[TOOL_CALLS]", vec![text("[{\"name\": \"")]),
        Opener::MistralArgs => ("[TOOL_CALLS]", Vec::new()),
        Opener::Qwen3Coder => ("<tool_call>", vec![text("\n<function=")]),
        Opener::Glm => ("<tool_call>", Vec::new()),
        Opener::MiniMax => ("<minimax:tool_call>", vec![text("\n<invoke name=\"")]),
        Opener::Kimi => (
            "<|tool_calls_section_begin|>",
            vec![Control("<|tool_call_begin|>"), text("functions.")],
        ),
        Opener::DeepSeek => (
            "<｜tool▁calls▁begin｜>",
            vec![Control("<｜tool▁call▁begin｜>")],
        ),
        Opener::DeepSeekFenced => (
            "<｜tool▁calls▁begin｜>",
            vec![
                Control("<｜tool▁call▁begin｜>"),
                text("function"),
                Control("<｜tool▁sep｜>"),
            ],
        ),
        Opener::Dsml => (
            "<｜DSML｜function_calls>",
            vec![text("\n<｜DSML｜invoke name=\"")],
        ),
        Opener::DsmlV4 => (
            "<｜DSML｜tool_calls>",
            vec![text("\n<｜DSML｜invoke name=\"")],
        ),
        Opener::Harmony | Opener::MiniMaxM3 | Opener::Gemma4 | Opener::KimiK3 => return None,
    })
}

/// The lazy grammar (llguidance's Lark, with the `lazy_start` line the runner resolves) for
/// `offered` under `auto`, when every offered tool is strict and the family has one; `None`
/// otherwise (a request that mixes strict and other tools keeps the model's own calls: the
/// grammar cannot leave one tool's arguments free in every family).
pub fn lazy_grammar(opener: Opener, offered: &[&Tool]) -> Option<String> {
    if offered.is_empty() || !offered.iter().all(|t| t.strict) {
        return None;
    }
    let (first, rest) = opening(opener)?;
    let mut writer = Writer::default();
    let open = writer.pieces(&rest);
    let calls = required_rules(opener, offered, None, &mut writer)?;
    let token = serde_json::to_string(first).ok()?;
    let start = [token.as_str(), open.as_str(), "lazy_call"]
        .into_iter()
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    Some(format!(
        "lazy_start: {start}\nlazy_call: {calls}{}",
        writer.control_rules()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, strict: bool) -> Tool {
        Tool {
            name: name.into(),
            description: None,
            parameters: Some(
                r#"{"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}"#
                    .into(),
            ),
            strict,
        }
    }

    #[test]
    fn the_opening_pieces_spell_the_required_opening() {
        for opener in super::super::forced::ALL_OPENERS {
            let Some((first, rest)) = opening(opener) else {
                continue;
            };
            let rest: String = rest
                .iter()
                .map(|p| match p {
                    Piece::Text(t) => t.as_str(),
                    Piece::Control(c) => c,
                    Piece::Pattern(p) => p,
                })
                .collect();
            assert_eq!(format!("{first}{rest}"), opener.required(), "{opener:?}");
        }
    }

    #[test]
    fn strict_tools_get_a_lazy_start_then_the_required_calls() {
        let (a, b) = (tool("get_weather", true), tool("get_time", true));
        let g = lazy_grammar(Opener::Hermes, &[&a, &b]).unwrap();
        assert!(
            g.starts_with(
                "lazy_start: \"<tool_call>\" \"\\n{\\\"name\\\": \\\"\" lazy_call\n\
                 lazy_call: call_0 | call_1\n"
            ),
            "{g}"
        );
        assert!(g.contains("args_0: %json {\"type\":\"object\""), "{g}");
        assert!(g.ends_with("ctl_0: \"</tool_call>\"\n"), "{g}");
        // Kimi: the call's index is any number (the grammar cannot count the calls).
        let g = lazy_grammar(Opener::Kimi, &[&a]).unwrap();
        assert!(
            g.starts_with("lazy_start: \"<|tool_calls_section_begin|>\" ctl_0 \"functions.\""),
            "{g}"
        );
        assert!(g.contains("\"get_weather:\" /[0-9]+/ ctl_1"), "{g}");
        // XML families.
        let g = lazy_grammar(Opener::Glm, &[&a]).unwrap();
        assert!(
            g.starts_with("lazy_start: \"<tool_call>\" lazy_call\n"),
            "{g}"
        );
        // Mistral's `[ARGS]`: the name right after the marker.
        let g = lazy_grammar(Opener::MistralArgs, &[&a]).unwrap();
        assert!(
            g.starts_with("lazy_start: \"[TOOL_CALLS]\" lazy_call\nlazy_call: call_0\n"),
            "{g}"
        );
        assert!(g.contains("call_0: \"get_weather\" ctl_0 args_0"), "{g}");
    }

    #[test]
    fn nothing_without_every_tool_strict_or_for_families_without_one() {
        let (strict, loose) = (tool("a", true), tool("b", false));
        assert_eq!(lazy_grammar(Opener::Hermes, &[&strict, &loose]), None);
        assert_eq!(lazy_grammar(Opener::Hermes, &[&loose]), None);
        assert_eq!(lazy_grammar(Opener::Hermes, &[]), None);
        for opener in [Opener::Harmony, Opener::MiniMaxM3, Opener::Gemma4] {
            assert_eq!(lazy_grammar(opener, &[&strict]), None, "{opener:?}");
        }
    }
}
