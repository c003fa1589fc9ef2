//! Chat templates rendered with minijinja match Python's jinja2 (as `transformers` configures
//! it: trim_blocks, lstrip_blocks). The templates under `templates/` are written in the style
//! of Qwen2.5's and Llama 3's (whitespace control, `namespace`-free slicing, `| trim`,
//! `.startswith()`/`.strip()`, `is defined`, `raise_exception`, `strftime_now`); the expected
//! strings were rendered by jinja2 3.1 with the same inputs, `strftime_now` pinned to
//! 1 January 2025 (here through the template's clock); production renders tell today's date.
//! These run without any download; `real_chat_templates.rs` renders the real Qwen2.5, Llama 3.x
//! and SmolLM2 templates (and every template llama.cpp ships) against jinja2 at test time.

use inference::{ChatMessage, DateTime, TemplateClock};
use text::chat_template::render_chat_template;
use text::TextError;

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
        &PINNED,
    )
    .unwrap()
}

/// The date the reference renders state.
const PINNED: TemplateClock = TemplateClock::Fixed(DateTime::midnight(2025, 1, 1));

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
    let err = render_chat_template(
        LLAMA3,
        &[ChatMessage::new("wizard", "hi")],
        true,
        "",
        "",
        &PINNED,
    )
    .unwrap_err();
    assert!(
        matches!(err, TextError::ChatTemplate(ref m) if m.contains("Unknown role: wizard")),
        "{err}"
    );
    let err = render_chat_template("{% for %}", &[], true, "", "", &PINNED).unwrap_err();
    assert!(matches!(err, TextError::ChatTemplate(_)));
}

/// `date -u +FORMAT` in the C locale: the system's own idea of today, not this crate's.
fn system_date(format: &str) -> String {
    let out = std::process::Command::new("date")
        .env("LC_ALL", "C")
        .args(["-u", &format!("+{format}")])
        .output()
        .expect("run date");
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

#[test]
fn production_renders_state_today() {
    // Read before and after, so a render at midnight matches one of them.
    let before = system_date("%d %b %Y");
    let clock = TemplateClock::default();
    let text = render_chat_template(LLAMA3, &conversation()[1..2], false, "", "", &clock).unwrap();
    let after = system_date("%d %b %Y");
    assert!(
        text.contains(&format!("Today Date: {before}\n"))
            || text.contains(&format!("Today Date: {after}\n")),
        "{text:?} does not state today ({before})"
    );
    assert!(!text.contains("01 Jan 2025") || before == "01 Jan 2025");
    let iso = render_chat_template(
        "{{ strftime_now('%Y-%m-%d %A') }}",
        &[],
        false,
        "",
        "",
        &clock,
    )
    .unwrap();
    let (b, a) = (system_date("%Y-%m-%d %A"), system_date("%Y-%m-%d %A"));
    assert!(iso == b || iso == a, "{iso} vs {b}");
}

#[test]
fn a_tokenizer_renders_today_unless_its_clock_is_pinned() {
    use inference::Tokenizer;
    // A word-level tokenizer is enough: only the template matters here.
    let dir = std::env::temp_dir().join(format!("shoal-template-date-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tokenizer_json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": null,
        "decoder": null, "model": {"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "a"},
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer_json.to_string()).unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        serde_json::json!({"chat_template": "{{ strftime_now('%d %b %Y') }}"}).to_string(),
    )
    .unwrap();
    let mut t = Tokenizer::from_hf_dir(&dir, &serde_json::json!({})).unwrap();
    let before = system_date("%d %b %Y");
    let today = t.apply_chat_template(&[], true).unwrap();
    assert!(
        today == before || today == system_date("%d %b %Y"),
        "{today}"
    );
    t.template_clock = PINNED;
    assert_eq!(t.apply_chat_template(&[], true).unwrap(), "01 Jan 2025");
    std::fs::remove_dir_all(&dir).ok();
}

/// Generation stops at every end token the folder names: config.json's `eos_token_id`, the
/// tokenizer's `eos_token`, and generation_config.json's list (gpt-oss ends a tool call with
/// `<|call|>`, which only generation_config.json lists).
#[test]
fn end_tokens_come_from_generation_config_too() {
    use inference::Tokenizer;
    let dir = std::env::temp_dir().join(format!("shoal-eos-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tokenizer_json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": null,
        "decoder": null, "model": {"type": "WordLevel",
            "vocab": {"a": 0, "<|return|>": 1, "<|call|>": 2, "<|end|>": 3}, "unk_token": "a"},
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer_json.to_string()).unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        serde_json::json!({"eos_token": "<|end|>"}).to_string(),
    )
    .unwrap();
    let config = serde_json::json!({"eos_token_id": 1});
    let t = Tokenizer::from_hf_dir(&dir, &config).unwrap();
    assert_eq!(t.eos_token_ids, [1, 3]);
    std::fs::write(
        dir.join("generation_config.json"),
        serde_json::json!({"eos_token_id": [1, 2, 3], "do_sample": true}).to_string(),
    )
    .unwrap();
    let t = Tokenizer::from_hf_dir(&dir, &config).unwrap();
    assert_eq!(t.eos_token_ids, [1, 2, 3]);
    // A broken generation_config.json adds nothing and breaks nothing.
    std::fs::write(dir.join("generation_config.json"), "{not json").unwrap();
    let t = Tokenizer::from_hf_dir(&dir, &config).unwrap();
    assert_eq!(t.eos_token_ids, [1, 3]);
    std::fs::remove_dir_all(&dir).ok();
}
