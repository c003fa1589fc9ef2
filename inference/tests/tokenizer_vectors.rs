//! Tokenizers rebuilt from GGUF metadata against llama.cpp's own test vectors: for each
//! vocab-only GGUF that llama.cpp ships (`ggml-vocab-NAME.gguf`), the inputs in `.gguf.inp` must
//! encode to exactly the ids in `.gguf.out` (llama.cpp's `test-tokenizer-0`: no BOS, special
//! tokens not parsed), and decode back to the input.
//!
//! The files come from the `llama-cpp-python` sdist that `cargo xtask setup` fetches into the
//! cache (`<cache>/reference/llama.cpp-<version>/vocab`); without them the tests say so and pass.

mod reference;

use formats::gguf::{GgufFile, GgufValue};
use inference::{InferenceError, Tokenizer};
use reference::{reference_dir, skip_without_reference};
use std::path::Path;

/// One vocabulary's result.
#[derive(Debug)]
struct VocabReport {
    name: &'static str,
    /// `tokenizer.ggml.pre` of the file.
    pre: String,
    vectors: usize,
    ids_match: usize,
    round_trips: usize,
    /// First few mismatches: input, expected ids, our ids.
    mismatches: Vec<(String, Vec<u32>, Vec<u32>)>,
}

/// Splits `.inp` and `.out` the way llama.cpp's test does: inputs separated by
/// `\n__ggml_vocab_test__\n`, one line of space-separated ids per input.
fn read_vectors(vocab: &Path) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read_to_string(vocab.with_extension("gguf.inp")).unwrap();
    let out = std::fs::read_to_string(vocab.with_extension("gguf.out")).unwrap();
    let inputs: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    let outputs: Vec<Vec<u32>> = out
        .lines()
        .map(|line| {
            line.split_whitespace()
                .map(|id| id.parse().unwrap())
                .collect()
        })
        .collect();
    // The input file ends with a separator followed by nothing.
    let inputs = match inputs.split_last() {
        Some((&"", rest)) => rest.to_vec(),
        _ => inputs,
    };
    assert_eq!(
        inputs.len(),
        outputs.len(),
        "{}: inputs and outputs differ in number",
        vocab.display()
    );
    inputs.into_iter().map(str::to_owned).zip(outputs).collect()
}

fn check_vocab(name: &'static str) -> Result<VocabReport, InferenceError> {
    let path = reference_dir()
        .join("vocab")
        .join(format!("ggml-vocab-{name}.gguf"));
    let file = GgufFile::open(&path)?;
    let pre = file
        .get("tokenizer.ggml.pre")
        .and_then(GgufValue::as_str)
        .unwrap_or("(none)")
        .to_owned();
    let tokenizer = Tokenizer::from_gguf(&file)?;
    let mut report = VocabReport {
        name,
        pre,
        vectors: 0,
        ids_match: 0,
        round_trips: 0,
        mismatches: Vec::new(),
    };
    for (text, expected) in read_vectors(&path) {
        report.vectors += 1;
        let ids = tokenizer.encode(&text)?;
        if ids == expected {
            report.ids_match += 1;
        } else if report.mismatches.len() < 3 {
            report
                .mismatches
                .push((text.clone(), expected, ids.clone()));
        }
        if tokenizer.decode(&ids, false)? == text {
            report.round_trips += 1;
        }
    }
    Ok(report)
}

fn print(report: &VocabReport) {
    eprintln!(
        "{:<15} pre={:<15} ids {:>2}/{:<2} round trips {:>2}/{}",
        report.name,
        report.pre,
        report.ids_match,
        report.vectors,
        report.round_trips,
        report.vectors
    );
    for (text, expected, got) in &report.mismatches {
        eprintln!("    {text:?}\n      llama.cpp {expected:?}\n      ours      {got:?}");
    }
}

/// Every vocabulary with vectors: each byte-level BPE one (Llama 3, Qwen2, Qwen3.5, GPT-2,
/// StarCoder and Refact, whose pre-tokenizer SmolLM2's `smollm` shares, DeepSeek, Falcon,
/// Command-R, MPT) must match llama.cpp on every vector, ids and round trip; the others
/// (SentencePiece, WordPiece, Gemma 4) are refused with a clear error, not mis-tokenized.
#[test]
fn every_vocab_matches_llama_cpp_or_is_refused() {
    if skip_without_reference() {
        return;
    }
    const ALL: &[&str] = &[
        "bert-bge",
        "command-r",
        "deepseek-coder",
        "deepseek-llm",
        "falcon",
        "gemma-4",
        "gpt-2",
        "llama-bpe",
        "llama-spm",
        "mpt",
        "phi-3",
        "qwen2",
        "qwen35",
        "refact",
        "starcoder",
    ];
    let mut refused = Vec::new();
    let mut differ = Vec::new();
    let mut vectors = 0;
    for &name in ALL {
        match check_vocab(name) {
            Ok(report) => {
                print(&report);
                assert!(report.vectors >= 40, "{report:?}");
                vectors += report.vectors;
                if report.ids_match != report.vectors || report.round_trips != report.vectors {
                    differ.push(name);
                }
            }
            Err(InferenceError::Tokenizer(reason)) => {
                eprintln!("{name:<15} refused: {reason}");
                assert!(reason.contains("is not supported"), "{reason}");
                refused.push(name);
            }
            Err(other) => panic!("{name}: {other}"),
        }
    }
    eprintln!("{vectors} vectors checked; refused: {refused:?}; differing: {differ:?}");
    assert_eq!(refused, ["bert-bge", "gemma-4", "llama-spm", "phi-3"]);
    assert!(
        differ.is_empty(),
        "vocabularies that differ from llama.cpp: {differ:?}"
    );
    assert_eq!(vectors, 11 * 46 + 4);
}

/// A character that spans tokens (byte-level BPE splits rare characters into byte pieces):
/// each piece decoded alone is U+FFFD, and [`Tokenizer::token_bytes`] gives its real bytes,
/// which join into the text (what the APIs' `logprobs[].bytes` are for).
#[test]
fn tokens_that_split_a_character_report_their_own_bytes() {
    if skip_without_reference() {
        return;
    }
    let text = "Price: 5€ — 日本語の🐟 𓂀 ok";
    for name in ["gpt-2", "llama-bpe", "qwen2", "starcoder"] {
        let path = reference_dir()
            .join("vocab")
            .join(format!("ggml-vocab-{name}.gguf"));
        let tokenizer = Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
        let ids = tokenizer.encode(text).unwrap();
        let split = ids
            .iter()
            .filter(|id| {
                tokenizer
                    .decode(&[**id], false)
                    .unwrap()
                    .contains('\u{FFFD}')
            })
            .count();
        assert!(split > 0, "{name}: no token splits a character of {text:?}");
        let joined: Vec<u8> = ids
            .iter()
            .flat_map(|id| tokenizer.token_bytes(*id))
            .collect();
        assert_eq!(
            String::from_utf8_lossy(&joined),
            text,
            "{name}: the tokens' bytes do not join into the text"
        );
        eprintln!(
            "{name}: {} tokens, {split} of them part of a character",
            ids.len()
        );
    }
}
