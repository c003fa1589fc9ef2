//! Tensor parallelism through the real MLX ring: 2 and 3 processes, each in its own network
//! namespace (on loopback when not root), each holding a slice of every layer's heads and MLP
//! units, give the logits of one process holding it all.
//!
//! Each test re-runs this binary as one child process per rank (the ignored
//! `tensor_parallel_child`, run with `--ignored` and `SHOAL_TP_CHILD` set, does the work).
//! Every rank compares its (all-summed) logits with the whole model's over a prefill and
//! greedy decode steps. The batched tests run several sequences at
//! once through `TensorStage` and `RingBatch` (each step's plan travels with it) and compare
//! each with the whole model running it alone (the same child, its spec saying `batched`).

mod common;

use common::reference::{rows_of, worst, Reference};
use common::{
    argmax, host, hosts_field, max_abs_diff, parse_hosts_field, run_ranks, smollm2, temp_dir,
    write_tiny_model, RankNet,
};
use inference::loader::{load_shard, LoadOptions};
use inference::ring::{RingConfig, RingGroup};
use inference::stage::Stage;
use inference::tensor_stage::TensorStage;
use inference::ShardInput;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

const CHILD_ENV: &str = "SHOAL_TP_CHILD";
/// Partial sums are added in a different order than one matmul adds them: rounding differs.
const TOLERANCE: f32 = 1e-3;
const DECODE_STEPS: usize = 3;

/// One rank's process, not a test of its own: ignored in a plain run (so it is never counted
/// as passing), run by its parent test with `--ignored --exact` and its spec in `CHILD_ENV`.
#[test]
#[ignore = "one rank's process: its parent test runs it"]
fn tensor_parallel_child() {
    // The ranks' logits are compared with one process's to float rounding: x stays f32 (the
    // int8 x of decode-sized CPU products turns a float-order difference into a different
    // rounding step, up to its bound: see `inference::cpu_kernels`).
    inference::cpu_kernels::round_x_to_int8(false);
    let spec = std::env::var(CHILD_ENV).unwrap_or_else(|_| {
        panic!("a rank's process: run only by its parent test, with {CHILD_ENV} set")
    });
    // model|rank|hosts (JSON)|prompt "1,2,3"|single or batched|weight format
    // [|tolerance against mlx-lm's logits: `single` on a family fixture checks them too]
    let parts: Vec<&str> = spec.split('|').collect();
    let model = PathBuf::from(parts[0]);
    let rank: usize = parts[1].parse().unwrap();
    let hosts = parse_hosts_field(parts[2]);
    let prompt: Vec<u32> = parts[3].split(',').map(|t| t.parse().unwrap()).collect();
    let options = LoadOptions {
        layers: None,
        format: Some(parts[5].parse().unwrap()),
    };

    let (whole, _) = load_shard(&model, &options, &mut |_, _| {}).unwrap();
    let (mine, _) = load_shard(&model, &options, &mut |_, _| {}).unwrap();
    let config = RingConfig { rank, hosts };
    let dir = std::env::temp_dir().join(format!("shoal-tp-{}", std::process::id()));
    let group = Arc::new(RingGroup::join(&config, &dir, Duration::from_secs(60)).unwrap());
    let sliced = mine.into_tensor_parallel(group.clone()).unwrap();
    if parts[4] == "batched" {
        // Rank 0 drives the batched scenario through `RingBatch`; the others serve.
        let mut stage = TensorStage::new(sliced, group).unwrap();
        if rank > 0 {
            let steps = stage.serve().unwrap();
            println!("RANK {rank} SERVED {steps}");
            return;
        }
        common::batched::drive(&mut stage, &whole, &prompt, DECODE_STEPS, TOLERANCE);
        return;
    }

    let (mut whole_cache, mut cache) = (whole.new_cache(), sliced.new_cache());
    let mut tokens = prompt;
    let mut worst = 0.0f32;
    let mut generated = Vec::new();
    for step in 0..=DECODE_STEPS {
        let want = host(
            &whole
                .forward(ShardInput::Tokens(&tokens), &mut whole_cache, true)
                .unwrap(),
        );
        let got = host(
            &sliced
                .forward(ShardInput::Tokens(&tokens), &mut cache, true)
                .unwrap(),
        );
        let diff = max_abs_diff(&want, &got);
        assert!(
            diff < TOLERANCE,
            "rank {rank} step {step}: logits differ by {diff}"
        );
        worst = worst.max(diff);
        let next = argmax(&got);
        assert_eq!(
            next,
            argmax(&want),
            "rank {rank} step {step}: greedy tokens differ"
        );
        generated.push(next);
        tokens = vec![next];
    }
    if let Some(tolerance) = parts.get(6) {
        let (prefill, decode) = against_mlx_lm(&sliced, &model, tolerance.parse().unwrap());
        println!("RANK {rank} mlx-lm max_diff prefill={prefill:e} decode={decode:e}");
    }
    println!("RANK {rank} OK max_diff={worst:e} tokens={generated:?}");
}

/// Runs mlx-lm's prompt of fixture folder `model` through the tensor-parallel `sliced` model
/// (every position's logits), then its greedy tokens one at a time on the cache, and checks
/// both against mlx-lm's logits within `tolerance`; returns the worst differences.
fn against_mlx_lm(
    sliced: &inference::ModelShard,
    model: &std::path::Path,
    tolerance: f32,
) -> (f32, f32) {
    let reference = Reference::read(model);
    let mut cache = sliced.new_cache();
    let mut pass = |tokens: &[u32]| {
        rows_of(
            &sliced
                .forward(ShardInput::Tokens(tokens), &mut cache, false)
                .unwrap(),
        )
    };
    let prefill = pass(&reference.prompt);
    let decode: Vec<Vec<f32>> = reference
        .decode_tokens
        .iter()
        .map(|&t| pass(&[t]).remove(0))
        .collect();
    let (p, d) = (
        worst(&reference.prefill, &prefill),
        worst(&reference.decode, &decode),
    );
    assert!(p < tolerance, "prefill logits differ from mlx-lm's by {p}");
    assert!(d < tolerance, "decode logits differ from mlx-lm's by {d}");
    (p, d)
}

/// Runs `size` ranks (`single`: every rank checks one sequence; `batched`: rank 0 runs the
/// batched scenario) and checks what they report.
fn run_tensor_parallel(model: &std::path::Path, size: usize, prompt: &str, slot: u16, mode: &str) {
    run_tensor_parallel_as(model, size, prompt, slot, mode, "f32");
}

/// [`run_tensor_parallel`] with the weights in `format` (`f32`, `quantized`).
fn run_tensor_parallel_as(
    model: &std::path::Path,
    size: usize,
    prompt: &str,
    slot: u16,
    mode: &str,
    format: &str,
) {
    run_ranks_with(model, size, prompt, slot, &format!("{mode}|{format}"));
}

/// Two ranks of fixture `family`/`layout` (`hf`: f32; else quantized) in ring slot `slot`:
/// the whole model against its slices over a prompt and greedy steps, then mlx-lm's prompt and
/// tokens against mlx-lm's logits (f32 within 1e-4, quantized within 1e-3).
fn family_ring_matches_mlx_lm(family: &str, layout: &str, slot: u16) {
    let dir = kit::dirs::family_fixture_dir(family, layout);
    let (format, tolerance) = if layout == "hf" {
        ("f32", 1e-4)
    } else {
        ("quantized", 1e-3)
    };
    run_ranks_with(
        &dir,
        2,
        "3,17,42,5,88",
        slot,
        &format!("single|{format}|{tolerance}"),
    );
}

/// Runs `size` ranks with `tail` (`mode|format[|tolerance]`) ending their specs.
fn run_ranks_with(model: &std::path::Path, size: usize, prompt: &str, slot: u16, tail: &str) {
    let mode = tail.split('|').next().unwrap_or_default();
    let base = 46000 + (std::process::id() % 300) as u16 * 40 + slot * 8;
    // Two digits: a tag must not begin another's (creating namespaces removes those whose
    // names begin with the tag, so `tp1` would remove `tp17`'s while it runs).
    let net = RankNet::new(&format!("tp{slot:02}"), size, base);
    let specs: Vec<String> = (0..size)
        .map(|rank| {
            let hosts = hosts_field(&net.hosts(rank));
            format!("{}|{rank}|{hosts}|{prompt}|{tail}", model.display())
        })
        .collect();
    let place = if net.in_namespaces() {
        "namespaces"
    } else {
        "loopback"
    };
    if mode == "batched" {
        let outputs = run_ranks(&net, "tensor_parallel_child", CHILD_ENV, &specs, "");
        let report = common::batched::check_served(&outputs);
        eprintln!("{size} ranks ({place}): {report}");
        return;
    }
    for stdout in run_ranks(&net, "tensor_parallel_child", CHILD_ENV, &specs, "OK") {
        for line in stdout
            .lines()
            .filter(|l| l.contains("OK max_diff") || l.contains("mlx-lm max_diff"))
        {
            eprintln!("{size} ranks ({place}): {line}");
        }
    }
}

#[test]
fn tiny_llama_two_ranks_match_one_node() {
    let dir = temp_dir("tp-llama");
    write_tiny_model(&dir, "llama", 11, 64);
    run_tensor_parallel(&dir, 2, "3,17,42,5,88", 0, "single");
}

#[test]
fn tiny_qwen3_two_ranks_match_one_node() {
    let dir = temp_dir("tp-qwen3");
    write_tiny_model(&dir, "qwen3", 12, 64);
    run_tensor_parallel(&dir, 2, "3,17,42,5,88", 1, "single");
}

/// SmolLM2 has 9 query and 3 key/value heads: 3 ranks divide both (2 would not).
#[test]
fn smollm2_three_ranks_match_one_node() {
    run_tensor_parallel(&smollm2(), 3, common::SMOLLM2_PROMPT, 2, "single");
}

#[test]
fn tiny_llama_two_ranks_batch_like_one_node_alone() {
    let dir = temp_dir("tp-batch-llama");
    write_tiny_model(&dir, "llama", 13, 64);
    run_tensor_parallel(&dir, 2, "3,17,42,5,88,7", 3, "batched");
}

#[test]
fn smollm2_three_ranks_batch_like_one_node_alone() {
    run_tensor_parallel(&smollm2(), 3, common::SMOLLM2_PROMPT, 4, "batched");
}

/// The qwen3_moe fixture (made by mlx-lm, see `tests/families.rs`) as `mlx_lm.convert` wrote
/// it at 4 bits (routers at 8): every rank keeps every expert at half its width, still packed,
/// sliced at the quantization groups; the router stays whole.
fn qwen3_moe_4bit() -> PathBuf {
    family_4bit("qwen3_moe")
}

/// The 4-bit fixture of `family`; setup must have made it.
fn family_4bit(family: &str) -> PathBuf {
    let dir = kit::dirs::family_fixture_dir(family, "q4");
    assert!(
        dir.join("config.json").exists(),
        "{} is missing: run `cargo xtask setup`",
        dir.display()
    );
    dir
}

#[test]
fn quantized_moe_two_ranks_match_one_node() {
    run_tensor_parallel_as(
        &qwen3_moe_4bit(),
        2,
        "3,17,42,5,88",
        5,
        "single",
        "quantized",
    );
}

#[test]
fn quantized_moe_two_ranks_batch_like_one_node_alone() {
    run_tensor_parallel_as(
        &qwen3_moe_4bit(),
        2,
        "3,17,42,5,88,7",
        6,
        "batched",
        "quantized",
    );
}

#[test]
fn moe_f32_two_ranks_match_one_node() {
    let dir = kit::dirs::family_fixture_dir("qwen3_moe", "hf");
    run_tensor_parallel_as(&dir, 2, "3,17,42,5,88", 7, "single", "f32");
}

/// GLM-4.5's shape at 4 bits: biased Q/K/V heads with per-head norms and partial rotary split
/// by heads; the sigmoid router (with its f32 score correction) whole on each rank; every
/// routed expert and the shared expert at half their width, one all-sum for both.
#[test]
fn glm4_moe_4bit_two_ranks_match_one_node() {
    run_tensor_parallel_as(
        &family_4bit("glm4_moe"),
        2,
        "3,17,42,5,88",
        8,
        "single",
        "quantized",
    );
}

/// MiniMax M2's shape at 4 bits: each rank holds half the heads, so the one Q norm and the
/// one K norm over all heads add their sums of squares over the ring before dividing.
#[test]
fn minimax_4bit_two_ranks_match_one_node() {
    run_tensor_parallel_as(
        &family_4bit("minimax"),
        2,
        "3,17,42,5,88",
        9,
        "single",
        "quantized",
    );
}

/// DeepSeek V3's latent attention at 4 bits: each rank keeps its query heads and their
/// `embed_q` / `unembed_out` slices, the latent projection and latent cache whole; the
/// grouped sigmoid router whole, routed and shared experts at half width.
#[test]
fn deepseek_v3_4bit_two_ranks_match_one_node() {
    run_tensor_parallel_as(
        &family_4bit("deepseek_v3"),
        2,
        "3,17,42,5,88",
        10,
        "single",
        "quantized",
    );
}

/// The same through the batched path (decoding rows over shared latent buffers).
#[test]
fn deepseek_v3_4bit_two_ranks_batch_like_one_node_alone() {
    run_tensor_parallel_as(
        &family_4bit("deepseek_v3"),
        2,
        "3,17,42,5,88,7",
        11,
        "batched",
        "quantized",
    );
}

/// GLM-4.7-Flash at 4 bits: DeepSeek V3's cut (query heads and their latent slices; the
/// latent whole) with its own bottleneck norms.
#[test]
fn glm4_moe_lite_4bit_two_ranks_match_one_node() {
    run_tensor_parallel_as(
        &family_4bit("glm4_moe_lite"),
        2,
        "3,17,42,5,88",
        16,
        "single",
        "quantized",
    );
}

/// gpt-oss as `mlx_lm.convert` wrote it in mxfp4 (experts, attention, embeddings; routers at 8
/// bits affine): every rank keeps its heads with their sinks and every expert at half its
/// width with its gate/up biases, the down projection's bias halved.
#[test]
fn gpt_oss_mxfp4_two_ranks_match_one_node() {
    let dir = kit::dirs::family_fixture_dir("gpt_oss", "mxfp4");
    run_tensor_parallel_as(
        &dir,
        2,
        "3,17,42,5,88,7,9,11,13,15",
        12,
        "single",
        "quantized",
    );
}

/// The same over a batch (sequences joining and leaving, past the sliding window).
#[test]
fn gpt_oss_mxfp4_two_ranks_batch_like_one_node_alone() {
    let dir = kit::dirs::family_fixture_dir("gpt_oss", "mxfp4");
    run_tensor_parallel_as(
        &dir,
        2,
        "3,17,42,5,88,7,9,11,13,15",
        13,
        "batched",
        "quantized",
    );
}

/// Gemma 3 at 4 bits: 2 ranks each keep 2 of the 4 heads (1 of 2 key/value heads) with the
/// whole (1+w) head and sandwich norms, and half of the GELU MLP; local layers slide.
#[test]
fn gemma3_4bit_two_ranks_match_one_node() {
    let dir = kit::dirs::family_fixture_dir("gemma3_text", "q4");
    run_tensor_parallel_as(
        &dir,
        2,
        "3,17,42,5,88,7,9,11,13,15",
        14,
        "single",
        "quantized",
    );
}

/// A K-quant GGUF file (the Q4_K_M fixture, see `tests/kquants.rs`) run quantized, as CPU
/// nodes run it by default: 3 ranks slice its repacked 4-, 5-, 6- and 8-bit matrices (groups
/// of 16 and 32) and batch like one node alone.
#[test]
fn smollm2_q4_k_m_quantized_three_ranks_batch_like_one_node_alone() {
    run_tensor_parallel_as(
        &kit::dirs::kquant_fixture_path("Q4_K_M"),
        3,
        common::SMOLLM2_PROMPT,
        15,
        "batched",
        "quantized",
    );
}

/// Gemma 4 at 4 bits: sliding and wider full layers cut by heads (a full layer's values are
/// its keys, cut with them), the dense MLP and every expert by units, each summed over the
/// ring before its own output norm.
#[test]
fn gemma4_text_4bit_two_ranks_match_one_node() {
    run_tensor_parallel_as(
        &family_4bit("gemma4_text"),
        2,
        "3,17,42,5,88",
        17,
        "single",
        "quantized",
    );
}

/// Llama 4's text model at 4 bits: heads reordered for RoPE at load, then cut as any.
#[test]
fn llama4_text_4bit_two_ranks_match_one_node() {
    run_tensor_parallel_as(
        &family_4bit("llama4_text"),
        2,
        "3,17,42,5,88",
        18,
        "single",
        "quantized",
    );
}

/// Step 3.5 at 4 bits: each layer's heads (sliding layers have more) and their head-wise
/// gates cut together; experts and the shared expert by units.
#[test]
fn step3p5_4bit_two_ranks_match_one_node() {
    run_tensor_parallel_as(
        &family_4bit("step3p5"),
        2,
        "3,17,42,5,88",
        19,
        "single",
        "quantized",
    );
}

/// DeepSeek V3.2 at 4 bits: DeepSeek V3's cut with the sparse attention's indexer replicated
/// (whole on every rank, so every rank reads the same `index_topk` positions); the prompt is
/// longer than `index_topk`, so prefill and decode both read a chosen subset.
#[test]
fn deepseek_v32_4bit_two_ranks_match_one_node() {
    run_tensor_parallel_as(
        &family_4bit("deepseek_v32"),
        2,
        "3,17,42,5,88,7,9,11,13,15",
        21,
        "single",
        "quantized",
    );
}

/// The same through the batched path (the indexer's keys in the shared latent buffers).
#[test]
fn deepseek_v32_4bit_two_ranks_batch_like_one_node_alone() {
    run_tensor_parallel_as(
        &family_4bit("deepseek_v32"),
        2,
        "3,17,42,5,88,7,9,11,13,15",
        22,
        "batched",
        "quantized",
    );
}

/// GLM-5 at 4 bits: the same cut, the indexer's RoPE interleaved.
#[test]
fn glm_moe_dsa_4bit_two_ranks_match_one_node() {
    run_tensor_parallel_as(
        &family_4bit("glm_moe_dsa"),
        2,
        "3,17,42,5,88,7,9,11,13,15",
        23,
        "single",
        "quantized",
    );
}

/// Mistral Small 4 at 4 bits: DeepSeek V3's cut (query heads and their latent slices, the
/// latent whole), the softmax router whole, experts at half width; the prompt runs past the
/// fixture's original_max_position_embeddings (8), so Llama 4's query scale is not 1.
#[test]
fn mistral4_4bit_two_ranks_match_one_node() {
    run_tensor_parallel_as(
        &family_4bit("mistral4"),
        2,
        "3,17,42,5,88,7,9,11,13,15",
        24,
        "single",
        "quantized",
    );
}

/// Qwen3.5 in f32: each rank keeps one of the 2 key heads of every Gated DeltaNet layer with
/// its 2 value heads (their rows of `in_proj_qkv` section by section, of `in_proj_z/b/a`, their
/// convolution channels, `A_log`, `dt_bias`), `out_proj` by columns; the gated attention
/// layers by heads.
#[test]
fn qwen3_5_f32_two_ranks_match_mlx_lm() {
    family_ring_matches_mlx_lm("qwen3_5", "hf", 25);
}

/// The same at 4 bits (`out_proj` cut at its quantization groups).
#[test]
fn qwen3_5_4bit_two_ranks_match_mlx_lm() {
    family_ring_matches_mlx_lm("qwen3_5", "q4", 26);
}

/// Qwen3.5-MoE at 4 bits: Qwen3.5's cut, the experts and the shared expert at half width.
#[test]
fn qwen3_5_moe_4bit_two_ranks_match_mlx_lm() {
    family_ring_matches_mlx_lm("qwen3_5_moe", "q4", 27);
}

/// Qwen3-Next at 4 bits: `in_proj_qkvz` and `in_proj_ba` hold each key head's rows together,
/// so a rank's heads are one run of rows.
#[test]
fn qwen3_next_4bit_two_ranks_match_mlx_lm() {
    family_ring_matches_mlx_lm("qwen3_next", "q4", 28);
}

/// Nemotron-H at 4 bits: Mamba-2 by heads and groups (`in_proj`'s gate, values and `dt` by
/// head, `B` and `C` by group, the group-wise norm on whole groups), attention by heads.
#[test]
fn nemotron_h_4bit_two_ranks_match_mlx_lm() {
    family_ring_matches_mlx_lm("nemotron_h", "q4", 29);
}

/// Kimi Linear at 4 bits: Kimi Delta Attention by heads (with their decay and gate rows; the
/// low-rank first projections whole), the NoPE latent attention as DeepSeek V3's.
#[test]
fn kimi_linear_4bit_two_ranks_match_mlx_lm() {
    family_ring_matches_mlx_lm("kimi_linear", "q4", 30);
}

/// The hybrid families in f32 (no quantization groups: the cut itself, to mlx-lm's 1e-4).
#[test]
fn hybrid_families_f32_two_ranks_match_mlx_lm() {
    for (family, slot) in [
        ("qwen3_5_moe", 31),
        ("qwen3_next", 32),
        ("nemotron_h", 33),
        ("kimi_linear", 34),
    ] {
        family_ring_matches_mlx_lm(family, "hf", slot);
    }
}

/// Qwen3.5-MoE at 4 bits through the batched path: sequences on their own recurrent caches
/// joining and leaving, each as it runs alone.
#[test]
fn qwen3_5_moe_4bit_two_ranks_batch_like_one_node_alone() {
    run_tensor_parallel_as(
        &family_4bit("qwen3_5_moe"),
        2,
        "3,17,42,5,88,7",
        35,
        "batched",
        "quantized",
    );
}

/// The MoE GGUF files llama.cpp wrote (see `tests/moe_gguf.rs`): 2 ranks cut the f32 files'
/// experts, and the quantized files' (Q4_K_M repacked, gpt-oss's MXFP4 as MLX's mxfp4) kept
/// quantized, like one node.
#[test]
fn moe_gguf_two_ranks_match_one_node() {
    let dir = kit::dirs::moe_gguf_fixtures_dir();
    let files = "qwen3moe.F32 qwen3moe.Q4_K_M glm4moe.F32 glm4moe.Q4_K_M gpt-oss.F32 \
                 gpt-oss.MXFP4 deepseek2.F32 deepseek2.Q4_K_M";
    for (slot, file) in (36..).zip(files.split_whitespace()) {
        let tail = ["single|quantized", "single|f32"][usize::from(file.ends_with("F32"))];
        let model = dir.join(format!("{file}.gguf"));
        run_ranks_with(&model, 2, "3,17,42,5,88", slot, tail);
    }
}
