//! A model's `config.json` comes from whoever published the repository. Each family's
//! fixture folder (mlx-lm's own, in the Hugging Face layout and at 4 bits) is loaded here
//! with its configuration edited at random: Mixture-of-Experts counts, router groups, latent
//! attention ranks, head counts and widths, sliding windows, rotary scaling and quantization
//! set to zero, one, huge, negative, fractional, or the wrong JSON type. Reading the
//! configuration, loading the weights against it and running a prompt and one cached decode
//! step may each fail with an error; none may panic or abort the process.

use inference::config::ModelConfig;
use inference::loader::{load_shard, LoadOptions};
use inference::memory::MemoryOf;
use inference::{ShardInput, WeightFormat};
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The folders edited: every family, as floats and at 4 bits.
const FOLDERS: &[(&str, &str)] = &[
    ("qwen3_moe", "hf"),
    ("qwen3_moe", "q4"),
    ("glm4_moe", "hf"),
    ("glm4_moe", "q4"),
    ("minimax", "q4"),
    ("deepseek_v3", "hf"),
    ("deepseek_v3", "q4"),
    ("gpt_oss", "mxfp4"),
    ("gpt_oss", "hf"),
    ("gemma3_text", "q4"),
    ("qwen3_5", "hf"),
    ("qwen3_5", "q4"),
    ("gemma4_text", "hf"),
    ("gemma4_text", "q4"),
    ("gemma4_text_e2b", "q4"),
    ("llama4_text", "q4"),
    ("step3p5", "hf"),
    ("step3p5", "q4"),
    ("nemotron_h", "hf"),
    ("nemotron_h", "q4"),
    ("nemotron_h_latent", "q4"),
    ("deepseek_v32", "q4"),
    ("glm_moe_dsa", "hf"),
    ("mistral4", "q4"),
    ("kimi_linear", "q4"),
    ("kimi_k3", "hf"),
    ("kimi_k3", "q4"),
];

/// The configuration keys the families read.
const KEYS: &[&str] = &[
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "n_shared_experts",
    "shared_intermediate_size",
    "n_group",
    "topk_group",
    "first_k_dense_replace",
    "moe_layer_freq",
    "mlp_only_layers",
    "decoder_sparse_step",
    "norm_topk_prob",
    "routed_scaling_factor",
    "scoring_func",
    "kv_lora_rank",
    "q_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
    "head_dim",
    "num_attention_heads",
    "num_key_value_heads",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "vocab_size",
    "max_position_embeddings",
    "sliding_window",
    "sliding_window_pattern",
    "layer_types",
    "rope_theta",
    "rope_scaling",
    "partial_rotary_factor",
    "rotary_dim",
    "use_qk_norm",
    "qk_norm_type",
    "attention_bias",
    "tie_word_embeddings",
    "swiglu_limit",
    "rms_norm_eps",
    "quantization",
    "query_pre_attn_scalar",
    "linear_num_value_heads",
    "linear_num_key_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
    "full_attention_interval",
    "rope_parameters",
    "global_head_dim",
    "num_global_key_value_heads",
    "attention_k_eq_v",
    "enable_moe_block",
    "top_k_experts",
    "final_logit_softcapping",
    "num_kv_shared_layers",
    "hidden_size_per_layer_input",
    "vocab_size_per_layer_input",
    "use_double_wide_mlp",
    "intermediate_size_mlp",
    "no_rope_layers",
    "num_attention_groups",
    "attention_other_setting",
    "partial_rotary_factors",
    "moe_layers_enum",
    "moe_num_experts",
    "moe_top_k",
    "share_expert_dim",
    "swiglu_limits",
    "yarn_only_types",
    "hybrid_override_pattern",
    "mamba_num_heads",
    "mamba_head_dim",
    "ssm_state_size",
    "n_groups",
    "conv_kernel",
    "layer_norm_epsilon",
    "time_step_limit",
    "moe_latent_size",
    "index_n_heads",
    "index_head_dim",
    "index_topk",
    "indexer_rope_interleave",
    "rope_interleave",
    "linear_attn_config",
    "num_experts_per_token",
    "num_shared_experts",
    "num_expert_group",
    "moe_renormalize",
    "attn_res_block_size",
    "routed_expert_hidden_size",
    "latent_moe_use_norm",
    "activation_situ_beta",
    "activation_situ_linear_beta",
    "mla_use_output_gate",
];

/// What a key may be set to.
fn values() -> Vec<Value> {
    vec![
        json!(0),
        json!(1),
        json!(2),
        json!(3),
        json!(7),
        json!(64),
        json!(-1),
        json!(1u64 << 40),
        json!(1e30),
        json!(0.5),
        json!("x"),
        Value::Null,
        json!([]),
        json!([0, 99]),
        json!(["full_attention", "sliding_attention"]),
        json!(true),
        json!({"type": "yarn", "factor": 0.0}),
        json!({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 0}),
        json!({"bits": 3, "group_size": 7}),
        json!({"bits": 4, "group_size": 32, "mode": "mxfp4"}),
        json!({"group_size": 64, "bits": 8, "model.layers.0.mlp.gate": {"bits": 2}}),
    ]
}

/// A folder holding `fixture`'s files with `config` as its config.json (the weights linked).
fn folder_with(fixture: &Path, config: &Value, case: usize) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("shoal-config-fuzz-{}-{case}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(fixture).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap();
        if name != "config.json" {
            std::os::unix::fs::symlink(&path, dir.join(name)).unwrap();
        }
    }
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    dir
}

/// Everything a node and a runner do with a folder before answering: each may fail.
/// Whether the model loaded.
fn exercise(dir: &Path, json: &Value, format: WeightFormat) -> bool {
    let Ok(config) = ModelConfig::from_hf_json(json) else {
        return false;
    };
    let _ = inference::memory::InstanceMemory::of(&config, 1 << 20);
    let _ = inference::tensor_split::tensor_divisors(&config);
    let _ = inference::loader::describe_model(dir);
    let options = LoadOptions {
        layers: None,
        format: Some(format),
    };
    let Ok((shard, _)) = load_shard(dir, &options, &mut |_, _| {}) else {
        return false;
    };
    let mut cache = shard.new_cache();
    if shard
        .forward(ShardInput::Tokens(&[3, 17, 42]), &mut cache, false)
        .is_ok()
    {
        let _ = shard.forward(ShardInput::Tokens(&[5]), &mut cache, false);
    }
    true
}

/// Edits one folder's configuration as `edits` say and exercises it; whether it loaded.
fn edited(folder: usize, edits: &[(usize, usize)], case: usize) -> bool {
    let (family, layout) = FOLDERS[folder];
    let fixture = kit::dirs::family_fixture_dir(family, layout);
    let text = std::fs::read_to_string(fixture.join("config.json"))
        .unwrap_or_else(|e| panic!("{family}/{layout}: {e} (run `cargo xtask setup`)"));
    let mut json: Value = serde_json::from_str(&text).unwrap();
    let values = values();
    for &(key, value) in edits {
        // A multimodal release's text model keeps its numbers under `text_config`.
        let target = match json.get("text_config") {
            Some(_) if KEYS[key] != "quantization" => &mut json["text_config"],
            _ => &mut json,
        };
        target[KEYS[key]] = values[value].clone();
    }
    let dir = folder_with(&fixture, &json, case);
    let format = if layout == "hf" {
        WeightFormat::F32
    } else {
        WeightFormat::Quantized
    };
    let loaded = exercise(&dir, &json, format);
    std::fs::remove_dir_all(&dir).unwrap();
    loaded
}

#[test]
fn an_edited_config_is_an_error_or_a_model_never_a_crash() {
    const CASES: u32 = 160;
    let mut runner = TestRunner::new(ProptestConfig {
        cases: CASES,
        ..ProptestConfig::default()
    });
    let strategy = (
        0..FOLDERS.len(),
        proptest::collection::vec((0..KEYS.len(), 0..values().len()), 1..4),
    );
    let (case, loaded) = (AtomicUsize::new(0), AtomicUsize::new(0));
    runner
        .run(&strategy, |(folder, edits)| {
            let n = case.fetch_add(1, Ordering::Relaxed);
            if edited(folder, &edits, n) {
                loaded.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        })
        .unwrap();
    let (case, loaded) = (case.into_inner(), loaded.into_inner());
    println!("{loaded} of {case} edited configurations loaded and ran; the rest were refused");
    // Not vacuous: many edits leave a model that still loads and runs (95 of 160 when written).
    assert!(loaded * 4 > case, "only {loaded} of {case} loaded");
}

/// Latent attention's widths set far too large are refused before anything is sized by them
/// (a `qk_rope_head_dim` of 2^40 once aborted the process allocating YaRN's periods: the
/// property above found it).
#[test]
fn huge_latent_widths_are_refused() {
    let huge = values()
        .iter()
        .position(|v| v == &json!(1u64 << 40))
        .unwrap();
    for name in [
        "kv_lora_rank",
        "q_lora_rank",
        "qk_rope_head_dim",
        "qk_nope_head_dim",
        "v_head_dim",
    ] {
        let key = KEYS.iter().position(|k| *k == name).unwrap();
        for folder in [5, 6] {
            assert_eq!(FOLDERS[folder].0, "deepseek_v3");
            assert!(
                !edited(folder, &[(key, huge)], 10_000 + key * 2 + folder),
                "{name} = 2^40 loaded in {:?}",
                FOLDERS[folder]
            );
        }
    }
}

/// The fixtures themselves load (the property above would pass vacuously without them).
#[test]
fn the_unedited_folders_load() {
    for (family, layout) in FOLDERS {
        let dir = kit::dirs::family_fixture_dir(family, layout);
        let options = LoadOptions {
            layers: None,
            format: Some(if *layout == "hf" {
                WeightFormat::F32
            } else {
                WeightFormat::Quantized
            }),
        };
        load_shard(&dir, &options, &mut |_, _| {})
            .unwrap_or_else(|e| panic!("{family}/{layout}: {e} (run `cargo xtask setup`)"));
    }
}
