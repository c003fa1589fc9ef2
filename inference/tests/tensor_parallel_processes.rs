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

use common::tensor_ranks::{
    family_4bit, family_ring_matches_mlx_lm, run_ranks_with, run_tensor_parallel,
    run_tensor_parallel_as,
};
use common::{smollm2, temp_dir, write_tiny_model};
use std::path::PathBuf;

/// One rank's process, not a test of its own: ignored in a plain run (so it is never counted
/// as passing), run by its parent test with `--ignored --exact` and its spec in `CHILD_ENV`.
#[test]
#[ignore = "one rank's process: its parent test runs it"]
fn tensor_parallel_child() {
    common::tensor_ranks::child();
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

/// Gemma 4 E2B's shape at 4 bits: the KV-shared layers' query heads cut as their source
/// layers' are (each rank's queries read the key/value heads its slice of the source holds),
/// the per-layer inputs' table, projection and gates whole on every rank.
#[test]
fn gemma4_text_e2b_4bit_two_ranks_match_mlx_lm() {
    family_ring_matches_mlx_lm("gemma4_text_e2b", "q4", 42);
}

/// The same in f32 (the cut itself, to mlx-lm's 1e-4).
#[test]
fn gemma4_text_e2b_f32_two_ranks_match_mlx_lm() {
    family_ring_matches_mlx_lm("gemma4_text_e2b", "hf", 43);
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
