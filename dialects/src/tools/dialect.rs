//! Which way a model writes its tool calls (and, for harmony, its reasoning): its *dialect*,
//! told by the chat template that renders its prompt. The node that renders the prompt knows
//! the template; the gateway that parses the answer may be another node (a forwarded chat),
//! so the dialect travels with the accepted stream ([`crate::answer::AnswerForm`]).
//!
//! A template renders an earlier assistant turn's calls in the very format the model was
//! trained to write, so the markers it contains tell the dialect, as llama.cpp's chat
//! handlers and exo's parser choice tell it from the template.

use serde::{Deserialize, Serialize};

/// A tool-call (and reasoning) format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dialect {
    /// Qwen3-Coder: `<tool_call><function=NAME><parameter=K>V</parameter></function></tool_call>`.
    Qwen3Coder,
    /// GLM-4.5/4.6/4.7: `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>`.
    Glm,
    /// MiniMax M2: `<minimax:tool_call><invoke name="NAME"><parameter name="K">V</parameter>
    /// </invoke></minimax:tool_call>`.
    MiniMax,
    /// gpt-oss harmony: `analysis`, `final` and `commentary to=functions.NAME` channels.
    Harmony,
    /// Kimi K2: `<|tool_calls_section_begin|>` sections of `functions.NAME:IDX` calls.
    Kimi,
    /// Kimi K3's XTML: `<|open|>tools<|sep|>` sections of `<|open|>call tool="NAME"<|sep|>`
    /// calls, arguments typed one by one or as one JSON object.
    KimiK3,
    /// DeepSeek V3/V3.1/R1: `<｜tool▁calls▁begin｜>` ... `<｜tool▁sep｜>` ... calls.
    DeepSeek,
    /// DeepSeek V3.2: DSML `<｜DSML｜function_calls>` blocks of `invoke`s.
    Dsml,
    /// DeepSeek V4: DSML `<｜DSML｜tool_calls>` blocks of `invoke`s.
    DsmlV4,
    /// Gemma 4: `<|tool_call>call:NAME{key:value,…}<tool_call|>` in Gemma's own notation.
    Gemma4,
    /// MiniMax M3: `]<]minimax[>[<tool_call>` blocks of `invoke`s whose arguments are
    /// elements named by their keys; reasoning in `<mm:think>`.
    MiniMaxM3,
    /// Hermes/Qwen `<tool_call>{json}</tool_call>`, Llama 3.1 JSON, Mistral `[TOOL_CALLS]`,
    /// recognised together ([`crate::tools::parse`]); also what an unknown dialect named by a
    /// newer node falls back to.
    #[default]
    #[serde(other)]
    Common,
}

impl Dialect {
    /// The dialect a chat template speaks (`Common` when it shows none of the others).
    pub fn of_template(template: &str) -> Dialect {
        // MiniMax M3 writes every tag behind its namespace marker (and `<tool_call>`).
        if template.contains("]<]minimax[>[") {
            return Dialect::MiniMaxM3;
        }
        // DeepSeek V3.2 and V4 tell their format in DSML, whose block names differ.
        if template.contains("｜DSML｜") {
            return if template.contains("function_calls") {
                Dialect::Dsml
            } else {
                Dialect::DsmlV4
            };
        }
        // Most distinctive first: GLM and Qwen3-Coder also use `<tool_call>`.
        let table = [
            ("<|channel|>", Dialect::Harmony),
            ("<minimax:tool_call>", Dialect::MiniMax),
            ("<|tool_calls_section_begin|>", Dialect::Kimi),
            ("<|open|>", Dialect::KimiK3),
            ("tool▁calls▁begin", Dialect::DeepSeek),
            ("<arg_key>", Dialect::Glm),
            ("<|tool_call>call:", Dialect::Gemma4),
        ];
        if let Some((_, dialect)) = table.into_iter().find(|(m, _)| template.contains(m)) {
            return dialect;
        }
        // Qwen3-Coder's parameters (Qwen3.5, Nemotron 3 and Step 3.5 write the same), not
        // functionary's `<function=NAME>{json}` nor Seed-OSS's `<seed:tool_call>`.
        let xml = template.contains("<function=") && template.contains("<parameter=");
        if xml && !template.contains("<seed:tool_call>") {
            return Dialect::Qwen3Coder;
        }
        Dialect::Common
    }

    /// Whether this is the default (left out of the wire form).
    pub fn is_common(&self) -> bool {
        *self == Dialect::Common
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_tell_their_dialect() {
        let cases = [
            (
                "{{ '<|start|>assistant<|channel|>final<|message|>' }}",
                Dialect::Harmony,
            ),
            (
                "{{ '<minimax:tool_call>\\n' }}<invoke name=",
                Dialect::MiniMax,
            ),
            ("<|tool_calls_section_begin|>{{ calls }}", Dialect::Kimi),
            (
                "{{- '<|open|>call tool=\"' ~ name ~ '\"<|sep|>' -}}",
                Dialect::KimiK3,
            ),
            (
                "{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'}}",
                Dialect::DeepSeek,
            ),
            (
                "<tool_call>{{ tc.name }}<arg_key>{{ k }}</arg_key>",
                Dialect::Glm,
            ),
            (
                "<tool_call>\n<function={{ name }}>\n<parameter={{ k }}>",
                Dialect::Qwen3Coder,
            ),
            (
                "<function={{ name }}>{{ args | tojson }}</function>",
                Dialect::Common,
            ),
            (
                "<seed:tool_call>\n<function=x>\n<parameter=y>",
                Dialect::Common,
            ),
            (
                "<tool_call>\n{{ tool_call | tojson }}\n</tool_call>",
                Dialect::Common,
            ),
            (
                "{%- set dsml_token = '｜DSML｜' -%}<{{ dsml_token }}function_calls>",
                Dialect::Dsml,
            ),
            (
                "'<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"'",
                Dialect::Dsml,
            ),
            (
                "'<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"'",
                Dialect::DsmlV4,
            ),
            (
                "{{- '<|tool_call>call:' + function['name'] + '{' -}}",
                Dialect::Gemma4,
            ),
            (
                "{%- set ns_token = ']<]minimax[>[' -%}{{ ns_token ~ '<tool_call>' }}",
                Dialect::MiniMaxM3,
            ),
            ("", Dialect::Common),
        ];
        for (template, want) in cases {
            assert_eq!(Dialect::of_template(template), want, "{template}");
        }
    }

    #[test]
    fn wire_form_round_trips_and_tolerates_unknown_names() {
        let text = serde_json::to_string(&Dialect::Qwen3Coder).unwrap();
        assert_eq!(text, "\"qwen3_coder\"");
        assert_eq!(
            serde_json::from_str::<Dialect>(&text).unwrap(),
            Dialect::Qwen3Coder
        );
        assert_eq!(
            serde_json::from_str::<Dialect>("\"from_the_future\"").unwrap(),
            Dialect::Common
        );
    }
}
