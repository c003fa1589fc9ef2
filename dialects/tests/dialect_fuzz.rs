//! Every dialect's splitter on text made of the dialects' own markup, shuffled: it never
//! panics, and however the text is cut into deltas, the answer is the same (texts and
//! reasonings joined, calls by name and arguments).

use dialects::answer::{AnswerForm, AnswerSplitter};
use dialects::answer_part::AnswerPart;
use dialects::tools::dialect::Dialect;
use dialects::tools::Tool;
use proptest::prelude::*;

const FRAGMENTS: &[&str] = &[
    "<tool_call>",
    "</tool_call>",
    "<function=get_weather>",
    "<parameter=city>",
    "</parameter>",
    "</function>",
    "get_weather",
    "<arg_key>city</arg_key>",
    "<arg_value>Zürich</arg_value>",
    "<minimax:tool_call>",
    "</minimax:tool_call>",
    "<invoke name=\"get_weather\">",
    "<parameter name=\"city\">",
    "</invoke>",
    "<|tool_calls_section_begin|>",
    "<|tool_call_begin|>functions.get_weather:0",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<|tool_calls_section_end|>",
    "<|open|>tools<|sep|>",
    "<|open|>call tool=\"get_weather\"<|sep|>",
    "<|open|>argument key=\"city\" type=\"string\"<|sep|>",
    "<|close|>argument<|sep|>",
    "<|open|>json type=\"object\"<|sep|>",
    "<|close|>json<|sep|>",
    "<|close|>call<|sep|>",
    "<|close|>tools<|sep|>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁calls▁end｜>",
    "<|channel|>",
    "analysis",
    "final",
    "commentary to=functions.get_weather <|constrain|>json",
    "<|message|>",
    "<|end|>",
    "<|start|>assistant",
    "<|call|>",
    "<think>",
    "</think>",
    "{\"city\": \"Zürich\"}",
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
    "[TOOL_CALLS]",
    "Zürich",
    " ",
    "\n",
    "<",
    "|",
    "x",
];

const DIALECTS: &[Dialect] = &[
    Dialect::Common,
    Dialect::Qwen3Coder,
    Dialect::Glm,
    Dialect::MiniMax,
    Dialect::Harmony,
    Dialect::Kimi,
    Dialect::KimiK3,
    Dialect::DeepSeek,
];

fn tools() -> Vec<Tool> {
    vec![Tool {
        name: "get_weather".into(),
        description: None,
        parameters: Some(
            r#"{"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}"#
                .into(),
        ),
        strict: false,
    }]
}

/// The answer's shape: adjacent texts and reasonings merged, calls as name and arguments.
fn run(form: &AnswerForm, deltas: &[&str]) -> Vec<(String, String)> {
    let mut splitter = AnswerSplitter::new(&tools(), form.clone());
    let mut parts: Vec<AnswerPart> = deltas.iter().flat_map(|d| splitter.push(d)).collect();
    parts.extend(splitter.finish());
    let mut out: Vec<(String, String)> = Vec::new();
    for part in parts {
        let (kind, text) = match part {
            AnswerPart::Reasoning(r) => ("reasoning".to_string(), r),
            AnswerPart::Text(t) => ("text".to_string(), t),
            AnswerPart::Call(c) => (format!("call {}", c.name), c.arguments),
            // Calls stream only when asked (`stream_arguments`), which this does not.
            AnswerPart::Stream(d) => (format!("call step {d:?}"), String::new()),
        };
        match out.last_mut() {
            Some((k, t)) if *k == kind && !kind.starts_with("call") => t.push_str(&text),
            _ => out.push((kind, text)),
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn deltas_do_not_change_the_answer(
        picks in proptest::collection::vec(0..FRAGMENTS.len(), 0..14),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..4),
        dialect in 0..DIALECTS.len(),
        opens_in_thought: bool,
    ) {
        let text: String = picks.iter().map(|&i| FRAGMENTS[i]).collect();
        let bounds: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
        let mut at: Vec<usize> = cuts
            .iter()
            .filter(|_| !bounds.is_empty())
            .map(|c| bounds[c.index(bounds.len())])
            .collect();
        at.sort_unstable();
        at.dedup();
        let mut deltas = Vec::new();
        let mut last = 0;
        for c in at {
            deltas.push(&text[last..c]);
            last = c;
        }
        deltas.push(&text[last..]);
        let form = AnswerForm { opens_in_thought, dialect: DIALECTS[dialect], ..AnswerForm::default() };
        let whole = run(&form, &[text.as_str()]);
        prop_assert_eq!(run(&form, &deltas), whole.clone(), "{:?}", text);
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let chars: Vec<&str> = chars.iter().map(String::as_str).collect();
        prop_assert_eq!(run(&form, &chars), whole, "char by char: {:?}", text);
    }
}
