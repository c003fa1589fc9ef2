//! Chat templates rendered with minijinja match Python's jinja2 (as `transformers` configures
//! it: trim_blocks, lstrip_blocks). The templates under `templates/` are written in the style
//! of Qwen2.5's and Llama 3's (whitespace control, `namespace`-free slicing, `| trim`,
//! `.startswith()`/`.strip()`, `is defined`, `raise_exception`, `strftime_now`); the expected
//! strings were rendered by jinja2 3.1 with the same inputs.
//! These run without any download; `real_chat_templates.rs` renders the real Qwen2.5, Llama 3.x
//! and SmolLM2 templates (and every template llama.cpp ships) against jinja2 at test time.

use inference::tokenizer::render_chat_template;
use inference::{ChatMessage, InferenceError};

const QWEN: &str = include_str!("templates/qwen2.5-style.jinja");
const LLAMA3: &str = include_str!("templates/llama3-style.jinja");

fn conversation() -> Vec<ChatMessage> {
    vec![
        ChatMessage::new("system", "  Be brief. "),
        ChatMessage::new("user", "Hi there\n"),
        ChatMessage::new("assistant", " Hello! "),
        ChatMessage::new("user", "2+2?"),
    ]
}

fn render(template: &str, messages: &[ChatMessage], add_generation_prompt: bool) -> String {
    render_chat_template(
        template,
        messages,
        add_generation_prompt,
        "<|begin_of_text|>",
        "<|eot_id|>",
    )
    .unwrap()
}

#[test]
fn qwen_style_template_matches_jinja2() {
    assert_eq!(
        render(QWEN, &conversation(), true),
        "<|im_start|>system\n  Be brief. <|im_end|>\n<|im_start|>user\nHi there\n<|im_end|>\n<|im_start|>assistant\n Hello! <|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(
        render(QWEN, &conversation()[1..2], false),
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi there\n<|im_end|>\n"
    );
}

#[test]
fn llama3_style_template_matches_jinja2() {
    assert_eq!(
        render(LLAMA3, &conversation(), true),
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 01 Jan 2025\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    );
    assert_eq!(
        render(LLAMA3, &conversation()[1..2], false),
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 01 Jan 2025\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
    );
}

#[test]
fn template_errors_are_reported_not_panicked() {
    let err = render_chat_template(LLAMA3, &[ChatMessage::new("wizard", "hi")], true, "", "")
        .unwrap_err();
    assert!(
        matches!(err, InferenceError::ChatTemplate(ref m) if m.contains("Unknown role: wizard")),
        "{err}"
    );
    let err = render_chat_template("{% for %}", &[], true, "", "").unwrap_err();
    assert!(matches!(err, InferenceError::ChatTemplate(_)));
}
