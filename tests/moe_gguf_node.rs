//! A Mixture-of-Experts GGUF file as a Linux user downloads it, served by a real node (issue
//! 46): the tiny Qwen3-MoE, gpt-oss (MXFP4 experts) and DeepSeek V3 that llama.cpp's own
//! `convert_hf_to_gguf.py` wrote (see `inference/tests/moe_gguf.rs` for the logits), each
//! named on a node's command line. Its greedy
//! answer to the fixture's chat, through the OpenAI API and the chat template the file
//! carries, is llama.cpp's greedy answer (libllama on the same file and the same prompt
//! tokens, `reference.json`): the same text and the same number of tokens, in one answer and
//! streamed.
//!
//! Needs root (namespaces) and the MoE GGUF fixtures (`cargo xtask setup`): fails otherwise, or
//! with `SHOAL_ALLOW_SKIP=1` is skipped and counted (see `kit::skip`).

mod support;

use serde_json::{json, Value};
use std::time::Duration;
use support::netns::Spec;
use support::TestNet;

#[test]
fn a_node_answers_a_chat_with_a_moe_gguf_as_llama_cpp_does() {
    node_answers_as_llama_cpp("moegguf", "qwen3moe", "F32");
}

/// gpt-oss's file with its experts in MXFP4, run as MLX's mxfp4 (llama.cpp's answer on the
/// same weights: its F32 file's, which is also its answer on this file).
#[test]
fn a_node_answers_a_chat_with_gpt_oss_mxfp4_experts_as_llama_cpp_does() {
    node_answers_as_llama_cpp("moeoss", "gpt-oss", "MXFP4");
}

/// DeepSeek V3's layout (llama.cpp's `deepseek2`: latent attention, shared expert).
#[test]
fn a_node_answers_a_chat_with_a_deepseek2_gguf_as_llama_cpp_does() {
    node_answers_as_llama_cpp("moeds", "deepseek2", "F32");
}

/// One node in namespaces `tag` serving `arch`'s `label` file answers the fixture's chat as
/// llama.cpp did on it.
fn node_answers_as_llama_cpp(tag: &str, arch: &str, label: &str) {
    let dir = kit::dirs::moe_gguf_fixtures_dir();
    let reference = std::fs::read_to_string(dir.join("reference.json"))
        .map_err(|e| format!("{}: {e}", dir.join("reference.json").display()));
    if !kit::skip::can_run(
        reference.as_ref().map(|_| ()).map_err(String::clone),
        "run `cargo xtask setup`",
    ) {
        return;
    }
    let reference: Value = serde_json::from_str(&reference.unwrap()).unwrap();
    let model = &reference["models"][arch];
    let file = &model["files"][label];
    let want_text = file["chat_text"].as_str().unwrap().to_string();
    let want_tokens = file["chat_tokens"].as_array().unwrap().len();
    let Some((net, mut nodes)) = TestNet::create(
        tag,
        &Spec {
            nodes: 1,
            ..Spec::default()
        },
    ) else {
        return;
    };
    let outside = net.dir.join("downloads");
    std::fs::create_dir_all(&outside).unwrap();
    let gguf = outside.join(file["gguf"].as_str().unwrap());
    std::fs::hard_link(dir.join(file["gguf"].as_str().unwrap()), &gguf).unwrap();
    let node = &mut nodes[0];
    node.extra_args = vec!["--model".into(), gguf.display().to_string()];
    node.env.push(("HF_HUB_OFFLINE".into(), "1".into()));
    node.start();
    let node = &nodes[0];
    let Some((id, took)) = support::ready_model_id(node, Duration::from_secs(120)) else {
        panic!("the MoE GGUF never became ready\n{}", node.log_tail());
    };
    let request = json!({
        "model": id,
        "messages": reference["chat"],
        "temperature": 0,
        "max_tokens": 10,
    });
    let (status, answer) = support::call(node, "POST", "/v1/chat/completions", Some(&request));
    assert_eq!(status, 200, "{answer}\n{}", node.log_tail());
    let text = answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default();
    eprintln!("{id} ready in {took:?}; answered {text:?}, llama.cpp {want_text:?}");
    assert_eq!(text, want_text, "the answer is llama.cpp's");
    assert_eq!(
        answer["usage"]["completion_tokens"], want_tokens,
        "as many tokens as llama.cpp's: {answer}"
    );
    assert_eq!(
        answer["usage"]["prompt_tokens"],
        model["chat_prompt"].as_array().unwrap().len(),
        "the prompt as the file's chat template makes it: {answer}"
    );
    net.teardown(nodes);
}
