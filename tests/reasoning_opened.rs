//! A real node serving a model whose chat template opens the thought itself, as
//! DeepSeek-R1 distills' does (`<｜Assistant｜><think>\n` at the end of the prompt): the
//! SmolLM2 fixture in Hugging Face form with that template. The answer starts inside the
//! thought, so everything the model writes before `</think>` (here: all of it, the fixture
//! never closes a thought it was not trained on) must reach each API's reasoning field —
//! `reasoning_content`, Anthropic `thinking` blocks, Ollama `thinking`, a Responses reasoning
//! item — and none of it the answer's text. Before the node told the gateway, all of it was
//! text.
//!
//! Needs root (namespaces) and the model fixture (`cargo xtask setup`): fails otherwise, or
//! with `SHOAL_ALLOW_SKIP=1` is skipped and counted (see `kit::skip`).

mod support;
use support::hf;

use serde_json::{json, Value};
use std::time::Duration;
use support::netns::Spec;
use support::{wait_for, TestNet};

const LIMIT: Duration = Duration::from_secs(120);

/// ChatML, as SmolLM2's own, ending the prompt inside an open thought.
const OPENED: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}";

#[test]
fn a_thought_the_template_opens_reaches_every_reasoning_field() {
    if !kit::skip::can_run(hf::fixture_repo().map(|_| ()), "run `cargo xtask setup`") {
        return;
    }
    let Some((net, mut nodes)) = TestNet::create(
        "opened",
        &Spec {
            nodes: 1,
            ..Spec::default()
        },
    ) else {
        return;
    };
    // The fixture's files, and the template that opens the thought.
    let models = net.dir.join("models");
    let folder = models.join("smol-opened");
    std::fs::create_dir_all(&folder).unwrap();
    for entry in std::fs::read_dir(hf::fixture_repo().unwrap())
        .unwrap()
        .flatten()
    {
        std::fs::copy(entry.path(), folder.join(entry.file_name())).unwrap();
    }
    std::fs::write(folder.join("chat_template.jinja"), OPENED).unwrap();
    let node = &mut nodes[0];
    node.extra_args = vec![
        "--models-dir".into(),
        models.display().to_string(),
        "--model".into(),
        folder.display().to_string(),
    ];
    node.env.push(("HF_HUB_OFFLINE".into(), "1".into()));
    node.start();
    let node = &nodes[0];
    let post = |path: &str, body: Value| -> (u16, Value) {
        match node
            .api
            .call("POST".parse().unwrap(), path, Some(&body), LIMIT)
        {
            Ok(a) => (
                a.status.as_u16(),
                serde_json::from_str(&a.text()).unwrap_or(Value::Null),
            ),
            Err(e) => (0, Value::String(e.to_string())),
        }
    };
    // The model's id as the node lists it, once ready.
    let model = wait_for(Duration::from_secs(300), || {
        let answer = node
            .api
            .call("GET".parse().unwrap(), "/v1/models", None, LIMIT)
            .ok()?;
        let models: Value = serde_json::from_str(&answer.text()).ok()?;
        models["data"]
            .as_array()?
            .iter()
            .find(|m| {
                m["ready"] == true
                    && m["id"]
                        .as_str()
                        .is_some_and(|id| id.contains("smol-opened"))
            })
            .and_then(|m| m["id"].as_str().map(str::to_string))
    })
    .map(|(id, _)| id)
    .unwrap_or_else(|| panic!("the model is served\n{}", node.log_tail()));
    let question = "What is the capital of France?";
    let chat = json!({"model": model, "temperature": 0, "max_tokens": 8,
                      "messages": [{"role": "user", "content": question}]});
    let (status, answer) = post("/v1/chat/completions", chat);
    assert_eq!(status, 200, "{answer}\n{}", node.log_tail());
    let message = &answer["choices"][0]["message"];
    let thought = message["reasoning_content"].as_str().unwrap_or_default();
    assert!(!thought.is_empty(), "{answer}");
    assert!(
        message["content"].as_str().unwrap_or_default().is_empty(),
        "{answer}"
    );

    let (status, m) = post(
        "/v1/messages",
        json!({"model": model, "max_tokens": 8, "temperature": 0,
               "messages": [{"role": "user", "content": question}]}),
    );
    assert_eq!(status, 200, "{m}");
    assert_eq!(m["content"][0]["type"], "thinking", "{m}");
    assert_eq!(m["content"][0]["thinking"], thought, "{m}");

    let (status, o) = post(
        "/api/chat",
        json!({"model": model, "stream": false,
               "messages": [{"role": "user", "content": question}],
               "options": {"temperature": 0, "num_predict": 8}}),
    );
    assert_eq!(status, 200, "{o}");
    assert_eq!(o["message"]["thinking"], thought, "{o}");
    assert_eq!(o["message"]["content"], "", "{o}");

    let (status, r) = post(
        "/v1/responses",
        json!({"model": model, "temperature": 0, "max_output_tokens": 8, "input": question}),
    );
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["output"][0]["type"], "reasoning", "{r}");
    assert_eq!(r["output"][0]["content"][0]["text"], thought, "{r}");
    net.teardown(nodes);
}
