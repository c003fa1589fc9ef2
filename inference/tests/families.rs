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
//! with mlx-lm running MLX's.

mod common;

use common::family_check::check;
use common::reference::fixture;
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

/// What Qwen3.5's released configuration makes: every second layer attention, a quarter of
/// each head rotated at `rope_parameters`' theta, memory per position only for the attention
/// layers and a fixed state per sequence for the linear ones, and a tensor ring of 2 (each rank
/// one of the 2 key heads) while 4 would cut a key head and is refused, naming the count.
#[test]
fn qwen3_5_configuration_is_read_from_text_config() {
    use inference::memory::{kv_bytes_per_token, state_bytes_per_sequence};
    for layout in ["hf", "q4"] {
        let dir = fixture("qwen3_5", layout);
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        let config = inference::config::ModelConfig::from_hf_json(&json).unwrap();
        assert_eq!(config.architecture.key(), "qwen3_5");
        assert_eq!(
            (config.hidden_size, config.num_layers, config.vocab_size),
            (64, 4, 49152)
        );
        let linear: Vec<bool> = (0..4).map(|l| config.is_linear_layer(l)).collect();
        assert_eq!(linear, [true, false, true, false]);
        assert_eq!(config.attention.rotary_dim, Some(8));
        assert_eq!(config.rope_theta, 1e7);
        // Keys and values of 2 attention layers (2 heads of 32), f32.
        assert_eq!(
            kv_bytes_per_token(&config, WeightFormat::F32),
            2 * 2 * 2 * 32 * 4
        );
        // 2 linear layers: 3 kept inputs of 256 channels, 4 matrices of 32 x 32 (f32).
        assert_eq!(
            state_bytes_per_sequence(&config, WeightFormat::F32),
            2 * (3 * 256 * 4 + 4 * 32 * 32 * 4)
        );
        assert_hybrid_ring_sizes(&config);
    }
}

/// A Gated DeltaNet model of 2 key heads (4 value heads) in a ring: 2 ranks split it; 4
/// would cut a key head and are refused with the count, and 3 with both counts.
fn assert_hybrid_ring_sizes(config: &inference::config::ModelConfig) {
    use inference::tensor_split::tensor_refusal;
    assert_eq!(tensor_refusal(config, 2), None);
    let four = tensor_refusal(config, 4).unwrap();
    assert!(four.contains("2 linear-attention key heads"), "{four}");
    assert!(!four.contains("linear-attention value heads"), "{four}");
    let three = tensor_refusal(config, 3).unwrap();
    assert!(
        three.contains("2 linear-attention key heads")
            && three.contains("4 linear-attention value heads"),
        "{three}"
    );
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

/// What Qwen3.5-MoE's released configuration makes (no `intermediate_size`, as released):
/// experts on every layer, softmax top-2 renormalized, the shared expert's width, the hybrid
/// layers of Qwen3.5, and a tensor ring of 2 (4 would cut a key head).
#[test]
fn qwen3_5_moe_configuration_is_read_from_text_config() {
    use inference::config::RouterKind;
    for layout in ["hf", "q4"] {
        let dir = fixture("qwen3_5_moe", layout);
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        let config = inference::config::ModelConfig::from_hf_json(&json).unwrap();
        assert_eq!(config.architecture.key(), "qwen3_5_moe");
        let linear: Vec<bool> = (0..4).map(|l| config.is_linear_layer(l)).collect();
        assert_eq!(linear, [true, false, true, false]);
        let moe = config.moe.as_ref().unwrap();
        assert!((0..4).all(|l| moe.is_moe_layer(l)));
        assert_eq!(
            (moe.num_experts, moe.experts_per_token, moe.expert_width),
            (8, 2, 128)
        );
        assert_eq!(moe.shared_width, 128);
        assert_eq!(moe.router, RouterKind::SoftmaxTopK { normalize: true });
        assert_hybrid_ring_sizes(&config);
    }
}

/// What Qwen3-Next's configuration makes (its keys at the top level): the sparse block on
/// every layer but `mlp_only_layers`, RoPE from `rope_theta` and `partial_rotary_factor`, a
/// tensor ring of 2 (4 would cut a key head).
#[test]
fn qwen3_next_configuration_is_read_from_top_level_keys() {
    use inference::config::RouterKind;
    for layout in ["hf", "q4"] {
        let dir = fixture("qwen3_next", layout);
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        let config = inference::config::ModelConfig::from_hf_json(&json).unwrap();
        assert_eq!(config.architecture.key(), "qwen3_next");
        let linear: Vec<bool> = (0..4).map(|l| config.is_linear_layer(l)).collect();
        assert_eq!(linear, [true, false, true, false]);
        assert_eq!(config.attention.rotary_dim, Some(8));
        assert_eq!(config.rope_theta, 1e7);
        let moe = config.moe.as_ref().unwrap();
        let sparse: Vec<bool> = (0..4).map(|l| moe.is_moe_layer(l)).collect();
        assert_eq!(sparse, [true, true, false, true]);
        assert_eq!((moe.shared_width, config.intermediate_size), (128, 128));
        assert_eq!(moe.router, RouterKind::SoftmaxTopK { normalize: true });
        assert_hybrid_ring_sizes(&config);
    }
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

/// A folder holding only a repository's support files (how a node places a model from the hub
/// before it downloads any weights) is described all the same; with no index to give the
/// weights' size, the estimate from the configuration is within 15% of the real file.
#[test]
fn a_folder_without_its_weights_is_described_from_its_configuration() {
    for (family, layout) in [
        ("qwen3_moe", "hf"),
        ("qwen3_moe", "q4"),
        ("qwen3_moe", "q8"),
        ("deepseek_v3", "q4"),
        ("gpt_oss", "mxfp4"),
        ("gemma3_text", "q8"),
    ] {
        let dir = fixture(family, layout);
        let support = std::env::temp_dir().join(format!(
            "shoal-describe-{family}-{layout}-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&support).unwrap();
        for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
            std::fs::copy(dir.join(f), support.join(f)).unwrap();
        }
        assert!(
            inference::loader::open_model(&support).is_err(),
            "{family}/{layout}: no weights to open"
        );
        let described = inference::loader::describe_model(&support).unwrap();
        let whole = inference::loader::describe_model(&dir).unwrap();
        let real = std::fs::metadata(dir.join("model.safetensors"))
            .unwrap()
            .len();
        assert_eq!(whole.bytes_on_disk, real, "{family}/{layout}");
        assert_eq!(
            described.config.num_layers, whole.config.num_layers,
            "{family}/{layout}"
        );
        let ratio = described.bytes_on_disk as f64 / real as f64;
        println!(
            "{family}/{layout}: estimated {} of {real} bytes ({ratio:.2})",
            described.bytes_on_disk
        );
        assert!(
            (0.85..1.15).contains(&ratio),
            "{family}/{layout}: estimated {} bytes for a {real}-byte file",
            described.bytes_on_disk
        );
        std::fs::remove_dir_all(&support).unwrap();
    }
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

/// What Nemotron 3 Super's configuration makes: the experts' latent width read, every E
/// layer's latent projections among the names a pipeline rank fetches, a tensor ring of 2
/// (the latent projections whole on each rank), 4 refused (it would cut a Mamba-2 group).
#[test]
fn nemotron_h_latent_configuration_names_its_projections() {
    use inference::tensor_split::tensor_refusal;
    for layout in ["hf", "q4"] {
        let dir = fixture("nemotron_h_latent", layout);
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        let config = inference::config::ModelConfig::from_hf_json(&json).unwrap();
        let names = inference::models::tensor_names(&config);
        for layer in [1, 4] {
            for proj in ["fc1_latent_proj", "fc2_latent_proj"] {
                let name = format!("model.layers.{layer}.mixer.{proj}.weight");
                assert!(names.contains(&name), "{layout}: {name} not named");
            }
        }
        assert!(!names.iter().any(|n| n.contains("layers.0.mixer.fc1")));
        assert_eq!(tensor_refusal(&config, 2), None, "{layout}");
        let four = tensor_refusal(&config, 4).unwrap();
        assert!(four.contains("2 Mamba-2 groups"), "{layout}: {four}");
    }
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

/// What Kimi Linear's configuration makes: KDA on the layers `kda_layers` names (from 1), a
/// latent cache per position only for the attention layer, a fixed state per sequence for
/// the KDA ones, and a tensor ring of 2 (one of the 2 KDA heads each; 4 would cut a head).
#[test]
fn kimi_linear_configuration_reads_its_layer_kinds() {
    use inference::memory::{kv_bytes_per_token, state_bytes_per_sequence};
    let dir = fixture("kimi_linear", "hf");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let config = inference::config::ModelConfig::from_hf_json(&json).unwrap();
    let linear: Vec<bool> = (0..4).map(|l| config.is_linear_layer(l)).collect();
    assert_eq!(linear, [true, true, false, true]);
    // One latent attention layer: the latent (64) and the unrotated key part (32), f32.
    assert_eq!(
        kv_bytes_per_token(&config, WeightFormat::F32),
        (64 + 32) * 4
    );
    // 3 KDA layers: 3 kept inputs of 3 x 128 channels, 2 matrices of 64 x 64 (f32).
    assert_eq!(
        state_bytes_per_sequence(&config, WeightFormat::F32),
        3 * (3 * 384 * 4 + 2 * 64 * 64 * 4)
    );
    assert_eq!(inference::tensor_split::tensor_refusal(&config, 2), None);
    let four = inference::tensor_split::tensor_refusal(&config, 4).unwrap();
    assert!(four.contains("2 Kimi Delta Attention heads"), "{four}");
}

/// What Nemotron-H's configuration allows a tensor ring: 2 ranks split the 4 Mamba-2 heads in
/// their 2 groups, the attention heads and (at 4 bits) every width in whole groups of 64; 4
/// would cut a group (each group's `B` and `C` are read by its heads alone) and are refused,
/// naming it.
#[test]
fn nemotron_h_tensor_ring_splits_heads_in_whole_groups() {
    use inference::tensor_split::tensor_refusal;
    for layout in ["hf", "q4"] {
        let dir = fixture("nemotron_h", layout);
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        let config = inference::config::ModelConfig::from_hf_json(&json).unwrap();
        assert_eq!(tensor_refusal(&config, 2), None, "{layout}");
        let four = tensor_refusal(&config, 4).unwrap();
        assert!(four.contains("2 Mamba-2 groups"), "{layout}: {four}");
        assert!(!four.contains("Mamba-2 heads"), "{layout}: {four}");
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

/// What MiniMax M3's configuration makes: the sparse layers `sparse_attention_freq` names,
/// each caching its index key as one more value head, the dense layer's MLP its own width,
/// and a tensor ring of a size that splits the index heads.
#[test]
fn minimax_m3_configuration_reads_its_sparse_layers() {
    use inference::memory::kv_bytes_per_token;
    let dir = fixture("minimax_m3_vl", "hf");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let config = inference::config::ModelConfig::from_hf_json(&json).unwrap();
    let shape = config.attention.block_index.as_ref().unwrap();
    let sparse: Vec<bool> = (0..4).map(|l| shape.is_sparse(l)).collect();
    assert_eq!(sparse, [true, false, true, true]);
    assert_eq!(
        (shape.heads, shape.head_dim, shape.block, shape.topk),
        (2, 32, 4, 2)
    );
    assert_eq!(config.intermediate_size, 128);
    let moe = config.moe.as_ref().unwrap();
    assert_eq!((moe.expert_width, moe.shared_width), (128, 128));
    assert!(!moe.is_moe_layer(0) && moe.is_moe_layer(1));
    assert_eq!(config.attention.rotary_dim, Some(16));
    // 4 layers of 2 key and 2 value heads of 32, plus 3 index keys padded to 32, f32.
    assert_eq!(
        kv_bytes_per_token(&config, WeightFormat::F32),
        (4 * 2 * 2 + 3) * 32 * 4
    );
    assert_eq!(inference::tensor_split::tensor_refusal(&config, 2), None);
    let three = inference::tensor_split::tensor_refusal(&config, 3).unwrap();
    assert!(three.contains("heads"), "{three}");
}
