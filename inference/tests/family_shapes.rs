//! What each family's configuration makes of its fixture (`cargo xtask setup` makes them with
//! mlx-lm, see `tests/families.rs`): which layers are linear, sparse or share another's keys,
//! what memory counts per position and per sequence, which tensors a pipeline rank fetches,
//! which cuts and ring sizes are refused and why. The logits are `tests/families.rs`'s.

mod common;

use common::reference::{config_of, fixture};
use inference::WeightFormat;

/// What Qwen3.5's released configuration makes: every second layer attention, a quarter of
/// each head rotated at `rope_parameters`' theta, memory per position only for the attention
/// layers and a fixed state per sequence for the linear ones, and a tensor ring of 2 (each rank
/// one of the 2 key heads) while 4 would cut a key head and is refused, naming the count.
#[test]
fn qwen3_5_configuration_is_read_from_text_config() {
    use inference::memory::{kv_bytes_per_token, state_bytes_per_sequence};
    for layout in ["hf", "q4"] {
        let dir = fixture("qwen3_5", layout);
        let config = config_of(&dir);
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

/// What Qwen3.5-MoE's released configuration makes (no `intermediate_size`, as released):
/// experts on every layer, softmax top-2 renormalized, the shared expert's width, the hybrid
/// layers of Qwen3.5, and a tensor ring of 2 (4 would cut a key head).
#[test]
fn qwen3_5_moe_configuration_is_read_from_text_config() {
    use inference::config::RouterKind;
    for layout in ["hf", "q4"] {
        let dir = fixture("qwen3_5_moe", layout);
        let config = config_of(&dir);
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
        let config = config_of(&dir);
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

/// What Gemma 4 E2B's configuration makes: which layer each KV-shared layer reads, the
/// per-layer tensors among the names a pipeline rank fetches, a pipeline cut between a
/// KV-shared layer and its source refused with the reason (and the layers placement must not
/// begin a stage at), and a 2-rank ring allowed.
#[test]
fn gemma4_text_e2b_cut_keeps_shared_layers_with_their_source() {
    use inference::loader::{load_shard, LoadOptions};
    let dir = fixture("gemma4_text_e2b", "hf");
    let config = config_of(&dir);
    let family = inference::models::family(config.architecture);
    let sources: Vec<Option<usize>> = (0..6).map(|l| family.kv_source(&config, l)).collect();
    assert_eq!(sources, [None, None, None, Some(1), Some(1), Some(2)]);
    // The KV budget counts the three layers with keys of their own.
    assert_eq!(inference::memory::own_kv_layers(&config), 3);
    assert_eq!(
        inference::memory::kv_bytes_per_token(&config, WeightFormat::F32),
        (3 * 2 * config.num_kv_heads * config.head_dim * 4) as u64
    );
    let names = inference::models::tensor_names(&config);
    for name in [
        "model.embed_tokens_per_layer.weight",
        "model.per_layer_model_projection.weight",
        "model.layers.5.per_layer_input_gate.weight",
    ] {
        assert!(names.iter().any(|n| n == name), "{name} not named");
    }
    assert!(!names
        .iter()
        .any(|n| n == "model.layers.4.self_attn.k_proj.weight"));
    for layers in [2..6, 3..6] {
        let options = LoadOptions {
            layers: Some(layers.clone()),
            format: Some(WeightFormat::F32),
        };
        let Err(err) = load_shard(&dir, &options, &mut |_, _| {}) else {
            panic!("{layers:?}: a cut between layer 3 and its source loaded");
        };
        let err = err.to_string();
        assert!(
            err.contains("layer 3 reads the keys and values of layer 1"),
            "{layers:?}: {err}"
        );
    }
    // Placement is told the same: no stage may begin at layers 2..=5 (layers 3 and 4 read
    // layer 1, layer 5 reads layer 2), so a 2-rank pipeline is cut at 1.
    assert_eq!(inference::models::no_cut_before(&config), [2, 3, 4, 5]);
    assert_eq!(inference::tensor_split::tensor_refusal(&config, 2), None);
}

/// What Nemotron 3 Super's configuration makes: the experts' latent width read, every E
/// layer's latent projections among the names a pipeline rank fetches, a tensor ring of 2
/// (the latent projections whole on each rank), 4 refused (it would cut a Mamba-2 group).
#[test]
fn nemotron_h_latent_configuration_names_its_projections() {
    use inference::tensor_split::tensor_refusal;
    for layout in ["hf", "q4"] {
        let dir = fixture("nemotron_h_latent", layout);
        let config = config_of(&dir);
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

/// What Kimi Linear's configuration makes: KDA on the layers `kda_layers` names (from 1), a
/// latent cache per position only for the attention layer, a fixed state per sequence for
/// the KDA ones, and a tensor ring of 2 (one of the 2 KDA heads each; 4 would cut a head).
#[test]
fn kimi_linear_configuration_reads_its_layer_kinds() {
    use inference::memory::{kv_bytes_per_token, state_bytes_per_sequence};
    let dir = fixture("kimi_linear", "hf");
    let config = config_of(&dir);
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

/// What Kimi K3's configuration makes (read from `text_config`): KDA on the layers
/// `kda_layers` names (from 1), a latent cache per position only for the attention layer, a
/// fixed state per sequence for the KDA ones, the attention residuals' 2 blocks carried after
/// the hidden state, the residual, gate and latent-expert weights among the names a pipeline
/// rank fetches, and a tensor ring of 2 (4 would cut a KDA head).
#[test]
fn kimi_k3_configuration_reads_its_layer_kinds_and_blocks() {
    use inference::memory::{kv_bytes_per_token, state_bytes_per_sequence};
    for layout in ["hf", "q4"] {
        let dir = fixture("kimi_k3", layout);
        let config = config_of(&dir);
        assert_eq!(config.architecture.key(), "kimi_k3");
        let linear: Vec<bool> = (0..4).map(|l| config.is_linear_layer(l)).collect();
        assert_eq!(linear, [true, true, false, true], "{layout}");
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
        let family = inference::models::family(config.architecture);
        assert_eq!(family.carried_columns(&config), 2 * 128);
        let moe = config.moe.as_ref().unwrap();
        assert_eq!((moe.latent_width, moe.first_dense), (64, 1));
        // Router 128 x 8, the 8 experts' three 64 x 128 matrices, the shared expert's three
        // 128 x 128, the latent projections 2 x 128 x 64.
        assert_eq!(
            moe.parameters(128),
            128 * 8 + 8 * 3 * 64 * 128 + 3 * 128 * 128 + 2 * 128 * 64
        );
        let names = inference::models::tensor_names(&config);
        for name in [
            "model.layers.0.self_attention_res.proj_weight",
            "model.layers.3.mlp_res.norm_weight",
            "model.output_attn_res.proj_weight",
            "model.layers.2.self_attn.g_proj.weight",
            "model.layers.2.self_attn.q_a_proj.weight",
            "model.layers.1.block_sparse_moe.routed_expert_norm.weight",
            "model.layers.3.self_attn.g_proj.weight",
        ] {
            assert!(
                names.iter().any(|n| n == name),
                "{layout}: {name} not named"
            );
        }
        assert!(!names.iter().any(|n| n.contains("g_a_proj")), "{layout}");
        assert_eq!(inference::tensor_split::tensor_refusal(&config, 2), None);
        let four = inference::tensor_split::tensor_refusal(&config, 4).unwrap();
        assert!(four.contains("2 Kimi Delta Attention heads"), "{four}");
    }
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
        let config = config_of(&dir);
        assert_eq!(tensor_refusal(&config, 2), None, "{layout}");
        let four = tensor_refusal(&config, 4).unwrap();
        assert!(four.contains("2 Mamba-2 groups"), "{layout}: {four}");
        assert!(!four.contains("Mamba-2 heads"), "{layout}: {four}");
    }
}

/// What MiniMax M3's configuration makes: the sparse layers `sparse_attention_freq` names,
/// each caching its index key as one more value head, the dense layer's MLP its own width,
/// and a tensor ring of a size that splits the index heads.
#[test]
fn minimax_m3_configuration_reads_its_sparse_layers() {
    use inference::memory::kv_bytes_per_token;
    let dir = fixture("minimax_m3_vl", "hf");
    let config = config_of(&dir);
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
