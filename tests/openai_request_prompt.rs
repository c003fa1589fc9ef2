//! The prompt a node builds from an OpenAI request is the one transformers builds from the same
//! request (issue 49 item 3). The chat-template tests compare shoal's renderer with jinja2 on
//! variables shoal itself made; this compares the whole mapping: the request's JSON body, read
//! by the gateway as a node reads it and rendered and tokenized by `prompt` as the node holding
//! rank 0 does, against transformers' own `apply_chat_template(messages, tools=...)` over that
//! request's messages and tools, tokenized by transformers.
//!
//! The request and transformers' prompt are written per dialect model by
//! `xtask/scripts/dialect_fixtures.py` (`openai_request.json`, `openai_request_prompt.json`):
//! a system prompt, a question, an assistant call whose `content` is null and whose
//! `arguments` is a JSON string (transformers is given the mapping, as vLLM and llama-server
//! pass it), the tool's result by `tool_call_id`, the answer and a next question, with two
//! tools. Where a template ignores `tools` the request offers none (the node describes tools
//! itself there, by design). Where transformers cannot render the template at all (its sandbox
//! refuses Kimi K2 Thinking's `list.append`) the fixture says so and the case is reported, not
//! compared; the other eight must match token for token.
//!
//! Needs the dialect fixtures (`cargo xtask setup`): fails without them, or with
//! `SHOAL_ALLOW_SKIP=1` is skipped and counted (see `kit::skip`).

use inference::{DateTime, Prompt, TemplateClock};
use serde_json::Value;
use std::path::PathBuf;

/// The moment transformers' `strftime_now` told while rendering (the script's
/// `OPENAI_REQUEST_DATE`): gpt-oss's template states the date.
const RENDERED_AT: DateTime = DateTime::midnight(2025, 1, 1);

/// `<cache>/fixtures/families/dialects`.
fn dialects_root() -> PathBuf {
    kit::dirs::family_fixture_dir("dialects", "x")
        .parent()
        .expect("a dialect folder is <root>/<dialect>")
        .to_path_buf()
}

fn read_json(path: &std::path::Path) -> Option<Value> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

#[test]
fn a_node_builds_the_prompt_transformers_builds_from_an_openai_request() {
    let root = dialects_root();
    let present = read_json(&root.join("manifest.json"))
        .ok_or_else(|| format!("no dialect fixtures in {}", root.display()));
    if !kit::skip::can_run(
        present.as_ref().map(|_| ()).map_err(Clone::clone),
        "run `cargo xtask setup`",
    ) {
        return;
    }
    let manifest = present.expect("checked above");
    let dialects: Vec<String> = manifest
        .as_array()
        .expect("the manifest lists the dialects")
        .iter()
        .filter_map(|d| d.as_str().map(String::from))
        .collect();
    let (mut matched, mut refused, mut differ) = (Vec::new(), Vec::new(), Vec::new());
    for dialect in &dialects {
        let folder = root.join(dialect);
        let body = std::fs::read(folder.join("openai_request.json"))
            .unwrap_or_else(|e| panic!("{dialect}: openai_request.json ({e}): run setup again"));
        let reference = read_json(&folder.join("openai_request_prompt.json"))
            .unwrap_or_else(|| panic!("{dialect}: openai_request_prompt.json: run setup again"));
        if let Some(why) = reference["transformers_refuses"].as_str() {
            refused.push(format!("{dialect}: {why}"));
            continue;
        }
        let want: Vec<u32> = reference["ids"]
            .as_array()
            .expect("token ids")
            .iter()
            .map(|v| v.as_u64().expect("a token id") as u32)
            .collect();
        let mut facts =
            facts::read(&folder).unwrap_or_else(|e| panic!("{dialect}: the model's facts: {e}"));
        facts.tokenizer.template_clock = TemplateClock::Fixed(RENDERED_AT);
        let parsed = gateway::openai::request::parse_chat_request(&body)
            .unwrap_or_else(|e| panic!("{dialect}: the gateway refused the request: {e:?}"));
        let (request, _) = prompt::generate_request(&parsed.request, &facts)
            .unwrap_or_else(|e| panic!("{dialect}: no prompt: {e:?}"));
        let Prompt::Tokens(got) = request.prompt else {
            panic!("{dialect}: the node's prompt is not token ids");
        };
        if got == want {
            matched.push(format!("{dialect} ({} tokens)", got.len()));
        } else {
            let text = |ids: &[u32]| facts.tokenizer.decode(ids, false).unwrap_or_default();
            let at = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
            differ.push(format!(
                "{dialect}: {} tokens against transformers' {}, first difference at token {at}:\n  \
                 shoal:        {:?}\n  transformers: {:?}",
                got.len(),
                want.len(),
                text(&got[at.saturating_sub(8)..(at + 24).min(got.len())]),
                text(&want[at.saturating_sub(8)..(at + 24).min(want.len())]),
            ));
        }
    }
    eprintln!("same prompt as transformers: {matched:?}");
    eprintln!("not rendered by transformers: {refused:?}");
    assert!(differ.is_empty(), "{}", differ.join("\n"));
    assert!(
        matched.len() + 1 >= dialects.len() && matched.len() >= 8,
        "fewer dialects compared than the fixtures hold: {matched:?}, {refused:?}"
    );
}
