//! The quantized weight path (the default on Apple GPUs) on the SmolLM2 fixture: the model
//! written as an MLX-community checkpoint by shoal's own exporter (affine 8-bit and 4-bit
//! weights, groups of 64, f32 scales and biases: the layout `mlx_lm.convert -q` writes; the
//! exporter is not mlx-lm, and mlx-lm's own quantized folders are checked against mlx-lm's
//! logits in `families.rs`) and loaded as quantized matrices
//! (`quantized_matmul`, quantized embedding rows).
//!
//! - Its first-step logits match the same checkpoint dequantized to f32 (the same numbers,
//!   multiplied without the quantized kernels) within [`KERNEL_BOUND`]: that tight bound is
//!   what a mistake in how scales and biases are applied would break, and a checkpoint with
//!   one layer's `down_proj` scales 25% off falls far outside it.
//! - They stay within [`BOUNDS`] of the f32 model's: how much quantizing costs, about twice
//!   the error measured.
//! - With x rounded to int8 in the decode-sized products (`SHOAL_QMM=int8`, see
//!   `inference::cpu_kernels`), they stay within [`INT8_BOUNDS`] of the same checkpoint's
//!   exact-x logits, and the greedy next token is one the exact logits rank within that
//!   rounding of the best.

mod common;

use common::{argmax, max_abs_diff, smollm2, temp_dir};
use inference::export::{export_hf_folder_as, ExportWeights};
use inference::{Engine, WeightFormat};
use mlx_rs::Array;
use std::path::Path;

const GROUP_SIZE: i32 = 64;

/// Per bit width: the bound on max |logit difference| from the f32 model (logits are of order
/// 25), about twice the error measured on the fixture (prompt [`common::SMOLLM2_PROMPT`]): 0.60 for
/// 8-bit, 7.06 for 4-bit (the fixture's 4-bit weights, groups of 32, requantized in groups of
/// 64). Quantization error, not a check of the kernels: a 25% error in one layer's scales
/// moved the 4-bit logits by 8.93, within this bound.
const BOUNDS: [(i32, f32); 2] = [(8, 1.2), (4, 14.0)];

/// The bound on max |logit difference| between the quantized path and the same checkpoint
/// dequantized to f32: rounding only (measured: 4.4e-5 for 8-bit, 6.0e-5 for 4-bit; one
/// layer's `down_proj` scales x1.25 gave 4.1 and 4.3).
const KERNEL_BOUND: f32 = 1e-3;

/// Per bit width: the bound on max |logit difference| that rounding x to int8 (per chunk of 32,
/// against centred weights) may add to the exact-x quantized logits, about twice what was
/// measured on the fixture's prompt: 0.72 for 8-bit, 0.76 for 4-bit (logits of order 25; the
/// 8-bit weights themselves cost 0.60).
const INT8_BOUNDS: [(i32, f32); 2] = [(8, 1.4), (4, 1.5)];

/// The deliberately wrong scale: one layer's `down_proj` scales x1.25.
const WRONG_SCALE: (&str, f32) = ("model.layers.0.mlp.down_proj.scales", 1.25);

/// The last position's logits of `model` loaded as `format`.
fn logits(model: &Path, format: WeightFormat) -> Vec<f32> {
    common::prompt_logits(&Engine::load(model, Some(format)).unwrap())
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
fn affine_quantized_logits_match_the_dequantized_checkpoint_and_a_wrong_scale_does_not() {
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

        // x rounded to int8 (`SHOAL_QMM=int8`), then kept in f32 (the default).
        inference::cpu_kernels::round_x_to_int8(true);
        let int8 = logits(&checkpoint, WeightFormat::Quantized);
        inference::cpu_kernels::round_x_to_int8(false);
        let quantized = logits(&checkpoint, WeightFormat::Quantized);
        // The same checkpoint, its weights dequantized to f32 when loaded.
        let dequantized = logits(&checkpoint, WeightFormat::F32);
        let rounding = max_abs_diff(&quantized, &int8);
        let int8_bound = INT8_BOUNDS.iter().find(|(b, _)| *b == bits).unwrap().1;
        eprintln!("{bits}-bit: int8 x moves the logits by {rounding} (bound {int8_bound})");
        assert!(
            rounding < int8_bound,
            "{bits}-bit: int8 x moved the logits by {rounding} (bound {int8_bound})"
        );
        if cfg!(target_arch = "x86_64") && std::is_x86_feature_detected!("avx2") {
            assert!(
                rounding > 1e-3,
                "{bits}-bit: x was not rounded ({rounding})"
            );
        }
        // The int8 choice is one the exact logits rank within the rounding of the best (the
        // fixture's prompt has two next tokens 0.015 apart, so the choice itself may flip).
        let best = quantized[argmax(&quantized) as usize];
        let chosen = quantized[argmax(&int8) as usize];
        assert!(
            best - chosen <= rounding,
            "{bits}-bit: int8 x chose a token {} below the best",
            best - chosen
        );
        let kernel = max_abs_diff(&dequantized, &quantized);
        let diff = max_abs_diff(&reference, &quantized);
        eprintln!(
            "{bits}-bit, groups of {GROUP_SIZE}: max |logit - dequantized logit| = {kernel}, \
             max |logit - f32 model's logit| = {diff}"
        );
        assert!(
            kernel < KERNEL_BOUND,
            "{bits}-bit logits differ from the dequantized checkpoint's by {kernel} (bound \
             {KERNEL_BOUND})"
        );
        assert!(
            diff < bound,
            "{bits}-bit logits differ from f32 by {diff} (bound {bound})"
        );
        // Quantization changed something (the quantized weights were used, not f32 copies).
        assert!(diff > bound / 100.0, "{bits}-bit: difference {diff}");

        // One layer's scales 25% off: far outside the kernel bound.
        let wrong = dir.join("wrong-scale");
        let (name, factor) = WRONG_SCALE;
        with_scaled_tensor(&checkpoint, &wrong, name, factor);
        let off = max_abs_diff(&dequantized, &logits(&wrong, WeightFormat::Quantized));
        eprintln!("{bits}-bit with {name} x{factor}: {off} from the dequantized checkpoint");
        assert!(
            off > 10.0 * KERNEL_BOUND,
            "{bits}-bit: a wrong scale gives {off}, close to the bound {KERNEL_BOUND}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
