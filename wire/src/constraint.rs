//! What a request's output must match (a JSON object, a JSON Schema, a Lark grammar): the data
//! the gateway's request and the runner protocol carry. `text::constraint` compiles it against a
//! vocabulary and masks the logits by it.

/// What the generated text must match.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputConstraint {
    /// Any JSON object (OpenAI's `json_object`, Ollama's `"json"`).
    JsonObject,
    /// A JSON Schema, as JSON text (OpenAI's `json_schema`, Ollama's schema `format`).
    JsonSchema {
        /// The schema.
        schema: String,
    },
    /// A Lark grammar in llguidance's dialect (which embeds schemas with `%json {…}`): what
    /// forced tool calls compile to.
    Lark {
        /// The grammar.
        grammar: String,
    },
}

impl OutputConstraint {
    /// The length of the schema's or grammar's text, which bounds the time it may take to
    /// compile.
    pub fn text_len(&self) -> usize {
        match self {
            OutputConstraint::JsonObject => 0,
            OutputConstraint::JsonSchema { schema } => schema.len(),
            OutputConstraint::Lark { grammar } => grammar.len(),
        }
    }
}
