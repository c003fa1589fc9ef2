//! Structured output for the engine: the request's `response_format` (any API's) or a forced
//! call's grammar as the engine's [`OutputConstraint`], compiled here, on the node that
//! renders the prompt, so that a schema the engine cannot enforce (a keyword llguidance does
//! not implement, a schema too large or too slow to compile) is a 400 naming it before the
//! request is accepted; the runner compiles it again from its own cache.
//!
//! `SHOAL_UNCONSTRAINED=1` in a node's environment drops every constraint (the answers are
//! then the model's own): how the tests show that their checks fail without it.

use gateway::response_format::ResponseFormat;
use gateway::ApiError;
use models::ModelFacts;
use wire::constraint::OutputConstraint;

/// The constraint for a request with `format` and (for a forced call) `call_grammar`:
/// the call's grammar wins, since a forced call's answer is the call. Checked by compiling.
pub fn output_constraint(
    format: Option<&ResponseFormat>,
    call_grammar: Option<String>,
    facts: &ModelFacts,
) -> Result<Option<OutputConstraint>, ApiError> {
    if std::env::var_os("SHOAL_UNCONSTRAINED").is_some_and(|v| v == "1") {
        return Ok(None);
    }
    let (constraint, field) = match (call_grammar, format) {
        (Some(grammar), _) => (OutputConstraint::Lark { grammar }, "tools"),
        (None, Some(ResponseFormat::JsonObject)) => {
            (OutputConstraint::JsonObject, "response_format")
        }
        (None, Some(f @ ResponseFormat::JsonSchema { schema, .. })) => (
            OutputConstraint::JsonSchema {
                schema: schema.clone(),
            },
            f.field(),
        ),
        (None, None) => return Ok(None),
    };
    let compiler = facts
        .tokenizer
        .grammar_compiler(facts.vocab_size)
        .map_err(|e| ApiError::internal(format!("the grammar engine failed to start: {e}")))?;
    compiler.start(&constraint).map_err(|e| {
        let message = e.to_string();
        let message = message.trim_start_matches("invalid request: ");
        ApiError::invalid_field(field, message)
    })?;
    Ok(Some(constraint))
}
