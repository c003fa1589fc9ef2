//! Every model family against mlx-lm itself: `cargo xtask setup` makes a random-weight model
//! of each family with mlx-lm's own classes, in the Hugging Face layout (`hf`, f32, one matrix
//! per expert) and converted by `mlx_lm.convert` (`q4`, `q8`: affine, routers at 8 bits by
//! per-path entries; `mxfp4`), with mlx-lm's logits of each folder (`reference.safetensors`:
//! every prompt position, then greedy decode steps through its KV cache).
//!
//! shoal must give the same logits from the same folder: as one shard, as a 2- and 3-stage
//! layer split, and inside a batch with other sequences joining and leaving. Floats within
//! 1e-4; quantized weights within 1e-3. On the CPU the quantized products are shoal's own
//! kernels (`inference::cpu_kernels`, x kept in f32 here), not MLX's: the test compares them
//! with mlx-lm running MLX's. What each family's configuration makes (layer kinds, memory,
//! refused cuts and ring sizes) is `tests/family_shapes.rs`'s.

mod common;

use common::family_check::check;
use inference::WeightFormat;

#[test]
fn qwen3_moe_hf_f32() {
    check("qwen3_moe", "hf", WeightFormat::F32, 1e-4);
}

#[test]
fn qwen3_moe_4bit() {
    check("qwen3_moe", "q4", WeightFormat::Quantized, 1e-3);
}

#[test]
fn qwen3_moe_8bit() {
    check("qwen3_moe", "q8", WeightFormat::Quantized, 1e-3);
}

#[test]
fn glm4_moe_hf_f32() {
    check("glm4_moe", "hf", WeightFormat::F32, 1e-4);
}

#[test]
fn glm4_moe_4bit() {
    check("glm4_moe", "q4", WeightFormat::Quantized, 1e-3);
}

#[test]
fn glm4_moe_8bit() {
    check("glm4_moe", "q8", WeightFormat::Quantized, 1e-3);
}

#[test]
fn minimax_hf_f32() {
    check("minimax", "hf", WeightFormat::F32, 1e-4);
}

#[test]
fn minimax_4bit() {
    check("minimax", "q4", WeightFormat::Quantized, 1e-3);
}

#[test]
fn minimax_8bit() {
    check("minimax", "q8", WeightFormat::Quantized, 1e-3);
}

#[test]
fn deepseek_v3_hf_f32() {
    check("deepseek_v3", "hf", WeightFormat::F32, 1e-4);
}

#[test]
fn deepseek_v3_4bit() {
    check("deepseek_v3", "q4", WeightFormat::Quantized, 1e-3);
}

#[test]
fn deepseek_v3_8bit() {
    check("deepseek_v3", "q8", WeightFormat::Quantized, 1e-3);
}

/// Qwen3.5 as released by Qwen (`model.language_model.*`, zero-centred norms, convolutions
/// `[channels, 1, kernel]`): Gated DeltaNet layers and gated attention; the 2-stage split at
/// layer 1 leaves the first rank only a linear layer.
#[test]
fn qwen3_5_hf_f32() {
    check("qwen3_5", "hf", WeightFormat::F32, 1e-4);
}

/// Qwen3.5 as mlx-community publishes it (`language_model.model.*`, 4-bit).
#[test]
fn qwen3_5_4bit() {
    check("qwen3_5", "q4", WeightFormat::Quantized, 1e-3);
}

/// Qwen3.5-MoE as released by Qwen (Qwen3.5's layout, each layer's experts fused as
/// `experts.gate_up_proj`): the hybrid layers with Qwen3-Next's sparse block on every layer
/// (softmax top-2 of 8 experts, a shared expert scaled by `sigmoid(shared_expert_gate(x))`).
#[test]
fn qwen3_5_moe_hf_f32() {
    check("qwen3_5_moe", "hf", WeightFormat::F32, 1e-4);
}

/// Qwen3.5-MoE as mlx-community publishes it: experts stacked at 4 bits, the routers and
/// shared-expert gates at 8 (mlx-lm's `quant_predicate` for this family).
#[test]
fn qwen3_5_moe_4bit() {
    check("qwen3_5_moe", "q4", WeightFormat::Quantized, 1e-3);
}

/// Qwen3-Next as released by Qwen (top-level keys, experts one matrix each, zero-centred
/// norms, convolutions `[channels, 1, kernel]`): Gated DeltaNet with its fused per-key-head
/// projections (`in_proj_qkvz`, `in_proj_ba`), the sparse block on every layer but layer 2
/// (`mlp_only_layers`, a dense MLP).
#[test]
fn qwen3_next_hf_f32() {
    check("qwen3_next", "hf", WeightFormat::F32, 1e-4);
}

/// Qwen3-Next as mlx-community publishes it (experts stacked at 4 bits, routers and
/// shared-expert gates at 8).
#[test]
fn qwen3_next_4bit() {
    check("qwen3_next", "q4", WeightFormat::Quantized, 1e-3);
}

/// GLM-4.7-Flash: DeepSeek V3's block with its bottleneck norms at `rms_norm_eps` (0.05 in
/// the fixture: DeepSeek's fixed 1e-6 there changes the logits).
#[test]
fn glm4_moe_lite_hf_f32() {
    check("glm4_moe_lite", "hf", WeightFormat::F32, 1e-4);
}

#[test]
fn glm4_moe_lite_4bit() {
    check("glm4_moe_lite", "q4", WeightFormat::Quantized, 1e-3);
}

/// The released OpenAI layout (experts as mxfp4 `*_blocks`, gate and up interleaved),
/// experts dequantized to f32 (mlx-lm runs them as mxfp4 with `gather_qmm`: the same values).
#[test]
fn gpt_oss_hf() {
    check("gpt_oss", "hf", WeightFormat::F32, 1e-4);
}

/// The same folder with the experts kept in mxfp4, as mlx-lm runs them.
#[test]
fn gpt_oss_hf_mxfp4_experts() {
    check("gpt_oss", "hf", WeightFormat::Quantized, 1e-4);
}

#[test]
fn gpt_oss_mxfp4() {
    check("gpt_oss", "mxfp4", WeightFormat::Quantized, 1e-3);
}

#[test]
fn gpt_oss_4bit() {
    check("gpt_oss", "q4", WeightFormat::Quantized, 1e-3);
}

#[test]
fn gpt_oss_8bit() {
    check("gpt_oss", "q8", WeightFormat::Quantized, 1e-3);
}

#[test]
fn gemma3_text_hf_f32() {
    check("gemma3_text", "hf", WeightFormat::F32, 1e-4);
}

#[test]
fn gemma3_text_4bit() {
    check("gemma3_text", "q4", WeightFormat::Quantized, 1e-3);
}

#[test]
fn gemma3_text_8bit() {
    check("gemma3_text", "q8", WeightFormat::Quantized, 1e-3);
}

/// mlx_lm.convert's mxfp4 folder dequantized to f32 (what a CPU node picks when it fits):
/// the same values through f32 kernels.
#[test]
fn gpt_oss_mxfp4_as_f32() {
    check("gpt_oss", "mxfp4", WeightFormat::F32, 1e-4);
}

#[test]
fn llama4_text_hf_f32() {
    check("llama4_text", "hf", WeightFormat::F32, 1e-4);
}

#[test]
fn llama4_text_4bit() {
    check("llama4_text", "q4", WeightFormat::Quantized, 1e-3);
}

/// Gemma 4 in the 26B-A4B shape: sliding and wider full layers (keys as values, proportional
/// RoPE), the GELU MLP beside the experts, layer scalars, soft-capped logits.
#[test]
fn gemma4_text_hf_f32() {
    check("gemma4_text", "hf", WeightFormat::F32, 1e-4);
}

#[test]
fn gemma4_text_4bit() {
    check("gemma4_text", "q4", WeightFormat::Quantized, 1e-3);
}

/// Gemma 4 E2B's shape: per-layer inputs (their own table and a projection of the embedding,
/// carried after the hidden state through the split [0, 1, 6]), the last 3 layers reading the
/// keys and values of the last earlier layer of their kind (windows of 4, below the prompt),
/// double-wide MLPs on them.
#[test]
fn gemma4_text_e2b_hf_f32() {
    check("gemma4_text_e2b", "hf", WeightFormat::F32, 1e-4);
}

#[test]
fn gemma4_text_e2b_4bit() {
    check("gemma4_text_e2b", "q4", WeightFormat::Quantized, 1e-3);
}

/// Step 3.5 Flash: per-layer head counts, RoPE bases, rotated fractions and clamps, YaRN on
/// the full layers, head-wise gates; StepFun's layout (experts under `moe.`, zero-centred
/// norms) and MLX's.
#[test]
fn step3p5_hf_f32() {
    check("step3p5", "hf", WeightFormat::F32, 1e-4);
}

#[test]
fn step3p5_4bit() {
    check("step3p5", "q4", WeightFormat::Quantized, 1e-3);
}

/// DeepSeek V3.2: latent attention reading only the indexer's `index_topk` (4 of up to 18)
/// positions, YaRN's factor on the indexer's rotated part.
#[test]
fn deepseek_v32_hf_f32() {
    check("deepseek_v32", "hf", WeightFormat::F32, 1e-4);
}

#[test]
fn deepseek_v32_4bit() {
    check("deepseek_v32", "q4", WeightFormat::Quantized, 1e-3);
}

/// GLM-5: DeepSeek V3.2's model under GLM's keys (RoPE from `rope_parameters`, the indexer's
/// RoPE interleaved).
#[test]
fn glm_moe_dsa_hf_f32() {
    check("glm_moe_dsa", "hf", WeightFormat::F32, 1e-4);
}

#[test]
fn glm_moe_dsa_4bit() {
    check("glm_moe_dsa", "q4", WeightFormat::Quantized, 1e-3);
}

/// Mistral Small 4 as released (`mistral3` around a `mistral4` text model): latent attention
/// with YaRN from `rope_parameters` and Llama 4's query scale past position 8, softmax-routed
/// grouped experts.
#[test]
fn mistral4_hf_f32() {
    check("mistral4", "hf", WeightFormat::F32, 1e-4);
}

#[test]
fn mistral4_4bit() {
    check("mistral4", "q4", WeightFormat::Quantized, 1e-3);
}

/// Nemotron-H: Mamba-2 mixers, attention without positions, relu² MLP and experts, each a
/// block of its own (the split [0, 1, 2, 5] leaves rank 1 only an MLP layer).
#[test]
fn nemotron_h_hf_f32() {
    check("nemotron_h", "hf", WeightFormat::F32, 1e-4);
}

#[test]
fn nemotron_h_4bit() {
    check("nemotron_h", "q4", WeightFormat::Quantized, 1e-3);
}

/// Nemotron 3 Super: Nemotron-H with its experts on a latent projection (`moe_latent_size`
/// 64 of hidden 128: `fc1_latent_proj` before the experts, `fc2_latent_proj` after their
/// weighted sum; the router and the shared expert read the hidden state), routed in 2 groups
/// of which 1 is kept (the split [0, 1, 5] leaves rank 0 only a Mamba-2 layer).
#[test]
fn nemotron_h_latent_hf_f32() {
    check("nemotron_h_latent", "hf", WeightFormat::F32, 1e-4);
}

#[test]
fn nemotron_h_latent_4bit() {
    check("nemotron_h_latent", "q4", WeightFormat::Quantized, 1e-3);
}

/// Kimi Linear: Kimi Delta Attention (a decay per key channel) on layers 1, 2 and 4, NoPE
/// latent attention on layer 3 (a 2-stage split at 1 leaves rank 0 only a KDA layer).
#[test]
fn kimi_linear_hf_f32() {
    check("kimi_linear", "hf", WeightFormat::F32, 1e-4);
}

#[test]
fn kimi_linear_4bit() {
    check("kimi_linear", "q4", WeightFormat::Quantized, 1e-3);
}

/// Kimi K3 as released (a vision-language checkpoint, the text model under `text_config`):
/// fused-q/k/v KDA with a bounded decay and a full-rank gate on layers 1, 2 and 4, NoPE latent
/// attention with a query bottleneck and an output gate on layer 3, attention residuals in
/// blocks of 2 layers (the 2- and 3-stage splits at 1 and 2 hand the embedding's block to the
/// next rank), SiTU in the dense MLP, the experts on a normed latent width and the shared
/// expert.
#[test]
fn kimi_k3_hf_f32() {
    check("kimi_k3", "hf", WeightFormat::F32, 1e-4);
}

#[test]
fn kimi_k3_4bit() {
    check("kimi_k3", "q4", WeightFormat::Quantized, 1e-3);
}

/// Kimi K3's attention residuals cross a pipeline cut: the activations a rank passes on carry
/// the blocks stored so far after the hidden state (two hidden-wide slots for 4 layers in
/// blocks of 2), so a cut at 3 hands layer 3 (which mixes blocks 0 and 2, then makes the
/// output mix) everything it reads, and the logits stay mlx-lm's.
#[test]
fn kimi_k3_pipeline_carries_the_attention_residual_blocks() {
    use common::family_check::{load, run_stages};
    use common::reference::{fixture, worst, Reference};
    for (layout, format, tolerance) in [
        ("hf", WeightFormat::F32, 1e-4),
        ("q4", WeightFormat::Quantized, 1e-3),
    ] {
        inference::cpu_kernels::round_x_to_int8(false);
        let dir = fixture("kimi_k3", layout);
        let reference = Reference::read(&dir);
        for cut in [1, 3] {
            let stages = [
                load(&dir, Some(0..cut), format),
                load(&dir, Some(cut..4), format),
            ];
            assert_eq!(stages[0].activation_width(), 3 * 128, "{layout}");
            let (prefill, decode) = run_stages(&stages, &reference);
            let worst = worst(&reference.prefill, &prefill).max(worst(&reference.decode, &decode));
            println!("kimi_k3/{layout} cut at {cut}: {worst:.2e}");
            assert!(
                worst < tolerance,
                "kimi_k3/{layout}: a cut at {cut} differs from mlx-lm by {worst}"
            );
        }
    }
}

/// MiniMax M3 as released (a vision-language checkpoint, the text model under `text_config`):
/// block-sparse attention on layers 0, 2 and 3 (blocks of 4, 2 read: the 12-token prompt's
/// last queries and every decode step drop a block), a dense first layer, then sigmoid-routed
/// experts with a shared expert, all gpt-oss's clamped SwiGLU, (1 + w) norms.
#[test]
fn minimax_m3_hf_f32() {
    check("minimax_m3_vl", "hf", WeightFormat::F32, 1e-4);
}

#[test]
fn minimax_m3_4bit() {
    check("minimax_m3_vl", "q4", WeightFormat::Quantized, 1e-3);
}
