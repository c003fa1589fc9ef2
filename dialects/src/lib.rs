//! Dialects: how model families write tool calls and reasoning into their text, and nothing
//! about HTTP. One job: turn a model's answer, as it streams, into its parts (reasoning, text,
//! tool calls: [`answer`], [`reasoning`], [`tools::parse`]) by the call format its chat
//! template shows ([`tools::dialect::Dialect`]), and give the openings and grammars that force
//! a call ([`tools::forced`], [`tools::call_grammar`], [`tools::lazy_grammar`]).
//!
//! **Why a crate of its own.** Both sides of a chat need it: the node that renders the prompt
//! (`prompt`: the opening a `tool_choice` forces, whether the prompt opened a thought) and the
//! gateway that parses the answer (`gateway`, which keeps the APIs' spellings and HTTP). The
//! code only reads and writes text, so neither side links anything it does not use.

pub mod answer;
pub mod answer_part;
pub mod reasoning;
pub mod text_scan;
pub mod tools;
pub mod xtml_channels;
