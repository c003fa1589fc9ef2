//! The quantized weight path (the default on Apple GPUs) against the f32 path, on the SmolLM2
//! fixture: the model written as an MLX-community checkpoint (affine 8-bit and 4-bit weights,
//! groups of 64, f32 scales and biases, as `mlx_lm.convert -q` writes it), loaded as quantized
//! matrices (`quantized_matmul`, quantized embedding rows), and its first-step logits compared
//! with the f32 model's within bounds set at about twice the error measured. A checkpoint with
//! one deliberately wrong scale tensor must fall outside the bound, so the bound can fail.

mod common;

use common::{max_abs_diff, smollm2, temp_dir, SMOLLM2_PROMPT};
use inference::export::{export_hf_folder_as, ExportWeights};
use inference::forward::last_logits_to_host;
use inference::{Engine, ShardInput, WeightFormat};
use mlx_rs::Array;
use std::path::Path;

const GROUP_SIZE: i32 = 64;

/// Per bit width: the bound on max |logit difference| from f32 (logits are of order 25), about
/// twice the error measured on the fixture (prompt [`SMOLLM2_PROMPT`]): 0.60 for 8-bit, 7.06
/// for 4-bit (the fixture's 4-bit weights, groups of 32, requantized in groups of 64).
const BOUNDS: [(i32, f32); 2] = [(8, 1.2), (4, 14.0)];

/// The deliberately wrong scale: the embedding's (also the tied output head's) scales doubled.
/// Measured with one layer's `down_proj` scales x1.25 instead: 3.87 for 8-bit (caught), 8.93
/// for 4-bit (within its bound), hence the larger mistake.
const WRONG_SCALE: (&str, f32) = ("model.embed_tokens.scales", 2.0);

fn prompt() -> Vec<u32> {
    SMOLLM2_PROMPT
        .split(',')
        .map(|t| t.parse().unwrap())
        .collect()
}

/// The last position's logits of `model` loaded as `format`.
fn logits(model: &Path, format: WeightFormat) -> Vec<f32> {
    let engine = Engine::load(model, Some(format)).unwrap();
    let mut cache = engine.model.new_cache();
    let ids = prompt();
    last_logits_to_host(
        &engine
            .model
            .forward(ShardInput::Tokens(&ids), &mut cache, true)
            .unwrap(),
    )
    .unwrap()
}

/// A copy of the checkpoint at `from` whose tensor `name` is multiplied by `factor`.
fn with_scaled_tensor(from: &Path, to: &Path, name: &str, factor: f32) {
    std::fs::create_dir_all(to).unwrap();
    for file in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(from.join(file), to.join(file)).unwrap();
    }
    let mut tensors = Array::load_safetensors(from.join("model.safetensors")).unwrap();
    let t = tensors.get_mut(name).unwrap();
    *t = mlx_rs::ops::multiply(&*t, Array::from_f32(factor)).unwrap();
    let mut named: Vec<(&String, &Array)> = tensors.iter().collect();
    named.sort_by_key(|(name, _)| *name);
    Array::save_safetensors(
        named.into_iter().map(|(n, a)| (n.as_str(), a)),
        None,
        to.join("model.safetensors"),
    )
    .unwrap();
}

#[test]
fn affine_quantized_logits_stay_close_to_f32_and_a_wrong_scale_does_not() {
    let fixture = smollm2();
    let reference = logits(&fixture, WeightFormat::F32);
    for (bits, bound) in BOUNDS {
        let dir = temp_dir(&format!("q{bits}"));
        let checkpoint = dir.join("model");
        export_hf_folder_as(
            &fixture,
            &checkpoint,
            ExportWeights::Affine {
                bits,
                group_size: GROUP_SIZE,
            },
        )
        .unwrap();
        // The checkpoint really is quantized: packed words with per-group scales.
        let stored = Array::load_safetensors(checkpoint.join("model.safetensors")).unwrap();
        let scales = &stored["model.layers.0.mlp.down_proj.scales"];
        assert_eq!(scales.shape(), &[576, 1536 / GROUP_SIZE]);
        assert_eq!(
            stored["model.layers.0.mlp.down_proj.weight"].shape(),
            &[576, 1536 * bits / 32]
        );

        let quantized = logits(&checkpoint, WeightFormat::Quantized);
        let diff = max_abs_diff(&reference, &quantized);
        eprintln!("{bits}-bit, groups of {GROUP_SIZE}: max |logit - f32 logit| = {diff}");
        assert!(
            diff < bound,
            "{bits}-bit logits differ from f32 by {diff} (bound {bound})"
        );
        // Quantization changed something (the quantized weights were used, not f32 copies).
        assert!(diff > bound / 100.0, "{bits}-bit: difference {diff}");

        // One scale tensor wrong: the bound catches it.
        let wrong = dir.join("wrong-scale");
        let (name, factor) = WRONG_SCALE;
        with_scaled_tensor(&checkpoint, &wrong, name, factor);
        let off = max_abs_diff(&reference, &logits(&wrong, WeightFormat::Quantized));
        eprintln!("{bits}-bit with {name} x{factor}: {off}");
        assert!(
            off > bound,
            "{bits}-bit: a wrong scale gives {off}, within the bound {bound}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
