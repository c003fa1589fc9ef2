//! Tensor parallelism of the hybrid families (recurrent layers beside attention: Gated
//! DeltaNet, Mamba-2, Kimi Delta Attention) through the real MLX ring: 2 processes, each in its
//! own network namespace, each holding a slice of every layer's heads (a recurrent layer's
//! value heads with their convolution channels and decay), give the logits of one process
//! holding it all, and mlx-lm's own logits of the fixture (`common::tensor_ranks` runs them).

mod common;

use common::tensor_ranks::{family_4bit, family_ring_matches_mlx_lm, run_tensor_parallel_as};

/// One rank's process, not a test of its own: ignored in a plain run (so it is never counted
/// as passing), run by its parent test with `--ignored --exact` and its spec in `CHILD_ENV`.
#[test]
#[ignore = "one rank's process: its parent test runs it"]
fn tensor_parallel_child() {
    common::tensor_ranks::child();
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

/// Kimi K3 at 4 bits: Kimi Linear's cut (its fused q/k/v read as three, the full-rank gate
/// by heads), the latent attention's output gate by heads, the experts at half width on the
/// latent, whose norm reads the ring's sum (one all-sum with the shared expert's, as mlx-lm's
/// `shard`); the attention residuals' blocks are the same on both ranks.
#[test]
fn kimi_k3_4bit_two_ranks_match_mlx_lm() {
    family_ring_matches_mlx_lm("kimi_k3", "q4", 60);
}

/// The same in f32 (no quantization groups: the cut itself, to mlx-lm's 1e-4).
#[test]
fn kimi_k3_f32_two_ranks_match_mlx_lm() {
    family_ring_matches_mlx_lm("kimi_k3", "hf", 61);
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

/// Nemotron 3 Super's latent experts at 4 bits: Nemotron-H's cut, every expert at half its
/// width on the latent (64 of hidden 128), `fc1_latent_proj` and `fc2_latent_proj` whole on
/// each rank (the up projection lifts each rank's partial sum; the ring adds them).
#[test]
fn nemotron_h_latent_4bit_two_ranks_match_mlx_lm() {
    family_ring_matches_mlx_lm("nemotron_h_latent", "q4", 40);
}

/// The same in f32 (no quantization groups: the cut itself, to mlx-lm's 1e-4).
#[test]
fn nemotron_h_latent_f32_two_ranks_match_mlx_lm() {
    family_ring_matches_mlx_lm("nemotron_h_latent", "hf", 41);
}
