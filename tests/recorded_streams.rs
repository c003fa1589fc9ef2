//! Tool calls and reasoning from real tokenizers' token streams, through every API's official
//! client. For the families whose real tokenizer is on this machine (llama.cpp's vocab GGUFs,
//! fetched by `cargo xtask setup`: Qwen3.5 for the Hermes/Qwen `<tool_call>` and `<think>`
//! dialect, Llama 3 for `<|python_tag|>`), a model's answer is encoded with that tokenizer,
//! decoded one token at a time by the runner's own streaming detokenizer
//! (`inference::detokenizer::StreamDecoder`), and the pieces are replayed by the gateway's fake
//! backend (`pieces: [...]`). These vocab files hold the base vocabularies without the chat
//! models' added tokens (no `<think>`, `<tool_call>` or `<|python_tag|>` entry; checked below),
//! so the markup arrives split over several byte-level pieces, the harder case for the
//! incremental parser; the models' own single-token markup is not tested here. The
//! official `openai` (chat, whole and streamed; Responses), `anthropic` (whole and streamed)
//! and `ollama` clients must each get the thought in their reasoning field and a typed
//! `get_weather({"city": "Paris"})` (`tests/recorded_stream_checks.py`).
//!
//! Needs the reference data and the venv (`cargo xtask setup`): fails otherwise, or with
//! `SHOAL_ALLOW_SKIP=1` is skipped and counted (see `kit::skip`).

use gateway::fake::FakeBackend;
use inference::detokenizer::StreamDecoder;
use inference::gguf::GgufFile;
use inference::Tokenizer;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The vocab GGUFs of the `llama-cpp-python` release setup extracts.
fn vocab(name: &str) -> PathBuf {
    kit::dirs::cache_dir()
        .join("reference/llama.cpp-0.3.36/vocab")
        .join(format!("ggml-vocab-{name}.gguf"))
}

/// One family's recorded answer: the vocab, the answer as the model writes it, the thought
/// it holds, and its markup (split over several tokens in these vocabularies).
struct Recorded {
    vocab: &'static str,
    answer: &'static str,
    thought: &'static str,
    markup: &'static [&'static str],
}

const RECORDED: [Recorded; 2] = [
    Recorded {
        vocab: "qwen35",
        answer: "<think>\nThe user wants the weather in Paris; I should call the tool.\n</think>\n\n\
                 <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        thought: "The user wants the weather in Paris; I should call the tool.",
        markup: &["<think>", "</think>", "<tool_call>", "</tool_call>"],
    },
    Recorded {
        vocab: "llama-bpe",
        answer: "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
        thought: "",
        markup: &["<|python_tag|>"],
    },
];

/// The answer's tokens, decoded as the runner streams them.
fn pieces(tokenizer: &Tokenizer, answer: &str) -> Vec<String> {
    let ids = tokenizer.encode(answer).expect("encode");
    let mut decoder = StreamDecoder::new();
    let mut pieces: Vec<String> = ids
        .iter()
        .map(|id| decoder.push(tokenizer, *id).expect("decode"))
        .collect();
    pieces.push(decoder.finish(tokenizer).expect("finish"));
    pieces.retain(|p| !p.is_empty());
    pieces
}

#[test]
fn real_tokenizers_streams_reach_every_client_as_typed_calls_and_reasoning() {
    let ready = (|| {
        for r in &RECORDED {
            if !vocab(r.vocab).exists() {
                return Err(format!("{} is missing", vocab(r.vocab).display()));
            }
        }
        if !kit::dirs::python().exists() {
            return Err(format!("{} is missing", kit::dirs::python().display()));
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
    for r in &RECORDED {
        let tokenizer = Tokenizer::from_gguf(&GgufFile::open(vocab(r.vocab)).unwrap()).unwrap();
        for markup in r.markup {
            let ids = tokenizer.encode(markup).unwrap();
            assert!(ids.len() > 1, "{}: {markup} is one token {ids:?}", r.vocab);
        }
        let pieces = pieces(&tokenizer, r.answer);
        assert_eq!(pieces.concat(), r.answer, "{}: the markup is kept", r.vocab);
        eprintln!("{}: {} pieces: {pieces:?}", r.vocab, pieces.len());
        let out = std::process::Command::new(kit::dirs::python())
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/recorded_stream_checks.py"
            ))
            .arg(format!("http://{addr}/v1"))
            .arg(format!("http://{addr}"))
            .arg(serde_json::to_string(&pieces).unwrap())
            .arg(r.thought)
            .env("NO_PROXY", "*")
            .env_remove("HTTP_PROXY")
            .env_remove("http_proxy")
            .output()
            .expect("the venv's python starts");
        let stdout = String::from_utf8_lossy(&out.stdout);
        eprintln!("{}:\n{stdout}", r.vocab);
        assert!(
            out.status.success() && stdout.contains("all passed"),
            "{}: {stdout}\n{}",
            r.vocab,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    shutdown.cancel();
}
