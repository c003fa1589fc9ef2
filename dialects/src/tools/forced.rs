//! `tool_choice: "required"` and a named function, made to hold: the node that renders the
//! prompt appends the opening of a call after the template's generation prompt, so the model
//! continues a call it has already begun — for `required`, the family's call marker (up to
//! the function's name where JSON with the name first follows it); for a
//! named function, also the start of that function's call, up to its arguments (and their
//! opening `{` where they are JSON).
//! The answer's parser reads the same text first ([`crate::answer::AnswerForm::primed`]), so
//! it sees the whole call. The rest of the call (the function for `required`, the arguments
//! under the tool's schema, the close) is then decoded under a grammar
//! ([`super::call_grammar`]) for every family but Mistral Small 3.2's `[ARGS]`, whose
//! arguments stay the model's and are checked as every call's are.
//!
//! Every family forces: each opening below is exactly what the family's template renders for
//! an earlier call (`dialects/tests/dialect_templates.rs` checks it against the real templates),
//! so the model reads its own format. A template that shows no call format of its own (such as
//! SmolLM2's ChatML) gets Hermes' `<tool_call>`, the ChatML families' convention, which the
//! common parser reads. When the prompt ends inside an open thought (DeepSeek-R1 distills,
//! Qwen3 thinking), the thought is closed empty first (`</think>\n\n`, what Qwen3's template
//! writes with thinking off): a forced call comes instead of the reasoning.
//!
//! With `required` the model still picks the function (and may write several calls), unless
//! one tool is offered, whose name is then forced as well; a named
//! function is called once, and the answer ends with its call
//! ([`crate::answer::AnswerSplitter::end_after_call`]). A forced call that turns out malformed
//! is text in a whole answer, as any malformed call is (see [`crate::tools::stream`] for a
//! streamed one).

use crate::tools::dialect::Dialect;
use crate::tools::ToolChoice;

/// How a model opens its calls: its [`Dialect`], with the common one told apart into its
/// three families.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opener {
    /// `<tool_call>\n{"name": …, "arguments": …}` (Hermes, Qwen2.5, Qwen3; also templates that
    /// show no call format).
    Hermes,
    /// Llama 3.1-3.3's answer-is-JSON `{"name": …, "parameters": …}`.
    Llama,
    /// Mistral Nemo's `[TOOL_CALLS][{"name": …, "arguments": …}]`.
    MistralList,
    /// Mistral Small 3.2's `[TOOL_CALLS]NAME[ARGS]{…}`.
    MistralArgs,
    Qwen3Coder,
    Glm,
    MiniMax,
    Kimi,
    /// DeepSeek V3.1: `NAME<｜tool▁sep｜>{…}`.
    DeepSeek,
    /// DeepSeek V3 and R1 (distills): `function<｜tool▁sep｜>NAME` and a JSON fence.
    DeepSeekFenced,
    Harmony,
    /// DeepSeek V3.2's DSML `function_calls` block.
    Dsml,
    /// DeepSeek V4's DSML `tool_calls` block.
    DsmlV4,
    /// Gemma 4's `<|tool_call>call:NAME{…}`.
    Gemma4,
    /// MiniMax M3's marked `invoke`s.
    MiniMaxM3,
    /// Kimi K3's XTML `call`s.
    KimiK3,
}

impl Opener {
    /// The opener of the model whose chat template is `template` (its dialect is
    /// [`Dialect::of_template`]'s).
    pub fn of_template(template: Option<&str>) -> Opener {
        let template = template.unwrap_or_default();
        match Dialect::of_template(template) {
            Dialect::Qwen3Coder => Opener::Qwen3Coder,
            Dialect::Glm => Opener::Glm,
            Dialect::MiniMax => Opener::MiniMax,
            Dialect::Harmony => Opener::Harmony,
            Dialect::Kimi => Opener::Kimi,
            Dialect::Dsml => Opener::Dsml,
            Dialect::DsmlV4 => Opener::DsmlV4,
            Dialect::Gemma4 => Opener::Gemma4,
            Dialect::MiniMaxM3 => Opener::MiniMaxM3,
            Dialect::KimiK3 => Opener::KimiK3,
            Dialect::DeepSeek if template.contains("```json") => Opener::DeepSeekFenced,
            Dialect::DeepSeek => Opener::DeepSeek,
            Dialect::Common if template.contains("[TOOL_CALLS]") => {
                if template.contains("[ARGS]") {
                    Opener::MistralArgs
                } else {
                    Opener::MistralList
                }
            }
            Dialect::Common
                if template.contains("<|python_tag|>")
                    || (template.contains("<|start_header_id|>")
                        && template.contains("\"parameters\": ")) =>
            {
                Opener::Llama
            }
            Dialect::Common => Opener::Hermes,
        }
    }

    /// The marker every call of this family starts with.
    fn marker(self) -> &'static str {
        match self {
            Opener::Hermes => "<tool_call>\n",
            Opener::Llama => "{\"name\": \"",
            Opener::MistralList | Opener::MistralArgs => "[TOOL_CALLS]",
            Opener::Qwen3Coder => "<tool_call>\n<function=",
            Opener::Glm => "<tool_call>",
            Opener::MiniMax => "<minimax:tool_call>\n<invoke name=\"",
            Opener::Kimi => "<|tool_calls_section_begin|><|tool_call_begin|>functions.",
            Opener::DeepSeek => "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>",
            Opener::DeepSeekFenced => {
                "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
            }
            Opener::Harmony => " to=functions.",
            Opener::Dsml => "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"",
            Opener::DsmlV4 => "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"",
            Opener::Gemma4 => "<|tool_call>call:",
            Opener::MiniMaxM3 => "]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name=\"",
            Opener::KimiK3 => "<|open|>tools<|sep|><|open|>call tool=\"",
        }
    }

    /// What `required` appends: the marker, and for the families whose marker is followed by
    /// JSON with the name first, that JSON up to the name (`{"name": "`), so the model goes
    /// on with a function's name rather than prose (SmolLM2 wrote prose after a bare
    /// `<tool_call>`). The other markers already end where the name begins.
    pub(crate) fn required(self) -> String {
        let marker = self.marker();
        match self {
            Opener::Hermes => format!("{marker}{{\"name\": \""),
            Opener::MistralList => format!("{marker}[{{\"name\": \""),
            _ => marker.to_string(),
        }
    }

    /// The start of a call of `name`, up to its arguments: for the families whose arguments
    /// are JSON, their opening `{` too (a call's arguments are always an object, as the
    /// template's `tojson` writes them; this is all of the tool's schema that a fixed prefix
    /// can force, and it keeps a model from writing them as a string or a number); `index` is
    /// the call's place among the conversation's calls (Kimi's ids count them).
    fn named(self, name: &str, index: usize) -> String {
        let marker = self.marker();
        match self {
            Opener::Hermes => format!("{marker}{{\"name\": \"{name}\", \"arguments\": {{"),
            Opener::Llama => format!("{marker}{name}\", \"parameters\": {{"),
            Opener::MistralList => format!("{marker}[{{\"name\": \"{name}\", \"arguments\": {{"),
            Opener::MistralArgs => format!("{marker}{name}[ARGS]{{"),
            Opener::Qwen3Coder => format!("{marker}{name}>\n"),
            Opener::Glm => format!("{marker}{name}"),
            Opener::MiniMax => format!("{marker}{name}\">\n"),
            Opener::Kimi => format!("{marker}{name}:{index}<|tool_call_argument_begin|>{{"),
            Opener::DeepSeek => format!("{marker}{name}<｜tool▁sep｜>{{"),
            Opener::DeepSeekFenced => format!("{marker}{name}\n```json\n{{"),
            Opener::Harmony => format!("{marker}{name}<|channel|>commentary json<|message|>{{"),
            Opener::Dsml | Opener::DsmlV4 => format!("{marker}{name}\">\n"),
            Opener::Gemma4 => format!("{marker}{name}{{"),
            Opener::MiniMaxM3 => format!("{marker}{name}\">"),
            // The template numbers a turn's calls from 1 (`index="1"` for its first).
            Opener::KimiK3 => format!("{marker}{name}\" index=\"1\"<|sep|>"),
        }
    }

    /// What closes the channel the prompt left open before a forced call: an open thought
    /// (`</think>`); for Kimi K3 its thinking channel and then an empty response channel (a
    /// turn that only calls is written `<|open|>response<|sep|><|close|>response<|sep|>`
    /// before its tools), or with thinking off the response channel its prompt opened.
    pub(crate) fn channel_close(self, in_thought: bool) -> &'static str {
        match (self, in_thought) {
            (Opener::KimiK3, true) => {
                "<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|>"
            }
            (Opener::KimiK3, false) => "<|close|>response<|sep|>",
            (_, true) => "</think>\n\n",
            (_, false) => "",
        }
    }
}

/// A forced opening: the text appended to the prompt, and the same text as the parser reads
/// it (the prompt's copy has the client's function name marked so that it cannot become a
/// control token, see `text::untrusted_text`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forced {
    pub prompt: String,
    pub primed: String,
}

/// The opening that makes `choice` hold for a model of this `opener` (`None` for `auto` and
/// `none`). `index`: how many calls the conversation made before; `in_thought`: the prompt
/// ends inside an open thought; `mark`: how a client's text is written into the prompt.
pub fn opening(
    opener: Opener,
    choice: &ToolChoice,
    index: usize,
    in_thought: bool,
    mark: &dyn Fn(&str) -> String,
) -> Option<Forced> {
    let (prompt, primed) = match choice {
        ToolChoice::Auto | ToolChoice::None => return None,
        ToolChoice::Required => (opener.required(), opener.required()),
        ToolChoice::Function(name) => (opener.named(&mark(name), index), opener.named(name, index)),
    };
    let close = opener.channel_close(in_thought);
    Some(Forced {
        prompt: format!("{close}{prompt}"),
        primed: format!("{close}{primed}"),
    })
}

/// Every opener, for tests that go over the families.
#[cfg(test)]
pub(crate) const ALL_OPENERS: [Opener; 16] = [
    Opener::Hermes,
    Opener::Llama,
    Opener::MistralList,
    Opener::MistralArgs,
    Opener::Qwen3Coder,
    Opener::Glm,
    Opener::MiniMax,
    Opener::Kimi,
    Opener::DeepSeek,
    Opener::DeepSeekFenced,
    Opener::Harmony,
    Opener::Dsml,
    Opener::DsmlV4,
    Opener::Gemma4,
    Opener::MiniMaxM3,
    Opener::KimiK3,
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::answer::{AnswerForm, AnswerSplitter};
    use crate::answer_part::AnswerPart;
    use crate::tools::block::testing::tools;

    fn dialect(opener: Opener) -> Dialect {
        match opener {
            Opener::Qwen3Coder => Dialect::Qwen3Coder,
            Opener::Glm => Dialect::Glm,
            Opener::MiniMax => Dialect::MiniMax,
            Opener::Kimi => Dialect::Kimi,
            Opener::DeepSeek | Opener::DeepSeekFenced => Dialect::DeepSeek,
            Opener::Harmony => Dialect::Harmony,
            Opener::Dsml => Dialect::Dsml,
            Opener::DsmlV4 => Dialect::DsmlV4,
            Opener::Gemma4 => Dialect::Gemma4,
            Opener::MiniMaxM3 => Dialect::MiniMaxM3,
            Opener::KimiK3 => Dialect::KimiK3,
            _ => Dialect::Common,
        }
    }

    /// What the model writes after the forced named opening of `get_weather({"city":
    /// "Paris"})`, up to its end of turn.
    fn rest_of_call(opener: Opener) -> &'static str {
        match opener {
            Opener::Hermes => "\"city\": \"Paris\"}}\n</tool_call>",
            Opener::Llama => "\"city\": \"Paris\"}}",
            Opener::MistralList => "\"city\": \"Paris\"}}]",
            Opener::MistralArgs => "\"city\": \"Paris\"}",
            Opener::Qwen3Coder => {
                "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
            }
            Opener::Glm => "\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>",
            Opener::MiniMax => {
                "<parameter name=\"city\">Paris</parameter>\n</invoke>\n</minimax:tool_call>"
            }
            Opener::Kimi => "\"city\": \"Paris\"}<|tool_call_end|><|tool_calls_section_end|>",
            Opener::DeepSeek => "\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            Opener::DeepSeekFenced => {
                "\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
            }
            Opener::Harmony => "\"city\": \"Paris\"}",
            Opener::Dsml => {
                "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n\
                 </｜DSML｜invoke>\n</｜DSML｜function_calls>"
            }
            Opener::DsmlV4 => {
                "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n\
                 </｜DSML｜invoke>\n</｜DSML｜tool_calls>"
            }
            Opener::Gemma4 => "city:<|\"|>Paris<|\"|>}<tool_call|>",
            Opener::MiniMaxM3 => {
                "]<]minimax[>[<city>Paris]<]minimax[>[</city>]<]minimax[>[</invoke>\n\
                 ]<]minimax[>[</tool_call>"
            }
            Opener::KimiK3 => {
                "<|open|>argument key=\"city\" type=\"string\"<|sep|>Paris\
                 <|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>"
            }
        }
    }

    /// The parts of `rest` read by a splitter primed with `forced`, whole and streamed.
    fn primed_parts(opener: Opener, forced: &Forced, rest: &str, stream: bool) -> Vec<AnswerPart> {
        let form = AnswerForm {
            opens_in_thought: false,
            dialect: dialect(opener),
            primed: forced.primed.clone(),
        };
        let mut splitter = AnswerSplitter::new(&tools(), form);
        splitter.stream_arguments(stream);
        let mut parts: Vec<AnswerPart> = rest
            .chars()
            .flat_map(|c| splitter.push(&c.to_string()))
            .collect();
        parts.extend(splitter.finish());
        parts
    }

    #[test]
    fn a_named_opening_primes_the_parser_for_the_whole_call() {
        for opener in ALL_OPENERS {
            let choice = ToolChoice::Function("get_weather".into());
            let forced = opening(opener, &choice, 0, false, &|n| format!("[{n}]")).unwrap();
            // The prompt's copy has the marked name, the parser's the name.
            assert!(forced.prompt.contains("[get_weather]"), "{opener:?}");
            assert!(forced.primed.contains("get_weather"), "{opener:?}");
            assert_eq!(
                forced.primed.replace("get_weather", "[get_weather]"),
                forced.prompt
            );
            let rest = rest_of_call(opener);
            let parts = primed_parts(opener, &forced, rest, false);
            assert!(
                matches!(&parts[..], [AnswerPart::Call(c)] if c.name == "get_weather" && c.arguments == r#"{"city":"Paris"}"#),
                "{opener:?}: {parts:?}"
            );
            // Streamed: the arguments come as deltas of the same call.
            let parts = primed_parts(opener, &forced, rest, true);
            let mut arguments = String::new();
            let mut ended = None;
            for part in &parts {
                match part {
                    AnswerPart::Stream(crate::tools::stream::CallDelta::Arguments(a)) => {
                        arguments.push_str(a)
                    }
                    AnswerPart::Stream(crate::tools::stream::CallDelta::End(c)) => ended = Some(c),
                    AnswerPart::Stream(_) => {}
                    other => panic!("{opener:?}: {other:?} in {parts:?}"),
                }
            }
            let ended = ended.unwrap_or_else(|| panic!("{opener:?}: no call in {parts:?}"));
            assert_eq!(ended.arguments, arguments, "{opener:?}");
            let value: serde_json::Value = serde_json::from_str(&arguments).unwrap();
            assert_eq!(value, serde_json::json!({"city": "Paris"}), "{opener:?}");
        }
    }

    #[test]
    fn required_opens_with_the_marker_and_auto_forces_nothing() {
        let mark = |n: &str| n.to_string();
        for opener in ALL_OPENERS {
            let forced = opening(opener, &ToolChoice::Required, 0, false, &mark).unwrap();
            let after_channel = forced.prompt.strip_prefix(opener.channel_close(false));
            assert!(
                after_channel.is_some_and(|p| p.starts_with(opener.marker())),
                "{opener:?}"
            );
            assert_eq!(forced.primed, forced.prompt);
            // Every named opening goes on from `required`'s: it forces nothing a call of
            // some function would not write.
            let named = opener.named("f", 0);
            assert!(named.starts_with(after_channel.unwrap()), "{opener:?}");
            assert_eq!(opening(opener, &ToolChoice::Auto, 0, false, &mark), None);
            assert_eq!(opening(opener, &ToolChoice::None, 0, false, &mark), None);
        }
        assert_eq!(
            opening(Opener::Hermes, &ToolChoice::Required, 0, true, &mark)
                .unwrap()
                .prompt,
            "</think>\n\n<tool_call>\n{\"name\": \""
        );
        assert_eq!(
            Opener::Kimi.named("get_weather", 3),
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:3<|tool_call_argument_begin|>{"
        );
    }

    #[test]
    fn a_forced_opening_after_an_open_thought_closes_it() {
        let choice = ToolChoice::Function("get_weather".into());
        let forced = opening(Opener::DeepSeekFenced, &choice, 0, true, &|n| n.into()).unwrap();
        let form = AnswerForm {
            opens_in_thought: true,
            dialect: Dialect::DeepSeek,
            primed: forced.primed.clone(),
        };
        let mut splitter = AnswerSplitter::new(&tools(), form);
        let mut parts = splitter.push(rest_of_call(Opener::DeepSeekFenced));
        parts.extend(splitter.finish());
        assert!(
            matches!(&parts[..], [AnswerPart::Call(c)] if c.name == "get_weather"),
            "{parts:?}"
        );
    }

    #[test]
    fn templates_tell_their_opener() {
        let cases = [
            (None, Opener::Hermes),
            (Some("<|im_start|>{{ m.content }}"), Opener::Hermes),
            (
                Some("{{ '[TOOL_CALLS]' }}{{ tool_call | tojson }}"),
                Opener::MistralList,
            ),
            (
                Some("[TOOL_CALLS]{{ name }}[ARGS]{{ args }}"),
                Opener::MistralArgs,
            ),
            (Some("{{- \"<|python_tag|>\" }}"), Opener::Llama),
            (
                Some("<｜tool▁calls▁begin｜>{{ name }}\n```json\n{{ a }}```"),
                Opener::DeepSeekFenced,
            ),
            (
                Some("<｜tool▁calls▁begin｜>{{ name }}<｜tool▁sep｜>"),
                Opener::DeepSeek,
            ),
            (Some("<|channel|>analysis"), Opener::Harmony),
        ];
        for (template, want) in cases {
            assert_eq!(Opener::of_template(template), want, "{template:?}");
        }
    }
}
