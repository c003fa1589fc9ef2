//! The chat with tools that the template tests render with shoal and with jinja2: two tools,
//! an assistant turn calling one, the tool's result, the answer and a next question; and the
//! comparison itself, in the variants every family is checked with.

use super::{python_with_jinja2, reference_dir, render_with_jinja2, skip_without_reference};
use inference::{ChatMessage, DateTime, TemplateClock, TemplateInput, ToolCall, ToolSpec};
use serde_json::json;
use text::chat_template::{render_template, template_variables};

/// Two tools; the schemas keep a non-alphabetical key order, nested objects, an enum and a
/// float Python prints in exponent form, all of which reach the prompt through `tojson`.
pub fn tools() -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: "get_weather".into(),
            description: Some("Current weather in a city «as reported»".into()),
            parameters: Some(
                r#"{"type": "object", "properties": {"city": {"type": "string", "description": "City name"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}"#
                    .into(),
            ),
        },
        ToolSpec {
            name: "get_time".into(),
            description: Some("Local time, offset in hours".into()),
            parameters: Some(
                r#"{"type": "object", "required": [], "properties": {"offset": {"type": "number", "default": 0.00001, "maximum": 14.0}}}"#
                    .into(),
            ),
        },
    ]
}

/// Mistral's templates demand call ids of 9 alphanumerics; the others accept any.
pub const CALL_ID: &str = "a1B2c3D4e";

/// System, user, an assistant turn calling `get_weather`, its result, the answer, a user turn.
pub fn conversation() -> Vec<ChatMessage> {
    vec![
        ChatMessage::new("system", "You answer with the tools."),
        ChatMessage::new("user", "What is the weather in Zürich?"),
        ChatMessage {
            role: "assistant".into(),
            content: String::new(),
            tool_calls: vec![ToolCall {
                id: CALL_ID.into(),
                name: "get_weather".into(),
                arguments: r#"{"city": "Zürich", "unit": "celsius"}"#.into(),
            }],
            ..ChatMessage::default()
        },
        ChatMessage {
            role: "tool".into(),
            content: r#"{"temperature": 21.5, "sky": "clear"}"#.into(),
            tool_call_id: Some(CALL_ID.into()),
            name: Some("get_weather".into()),
            ..ChatMessage::default()
        },
        ChatMessage::new("assistant", "It is 21.5 °C and clear."),
        ChatMessage::new("user", "And the time there?"),
    ]
}

pub const CLOCK: TemplateClock = TemplateClock::Fixed(DateTime::midnight(2025, 1, 1));

/// Renders each variant of the tool conversation with shoal and jinja2 and asserts they are
/// equal; returns shoal's renders, in order: the whole chat; the chat up to the tool's result
/// (the prompt of the answer's turn); the first user turn alone with tools; the whole chat
/// with `enable_thinking: false`, with `enable_thinking: true`, and with `reasoning_effort:
/// "high"`.
pub fn assert_same_as_jinja2(file: &str, bos: &str, eos: &str) -> Option<Vec<String>> {
    assert_same_as_jinja2_with(file, bos, eos, &tools())
}

/// [`assert_same_as_jinja2`] with these tools.
pub fn assert_same_as_jinja2_with(
    file: &str,
    bos: &str,
    eos: &str,
    tools: &[ToolSpec],
) -> Option<Vec<String>> {
    if skip_without_reference() {
        return None;
    }
    let python = python_with_jinja2()?;
    let path = reference_dir().join("templates").join(file);
    let template =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let messages = conversation();
    let input = |messages, enable_thinking, reasoning_effort| TemplateInput {
        messages,
        tools: Some(tools),
        add_generation_prompt: true,
        enable_thinking,
        reasoning_effort,
        bos_token: bos,
        eos_token: eos,
    };
    let inputs = [
        input(&messages[..], None, None),
        input(&messages[..4], None, None),
        input(&messages[1..2], None, None),
        input(&messages[..], Some(false), None),
        input(&messages[..], Some(true), None),
        input(&messages[..], None, Some("high")),
    ];
    let jobs: Vec<String> = inputs
        .iter()
        .map(|i| {
            format!(
                r#"{{"template": {}, "variables": {}}}"#,
                json!(template),
                template_variables(i)
            )
        })
        .collect();
    let reference = render_with_jinja2(&python, &jobs);
    let mut renders = Vec::new();
    for (n, (input, expected)) in inputs.iter().zip(reference).enumerate() {
        let expected = expected.unwrap_or_else(|e| panic!("{file} #{n}: jinja2 failed: {e}"));
        let got = render_template(&template, input, &CLOCK)
            .unwrap_or_else(|e| panic!("{file} #{n}: shoal failed: {e}"));
        assert_eq!(got, expected, "{file} #{n} differs from jinja2");
        renders.push(got);
    }
    Some(renders)
}
