//! The parts of an answer as it streams: the model's reasoning ([`crate::reasoning`]), then
//! text and, when the request offered tools, the calls parsed out of it
//! ([`crate::tools::parse`]). Every API's driver ([`crate::generation`]) feeds the text after
//! the gateway's own guarantees through this, so all APIs split answers the same way.

use crate::reasoning::{Piece, ThinkSplitter};
use crate::tools::dialect::Dialect;
use crate::tools::parse::{ToolCallParser, ToolPiece};
use crate::tools::{Tool, ToolCall};
use serde::{Deserialize, Serialize};

/// How the model's output is to be read, as the node that rendered the prompt knows it (its
/// template); it travels with the accepted stream to the gateway that parses the answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnswerForm {
    /// The prompt ended inside an open thought (`<think>`): the output starts in reasoning
    /// ([`crate::reasoning::prompt_opens_thought`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub opens_in_thought: bool,
    /// How the model writes tool calls.
    #[serde(default, skip_serializing_if = "Dialect::is_common")]
    pub dialect: Dialect,
}

impl AnswerForm {
    /// The form of an answer to `prompt`, rendered by `template`.
    pub fn of_prompt(template: Option<&str>, prompt: &str) -> AnswerForm {
        AnswerForm {
            opens_in_thought: crate::reasoning::prompt_opens_thought(prompt),
            dialect: template.map_or(Dialect::Common, Dialect::of_template),
        }
    }

    /// Whether this is the default (a plain answer in the common dialect).
    pub fn is_plain(&self) -> bool {
        *self == AnswerForm::default()
    }
}

/// One part of an answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Reasoning(String),
    Text(String),
    Call(ToolCall),
}

/// Splits an answer's text into [`Part`]s as it streams.
#[derive(Debug, Clone, Default)]
pub struct AnswerSplitter {
    think: ThinkSplitter,
    /// Only when tools are offered: without them a call-like text is text.
    tools: Option<ToolCallParser>,
}

impl AnswerSplitter {
    /// A splitter that parses calls of `tools` (none: no call parsing) from an answer of
    /// this `form`.
    pub fn new(tools: &[Tool], form: AnswerForm) -> AnswerSplitter {
        AnswerSplitter {
            think: if form.opens_in_thought {
                ThinkSplitter::in_thought()
            } else {
                ThinkSplitter::default()
            },
            tools: (!tools.is_empty()).then(|| ToolCallParser::new(tools)),
        }
    }

    /// The next text; the parts that can be released now.
    pub fn push(&mut self, delta: &str) -> Vec<Part> {
        let pieces = self.think.push(delta);
        self.route(pieces, false)
    }

    /// The end of the answer: everything held back.
    pub fn finish(&mut self) -> Vec<Part> {
        let pieces = self.think.finish();
        self.route(pieces, true)
    }

    fn route(&mut self, pieces: Vec<Piece>, end: bool) -> Vec<Part> {
        let mut out = Vec::new();
        for piece in pieces {
            match (piece, &mut self.tools) {
                (Piece::Reasoning(r), _) => out.push(Part::Reasoning(r)),
                (Piece::Text(t), None) => out.push(Part::Text(t)),
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

fn part(piece: ToolPiece) -> Part {
    match piece {
        ToolPiece::Text(t) => Part::Text(t),
        ToolPiece::Call(c) => Part::Call(c),
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
        }];
        let mut s = AnswerSplitter::new(&tools, AnswerForm::default());
        let mut parts = s.push("<think>hm</think>ok <tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_call>");
        parts.extend(s.finish());
        assert_eq!(parts[0], Part::Reasoning("hm".into()));
        assert_eq!(parts[1], Part::Text("ok".into()));
        assert!(matches!(&parts[2], Part::Call(c) if c.name == "f" && c.arguments == "{\"a\":1}"));
        // Without tools the same text is text.
        let mut s = AnswerSplitter::new(&[], AnswerForm::default());
        let parts = s.push("<tool_call>{\"name\": \"f\"}</tool_call>");
        assert_eq!(
            parts,
            [Part::Text(
                "<tool_call>{\"name\": \"f\"}</tool_call>".into()
            )]
        );
    }
}
