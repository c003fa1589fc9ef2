//! `Tokenizer::holds_more_than`, the early refusal of prompts longer than the context, on the
//! SmolLM2 fixture's tokenizer: it agrees with encoding the text whole on both sides of the
//! limit, across many pieces. (That it stops early, in memory and time, is shown on a real
//! node: `tests/serve_local.rs`.)

mod common;

use formats::gguf::GgufFile;
use text::tokenizer::{Tokenizer, COUNT_PIECE_BYTES, CUT_SLACK_TOKENS};

fn tokenizer() -> Tokenizer {
    let file = GgufFile::open(common::smollm2()).unwrap();
    Tokenizer::from_gguf(&file).unwrap()
}

#[test]
fn a_text_holds_more_than_a_limit_exactly_when_its_encoding_does() {
    let t = tokenizer();
    // Prose, a run without whitespace (cut inside it) and text with multi-byte characters,
    // each several pieces long.
    let texts = [
        "The harbour master logged every ship that came in, and its cargo. ".repeat(1_000),
        "x".repeat(3 * COUNT_PIECE_BYTES + 17),
        "Zürich, Ålesund und Genève: 北京 ".repeat(2_000),
    ];
    for text in &texts {
        let whole = t.encode(text).unwrap().len();
        let pieces = text.len().div_ceil(COUNT_PIECE_BYTES);
        assert!(pieces > 2, "{pieces} pieces");
        // Below the count, less the slack the cuts may add: surely more.
        let margin = pieces * CUT_SLACK_TOKENS;
        assert!(
            t.holds_more_than([text.as_str()], whole - margin - 1)
                .unwrap(),
            "{whole} tokens, limit {}",
            whole - margin - 1
        );
        // At the count or above it: never.
        for limit in [whole, whole + 1, 10 * whole] {
            assert!(
                !t.holds_more_than([text.as_str()], limit).unwrap(),
                "{limit}"
            );
        }
    }
    // Several texts add up.
    let half = "one two three four five six seven eight nine ten ".repeat(200);
    let each = t.encode(&half).unwrap().len();
    assert!(t
        .holds_more_than([half.as_str(), half.as_str()], each + each / 2)
        .unwrap());
    assert!(!t
        .holds_more_than([half.as_str(), half.as_str()], 2 * each + 4)
        .unwrap());
}
