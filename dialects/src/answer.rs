//! The parts of an answer as it streams: the model's reasoning ([`crate::reasoning`]), then
//! text and, when the request offered tools, the calls parsed out of it
//! ([`crate::tools::parse`]). Every API's driver (the gateway's `generation`) feeds the text after
//! the gateway's own guarantees through this, so all APIs split answers the same way.

use crate::answer_part::AnswerPart;
use crate::reasoning::{Piece, ThinkSplitter};
use crate::tools::block::BlockParser;
use crate::tools::dialect::Dialect;
use crate::tools::dialects;
use crate::tools::harmony::HarmonyParser;
use crate::tools::parse::{ToolCallParser, ToolPiece};
use crate::tools::stream::CallDelta;
use crate::tools::Tool;
use crate::xtml_channels::ChannelTags;
use serde::{Deserialize, Serialize};

/// How the model's output is to be read, as the node that rendered the prompt knows it (its
/// template); it travels with the accepted stream to the gateway that parses the answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnswerForm {
    /// The prompt ended inside an open thought (`<think>`): the output starts in reasoning
    /// ([`crate::reasoning::prompt_opens_thought`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub opens_in_thought: bool,
    /// How the model writes tool calls.
    #[serde(default, skip_serializing_if = "Dialect::is_common")]
    pub dialect: Dialect,
    /// What the node appended to the prompt after the template's generation prompt to force
    /// a call (`tool_choice` required or named, [`crate::tools::forced`]): the answer's parser
    /// reads it first, as if the model had written it, so that it sees the whole call.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub primed: String,
}

impl AnswerForm {
    /// The form of an answer to `prompt`, rendered by `template`.
    pub fn of_prompt(template: Option<&str>, prompt: &str) -> AnswerForm {
        AnswerForm {
            opens_in_thought: crate::reasoning::prompt_opens_thought(prompt),
            dialect: template.map_or(Dialect::Common, Dialect::of_template),
            primed: String::new(),
        }
    }

    /// Whether this is the default (a plain answer in the common dialect).
    pub fn is_plain(&self) -> bool {
        *self == AnswerForm::default()
    }
}

/// Splits an answer's text into [`AnswerPart`]s as it streams.
#[derive(Debug, Clone, Default)]
pub struct AnswerSplitter {
    think: ThinkSplitter,
    /// Kimi K3: the channel tags around its answer, dropped from the text.
    channel_tags: Option<ChannelTags>,
    /// Only when tools are offered: without them a call-like text is text.
    tools: Option<Calls>,
    /// gpt-oss: the harmony channels carry reasoning and calls both, in place of the two
    /// above.
    harmony: Option<HarmonyParser>,
    /// Parts that reading the primed text released, sent with the first delta.
    held: Vec<AnswerPart>,
    /// The answer ends with its first call (`tool_choice` named one function).
    end_after_call: bool,
    /// The call that ends the answer came: nothing more is released.
    closed: bool,
}

/// The call parser of the answer's dialect.
#[derive(Debug, Clone)]
enum Calls {
    Common(ToolCallParser),
    Block(BlockParser),
}

impl Calls {
    fn new(dialect: Dialect, tools: &[Tool]) -> Calls {
        let grammar = match dialect {
            Dialect::Common | Dialect::Harmony => return Calls::Common(ToolCallParser::new(tools)),
            Dialect::Qwen3Coder => &dialects::qwen3_coder::GRAMMAR,
            Dialect::Glm => &dialects::glm::GRAMMAR,
            Dialect::MiniMax => &dialects::minimax::GRAMMAR,
            Dialect::Kimi => &dialects::kimi::GRAMMAR,
            Dialect::KimiK3 => &dialects::kimi_k3::GRAMMAR,
            Dialect::DeepSeek => &dialects::deepseek::GRAMMAR,
            Dialect::Dsml => &dialects::dsml::GRAMMAR_V32,
            Dialect::DsmlV4 => &dialects::dsml::GRAMMAR_V4,
            Dialect::Gemma4 => &dialects::gemma4::GRAMMAR,
            Dialect::MiniMaxM3 => &dialects::minimax_m3::GRAMMAR,
        };
        Calls::Block(BlockParser::new(grammar, tools))
    }

    fn push(&mut self, text: &str) -> Vec<ToolPiece> {
        match self {
            Calls::Common(p) => p.push(text),
            Calls::Block(p) => p.push(text),
        }
    }

    fn stream_arguments(&mut self, on: bool) {
        match self {
            Calls::Common(p) => p.stream_arguments(on),
            Calls::Block(p) => p.stream_arguments(on),
        }
    }

    fn finish(&mut self) -> Vec<ToolPiece> {
        match self {
            Calls::Common(p) => p.finish(),
            Calls::Block(p) => p.finish(),
        }
    }
}

impl AnswerSplitter {
    /// A splitter that parses calls of `tools` (none: no call parsing) from an answer of
    /// this `form`.
    /// The primed text of the `form` (a forced call's opening) is read first.
    pub fn new(tools: &[Tool], form: AnswerForm) -> AnswerSplitter {
        let mut splitter = AnswerSplitter {
            think: {
                let splitter = if form.opens_in_thought {
                    ThinkSplitter::in_thought()
                } else {
                    ThinkSplitter::default()
                };
                match form.dialect {
                    Dialect::MiniMaxM3 => splitter.with_tags(crate::reasoning::MINIMAX_M3_TAGS),
                    Dialect::KimiK3 => splitter.with_tags(crate::reasoning::KIMI_K3_TAGS),
                    _ => splitter,
                }
            },
            channel_tags: (form.dialect == Dialect::KimiK3)
                .then(|| ChannelTags::new(crate::xtml_channels::KIMI_K3_SCAFFOLD)),
            tools: (!tools.is_empty()).then(|| Calls::new(form.dialect, tools)),
            harmony: (form.dialect == Dialect::Harmony).then(|| HarmonyParser::new(tools)),
            held: Vec::new(),
            end_after_call: false,
            closed: false,
        };
        if !form.primed.is_empty() {
            splitter.held = splitter.push(&form.primed);
        }
        splitter
    }

    /// Makes calls stream their arguments as they are generated (for the APIs that show
    /// argument deltas, [`crate::tools::stream`]); without it calls come whole and a call
    /// that does not fit its schema stays text.
    pub fn stream_arguments(&mut self, on: bool) {
        if let Some(calls) = &mut self.tools {
            calls.stream_arguments(on);
        }
        if let Some(harmony) = &mut self.harmony {
            harmony.stream_arguments(on);
        }
    }

    /// Makes the answer end with its first call, as a named `tool_choice` asks (OpenAI's
    /// and vLLM's forced calls end there too): the parts after it are dropped and
    /// [`AnswerSplitter::closed`] tells the driver to stop the generation.
    pub fn end_after_call(&mut self, on: bool) {
        self.end_after_call = on;
    }

    /// Whether the call that ends the answer came ([`AnswerSplitter::end_after_call`]).
    pub fn closed(&self) -> bool {
        self.closed
    }

    /// The next text; the parts that can be released now.
    pub fn push(&mut self, delta: &str) -> Vec<AnswerPart> {
        if self.closed {
            return Vec::new();
        }
        let mut out = std::mem::take(&mut self.held);
        if let Some(harmony) = &mut self.harmony {
            out.extend(harmony.push(delta));
        } else {
            let pieces = self.think.push(delta);
            out.extend(self.route(pieces, false));
        }
        self.cut_after_call(out)
    }

    /// The end of the answer: everything held back.
    pub fn finish(&mut self) -> Vec<AnswerPart> {
        if self.closed {
            return Vec::new();
        }
        let mut out = std::mem::take(&mut self.held);
        if let Some(harmony) = &mut self.harmony {
            out.extend(harmony.finish());
        } else {
            let pieces = self.think.finish();
            out.extend(self.route(pieces, true));
        }
        self.cut_after_call(out)
    }

    /// With [`AnswerSplitter::end_after_call`], the parts up to the first call's end.
    fn cut_after_call(&mut self, mut out: Vec<AnswerPart>) -> Vec<AnswerPart> {
        if self.end_after_call {
            let ended = out.iter().position(|p| {
                matches!(
                    p,
                    AnswerPart::Call(_) | AnswerPart::Stream(CallDelta::End(_))
                )
            });
            if let Some(at) = ended {
                out.truncate(at + 1);
                self.closed = true;
            }
        }
        out
    }

    fn route(&mut self, mut pieces: Vec<Piece>, end: bool) -> Vec<AnswerPart> {
        if let Some(tags) = &mut self.channel_tags {
            for piece in &mut pieces {
                if let Piece::Text(t) = piece {
                    *t = tags.push(t);
                }
            }
            if end {
                pieces.push(Piece::Text(tags.finish()));
            }
            pieces.retain(|p| !matches!(p, Piece::Text(t) if t.is_empty()));
        }
        let mut out = Vec::new();
        for piece in pieces {
            match (piece, &mut self.tools) {
                (Piece::Reasoning(r), _) => out.push(AnswerPart::Reasoning(r)),
                (Piece::Text(t), None) => out.push(AnswerPart::Text(t)),
                (Piece::Text(t), Some(parser)) => out.extend(parser.push(&t).into_iter().map(part)),
            }
        }
        if end {
            if let Some(parser) = &mut self.tools {
                out.extend(parser.finish().into_iter().map(part));
            }
        }
        out
    }
}

fn part(piece: ToolPiece) -> AnswerPart {
    match piece {
        ToolPiece::Text(t) => AnswerPart::Text(t),
        ToolPiece::Call(c) => AnswerPart::Call(c),
        ToolPiece::Stream(d) => AnswerPart::Stream(d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasoning_text_and_calls() {
        let tools = [Tool {
            name: "f".into(),
            description: None,
            parameters: None,
            strict: false,
        }];
        let mut s = AnswerSplitter::new(&tools, AnswerForm::default());
        let mut parts = s.push("<think>hm</think>ok <tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_call>");
        parts.extend(s.finish());
        assert_eq!(parts[0], AnswerPart::Reasoning("hm".into()));
        assert_eq!(parts[1], AnswerPart::Text("ok".into()));
        assert!(
            matches!(&parts[2], AnswerPart::Call(c) if c.name == "f" && c.arguments == "{\"a\":1}")
        );
        // Without tools the same text is text.
        let mut s = AnswerSplitter::new(&[], AnswerForm::default());
        let parts = s.push("<tool_call>{\"name\": \"f\"}</tool_call>");
        assert_eq!(
            parts,
            [AnswerPart::Text(
                "<tool_call>{\"name\": \"f\"}</tool_call>".into()
            )]
        );
    }

    #[test]
    fn a_named_choice_ends_the_answer_with_its_call() {
        let tools = [Tool {
            name: "f".into(),
            description: None,
            parameters: None,
            strict: false,
        }];
        let text = "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_call> then <tool_call>{\"name\": \"f\"}</tool_call> more";
        for stream in [false, true] {
            let mut s = AnswerSplitter::new(&tools, AnswerForm::default());
            s.stream_arguments(stream);
            s.end_after_call(true);
            let mut parts: Vec<AnswerPart> =
                text.chars().flat_map(|c| s.push(&c.to_string())).collect();
            assert!(s.closed(), "streamed: {stream}");
            parts.extend(s.finish());
            let last = parts.last().cloned();
            assert!(
                matches!(&last, Some(AnswerPart::Call(c) | AnswerPart::Stream(CallDelta::End(c))) if c.arguments.contains("\"a\"")),
                "streamed: {stream}: {parts:?}"
            );
            assert!(
                !parts.iter().any(|p| matches!(p, AnswerPart::Text(_))),
                "{parts:?}"
            );
            assert!(s.push("anything").is_empty());
        }
        // Without it, both calls and the text.
        let parts = collect(&tools, AnswerForm::default(), &[text]);
        assert_eq!(parts.len(), 4, "{parts:?}");
    }

    fn collect(tools: &[Tool], form: AnswerForm, deltas: &[&str]) -> Vec<AnswerPart> {
        let mut s = AnswerSplitter::new(tools, form);
        let mut parts: Vec<AnswerPart> = deltas.iter().flat_map(|d| s.push(d)).collect();
        parts.extend(s.finish());
        parts
    }

    #[test]
    fn each_dialect_through_the_splitter() {
        let tools = [Tool {
            name: "f".into(),
            description: None,
            parameters: Some(
                r#"{"type": "object", "properties": {"n": {"type": "number"}}}"#.into(),
            ),
            strict: false,
        }];
        let form = |dialect| AnswerForm {
            opens_in_thought: false,
            dialect,
            primed: String::new(),
        };
        let is_call = |p: &AnswerPart| matches!(p, AnswerPart::Call(c) if c.name == "f" && c.arguments == r#"{"n":1.5}"#);
        let cases = [
            (Dialect::Glm, "<think>hm</think><tool_call>f<arg_key>n</arg_key><arg_value>1.5</arg_value></tool_call>"),
            (Dialect::Qwen3Coder, "<think>hm</think><tool_call>\n<function=f>\n<parameter=n>\n1.5\n</parameter>\n</function>\n</tool_call>"),
            (Dialect::MiniMax, "<think>hm</think><minimax:tool_call><invoke name=\"f\"><parameter name=\"n\">1.5</parameter></invoke></minimax:tool_call>"),
            (Dialect::Kimi, "<think>hm</think><|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"n\": 1.5}<|tool_call_end|><|tool_calls_section_end|>"),
            (Dialect::DeepSeek, "<think>hm</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"n\": 1.5}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
            (Dialect::Harmony, "<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"n\": 1.5}"),
        ];
        for (dialect, text) in cases {
            let parts = collect(&tools, form(dialect), &[text]);
            assert_eq!(parts.len(), 2, "{dialect:?}: {parts:?}");
            assert_eq!(parts[0], AnswerPart::Reasoning("hm".into()), "{dialect:?}");
            assert!(is_call(&parts[1]), "{dialect:?}: {parts:?}");
            // Without tools, the call is text (harmony still splits its channels).
            let parts = collect(&[], form(dialect), &[text]);
            assert!(
                parts.iter().all(|p| !matches!(p, AnswerPart::Call(_))),
                "{dialect:?}"
            );
        }
        // Kimi K3's channels: the thought's, the response's (dropped) and its tools section.
        let k3 = AnswerForm {
            opens_in_thought: true,
            dialect: Dialect::KimiK3,
            primed: String::new(),
        };
        let turn = "hm<|close|>think<|sep|><|open|>response<|sep|>ok<|close|>response<|sep|>\
            <|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|><|open|>argument \
            key=\"n\" type=\"number\"<|sep|>1.5<|close|>argument<|sep|><|close|>call<|sep|>\
            <|close|>tools<|sep|><|close|>message<|sep|>";
        let parts = collect(&tools, k3.clone(), &[turn]);
        assert_eq!(parts.len(), 3, "{parts:?}");
        assert_eq!(parts[0], AnswerPart::Reasoning("hm".into()));
        assert_eq!(parts[1], AnswerPart::Text("ok".into()));
        assert!(is_call(&parts[2]), "{parts:?}");
        let pieces: Vec<String> = turn.chars().map(String::from).collect();
        let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
        let text: String = collect(&[], k3, &pieces)
            .iter()
            .filter_map(|p| match p {
                AnswerPart::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert!(text.starts_with("ok<|open|>tools<|sep|>"), "{text}");
        assert!(
            !text.contains("response") && !text.contains("message"),
            "{text}"
        );
        // The DeepSeek-R1 distill / V3.1 thinking prompt: the output starts in the thought.
        let opened = AnswerForm {
            opens_in_thought: true,
            dialect: Dialect::DeepSeek,
            primed: String::new(),
        };
        let parts = collect(&tools, opened, &["hm</think>ok"]);
        assert_eq!(
            parts,
            [
                AnswerPart::Reasoning("hm".into()),
                AnswerPart::Text("ok".into())
            ]
        );
    }
}
