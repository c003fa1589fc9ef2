//! Real Hugging Face chat templates rendered by shoal (minijinja) and by Python's jinja2, the
//! renderer `transformers` uses, must give the same text byte for byte.
//!
//! The templates are the files llama.cpp ships (Qwen2.5-7B-Instruct, Llama 3.1/3.2/3.3
//! Instruct, ...), fetched by `cargo xtask setup` from the `llama-cpp-python` sdist, and
//! SmolLM2's own template from the fixture GGUF. jinja2 runs in the setup's venv through
//! `tests/reference/jinja2_render.py`. Without the reference data or jinja2 the tests say why
//! and pass.

mod reference;

use formats::gguf::{GgufFile, GgufValue};
use inference::{ChatMessage, DateTime, TemplateClock, TemplateInput};
use reference::{python_with_jinja2, reference_dir, render_with_jinja2, skip_without_reference};
use serde_json::json;
use text::chat_template::{render_chat_template, template_variables};

/// A template, the conversation and the special tokens to render it with.
#[derive(Clone)]
struct Job<'a> {
    template: &'a str,
    messages: &'a [ChatMessage],
    add_generation_prompt: bool,
    bos_token: &'a str,
    eos_token: &'a str,
}

/// The fixed conversation: system, user, assistant, user, with the whitespace templates trim.
fn conversation() -> Vec<ChatMessage> {
    vec![
        ChatMessage::new("system", "  You are a terse assistant. "),
        ChatMessage::new("user", "What is the capital of France?\n"),
        ChatMessage::new("assistant", " Paris. "),
        ChatMessage::new("user", "And of Italy? Answer in «one» word."),
    ]
}

fn ours(job: &Job) -> Result<String, String> {
    render_chat_template(
        job.template,
        job.messages,
        job.add_generation_prompt,
        job.bos_token,
        job.eos_token,
        // jinja2_render.py pins `strftime_now` to the same date.
        &TemplateClock::Fixed(DateTime::midnight(2025, 1, 1)),
    )
    .map_err(|e| e.to_string())
}

/// Renders every job with jinja2 in one Python process.
fn jinja2(python: &std::path::Path, jobs: &[Job]) -> Vec<Result<String, String>> {
    let input: Vec<String> = jobs
        .iter()
        .map(|j| {
            let variables = template_variables(&TemplateInput {
                messages: j.messages,
                add_generation_prompt: j.add_generation_prompt,
                bos_token: j.bos_token,
                eos_token: j.eos_token,
                ..TemplateInput::default()
            });
            format!(
                r#"{{"template": {}, "variables": {variables}}}"#,
                json!(j.template)
            )
        })
        .collect();
    render_with_jinja2(python, &input)
}

fn read_template(file: &str) -> String {
    let path = reference_dir().join("templates").join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Renders `template` for the conversation with and without the system message and the
/// generation prompt; each of shoal's renders must equal jinja2's. Returns shoal's render of
/// the full conversation with the generation prompt, for further checks.
fn assert_same_as_jinja2(
    python: &std::path::Path,
    name: &str,
    template: &str,
    bos: &str,
) -> String {
    let full = conversation();
    let variants: [(&[ChatMessage], bool); 3] =
        [(&full, true), (&full, false), (&full[1..2], true)];
    let jobs: Vec<Job> = variants
        .iter()
        .map(|&(messages, add_generation_prompt)| Job {
            template,
            messages,
            add_generation_prompt,
            bos_token: bos,
            eos_token: "",
        })
        .collect();
    let reference = jinja2(python, &jobs);
    for (job, expected) in jobs.iter().zip(&reference) {
        let expected = expected
            .as_ref()
            .unwrap_or_else(|e| panic!("{name}: jinja2 failed: {e}"));
        let got = ours(job).unwrap_or_else(|e| panic!("{name}: shoal failed: {e}"));
        assert_eq!(
            &got,
            expected,
            "{name} ({} messages, add_generation_prompt {}) differs from jinja2",
            job.messages.len(),
            job.add_generation_prompt
        );
    }
    ours(&jobs[0]).unwrap()
}

#[test]
fn qwen2_5_instruct_template_matches_jinja2() {
    if skip_without_reference() {
        return;
    }
    let Some(python) = python_with_jinja2() else {
        return;
    };
    let text = assert_same_as_jinja2(
        &python,
        "Qwen2.5",
        &read_template("Qwen-Qwen2.5-7B-Instruct.jinja"),
        "",
    );
    // The render is the real ChatML conversation, not an empty or error string.
    assert!(
        text.starts_with("<|im_start|>system\n  You are a terse assistant. <|im_end|>\n"),
        "{text:?}"
    );
    assert!(
        text.ends_with("in «one» word.<|im_end|>\n<|im_start|>assistant\n"),
        "{text:?}"
    );
}

#[test]
fn llama3_instruct_templates_match_jinja2() {
    if skip_without_reference() {
        return;
    }
    let Some(python) = python_with_jinja2() else {
        return;
    };
    for file in [
        "meta-llama-Llama-3.1-8B-Instruct.jinja",
        "meta-llama-Llama-3.2-3B-Instruct.jinja",
        "meta-llama-Llama-3.3-70B-Instruct.jinja",
    ] {
        let text = assert_same_as_jinja2(&python, file, &read_template(file), "<|begin_of_text|>");
        assert!(
            text.starts_with("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"),
            "{file}: {text:?}"
        );
        assert!(
            text.contains("<|start_header_id|>assistant<|end_header_id|>\n\nParis.<|eot_id|>"),
            "{file}: {text:?}"
        );
        assert!(
            text.ends_with("<|start_header_id|>assistant<|end_header_id|>\n\n"),
            "{file}: {text:?}"
        );
    }
}

#[test]
fn smollm2_fixture_template_matches_jinja2() {
    if skip_without_reference() {
        return;
    }
    let Some(python) = python_with_jinja2() else {
        return;
    };
    let path = kit::dirs::default_model_path();
    let gguf = GgufFile::open(&path).expect("the SmolLM2 fixture (run `cargo xtask setup`)");
    let template = gguf
        .get("tokenizer.chat_template")
        .and_then(GgufValue::as_str)
        .expect("SmolLM2 carries a chat template");
    let text = assert_same_as_jinja2(&python, "SmolLM2", template, "<|im_start|>");
    assert!(text.ends_with("<|im_start|>assistant\n"), "{text:?}");
}

/// Every template llama.cpp ships, rendered for the conversation with and without its system
/// message: wherever jinja2
/// renders one, shoal must render the same text; where jinja2 refuses (a template that demands
/// tools, or has no system role), shoal must return an error too.
#[test]
fn every_shipped_template_that_jinja2_renders_matches() {
    if skip_without_reference() {
        return;
    }
    let Some(python) = python_with_jinja2() else {
        return;
    };
    let dir = reference_dir().join("templates");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".jinja"))
        .collect();
    files.sort();
    let templates: Vec<String> = files
        .iter()
        .map(|f| std::fs::read_to_string(dir.join(f)).unwrap())
        .collect();
    // With and without the system message (some templates have no system role).
    let messages = conversation();
    let conversations: [&[ChatMessage]; 2] = [&messages, &messages[1..]];
    let jobs: Vec<(&String, Job)> = conversations
        .iter()
        .flat_map(|&messages| {
            files.iter().zip(&templates).map(move |(file, template)| {
                let job = Job {
                    template,
                    messages,
                    add_generation_prompt: true,
                    bos_token: "<s>",
                    eos_token: "</s>",
                };
                (file, job)
            })
        })
        .collect();
    let reference = jinja2(
        &python,
        &jobs.iter().map(|(_, job)| job.clone()).collect::<Vec<_>>(),
    );
    let (mut same, mut refused_by_jinja2) = (0, 0);
    let mut differ = Vec::new();
    for ((file, job), expected) in jobs.iter().zip(&reference) {
        match (expected, ours(job)) {
            // What jinja2 refuses, shoal must refuse too (with an error, not a render).
            (Err(theirs), Err(_)) => {
                eprintln!("{file}: both refuse ({theirs})");
                refused_by_jinja2 += 1
            }
            (Err(theirs), Ok(_)) => {
                eprintln!("{file}: jinja2 refuses ({theirs}), shoal renders");
                differ.push(file.to_string());
            }
            (Ok(expected), Ok(got)) if &got == expected => same += 1,
            (Ok(_), got) => {
                eprintln!(
                    "{file}: {:?}",
                    got.map(|t| t.chars().take(200).collect::<String>())
                );
                differ.push(file.to_string());
            }
        }
    }
    eprintln!(
        "{} templates x 2 conversations: {same} renders identical to jinja2, {} differ \
         {differ:?}, {refused_by_jinja2} refused by both",
        files.len(),
        differ.len()
    );
    assert!(files.len() >= 60, "{}", files.len());
    assert!(
        differ.is_empty(),
        "templates rendered differently: {differ:?}"
    );
}
