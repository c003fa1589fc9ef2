//! Each family's real chat template, rendered by jinja2 (as `transformers` renders it), tells
//! its own dialect, and the earlier call it renders — what the model was trained to write — is
//! read back by that dialect as the call it was, typed. The answer is what the template adds
//! to the prompt for the assistant's turn that made the call (its end-of-turn token cut, as
//! the engine cuts it); where the prompt opens a thought, a thought and `</think>` come first,
//! as the model writes them.
//!
//! A `tool_choice` naming the function forces an opening ([`dialects::tools::forced`]) that must
//! be how the template itself begins that call, and a parser primed with it reads the rest of
//! the turn as the call, whole and with its arguments streamed.
//!
//! Kimi-K2-Instruct's and Kimi-K2-Thinking's templates call `list.append`, which jinja2's
//! sandbox refuses (`inference/tests/dialect_chat_templates.rs`); moonshotai-Kimi-K2's stands
//! for the family.
//!
//! Needs the reference templates and jinja2 (`cargo xtask setup`): fails otherwise, or with
//! `SHOAL_ALLOW_SKIP=1` is skipped and counted (see `kit::skip`).

use dialects::answer::{AnswerForm, AnswerSplitter};
use dialects::answer_part::AnswerPart;
use dialects::tools::dialect::Dialect;
use dialects::tools::forced::{self, Opener};
use dialects::tools::stream::CallDelta;
use dialects::tools::{Tool, ToolChoice};
use serde_json::{json, Value};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// This package's folder, as cargo names it to the running test (a test binary reused from
/// another checkout of the same sources, in a shared target folder, carries that checkout's
/// path in `env!`), else as it was at compile time.
fn package_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

fn templates() -> PathBuf {
    kit::dirs::cache_dir()
        .join("reference")
        .join("llama.cpp-0.3.36")
        .join("templates")
}

/// Renders `jobs` with jinja2 (the inference tests' renderer): text, or jinja2's error.
fn jinja2(jobs: &[Value]) -> Vec<Result<String, String>> {
    let script = package_dir().join("../inference/tests/reference/jinja2_render.py");
    let mut child = Command::new(kit::dirs::python())
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python runs");
    let input = serde_json::to_vec(jobs).unwrap();
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let output = child.wait_with_output().unwrap();
    let results: Vec<Value> = serde_json::from_slice(&output.stdout).expect("jinja2's results");
    results
        .into_iter()
        .map(|r| match r.get("ok").and_then(Value::as_str) {
            Some(text) => Ok(text.to_string()),
            None => Err(r["error"].to_string()),
        })
        .collect()
}

fn weather() -> Tool {
    Tool {
        name: "get_weather".into(),
        description: Some("Weather in a city".into()),
        parameters: Some(
            json!({"type": "object", "properties": {"city": {"type": "string"},
                   "days": {"type": "integer"}}, "required": ["city"]})
            .to_string(),
        ),
        strict: false,
    }
}

#[test]
fn each_family_reads_back_the_call_its_template_renders() {
    let dir = templates();
    let ready = kit::dirs::python().exists() && dir.is_dir();
    let check = if ready {
        Ok(())
    } else {
        Err("the reference templates or the venv's jinja2 are missing".to_string())
    };
    if !kit::skip::can_run(check, "run `cargo xtask setup`") {
        return;
    }
    // (template, its dialect, bos, eos)
    let families = [
        ("GLM-4.6.jinja", Dialect::Glm, "", "<|endoftext|>"),
        ("GLM-4.7-Flash.jinja", Dialect::Glm, "", "<|endoftext|>"),
        ("MiniMax-M2.jinja", Dialect::MiniMax, "]~!b[", "[e~["),
        (
            "moonshotai-Kimi-K2.jinja",
            Dialect::Kimi,
            "[BOS]",
            "<|im_end|>",
        ),
        (
            "deepseek-ai-DeepSeek-V3.1.jinja",
            Dialect::DeepSeek,
            "<｜begin▁of▁sentence｜>",
            "<｜end▁of▁sentence｜>",
        ),
        (
            "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
            Dialect::DeepSeek,
            "<｜begin▁of▁sentence｜>",
            "<｜end▁of▁sentence｜>",
        ),
        (
            "openai-gpt-oss-120b.jinja",
            Dialect::Harmony,
            "<|startoftext|>",
            "<|call|>",
        ),
        ("Qwen3-Coder.jinja", Dialect::Qwen3Coder, "", "<|im_end|>"),
        ("Qwen3.5-4B.jinja", Dialect::Qwen3Coder, "", "<|im_end|>"),
        ("Qwen-Qwen3-0.6B.jinja", Dialect::Common, "", "<|im_end|>"),
        // The 2026 releases that write Qwen3-Coder's parameters, and DeepSeek's DSML.
        (
            "StepFun3.5-Flash.jinja",
            Dialect::Qwen3Coder,
            "",
            "<|im_end|>",
        ),
        (
            "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja",
            Dialect::Qwen3Coder,
            "",
            "<|im_end|>",
        ),
        (
            "deepseek-ai-DeepSeek-V3.2.jinja",
            Dialect::Dsml,
            "<｜begin▁of▁sentence｜>",
            "<｜end▁of▁sentence｜>",
        ),
        (
            "deepseek-ai-DeepSeek-V4.jinja",
            Dialect::DsmlV4,
            "<｜begin▁of▁sentence｜>",
            "<｜end▁of▁sentence｜>",
        ),
        ("MiniMax-M3.jinja", Dialect::MiniMaxM3, "]~!b[", "[e~["),
        // Kimi K3's XTML; a turn ends with `<|end_of_msg|>`.
        ("Kimi-K3.jinja", Dialect::KimiK3, "", "<|end_of_msg|>"),
        // Gemma 4 ends a turn that calls with the opening of the tool's response.
        (
            "google-gemma-4-31B-it.jinja",
            Dialect::Gemma4,
            "<bos>",
            "<|tool_response>",
        ),
    ];
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Weather in a city", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"]}}}]);
    let user = json!({"role": "user", "content": "Weather in Zürich for 3 days?"});
    let call = json!({"role": "assistant", "content": "", "tool_calls": [{"id": "functions.get_weather:0",
        "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "days": 3}}}]});
    let mut jobs = Vec::new();
    let mut sources = Vec::new();
    for (file, _, bos, eos) in &families {
        let template = std::fs::read_to_string(dir.join(file)).unwrap();
        let job = |messages: Value, add_generation_prompt: bool| {
            json!({"template": template, "variables": {"messages": messages, "tools": tools,
                   "add_generation_prompt": add_generation_prompt, "bos_token": bos,
                   "eos_token": eos}})
        };
        jobs.push(job(json!([user]), true));
        jobs.push(job(json!([user, call]), false));
        sources.push(template);
    }
    let renders = jinja2(&jobs);
    for (n, (file, dialect, _, eos)) in families.iter().enumerate() {
        assert_eq!(Dialect::of_template(&sources[n]), *dialect, "{file}");
        let prompt = renders[2 * n]
            .as_ref()
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        let whole = renders[2 * n + 1]
            .as_ref()
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        // The assistant's turn: what the whole chat adds after the prompt they share (where
        // the prompt ends otherwise, as in an opened thought, from the last tag they share).
        let mut shared = prompt
            .char_indices()
            .zip(whole.chars())
            .find(|((_, a), b)| a != b)
            .map_or(prompt.len().min(whole.len()), |((i, _), _)| i);
        if shared < prompt.len() {
            while shared > 0 && !whole[..shared].ends_with(['>', '\n']) {
                shared = whole[..shared].char_indices().last().map_or(0, |(i, _)| i);
            }
        }
        // The engine stops at the end-of-turn token.
        let turn = whole[shared..]
            .split(eos)
            .next()
            .unwrap_or_default()
            .trim_end();
        let form = AnswerForm::of_prompt(Some(&sources[n]), prompt);
        // Where the thought ends: `</think>`, or Kimi K3's thinking channel's close.
        let close = match dialect {
            Dialect::KimiK3 => dialects::reasoning::KIMI_K3_TAGS.1,
            _ => "</think>",
        };
        let answer = match (form.opens_in_thought, turn.trim_start().starts_with(close)) {
            (true, true) => format!("The user wants the weather.{turn}"),
            (true, false) => format!("The user wants the weather.{close}{turn}"),
            // The prompt closed an empty thought (DeepSeek V3.2 with thinking off), which
            // the history renders after the turn's start: the model goes on after it.
            (false, true) if prompt.ends_with("</think>") => {
                turn.trim_start().trim_start_matches("</think>").to_string()
            }
            // MiniMax M3's history keeps only the thought's close: the model opens it.
            (false, _) if turn.trim_start().starts_with("</mm:think>") => {
                format!("<mm:think>The user wants the weather.{}", turn.trim_start())
            }
            (false, _) => turn.to_string(),
        };
        let mut splitter = AnswerSplitter::new(&[weather()], form.clone());
        // Token-sized pieces, as the engine streams them.
        let chars: Vec<char> = answer.chars().collect();
        let mut parts: Vec<AnswerPart> = chars
            .chunks(3)
            .flat_map(|c| splitter.push(&c.iter().collect::<String>()))
            .collect();
        parts.extend(splitter.finish());
        let calls: Vec<_> = parts
            .iter()
            .filter_map(|p| match p {
                AnswerPart::Call(c) => Some(c),
                _ => None,
            })
            .collect();
        assert_eq!(calls.len(), 1, "{file}: {answer:?} -> {parts:?}");
        assert_eq!(calls[0].name, "get_weather", "{file}");
        assert_eq!(
            calls[0].arguments, r#"{"city":"Zürich","days":3}"#,
            "{file}: {answer:?}"
        );
        let text: String = parts
            .iter()
            .filter_map(|p| match p {
                AnswerPart::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert!(
            text.trim().is_empty(),
            "{file}: text {text:?} from {answer:?}"
        );

        // `tool_choice` naming the function: the forced opening is how the template begins
        // the call (the model's own format), and a parser primed with it reads the rest of
        // the turn as that call, whole and streamed.
        let opener = Opener::of_template(Some(&sources[n]));
        let choice = ToolChoice::Function("get_weather".into());
        // Kimi K3's forced opening closes its thinking channel itself, passing an empty
        // response channel as its template writes a turn that only calls: it is checked
        // from the thought's close on.
        let k3_thought = *dialect == Dialect::KimiK3 && form.opens_in_thought;
        let forced = forced::opening(opener, &choice, 0, k3_thought, &|n: &str| n.to_string())
            .expect("a named function is forced");
        let thought_end = ["</think>", "</mm:think>"]
            .into_iter()
            .filter(|_| !k3_thought)
            .find_map(|tag| turn.find(tag).map(|at| at + tag.len()));
        let call_turn = match thought_end {
            Some(at) => &turn[at..],
            None => turn,
        }
        .trim_start();
        let opening = forced.primed.trim_start();
        let rest = call_turn.strip_prefix(opening).unwrap_or_else(|| {
            panic!("{file}: the forced opening {opening:?} does not begin {call_turn:?}")
        });
        for stream in [false, true] {
            let primed = AnswerForm {
                opens_in_thought: k3_thought,
                primed: forced.primed.clone(),
                ..form.clone()
            };
            let mut splitter = AnswerSplitter::new(&[weather()], primed);
            splitter.stream_arguments(stream);
            let chars: Vec<char> = rest.chars().collect();
            let mut parts: Vec<AnswerPart> = chars
                .chunks(3)
                .flat_map(|c| splitter.push(&c.iter().collect::<String>()))
                .collect();
            parts.extend(splitter.finish());
            let mut args = String::new();
            let mut calls = Vec::new();
            for part in &parts {
                match part {
                    AnswerPart::Call(c) if !stream => calls.push(c.clone()),
                    AnswerPart::Stream(CallDelta::Arguments(a)) => args.push_str(a),
                    AnswerPart::Stream(CallDelta::End(c)) => {
                        assert_eq!(c.arguments, args, "{file}");
                        calls.push(c.clone());
                    }
                    AnswerPart::Stream(CallDelta::Start { name, .. }) => {
                        assert_eq!(name, "get_weather", "{file}")
                    }
                    AnswerPart::Text(t) if t.trim().is_empty() => {}
                    other => panic!("{file}: {other:?} in {parts:?}"),
                }
            }
            assert_eq!(calls.len(), 1, "{file}: {rest:?} -> {parts:?}");
            let value: Value = serde_json::from_str(&calls[0].arguments).unwrap();
            assert_eq!(value, json!({"city": "Zürich", "days": 3}), "{file}");
        }
    }
}
