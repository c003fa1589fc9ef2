//! The tool-call parser on each family's call text — the exact strings the real chat
//! templates render for an earlier call (asserted in `inference/tests/tool_chat_templates.rs`
//! against jinja2), which is what the models were trained to write — fed whole and split at
//! every byte boundary; malformed calls come back as the text they were.

use super::block::testing::assemble;
use super::parse::{ToolCallParser, ToolPiece};
use super::stream::CallDelta;
use super::{Tool, ToolCall};
use proptest::prelude::*;

fn tools() -> Vec<Tool> {
    vec![
        Tool {
            name: "get_weather".into(),
            description: Some("Weather in a city".into()),
            parameters: Some(
                r#"{"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}"#
                    .into(),
            ),
            strict: false,
        },
        Tool {
            name: "get_time".into(),
            description: None,
            parameters: None,
            strict: false,
        },
    ]
}

/// The pieces for `deltas`, adjacent texts merged; with `stream`, calls stream their
/// arguments and are put back together (checking that each end carries its deltas).
fn parse_with(deltas: &[&str], stream: bool) -> Vec<ToolPiece> {
    let mut p = ToolCallParser::new(&tools());
    p.stream_arguments(stream);
    let mut pieces: Vec<ToolPiece> = deltas.iter().flat_map(|d| p.push(d)).collect();
    pieces.extend(p.finish());
    assemble(pieces)
}

/// The pieces for `deltas`, adjacent texts merged.
fn parse(deltas: &[&str]) -> Vec<ToolPiece> {
    parse_with(deltas, false)
}

/// The pieces without the generated ids (they are fresh each time).
fn shapes(pieces: &[ToolPiece]) -> Vec<(String, String)> {
    pieces
        .iter()
        .map(|p| match p {
            ToolPiece::Text(t) => ("text".into(), t.clone()),
            ToolPiece::Call(c) => (c.name.clone(), c.arguments.clone()),
            ToolPiece::Stream(d) => ("stream".into(), format!("{d:?}")),
        })
        .collect()
}

/// Parses `text` whole, then split in two at every char boundary and in single chars:
/// every split gives the same pieces. When every call attempt in it is valid, streaming the
/// arguments gives the same calls, however split. Returns the pieces.
fn parse_every_split(text: &str) -> Vec<ToolPiece> {
    let whole = parse(&[text]);
    let failed = |p: &ToolPiece| {
        matches!(p, ToolPiece::Text(t) if ["<tool_call>", "[TOOL_CALLS]", "\"name\""]
            .iter().any(|m| t.contains(m)))
    };
    let modes: &[bool] = if whole.iter().any(failed) {
        &[false]
    } else {
        &[false, true]
    };
    for &stream in modes {
        for (i, _) in text.char_indices().skip(1) {
            let split = parse_with(&[&text[..i], &text[i..]], stream);
            assert_eq!(
                shapes(&split),
                shapes(&whole),
                "split at {i} of {text:?}, streamed: {stream}"
            );
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let chars: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(
            shapes(&parse_with(&chars, stream)),
            shapes(&whole),
            "char by char: {text:?}, streamed: {stream}"
        );
    }
    whole
}

fn call(pieces: &[ToolPiece], i: usize) -> &ToolCall {
    match &pieces[i] {
        ToolPiece::Call(c) => c,
        other => panic!("piece {i} is {other:?}"),
    }
}

const ZURICH: &str = r#"{"city":"Zürich","unit":"celsius"}"#;

#[test]
fn hermes_qwen_calls() {
    let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\", \"unit\": \"celsius\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
    let p = parse_every_split(text);
    // The line breaks around the calls are formatting.
    assert_eq!(p.len(), 3, "{p:?}");
    assert_eq!(p[0], ToolPiece::Text("Let me check.".into()));
    assert_eq!(call(&p, 1).name, "get_weather");
    assert_eq!(call(&p, 1).arguments, ZURICH);
    assert_eq!(call(&p, 2).arguments, "{}");
    assert_eq!(call(&p, 1).id.len(), 9);
    assert_ne!(call(&p, 1).id, call(&p, 2).id);
    let p = parse_every_split("\n<tool_call>{\"name\": \"get_time\"}</tool_call>\n\nDone. ");
    assert_eq!(
        shapes(&p),
        [
            ("get_time".to_string(), "{}".to_string()),
            ("text".to_string(), "Done. ".to_string())
        ]
    );
}

#[test]
fn llama3_json_calls() {
    let text = r#"{"name": "get_weather", "parameters": {"city": "Zürich", "unit": "celsius"}}"#;
    let p = parse_every_split(text);
    assert_eq!(
        shapes(&p),
        [("get_weather".to_string(), ZURICH.to_string())]
    );
    let tagged = r#"<|python_tag|>{"name": "get_weather", "parameters": {"city": "Zürich"}}; {"name": "get_time", "parameters": {}}"#;
    let p = parse_every_split(tagged);
    assert_eq!(
        shapes(&p),
        [
            (
                "get_weather".to_string(),
                r#"{"city":"Zürich"}"#.to_string()
            ),
            ("get_time".to_string(), "{}".to_string())
        ]
    );
}

#[test]
fn mistral_calls_both_spellings() {
    let nemo = r#"[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}, "id": "a1B2c3D4e"}]"#;
    let p = parse_every_split(nemo);
    assert_eq!(
        shapes(&p),
        [("get_weather".to_string(), ZURICH.to_string())]
    );
    assert_eq!(call(&p, 0).id, "a1B2c3D4e");
    let small = r#"[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Zürich", "unit": "celsius"}[TOOL_CALLS]get_time[ARGS]{}"#;
    let p = parse_every_split(small);
    assert_eq!(
        shapes(&p),
        [
            ("get_weather".to_string(), ZURICH.to_string()),
            ("get_time".to_string(), "{}".to_string())
        ]
    );
    assert_eq!(call(&p, 0).id, "a1B2c3D4e");
}

#[test]
fn what_is_not_a_valid_call_stays_text() {
    for text in [
        // Plain answers, including ones that look like the start of a call.
        "The weather is fine.",
        "  <tool",
        "[TOOL_CALLS",
        "<|python_ta",
        "Use <b>bold</b> and [links].",
        // Malformed JSON, cut-off calls, unknown tools, arguments against the schema.
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": </tool_call> after",
        "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par",
        "<tool_call>{\"name\": \"launch_rockets\", \"arguments\": {}}</tool_call>",
        "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"celsius\"}}</tool_call>",
        "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": 7}}</tool_call>",
        "<tool_call>{\"name\": \"get_weather\", \"arguments\": [1]}</tool_call>",
        "{\"answer\": 42}",
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"kelvin\"}}",
        "{not json at all",
        "[TOOL_CALLS] nothing here",
        "[TOOL_CALLS][{\"name\": \"get_weather\"",
        "[TOOL_CALLS]get_weather[ARGS]{\"city\": ",
        "<|python_tag|>brave_search.call(query=\"weather\")",
        "}{][\"\\",
    ] {
        let p = parse_every_split(text);
        assert_eq!(p, vec![ToolPiece::Text(text.to_string())], "{text:?}");
    }
    assert_eq!(parse(&[]), vec![]);
    assert_eq!(parse(&["   "]), vec![ToolPiece::Text("   ".into())]);
}

#[test]
fn text_streams_before_a_call_completes() {
    let mut p = ToolCallParser::new(&tools());
    assert_eq!(p.push("Sure"), vec![ToolPiece::Text("Sure".into())]);
    assert_eq!(
        p.push(", one moment <tool"),
        vec![ToolPiece::Text(", one moment".into())]
    );
    assert_eq!(p.push("_call>{\"name\": \"get_time\""), vec![]);
    let done = p.push(", \"arguments\": {}}</tool_call>");
    assert!(
        matches!(&done[..], [ToolPiece::Call(c)] if c.name == "get_time"),
        "{done:?}"
    );
    assert_eq!(p.finish(), vec![]);
}

#[test]
fn arguments_stream_as_they_are_written() {
    let mut p = ToolCallParser::new(&tools());
    p.stream_arguments(true);
    let mut steps = Vec::new();
    for delta in [
        "Sure. <tool_call>\n{\"name\": \"get_wea",
        "ther\", \"arguments\": {\"ci",
        "ty\": \"Zür",
        "ich\"}}\n</tool_",
        "call> ok",
    ] {
        steps.push(p.push(delta));
    }
    steps.push(p.finish());
    let is = |piece: &ToolPiece, want: &str| match piece {
        ToolPiece::Text(t) => t == want,
        ToolPiece::Stream(CallDelta::Start { name, .. }) => format!("start {name}") == want,
        ToolPiece::Stream(CallDelta::Arguments(a)) => format!("args {a}") == want,
        ToolPiece::Stream(CallDelta::End(c)) => format!("end {}", c.arguments) == want,
        ToolPiece::Call(_) => false,
    };
    let want: [&[&str]; 6] = [
        &["Sure."],
        &["start get_weather", "args {\"ci"],
        &["args ty\": \"Zür"],
        &["args ich\"}", "end {\"city\": \"Zürich\"}"],
        &["ok"],
        &[],
    ];
    for (i, (got, want)) in steps.iter().zip(want).enumerate() {
        assert!(
            got.len() == want.len() && got.iter().zip(want).all(|(g, w)| is(g, w)),
            "step {i}: {got:?} != {want:?}"
        );
    }
}

#[test]
fn a_streamed_call_that_fails_its_schema_still_ends_as_a_call() {
    // Strict (a whole answer): text. Streamed: the client already has the call's start.
    let text =
        "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": 7}}</tool_call> after";
    assert_eq!(parse(&[text]), vec![ToolPiece::Text(text.into())]);
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let chars: Vec<&str> = chars.iter().map(String::as_str).collect();
    let streamed = parse_with(&chars, true);
    assert_eq!(
        shapes(&streamed),
        [
            ("get_weather".to_string(), r#"{"city":7}"#.to_string()),
            ("text".to_string(), "after".to_string())
        ]
    );
    // An unknown tool never starts: it stays text, streamed or not.
    let text = "<tool_call>{\"name\": \"launch\", \"arguments\": {\"a\": 1}}</tool_call>";
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let chars: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(parse_with(&chars, true), vec![ToolPiece::Text(text.into())]);
    // Prose after a complete object without its closing tag: the call, then the text.
    let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n\nThe weather in Paris";
    let p = parse_every_split(text);
    assert_eq!(
        shapes(&p),
        [
            ("get_weather".to_string(), r#"{"city":"Paris"}"#.to_string()),
            ("text".to_string(), "The weather in Paris".to_string())
        ]
    );
}

/// Rebuilds the text a list of pieces came from (calls in Hermes form).
fn hermes_text(pieces: &[ToolPiece]) -> String {
    pieces
        .iter()
        .map(|p| match p {
            ToolPiece::Text(t) => t.clone(),
            ToolPiece::Call(c) => format!(
                "<tool_call>{{\"name\": \"{}\", \"arguments\": {}}}</tool_call>",
                c.name, c.arguments
            ),
            ToolPiece::Stream(_) => String::new(),
        })
        .collect()
}

proptest! {
    /// Any text at all: no panic, and without a valid call, the text comes back unchanged,
    /// however it was split.
    #[test]
    fn arbitrary_text_survives(
        text in "(\\PC|<tool_call>|</tool_call>|\\[TOOL_CALLS\\]|\\[ARGS\\]|<\\|python_tag\\|>|[{}\\[\\]\";:]){0,40}",
        cuts in proptest::collection::vec(0usize..200, 0..5),
    ) {
        let mut bounds: Vec<usize> = cuts.into_iter().filter(|c| text.is_char_boundary(*c)).collect();
        bounds.sort();
        bounds.dedup();
        let mut deltas = Vec::new();
        let mut last = 0;
        for b in bounds { deltas.push(&text[last..b]); last = b; }
        deltas.push(&text[last..]);
        let split = parse(&deltas);
        prop_assert_eq!(shapes(&split), shapes(&parse(&[text.as_str()])));
        if split.iter().all(|p| matches!(p, ToolPiece::Text(_))) {
            let joined: String = split.iter().map(|p| match p { ToolPiece::Text(t) => t.as_str(), _ => "" }).collect();
            prop_assert_eq!(joined, text);
        }
    }

    /// Text and valid calls interleaved come back as those pieces, however split.
    #[test]
    fn calls_among_text_are_found(
        before in "[a-z .,!?]{0,12}",
        city in "[A-Za-zü ]{1,10}",
        after in "[a-z .,!?]{0,12}",
        cut in 0usize..120,
    ) {
        let pieces = vec![
            ToolPiece::Text(before.clone()),
            ToolPiece::Call(ToolCall { id: String::new(), name: "get_weather".into(), arguments: serde_json::json!({"city": city}).to_string() }),
            ToolPiece::Text(after.clone()),
        ];
        let text = hermes_text(&pieces);
        let cut = (0..=cut.min(text.len())).rev().find(|c| text.is_char_boundary(*c)).unwrap_or(0);
        let got = parse(&[&text[..cut], &text[cut..]]);
        // Whitespace next to the call is formatting.
        let want: Vec<ToolPiece> = vec![
            ToolPiece::Text(before.trim_end().to_string()),
            pieces[1].clone(),
            ToolPiece::Text(after.trim_start().to_string()),
        ]
        .into_iter()
        .filter(|p| !matches!(p, ToolPiece::Text(t) if t.is_empty()))
        .collect();
        prop_assert_eq!(shapes(&got), shapes(&want));
        // Streamed, the same call.
        let streamed = parse_with(&[&text[..cut], &text[cut..]], true);
        prop_assert_eq!(shapes(&streamed), shapes(&want));
    }
}
