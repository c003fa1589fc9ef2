//! Tool calls in model text, the same for every API and every node: the tools a request offers
//! ([`Tool`], rendered into the prompt by the model's own chat template), which of them the
//! model may call ([`ToolChoice`]), the calls parsed back out of the answer
//! ([`parse::ToolCallParser`], one parser per family's dialect: [`dialect`], [`dialects`],
//! [`harmony`]), and the openings and grammars that force a call ([`forced`],
//! [`call_grammar`], [`lazy_grammar`]).
//!
//! Schemas and arguments travel as JSON *text* with their keys in the order the client (or
//! the model) wrote them ([`json::Ordered`]): the model reads them in its prompt.

pub mod block;
pub mod call_grammar;
pub mod dialect;
pub mod dialects;
pub mod forced;
pub mod harmony;
#[cfg(test)]
mod harmony_tests;
pub mod json;
pub mod lazy_grammar;
pub mod offered;
pub mod parse;
#[cfg(test)]
mod parse_tests;
pub mod schema;
pub mod stream;

use serde::{Deserialize, Serialize};

/// A function the model may call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tool {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Its JSON Schema, as JSON text in the client's key order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<String>,
    /// The client asked for arguments that always fit the schema (`strict: true`, OpenAI's
    /// function tools and Anthropic's): under `auto` a call the model opens is decoded under
    /// a grammar ([`lazy_grammar::lazy_grammar`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub strict: bool,
}

/// A call: made by an earlier assistant turn (sent back by the client), or parsed out of
/// this answer. One type with the chat template's ([`wire::chat`]).
pub use wire::chat::ToolCall;

/// Which tools the model may call (`tool_choice`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    /// Any of them, or none (the default).
    #[default]
    Auto,
    /// None: the tools are left out of the prompt and calls are not parsed.
    None,
    /// One or more calls are wanted: the node opens the answer with the model's call marker
    /// ([`forced`]).
    Required,
    /// Only this function: the only tool rendered and parsed, and the node opens the answer
    /// with the start of its call ([`forced`]).
    Function(String),
}

impl ToolChoice {
    /// Whether this is the default (left out of a forwarded request's JSON).
    pub fn is_auto(&self) -> bool {
        *self == ToolChoice::Auto
    }

    /// The tools the prompt offers and the parser accepts, under this choice.
    pub fn offered<'a>(&self, tools: &'a [Tool]) -> Vec<&'a Tool> {
        match self {
            ToolChoice::None => Vec::new(),
            ToolChoice::Function(name) => tools.iter().filter(|t| &t.name == name).collect(),
            ToolChoice::Auto | ToolChoice::Required => tools.iter().collect(),
        }
    }
}

/// A fresh call id: 9 letters and digits, the shape Mistral's templates demand of the ids a
/// client sends back (the other families take any string).
pub fn call_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let micros = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    // Mix so that consecutive ids differ in every position.
    let mut x = micros ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 31)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 29;
    (0..9)
        .map(|_| {
            let c = ALPHABET[(x % 62) as usize] as char;
            x /= 62;
            c
        })
        .collect()
}
