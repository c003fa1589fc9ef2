//! `shoal place`: JSON in, JSON out (the format is documented at the crate root).

use crate::error::PlaceError;
use crate::input::Input;
use crate::place::{place, Placement};
use serde::Serialize;

/// Exit code when a placement was computed, or placement failed for a reason in the cluster.
pub const EXIT_OK: i32 = 0;
/// Exit code when the input is malformed: not JSON, a missing or mistyped field.
pub const EXIT_MALFORMED: i32 = 2;

#[derive(Serialize)]
#[serde(untagged)]
enum Output<'a> {
    Placed { ok: bool, placement: &'a Placement },
    Failed { ok: bool, error: &'a PlaceError },
}

/// Parses an input document and names the field that is wrong when it is malformed.
pub fn parse_input(text: &str) -> Result<Input, PlaceError> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let input: Input = serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
        let path = error.path().to_string();
        PlaceError::InvalidInput {
            field: if path == "." {
                "(document)".into()
            } else {
                path
            },
            reason: error.into_inner().to_string(),
        }
    })?;
    deserializer
        .end()
        .map_err(|error| PlaceError::InvalidInput {
            field: "(document)".into(),
            reason: format!("{error}; the input is one JSON object"),
        })?;
    input.validate()?;
    Ok(input)
}

/// Runs `shoal place` on the text of an input document: returns what to print on stdout (one
/// JSON document and a newline) and the exit code: [`EXIT_OK`] with `{"ok": true, ...}` or
/// `{"ok": false, "error": ...}`, or [`EXIT_MALFORMED`] with an `invalid_input` error that
/// names the field.
pub fn run(text: &str) -> (String, i32) {
    let (output, code) = match parse_input(text) {
        Err(error) => (
            render(&Output::Failed {
                ok: false,
                error: &error,
            }),
            EXIT_MALFORMED,
        ),
        Ok(input) => match place(&input) {
            Ok(placement) => (
                render(&Output::Placed {
                    ok: true,
                    placement: &placement,
                }),
                EXIT_OK,
            ),
            Err(error) => {
                let code = if matches!(error, PlaceError::InvalidInput { .. }) {
                    EXIT_MALFORMED
                } else {
                    EXIT_OK
                };
                (
                    render(&Output::Failed {
                        ok: false,
                        error: &error,
                    }),
                    code,
                )
            }
        },
    };
    (output, code)
}

fn render(output: &Output) -> String {
    // Serializing these plain structs to a String cannot fail.
    let mut text = serde_json::to_string_pretty(output).unwrap_or_default();
    text.push('\n');
    text
}
