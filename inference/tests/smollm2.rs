//! The real SmolLM2-135M-Instruct fixture (Q4_1 GGUF, from `cargo xtask setup`): greedy
//! answers, first-step logits against an independent pure-Rust reference, tokenizer and chat
//! template against reference outputs, and a truncated copy of the file.

use formats::gguf::GgufFile;
use inference::quant::dequantize;
use inference::{ChatMessage, Engine, GenerateRequest, InferenceError, Prompt, WeightFormat};
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, OnceLock};

fn fixture() -> PathBuf {
    let p = kit::dirs::default_model_path();
    assert!(
        p.exists(),
        "{} is missing: run `cargo xtask setup`",
        p.display()
    );
    p
}

/// The f32 engine, loaded once; MLX arrays are not `Sync`, so tests take turns.
fn engine() -> MutexGuard<'static, Engine> {
    static ENGINE: OnceLock<Mutex<Engine>> = OnceLock::new();
    ENGINE
        .get_or_init(|| Mutex::new(Engine::load(fixture(), Some(WeightFormat::F32)).unwrap()))
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

fn capital_question() -> Prompt {
    Prompt::Chat(vec![ChatMessage::new(
        "user",
        "What is the capital of France?",
    )])
}

/// Reference rendering by Python's jinja2 (trim_blocks, lstrip_blocks), as transformers does.
const SMOL_RENDER_DEFAULT_SYSTEM: &str = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";
const SMOL_RENDER_CONVERSATION: &str = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n";

#[test]
fn chat_template_renders_like_jinja2() {
    let e = engine();
    let t = &e.tokenizer;
    let one = t
        .apply_chat_template(
            &[ChatMessage::new("user", "What is the capital of France?")],
            true,
        )
        .unwrap();
    assert_eq!(one, SMOL_RENDER_DEFAULT_SYSTEM);
    let conv = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Hi"),
        ChatMessage::new("assistant", "Hello!"),
        ChatMessage::new("user", "Bye"),
    ];
    assert_eq!(
        t.apply_chat_template(&conv, false).unwrap(),
        SMOL_RENDER_CONVERSATION
    );
}

#[test]
fn tokenizer_round_trips_and_knows_its_special_tokens() {
    let e = engine();
    let t = &e.tokenizer;
    assert_eq!(t.vocab_size(), 49152);
    assert_eq!(t.bos_token_id, Some(1));
    assert!(t.eos_token_ids.contains(&2));
    assert_eq!(t.encode("<|im_start|>user\n").unwrap()[0], 1);
    assert_eq!(t.encode("<|im_end|>").unwrap(), vec![2]);
    // SmolLM2's pre-tokenizer splits digits one by one.
    let digits = t.encode("2024").unwrap();
    assert_eq!(digits.len(), 4);
    assert_eq!(t.decode(&digits[..1], false).unwrap(), "2");
    // A common word is one token, with its leading space.
    assert_eq!(t.encode(" Paris").unwrap().len(), 1);
    for text in [
        "Hello, world!",
        "  leading spaces and trailing  ",
        "Ünïcödé — 東京 🚀 emoji",
        "code: fn main() { println!(\"{}\", 42); }",
        "line one\nline two\r\n\ttabbed",
    ] {
        let ids = t.encode(text).unwrap();
        assert_eq!(t.decode(&ids, false).unwrap(), text, "{ids:?}");
    }
}

#[test]
fn greedy_answer_names_paris() {
    let e = engine();
    let mut streamed = String::new();
    let c = e
        .generate(&GenerateRequest::new(capital_question(), 24), |ev| {
            streamed.push_str(ev.text);
            ControlFlow::Continue(())
        })
        .unwrap();
    assert!(c.text.contains("Paris"), "answer: {:?}", c.text);
    assert_eq!(streamed, c.text);
    assert!(c.prompt_tokens > 20);
}

#[test]
fn streaming_never_splits_a_character() {
    // Emoji take several byte-level tokens; every streamed piece must be valid on its own.
    let e = engine();
    let ids = e.tokenizer.encode("🚀🚀 東京").unwrap();
    let mut dec = text::detokenizer::StreamDecoder::new();
    let mut out = String::new();
    for &id in &ids {
        let piece = dec.push(&e.tokenizer, id).unwrap();
        assert!(!piece.contains('\u{FFFD}'), "{piece:?}");
        out.push_str(&piece);
    }
    out.push_str(&dec.finish(&e.tokenizer).unwrap());
    assert_eq!(out, "🚀🚀 東京");
    assert!(ids.len() > 4);
}

#[test]
fn quantized_representation_gives_the_same_answer() {
    let q = Engine::load(fixture(), Some(WeightFormat::Quantized)).unwrap();
    let c = q
        .generate(
            &GenerateRequest::new(Prompt::Text("The capital of France is".into()), 3),
            |_| ControlFlow::Continue(()),
        )
        .unwrap();
    assert!(c.text.contains("Paris"), "{:?}", c.text);
}

#[test]
fn a_truncated_gguf_is_a_clear_error() {
    let src = fixture();
    let bytes = std::fs::read(&src).unwrap();
    let dir = std::env::temp_dir().join(format!("shoal-truncated-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for cut in [100usize, 2_000_000, bytes.len() - 1000] {
        let p = dir.join("cut.gguf");
        std::fs::write(&p, &bytes[..cut]).unwrap();
        let err = Engine::load(&p, Some(WeightFormat::F32)).err().unwrap();
        assert!(
            matches!(err, InferenceError::BadGguf { .. }),
            "cut at {cut}: {err}"
        );
        assert!(err.to_string().contains("truncated"), "cut at {cut}: {err}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// An independent f32 forward pass written with plain loops: it reads the GGUF tensors as
/// stored (Q and K rows still in GGML's interleaved order) and uses GGML's interleaved RoPE,
/// so it shares neither the un-permutation nor any MLX kernel with the model under test.
struct Reference {
    file: GgufFile,
}

impl Reference {
    fn tensor(&self, name: &str) -> (Vec<usize>, Vec<f32>) {
        let (info, bytes) = self.file.read_tensor_bytes(name).unwrap();
        (
            info.shape.clone(),
            dequantize(info.ggml_type.unwrap(), &bytes),
        )
    }

    fn matvec(w: &[f32], cols: usize, x: &[f32]) -> Vec<f32> {
        w.chunks_exact(cols)
            .map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum())
            .collect()
    }

    fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
        let ms: f32 = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
        let r = 1.0 / (ms + eps).sqrt();
        x.iter().zip(w).map(|(v, g)| v * r * g).collect()
    }

    fn rope_interleaved(v: &mut [f32], head_dim: usize, pos: usize, theta: f32) {
        for head in v.chunks_exact_mut(head_dim) {
            for j in 0..head_dim / 2 {
                let angle = pos as f32 / theta.powf(2.0 * j as f32 / head_dim as f32);
                let (s, c) = angle.sin_cos();
                let (a, b) = (head[2 * j], head[2 * j + 1]);
                head[2 * j] = a * c - b * s;
                head[2 * j + 1] = a * s + b * c;
            }
        }
    }

    fn last_logits(&self, tokens: &[u32]) -> Vec<f32> {
        let (d, nh, nkv, hd, layers, eps, theta) = (576, 9, 3, 64, 30, 1e-5f32, 100000.0f32);
        let (_, embd) = self.tensor("token_embd.weight");
        let mut xs: Vec<Vec<f32>> = tokens
            .iter()
            .map(|&t| embd[t as usize * d..(t as usize + 1) * d].to_vec())
            .collect();
        for l in 0..layers {
            let t = |n: &str| self.tensor(&format!("blk.{l}.{n}.weight")).1;
            let (wq, wk, wv, wo) = (t("attn_q"), t("attn_k"), t("attn_v"), t("attn_output"));
            let (wg, wu, wd) = (t("ffn_gate"), t("ffn_up"), t("ffn_down"));
            let (an, fnorm) = (t("attn_norm"), t("ffn_norm"));
            let mut ks = Vec::new();
            let mut vs = Vec::new();
            let mut qs = Vec::new();
            for (pos, x) in xs.iter().enumerate() {
                let xn = Self::rms_norm(x, &an, eps);
                let mut q = Self::matvec(&wq, d, &xn);
                let mut k = Self::matvec(&wk, d, &xn);
                Self::rope_interleaved(&mut q, hd, pos, theta);
                Self::rope_interleaved(&mut k, hd, pos, theta);
                qs.push(q);
                ks.push(k);
                vs.push(Self::matvec(&wv, d, &xn));
            }
            for (pos, x) in xs.iter_mut().enumerate() {
                let mut attn = vec![0f32; nh * hd];
                for h in 0..nh {
                    let kvh = h / (nh / nkv);
                    let q = &qs[pos][h * hd..(h + 1) * hd];
                    let scores: Vec<f32> = (0..=pos)
                        .map(|p| {
                            q.iter()
                                .zip(&ks[p][kvh * hd..(kvh + 1) * hd])
                                .map(|(a, b)| a * b)
                                .sum::<f32>()
                                / (hd as f32).sqrt()
                        })
                        .collect();
                    let m = scores.iter().cloned().fold(f32::MIN, f32::max);
                    let e: Vec<f32> = scores.iter().map(|s| (s - m).exp()).collect();
                    let z: f32 = e.iter().sum();
                    for (p, w) in e.iter().enumerate() {
                        for i in 0..hd {
                            attn[h * hd + i] += w / z * vs[p][kvh * hd + i];
                        }
                    }
                }
                let o = Self::matvec(&wo, nh * hd, &attn);
                x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
                let xn = Self::rms_norm(x, &fnorm, eps);
                let g = Self::matvec(&wg, d, &xn);
                let u = Self::matvec(&wu, d, &xn);
                let hmid: Vec<f32> = g
                    .iter()
                    .zip(&u)
                    .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                    .collect();
                let down = Self::matvec(&wd, 1536, &hmid);
                x.iter_mut().zip(&down).for_each(|(a, b)| *a += b);
            }
        }
        let (_, on) = self.tensor("output_norm.weight");
        let xn = Self::rms_norm(xs.last().unwrap(), &on, eps);
        Self::matvec(&embd, d, &xn)
    }
}

#[test]
fn first_step_logits_match_an_independent_reference() {
    let ids = engine().prompt_ids(&capital_question()).unwrap();
    let reference = Reference {
        file: GgufFile::open(fixture()).unwrap(),
    }
    .last_logits(&ids);
    let e = engine();
    let mut cache = e.model.new_cache();
    let logits = e
        .model
        .forward(inference::ShardInput::Tokens(&ids), &mut cache, true)
        .unwrap();
    let got = inference::sequence_forward::last_logits_to_host(&logits).unwrap();
    assert_eq!(got.len(), reference.len());
    let diff = got
        .iter()
        .zip(&reference)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    // Both are f32 over the same dequantized weights; only summation order differs.
    // Logits are of order 25; measured difference about 7e-5, tolerance 1e-3 (4e-5 relative).
    assert!(diff < 1e-3, "max |logit difference| = {diff}");
    let top = text::sampling::argmax(&reference);
    assert_eq!(text::sampling::argmax(&got), top);
    eprintln!(
        "max |logit difference| vs reference: {diff}; top token {top} ({:?}) logit {}",
        e.tokenizer.id_to_token(top as u32),
        reference[top]
    );
}

#[test]
fn the_same_model_as_a_hugging_face_folder_gives_the_same_logits() {
    let dir = std::env::temp_dir().join(format!("shoal-smollm2-hf-{}", std::process::id()));
    inference::export::export_hf_folder(&fixture(), &dir, mlx_rs::Dtype::Float32).unwrap();
    let hf = Engine::load(&dir, Some(WeightFormat::F32)).unwrap();
    let e = engine();
    let prompt = capital_question();
    let ids = e.prompt_ids(&prompt).unwrap();
    assert_eq!(
        hf.prompt_ids(&prompt).unwrap(),
        ids,
        "tokenizer.json + chat template from the folder"
    );
    let run = |m: &Engine| {
        let mut cache = m.model.new_cache();
        inference::sequence_forward::last_logits_to_host(
            &m.model
                .forward(inference::ShardInput::Tokens(&ids), &mut cache, true)
                .unwrap(),
        )
        .unwrap()
    };
    let (a, b) = (run(&e), run(&hf));
    let diff = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max);
    assert!(diff < 1e-4, "GGUF vs safetensors logits differ by {diff}");
    std::fs::remove_dir_all(&dir).ok();
}
