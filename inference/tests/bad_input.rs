//! Bad input gives a clear error, never a panic or a hang: GGUF files mangled at random
//! (property tests over a small GGUF written here), a GGUF of an unknown architecture, a
//! vocab-only GGUF offered as a model, corrupt or truncated safetensors, and text and chat
//! prompts longer than the context. (A missing file, a bad config.json, a GGUF cut short and a
//! token prompt past the context are covered in `tiny_models.rs`, `smollm2.rs` and
//! `runner.rs`.)

mod common;
mod reference;

use common::{temp_dir, write_tiny_model};
use formats::gguf::GgufFile;
use inference::config::ModelConfig;
use inference::loader::{load_shard, LoadOptions};
use inference::{
    ChatMessage, Engine, GenerateRequest, InferenceError, Prompt, Tokenizer, WeightFormat,
};
use proptest::prelude::*;
use std::ops::ControlFlow;
use std::path::Path;

/// One GGUF metadata value, as written by [`gguf_bytes`].
enum Meta {
    U32(u32),
    F32(f32),
    Bool(bool),
    Str(&'static str),
    Strs(Vec<String>),
    I32s(Vec<i32>),
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

/// A GGUF v3 file: metadata, then F32 tensors (shape outermost first) at 32-byte alignment.
fn gguf_bytes(metadata: &[(&str, Meta)], tensors: &[(&str, Vec<usize>)]) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend((metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata {
        put_string(&mut out, key);
        match value {
            Meta::U32(v) => {
                out.extend(4u32.to_le_bytes());
                out.extend(v.to_le_bytes());
            }
            Meta::F32(v) => {
                out.extend(6u32.to_le_bytes());
                out.extend(v.to_le_bytes());
            }
            Meta::Bool(v) => {
                out.extend(7u32.to_le_bytes());
                out.push(*v as u8);
            }
            Meta::Str(s) => {
                out.extend(8u32.to_le_bytes());
                put_string(&mut out, s);
            }
            Meta::Strs(items) => {
                out.extend(9u32.to_le_bytes());
                out.extend(8u32.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                for s in items {
                    put_string(&mut out, s);
                }
            }
            Meta::I32s(items) => {
                out.extend(9u32.to_le_bytes());
                out.extend(5u32.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                for v in items {
                    out.extend(v.to_le_bytes());
                }
            }
        }
    }
    let mut offset = 0u64;
    for (name, shape) in tensors {
        put_string(&mut out, name);
        out.extend((shape.len() as u32).to_le_bytes());
        for d in shape.iter().rev() {
            out.extend((*d as u64).to_le_bytes());
        }
        out.extend(0u32.to_le_bytes()); // F32
        out.extend(offset.to_le_bytes());
        let bytes = shape.iter().product::<usize>() as u64 * 4;
        offset += bytes.div_ceil(32) * 32;
    }
    out.resize(out.len().div_ceil(32) * 32, 0);
    for (i, (_, shape)) in tensors.iter().enumerate() {
        let n: usize = shape.iter().product();
        for j in 0..n {
            out.extend(((i * 1000 + j) as f32 * 0.001).to_le_bytes());
        }
        out.resize(out.len().div_ceil(32) * 32, 0);
    }
    out
}

/// A small but complete-looking Llama GGUF: config keys, a byte-level BPE tokenizer, a chat
/// template, and a few tensors (not all a model needs).
fn small_llama_gguf(architecture: &'static str) -> Vec<u8> {
    let tokens: Vec<String> = ["<|im_start|>", "<|im_end|>", "a", "b", "ab", "Ġ", "Ġa"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let metadata = [
        ("general.architecture", Meta::Str(architecture)),
        ("llama.block_count", Meta::U32(1)),
        ("llama.context_length", Meta::U32(64)),
        ("llama.embedding_length", Meta::U32(8)),
        ("llama.feed_forward_length", Meta::U32(16)),
        ("llama.attention.head_count", Meta::U32(2)),
        ("llama.attention.head_count_kv", Meta::U32(1)),
        ("llama.rope.freq_base", Meta::F32(10000.0)),
        ("llama.attention.layer_norm_rms_epsilon", Meta::F32(1e-5)),
        ("tokenizer.ggml.model", Meta::Str("gpt2")),
        ("tokenizer.ggml.pre", Meta::Str("smollm")),
        ("tokenizer.ggml.tokens", Meta::Strs(tokens)),
        ("tokenizer.ggml.token_type", Meta::I32s(vec![3, 3, 1, 1, 1, 1, 1])),
        (
            "tokenizer.ggml.merges",
            Meta::Strs(vec!["a b".into(), "Ġ a".into()]),
        ),
        ("tokenizer.ggml.bos_token_id", Meta::U32(0)),
        ("tokenizer.ggml.eos_token_id", Meta::U32(1)),
        ("tokenizer.ggml.add_bos_token", Meta::Bool(false)),
        (
            "tokenizer.chat_template",
            Meta::Str("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"),
        ),
    ];
    gguf_bytes(
        &metadata,
        &[
            ("token_embd.weight", vec![7, 8]),
            ("blk.0.attn_norm.weight", vec![8]),
            ("output_norm.weight", vec![8]),
        ],
    )
}

fn options() -> LoadOptions {
    LoadOptions {
        layers: None,
        format: Some(WeightFormat::F32),
    }
}

/// Everything the crate does with a GGUF before running it, on whatever `path` holds: each
/// step may fail, none may panic.
fn exercise_gguf(path: &Path) {
    let Ok(file) = GgufFile::open(path) else {
        return;
    };
    let names: Vec<String> = file.tensors.keys().cloned().collect();
    for name in names {
        let _ = file.read_tensor_bytes(&name);
    }
    let _ = ModelConfig::from_gguf(&file);
    if let Ok(tokenizer) = Tokenizer::from_gguf(&file) {
        let _ = tokenizer.encode("ab a<|im_end|>");
        let _ = tokenizer.apply_chat_template(&[ChatMessage::new("user", "a")], true);
    }
    let _ = load_shard(path, &options(), &mut |_, _| {});
}

#[test]
fn the_small_gguf_is_read_as_written() {
    let dir = temp_dir("bad-input-small");
    let path = dir.join("small.gguf");
    std::fs::write(&path, small_llama_gguf("llama")).unwrap();
    let file = GgufFile::open(&path).unwrap();
    assert_eq!(file.tensors.len(), 3);
    let (info, bytes) = file.read_tensor_bytes("blk.0.attn_norm.weight").unwrap();
    assert_eq!(info.shape, [8]);
    assert_eq!(f32::from_le_bytes(bytes[4..8].try_into().unwrap()), 1.001);
    let tokenizer = Tokenizer::from_gguf(&file).unwrap();
    assert_eq!(tokenizer.encode("ab a").unwrap(), [4, 6]);
    // It lacks most of a model's tensors: loading it names the first one missing.
    let err = load_shard(&path, &options(), &mut |_, _| {}).err().unwrap();
    assert!(matches!(err, InferenceError::MissingTensor(_)), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_gguf_of_an_unknown_architecture_is_refused() {
    let dir = temp_dir("bad-input-arch");
    let path = dir.join("mamba.gguf");
    std::fs::write(&path, small_llama_gguf("mamba")).unwrap();
    let err = Engine::load(&path, Some(WeightFormat::F32)).err().unwrap();
    assert!(
        matches!(err, InferenceError::UnsupportedArchitecture { ref name, .. } if name == "mamba"),
        "{err}"
    );
    // The list comes from the family registry (it once named three families of nine).
    let message = err.to_string();
    for family in inference::models::registry::FAMILIES {
        assert!(
            message.contains(family.0),
            "{} missing: {message}",
            family.0
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A GGUF of a family shoal runs only from safetensors (Qwen3.5-MoE's, as llama.cpp writes
/// it) is refused before any tensor is read, naming the family and the release to take.
#[test]
fn a_gguf_of_a_family_run_from_safetensors_only_says_which_release_to_take() {
    let dir = temp_dir("bad-input-hybrid-arch");
    let path = dir.join("qwen35moe.gguf");
    std::fs::write(&path, small_llama_gguf("qwen35moe")).unwrap();
    let err = Engine::load(&path, Some(WeightFormat::F32)).err().unwrap();
    let message = err.to_string();
    assert!(
        matches!(err, InferenceError::UnsupportedArchitecture { ref name, .. } if name == "qwen35moe"),
        "{message}"
    );
    assert!(message.contains("(`qwen3_5_moe`)"), "{message}");
    assert!(message.contains("safetensors release"), "{message}");
    std::fs::remove_dir_all(&dir).ok();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Random bytes changed anywhere in the file (header, metadata, tensor directory, data).
    #[test]
    fn a_mangled_gguf_never_panics(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
    ) {
        let mut bytes = small_llama_gguf("llama");
        for (at, value) in edits {
            let i = at.index(bytes.len());
            bytes[i] = value;
        }
        let dir = temp_dir("bad-input-mangled");
        let path = dir.join("m.gguf");
        std::fs::write(&path, &bytes).unwrap();
        exercise_gguf(&path);
        std::fs::remove_dir_all(&dir).ok();
    }

    /// The file cut anywhere: opening it fails with a GGUF error, or (cut inside tensor data)
    /// reading the cut tensor does.
    #[test]
    fn a_gguf_cut_anywhere_is_a_clear_error(cut in any::<prop::sample::Index>()) {
        let bytes = small_llama_gguf("llama");
        let cut = cut.index(bytes.len());
        let dir = temp_dir("bad-input-cut");
        let path = dir.join("cut.gguf");
        std::fs::write(&path, &bytes[..cut]).unwrap();
        match GgufFile::open(&path) {
            Err(err) => prop_assert!(matches!(err, formats::FormatError::BadGguf { .. }), "{}", err),
            Ok(file) => {
                let failed = file
                    .tensors
                    .keys()
                    .any(|name| file.read_tensor_bytes(name).is_err());
                prop_assert!(failed || cut == bytes.len(), "cut at {cut} of {} went unnoticed", bytes.len());
            }
        }
        exercise_gguf(&path);
        std::fs::remove_dir_all(&dir).ok();
    }
}

#[test]
fn a_vocab_only_gguf_is_not_a_model() {
    if reference::skip_without_reference() {
        return;
    }
    let path = reference::reference_dir().join("vocab/ggml-vocab-llama-bpe.gguf");
    let err = Engine::load(&path, Some(WeightFormat::F32)).err().unwrap();
    assert!(
        matches!(
            err,
            InferenceError::MissingTensor(_)
                | InferenceError::BadConfig(_)
                | InferenceError::BadModel { .. }
        ),
        "{err}"
    );
}

#[test]
fn corrupt_safetensors_are_a_clear_error() {
    let dir = temp_dir("bad-input-safetensors");
    write_tiny_model(&dir, "llama", 3, 64);
    let weights = dir.join("model.safetensors");
    let good = std::fs::read(&weights).unwrap();
    let header_len = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let mut huge_header = good.clone();
    huge_header[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    let mut bad_json = good.clone();
    bad_json[8] = b'!';
    let cases: [(&str, Vec<u8>); 5] = [
        ("empty", Vec::new()),
        ("not safetensors", b"hello, not weights".to_vec()),
        ("header length past the end", huge_header),
        ("header not JSON", bad_json),
        ("cut inside the header", good[..8 + header_len / 2].to_vec()),
    ];
    for (what, bytes) in cases {
        std::fs::write(&weights, &bytes).unwrap();
        let err = load_shard(&dir, &options(), &mut |_, _| {}).err();
        let err = err.unwrap_or_else(|| panic!("{what}: loaded"));
        assert!(
            matches!(err, InferenceError::BadModel { .. }),
            "{what}: {err}"
        );
        assert!(
            err.to_string().contains("model.safetensors"),
            "{what}: {err}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn text_and_chat_prompts_longer_than_the_context_are_refused() {
    let dir = temp_dir("bad-input-context");
    write_tiny_model(&dir, "llama", 4, 16);
    let engine = Engine::load(&dir, Some(WeightFormat::F32)).unwrap();
    // The tiny tokenizer reads words `w{i}`: 16 words fill the whole context.
    let text = vec!["w5"; 16].join(" ");
    let req = GenerateRequest::new(Prompt::Text(text), 4);
    let err = engine
        .generate(&req, |_| ControlFlow::Continue(()))
        .unwrap_err();
    assert!(
        matches!(
            err,
            InferenceError::PromptTooLong {
                prompt_tokens: 16,
                context_length: 16
            }
        ),
        "{err}"
    );
    // A megabyte of prompt is refused as quickly, not run.
    let huge = vec!["w7"; 200_000].join(" ");
    let started = std::time::Instant::now();
    let err = engine
        .generate(
            &GenerateRequest::new(Prompt::Chat(vec![ChatMessage::new("user", huge)]), 4),
            |_| ControlFlow::Continue(()),
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            InferenceError::PromptTooLong {
                context_length: 16,
                ..
            }
        ),
        "{err}"
    );
    eprintln!(
        "a 200,000-word chat prompt refused in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    std::fs::remove_dir_all(&dir).ok();
}
