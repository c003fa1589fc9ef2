//! The harmony parser on what gpt-oss writes after the template's `<|start|>assistant`, fed
//! whole, split at every char boundary and char by char.

use super::harmony::HarmonyParser;
use crate::answer_part::AnswerPart;
use crate::tools::block::testing::tools;
use crate::tools::json::Ordered;
use crate::tools::stream::CallDelta;

/// Parts as (kind, text or name + arguments), adjacent texts and reasonings merged; with
/// `stream`, streamed calls put back together (their arguments normalized), checking that
/// each end carries exactly its deltas.
fn run_with(deltas: &[&str], stream: bool) -> Vec<(String, String)> {
    let mut p = HarmonyParser::new(&tools());
    p.stream_arguments(stream);
    let mut parts: Vec<AnswerPart> = deltas.iter().flat_map(|d| p.push(d)).collect();
    parts.extend(p.finish());
    let mut out: Vec<(String, String)> = Vec::new();
    let mut open: Option<String> = None;
    for part in parts {
        let (kind, text) = match part {
            AnswerPart::Reasoning(r) => ("reasoning".to_string(), r),
            AnswerPart::Text(t) => ("text".to_string(), t),
            AnswerPart::Call(c) => (c.name, c.arguments),
            AnswerPart::Stream(CallDelta::Start { .. }) => {
                open = Some(String::new());
                continue;
            }
            AnswerPart::Stream(CallDelta::Arguments(a)) => {
                open.as_mut().expect("arguments in a call").push_str(&a);
                continue;
            }
            AnswerPart::Stream(CallDelta::End(c)) => {
                assert_eq!(open.take().as_deref(), Some(c.arguments.as_str()));
                let args =
                    Ordered::parse(c.arguments.as_bytes()).map_or(c.arguments, |v| v.to_text());
                (c.name, args)
            }
        };
        match out.last_mut() {
            Some((k, t)) if *k == kind && (kind == "text" || kind == "reasoning") => {
                t.push_str(&text)
            }
            _ => out.push((kind, text)),
        }
    }
    out
}

fn run(deltas: &[&str]) -> Vec<(String, String)> {
    run_with(deltas, false)
}

/// Whole, split at every char boundary and char by char: the same parts; streamed too when
/// every call in it is valid.
fn every_split(text: &str) -> Vec<(String, String)> {
    let whole = run(&[text]);
    let valid = !whole
        .iter()
        .any(|(k, t)| k == "text" && t.contains("to=functions"));
    for stream in [false, true] {
        if stream && !valid {
            continue;
        }
        for (i, _) in text.char_indices().skip(1) {
            assert_eq!(
                run_with(&[&text[..i], &text[i..]], stream),
                whole,
                "split at {i} of {text:?}, streamed: {stream}"
            );
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let chars: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(
            run_with(&chars, stream),
            whole,
            "char by char: {text:?}, streamed: {stream}"
        );
    }
    whole
}

fn p(kind: &str, text: &str) -> (String, String) {
    (kind.to_string(), text.to_string())
}

#[test]
fn analysis_then_final() {
    let text = "<|channel|>analysis<|message|>User asks 2+2. Simple.<|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = 4.";
    assert_eq!(
        every_split(text),
        [
            p("reasoning", "User asks 2+2. Simple."),
            p("text", "2 + 2 = 4.")
        ]
    );
    // With the end token kept (`<|return|>`).
    assert_eq!(
        every_split("<|channel|>final<|message|>Hi!<|return|>"),
        [p("text", "Hi!")]
    );
}

#[test]
fn calls_with_the_recipient_after_or_before_the_channel() {
    let text = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Zürich\", \"days\": 2}<|call|>";
    assert_eq!(
        every_split(text),
        [
            p("reasoning", "Need weather."),
            p("get_weather", r#"{"city":"Zürich","days":2}"#)
        ]
    );
    // As the template renders an earlier call (`to=` first); `<|call|>` cut as an end token.
    let text = " to=functions.get_time<|channel|>commentary json<|message|>{}";
    assert_eq!(every_split(text), [p("get_time", "{}")]);
    // The turn ends at `<|call|>`: a tool result the model goes on to imagine is left out.
    let text = "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{}<|call|><|start|>functions.get_time to=assistant<|channel|>commentary<|message|>\"noon\"<|end|>";
    assert_eq!(every_split(text), [p("get_time", "{}")]);
    // A preamble (commentary for the user), then the call.
    let text = "<|channel|>commentary<|message|>Looking it up.<|end|><|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{}<|call|>";
    assert_eq!(
        every_split(text),
        [p("text", "Looking it up."), p("get_time", "{}")]
    );
}

#[test]
fn malformed_or_unknown_calls_stay_text() {
    for text in [
        "<|channel|>commentary to=functions.launch <|constrain|>json<|message|>{}",
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": ",
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"town\": \"x\"}<|call|>",
    ] {
        assert_eq!(every_split(text), [p("text", text)], "{text}");
    }
}

#[test]
fn text_that_is_not_harmony_stays_text() {
    assert_eq!(
        every_split("Just an answer."),
        [p("text", "Just an answer.")]
    );
    assert_eq!(every_split("<b>bold</b>"), [p("text", "<b>bold</b>")]);
    // A message that ends in something other than a next message: the rest is text.
    assert_eq!(
        every_split("<|channel|>final<|message|>A<|end|> trailing"),
        [p("text", "A trailing")]
    );
}

#[test]
fn reasoning_after_the_answer_began_is_left_out() {
    let text = "<|channel|>final<|message|>A<|end|><|start|>assistant<|channel|>analysis<|message|>late<|end|>";
    assert_eq!(every_split(text), [p("text", "A")]);
}
