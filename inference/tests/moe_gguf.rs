//! Mixture-of-Experts GGUF files as llama.cpp writes them (issue 46): tiny random-weight
//! Qwen3-MoE, GLM-4.5, gpt-oss (its MXFP4 experts too) and DeepSeek V3 (`deepseek2`) models
//! converted by llama.cpp's own `convert_hf_to_gguf.py` (f32) and quantized by
//! `llama-quantize` (Q8_0, Q4_K_M), with llama.cpp's logits on each file from libllama
//! (`cargo xtask setup`, see `xtask/src/moe_gguf.rs`). llama.cpp's reader defines the layout
//! (`blk.N.ffn_{gate,up,down}_exps` holding every expert, `ffn_gate_inp`, the `qwen3moe.expert_*`
//! keys) and its graph the logits shoal must give:
//!
//! - the f32 file, as one shard and as a 2-stage pipeline: every prompt position's logits
//!   within [`F32_TOLERANCE`] of llama.cpp's (its KV cache in f32 there), and the same greedy
//!   tokens through the cache;
//! - the quantized files run quantized (the experts repacked into MLX's affine layout, through
//!   the CPU kernel's gathered product, never expanded; gpt-oss's MXFP4 moved into MLX's
//!   mxfp4): within [`KERNEL_BOUND`] of the same file dequantized to f32, within
//!   [`F32_TOLERANCE`] of llama.cpp on the same weights expanded to f32 (with its greedy
//!   tokens), and within [`QUANTIZED_BOUND`] of llama.cpp's quantized run, which rounds each
//!   product's activations to 8 bits (Q8_0/Q8_K) where shoal keeps them in f32.

mod common;

use common::reference::{rows_of, worst};
use inference::loader::{load_shard, LoadOptions};
use inference::weights::FormatOnMlx;
use inference::weights::{Stacked, WeightFormat};
use inference::{ModelShard, ShardInput};
use std::ops::Range;
use std::path::{Path, PathBuf};

/// llama.cpp and shoal on the f32 file: the same f32 weights, summed in other orders.
const F32_TOLERANCE: f32 = 1e-3;
/// A quantized file run quantized against the same file dequantized to f32 (the same weight
/// values, exactly repacked; logits of order 10).
const KERNEL_BOUND: f32 = 1e-3;
/// A quantized file run by shoal against llama.cpp on it: llama.cpp rounds each product's
/// activations to 8 bits (Q8_0 for Q8_0 weights, Q8_K for K-quants), shoal keeps them in f32,
/// and on random weights a router's near tie then picks another expert. Twice the largest
/// measured (qwen3moe 0.49 Q8_0, 1.01 Q4_K_M; glm4moe 0.46, 0.83). The first greedy token is
/// llama.cpp's; later ones may part where llama.cpp's rounding flips a near tie (glm4moe
/// Q4_K_M at the third token), so only their agreement is printed.
const QUANTIZED_BOUND: f32 = 2.0;
/// [`QUANTIZED_BOUND`] for the DeepSeek V3 fixture, whose routes flip more under llama.cpp's
/// rounding (its latent attention's products are rounded too): llama.cpp's own Q8_0 logits
/// differ from its F32 ones by 11.0 at worst, its Q4_K_M by 17.8, and its Q4_K_M greedy
/// tokens from its own on the same weights expanded from the first one on, so that first
/// token is not asserted there (the expanded run's tokens are). Twice the largest measured
/// (11.0 Q8_0, 6.45 Q4_K_M).
const DEEPSEEK2_QUANTIZED_BOUND: f32 = 22.0;

struct Fixture {
    dir: PathBuf,
    json: serde_json::Value,
    /// llama.cpp's architecture (`qwen3moe`, `glm4moe`, `gpt-oss`, `deepseek2`): its entry
    /// in `reference.json`.
    arch: &'static str,
}

impl Fixture {
    fn read(arch: &'static str) -> Fixture {
        let dir = kit::dirs::moe_gguf_fixtures_dir();
        let path = dir.join("reference.json");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (run `cargo xtask setup`: it makes the MoE GGUF fixtures)",
                path.display()
            )
        });
        Fixture {
            dir,
            json: serde_json::from_str(&text).unwrap(),
            arch,
        }
    }

    fn ids(&self, v: &serde_json::Value) -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect()
    }

    fn prompt(&self) -> Vec<u32> {
        self.ids(&self.json["prompt"])
    }

    fn file(&self, label: &str) -> &serde_json::Value {
        &self.json["models"][self.arch]["files"][label]
    }

    fn gguf(&self, label: &str) -> PathBuf {
        self.dir.join(self.file(label)["gguf"].as_str().unwrap())
    }

    /// llama.cpp's logits on the prompt, one row per position.
    fn llama_logits(&self, label: &str, vocab: usize) -> Vec<Vec<f32>> {
        self.logits_at(label, "logits", vocab)
    }

    /// The logits file named by the entry's `key` (`logits`, `dequantized_logits`).
    fn logits_at(&self, label: &str, key: &str, vocab: usize) -> Vec<Vec<f32>> {
        let name = self.file(label)[key].as_str();
        let name =
            name.unwrap_or_else(|| panic!("no `{key}` for {label}: run `cargo xtask setup`"));
        let path = self.dir.join(name);
        let bytes = std::fs::read(&path).unwrap();
        let values: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert_eq!(
            values.len(),
            self.prompt().len() * vocab,
            "{}",
            path.display()
        );
        values.chunks(vocab).map(<[f32]>::to_vec).collect()
    }

    fn llama_greedy(&self, label: &str) -> Vec<u32> {
        self.ids(&self.file(label)["prompt_greedy"])
    }
}

fn load(path: &Path, layers: Option<Range<usize>>, format: WeightFormat) -> ModelShard {
    let options = LoadOptions {
        layers,
        format: Some(format),
    };
    load_shard(path, &options, &mut |_, _| {})
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .0
}

/// The prompt's logits through `stages` (a layer split, in order), then `steps` greedy tokens
/// through their caches.
fn run_stages(stages: &[ModelShard], prompt: &[u32], steps: usize) -> (Vec<Vec<f32>>, Vec<u32>) {
    let mut caches: Vec<_> = stages.iter().map(ModelShard::new_cache).collect();
    let mut pass = |tokens: &[u32]| -> Vec<Vec<f32>> {
        let mut input = ShardInput::Tokens(tokens);
        for (stage, cache) in stages.iter().zip(caches.iter_mut()) {
            input = ShardInput::Hidden(stage.forward(input, cache, false).unwrap());
        }
        match input {
            ShardInput::Hidden(logits) => rows_of(&logits),
            ShardInput::Tokens(_) => unreachable!("at least one stage"),
        }
    };
    let prefill = pass(prompt);
    let mut tokens = vec![common::argmax(prefill.last().unwrap())];
    while tokens.len() < steps {
        let row = pass(&[*tokens.last().unwrap()]).remove(0);
        tokens.push(common::argmax(&row));
    }
    (prefill, tokens)
}

/// The f32 file of `arch` against llama.cpp, whole and as 2 stages; its experts' numbers.
fn f32_file_matches_llama_cpp(arch: &'static str, experts: (usize, usize, usize)) {
    let fixture = Fixture::read(arch);
    let path = fixture.gguf("F32");
    let whole = load(&path, None, WeightFormat::F32);
    let config = whole.config.clone();
    let moe = config.moe.as_ref().expect("an MoE has experts");
    assert_eq!(
        (moe.num_experts, moe.experts_per_token, moe.expert_width),
        experts,
        "the {arch}.expert_* keys"
    );
    let prompt = fixture.prompt();
    let want = fixture.llama_logits("F32", config.vocab_size);
    let greedy = fixture.llama_greedy("F32");
    let spread = want[0].iter().fold(f32::MIN, |m, &x| m.max(x))
        - want[0].iter().fold(f32::MAX, |m, &x| m.min(x));
    assert!(spread > 1.0, "llama.cpp's logits spread only {spread}");

    let (logits, tokens) = run_stages(std::slice::from_ref(&whole), &prompt, greedy.len());
    let diff = worst(&want, &logits);
    println!("{arch} F32 one shard: max |shoal - llama.cpp| = {diff:.2e}, greedy {tokens:?}");
    assert!(
        diff < F32_TOLERANCE,
        "one shard differs from llama.cpp by {diff}"
    );
    assert_eq!(tokens, greedy, "greedy tokens through the cache");
    drop(whole);

    let layers = config.num_layers;
    let stages: Vec<ModelShard> = [0..2, 2..layers]
        .into_iter()
        .map(|r| load(&path, Some(r), WeightFormat::F32))
        .collect();
    let (logits, tokens) = run_stages(&stages, &prompt, greedy.len());
    let diff = worst(&want, &logits);
    println!("{arch} F32 stages [0, 2, {layers}]: {diff:.2e}");
    assert!(diff < F32_TOLERANCE, "the 2-stage split differs by {diff}");
    assert_eq!(tokens, greedy);
}

#[test]
fn the_f32_qwen3moe_gguf_gives_llama_cpps_logits_whole_and_split() {
    f32_file_matches_llama_cpp("qwen3moe", (8, 2, 256));
}

/// GLM-4.5's layout: a dense first layer, sigmoid routing with `exp_probs_b`, the shared expert
/// (`ffn_*_shexp`), Q/K/V biases, RoPE on half of each head, `post_attention_norm`.
#[test]
fn the_f32_glm4moe_gguf_gives_llama_cpps_logits_whole_and_split() {
    f32_file_matches_llama_cpp("glm4moe", (8, 2, 256));
}

/// gpt-oss's layout: attention sinks (`attn_sinks`), biases on Q/K/V/O, the router and every
/// expert projection, YaRN, every other layer sliding (a window of 4 inside the 12-token
/// prompt); its experts here as the converter's float path writes them.
#[test]
fn the_f32_gpt_oss_gguf_gives_llama_cpps_logits_whole_and_split() {
    f32_file_matches_llama_cpp("gpt-oss", (8, 2, 256));
}

/// DeepSeek V3's layout (llama.cpp's `deepseek2`): latent attention (`attn_q_a`, `attn_q_b`,
/// `attn_kv_a_mqa` and the converter's per-head split `attn_k_b` / `attn_v_b`), V3's YaRN
/// (`yarn_log_multiplier`), a dense first layer, sigmoid routing with `exp_probs_b`, the shared
/// expert, the routed weights normalized and scaled.
#[test]
fn the_f32_deepseek2_gguf_gives_llama_cpps_logits_whole_and_split() {
    f32_file_matches_llama_cpp("deepseek2", (8, 2, 256));
}

#[test]
fn quantized_deepseek2_ggufs_run_quantized_near_llama_cpp() {
    quantized_files_near_llama_cpp("deepseek2", DEEPSEEK2_QUANTIZED_BOUND, false);
}

/// The converter's MXFP4 path on the same weights: the experts stay MXFP4, moved into MLX's
/// own `mxfp4` layout (codes and exponents as stored) and run through the gathered product.
/// Against the same file expanded to f32 within [`KERNEL_BOUND`]; against llama.cpp's logits
/// on the F32 file (the same weight values: the MXFP4 codes are exact in f32) within
/// [`F32_TOLERANCE`], with its greedy tokens. llama.cpp on the MXFP4 file rounds the experts'
/// inputs to Q8_0 (its MXFP4 product's partner type), so there only the first token is
/// asserted and the distance printed.
#[test]
fn the_mxfp4_gpt_oss_gguf_runs_mxfp4_and_matches_llama_cpp() {
    inference::cpu_kernels::round_x_to_int8(false);
    let fixture = Fixture::read("gpt-oss");
    let prompt = fixture.prompt();
    let path = fixture.gguf("MXFP4");
    let opened = inference::loader::open_model(&path).unwrap();
    let q = opened
        .config
        .quantization
        .as_ref()
        .expect("MXFP4 experts are quantized");
    assert_eq!(q.mode, inference::quantized::QuantMode::Mxfp4, "{q:?}");
    assert!(opened.config.sliding_window.is_some(), "gpt-oss slides");
    if std::env::var_os(WeightFormat::ENV).is_none() {
        assert_eq!(
            WeightFormat::preferred(&opened.config),
            WeightFormat::Quantized
        );
    }
    let mut source = opened.source;
    for proj in ["gate_proj", "up_proj", "down_proj"] {
        let name = format!("model.layers.1.mlp.experts.{proj}");
        let stacked = source.stacked(&name, WeightFormat::Quantized).unwrap();
        let Some(Stacked::Quantized(m)) = stacked else {
            panic!("{proj}: the MXFP4 experts were expanded to floats");
        };
        assert_eq!(m.spec.mode, inference::quantized::QuantMode::Mxfp4);
        assert_eq!((m.spec.bits, m.spec.group_size), (4, 32));
        assert_eq!(
            m.packed.shape(),
            [8, 256, 32],
            "{proj}: 4-bit codes in u32 words"
        );
        assert_eq!(m.scales.shape(), [8, 256, 8], "{proj}: one exponent per 32");
        assert!(m.biases.is_none(), "mxfp4 has no biases");
    }
    drop(source);
    let quantized = load(&path, None, WeightFormat::Quantized);
    let vocab = quantized.config.vocab_size;
    let greedy = fixture.llama_greedy("F32");
    let (logits, tokens) = run_stages(std::slice::from_ref(&quantized), &prompt, greedy.len());
    let expanded = load(&path, None, WeightFormat::F32);
    let (f32_logits, _) = run_stages(std::slice::from_ref(&expanded), &prompt, 1);
    let kernel = worst(&f32_logits, &logits);
    let same_weights = worst(&fixture.llama_logits("F32", vocab), &logits);
    let own = worst(&fixture.llama_logits("MXFP4", vocab), &logits);
    println!(
        "gpt-oss MXFP4: mxfp4 vs expanded {kernel:.2e}; vs llama.cpp on the F32 file \
         {same_weights:.2e}, on the MXFP4 file {own:.2e}; greedy {tokens:?}, llama.cpp's {:?}",
        fixture.llama_greedy("MXFP4")
    );
    assert!(kernel < KERNEL_BOUND, "mxfp4 vs expanded {kernel}");
    assert!(
        kernel > 0.0,
        "the mxfp4 path ran (expanded would be identical)"
    );
    assert!(
        same_weights < F32_TOLERANCE,
        "vs llama.cpp on the same weights {same_weights}"
    );
    assert_eq!(tokens, greedy, "greedy tokens through the cache");
    assert_eq!(tokens[0], fixture.llama_greedy("MXFP4")[0]);
}

/// The Q8_0 and Q4_K_M files of `arch` run quantized: against the same files as f32, against
/// llama.cpp on the same weights expanded to f32 (`llama-quantize ... F32`: within
/// [`F32_TOLERANCE`], the same greedy tokens), and within `bound` of llama.cpp's own quantized
/// run (whose first greedy token it must share when `first_token` says so).
fn quantized_files_near_llama_cpp(arch: &'static str, bound: f32, first_token: bool) {
    // x kept in f32 in the kernel's products (the int8 decode path is bounded elsewhere).
    inference::cpu_kernels::round_x_to_int8(false);
    let fixture = Fixture::read(arch);
    let prompt = fixture.prompt();
    for label in ["Q8_0", "Q4_K_M"] {
        let path = fixture.gguf(label);
        let mut opened = inference::loader::open_model(&path).unwrap();
        let moe_layer = opened.config.moe.as_ref().map_or(0, |m| m.first_dense);
        assert!(opened.config.quantization.is_some(), "{label} is quantized");
        // The experts stay in their stored bits: one [experts, out, words] tensor per
        // projection, repacked, not expanded (Q4_K_M stores the gate experts as Q4_K).
        let gate = opened
            .source
            .stacked(
                &format!("model.layers.{moe_layer}.mlp.switch_mlp.gate_proj"),
                WeightFormat::Quantized,
            )
            .unwrap()
            .expect("the experts are stacked");
        let Stacked::Quantized(q) = gate else {
            panic!("{label}: the experts were expanded to floats");
        };
        let bits = if label == "Q8_0" { 8 } else { 4 };
        assert_eq!(q.spec.bits, bits, "{label}: {:?}", q.spec);
        assert_eq!(q.packed.shape(), [8, 256, 256 * bits / 32], "{label}");
        if std::env::var_os(WeightFormat::ENV).is_none() {
            assert_eq!(
                WeightFormat::preferred(&opened.config),
                WeightFormat::Quantized,
                "{label}: an MoE file stays quantized by default"
            );
        }
        drop(opened);
        let quantized = load(&path, None, WeightFormat::Quantized);
        let vocab = quantized.config.vocab_size;
        let (logits, tokens) = run_stages(std::slice::from_ref(&quantized), &prompt, 6);
        let dequantized = load(&path, None, WeightFormat::F32);
        let (f32_logits, _) = run_stages(std::slice::from_ref(&dequantized), &prompt, 1);
        let kernel = worst(&f32_logits, &logits);
        let want = fixture.llama_logits(label, vocab);
        let llama = worst(&want, &logits);
        let expanded = worst(
            &fixture.logits_at(label, "dequantized_logits", vocab),
            &logits,
        );
        let expanded_greedy = fixture.ids(&fixture.file(label)["dequantized_greedy"]);
        println!(
            "{arch} {label}: quantized vs dequantized {kernel:.2e}, vs llama.cpp on the \
             expanded weights {expanded:.2e}, vs llama.cpp quantized {llama:.2e}; greedy \
             {tokens:?}, llama.cpp's {:?} (expanded {expanded_greedy:?})",
            fixture.llama_greedy(label)
        );
        assert!(
            expanded < F32_TOLERANCE,
            "{label}: vs llama.cpp on the same weights {expanded}"
        );
        assert_eq!(
            tokens, expanded_greedy,
            "{label}: llama.cpp's on the same weights"
        );
        assert!(kernel < KERNEL_BOUND, "{label}: kernel vs f32 {kernel}");
        assert!(
            kernel > 0.0,
            "{label}: the quantized path ran (f32 would be identical)"
        );
        assert!(llama < bound, "{label}: vs llama.cpp {llama}");
        if first_token {
            let llama_greedy = fixture.llama_greedy(label);
            assert_eq!(
                tokens[0], llama_greedy[0],
                "{label}: the first greedy token"
            );
        }
    }
}

#[test]
fn quantized_qwen3moe_ggufs_run_quantized_near_llama_cpp() {
    quantized_files_near_llama_cpp("qwen3moe", QUANTIZED_BOUND, true);
}

#[test]
fn quantized_glm4moe_ggufs_run_quantized_near_llama_cpp() {
    quantized_files_near_llama_cpp("glm4moe", QUANTIZED_BOUND, true);
}
