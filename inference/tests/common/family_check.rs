//! The check every family fixture runs (`tests/families.rs`): a folder `cargo xtask setup`
//! made with mlx-lm, loaded as one shard, as 2- and 3-stage layer splits, fed in chunks where
//! its caches trim or carry state, and inside a batch with other sequences joining and
//! leaving, each against mlx-lm's logits of that folder.

use super::reference::{fixture, rows_of, worst, Reference};
use super::{argmax, max_abs_diff};
use inference::batch::LocalBatch;
use inference::loader::{load_shard, LoadOptions};
use inference::{ModelShard, ShardInput, WeightFormat};
use mlx_rs::Array;
use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;

/// Loads `dir` (its `layers`, or all) in `format`, panicking with the folder on failure.
pub fn load(dir: &Path, layers: Option<Range<usize>>, format: WeightFormat) -> ModelShard {
    let options = LoadOptions {
        layers,
        format: Some(format),
    };
    load_shard(dir, &options, &mut |_, _| {})
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .0
}

/// Runs the reference's prompt and decode tokens through `stages` (a layer split of the
/// model, in order) and returns (prefill logits, decode logits).
pub fn run_stages(stages: &[ModelShard], reference: &Reference) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let mut caches: Vec<_> = stages.iter().map(ModelShard::new_cache).collect();
    let mut pass = |tokens: &[u32]| -> Vec<Vec<f32>> {
        let mut input = ShardInput::Tokens(tokens);
        for (stage, cache) in stages.iter().zip(caches.iter_mut()) {
            let out = stage.forward(input, cache, false).unwrap();
            input = ShardInput::Hidden(out);
        }
        match input {
            ShardInput::Hidden(logits) => rows_of(&logits),
            ShardInput::Tokens(_) => unreachable!("at least one stage"),
        }
    };
    let prefill = pass(&reference.prompt);
    let decode = reference
        .decode_tokens
        .iter()
        .map(|&t| pass(&[t]).remove(0))
        .collect();
    (prefill, decode)
}

/// Checks one folder: one shard, 2- and 3-stage splits, and a batch.
pub fn check(family: &str, layout: &str, format: WeightFormat, tolerance: f32) {
    // mlx-lm's quantized products keep x in f32; so do shoal's here (the int8 decode path's
    // rounding is bounded in `cpu_qmm.rs` and on SmolLM2 in `quantized.rs`).
    inference::cpu_kernels::round_x_to_int8(false);
    let dir = fixture(family, layout);
    let reference = Reference::read(&dir);
    let whole = load(&dir, None, format);
    let layers = whole.config.num_layers;
    // The reference is not degenerate: logits spread, greedy tokens vary.
    let spread = reference.prefill[0].iter().fold(f32::MIN, |m, &x| m.max(x))
        - reference.prefill[0].iter().fold(f32::MAX, |m, &x| m.min(x));
    assert!(
        spread > 0.1,
        "{family}/{layout}: reference logits spread {spread}"
    );
    assert_eq!(
        reference.decode_tokens[0],
        argmax(reference.prefill.last().unwrap()),
        "{family}/{layout}: the reference's first decode token is its greedy choice"
    );

    if layout == "hf" {
        // The names the hub picks each pipeline rank's files by are the checkpoint's names.
        // A multimodal release's language model is read under its text model's names.
        let stored: HashMap<String, Array> = Array::load_safetensors(dir.join("model.safetensors"))
            .unwrap()
            .into_iter()
            .map(|(k, v)| (inference::weights::text_model_name(&k).into_owned(), v))
            .collect();
        for name in inference::models::tensor_names(&whole.config) {
            assert!(
                stored.contains_key(&name),
                "{family}: `{name}` is not in the checkpoint"
            );
        }
    }

    let (prefill, decode) = run_stages(std::slice::from_ref(&whole), &reference);
    let (p, d) = (
        worst(&reference.prefill, &prefill),
        worst(&reference.decode, &decode),
    );
    println!("{family}/{layout} one shard: prefill {p:.2e}, cached decode {d:.2e}");
    assert!(
        p < tolerance,
        "{family}/{layout}: prefill logits differ from mlx-lm's by {p}"
    );
    assert!(
        d < tolerance,
        "{family}/{layout}: decode logits differ from mlx-lm's by {d}"
    );

    for cuts in [vec![0, 1, layers], vec![0, 1, 2, layers]] {
        if cuts.windows(2).any(|w| w[0] >= w[1]) {
            continue;
        }
        // A cut between a KV-shared layer and the layer whose keys it reads is refused
        // (`gemma4_text_e2b`; its own test asserts the reason), and only such a cut.
        let options = |w: &[usize]| LoadOptions {
            layers: Some(w[0]..w[1]),
            format: Some(format),
        };
        let refused = cuts.windows(2).find_map(|w| {
            load_shard(&dir, &options(w), &mut |_, _| {})
                .err()
                .map(|e| e.to_string())
        });
        if let Some(reason) = refused {
            assert!(
                reason.contains("a cut must keep a KV-shared layer with its source"),
                "{family}/{layout}: a split at {cuts:?} refused: {reason}"
            );
            println!("{family}/{layout} stages {cuts:?}: refused ({reason})");
            continue;
        }
        let stages: Vec<ModelShard> = cuts
            .windows(2)
            .map(|w| load(&dir, Some(w[0]..w[1]), format))
            .collect();
        let (prefill, decode) = run_stages(&stages, &reference);
        let worst = worst(&reference.prefill, &prefill).max(worst(&reference.decode, &decode));
        println!("{family}/{layout} stages {cuts:?}: {worst:.2e}");
        assert!(
            worst < tolerance,
            "{family}/{layout}: a pipeline split at {cuts:?} differs from mlx-lm by {worst}"
        );
    }

    // Sliding layers forget what their window no longer sees: in small chunks the caches
    // trim many times over the reference's positions, and the decode rows too over a longer
    // batched run. Recurrent layers carry their state from chunk to chunk.
    // Sparse attention's indexer keys are cache state too (MiniMax M3's blocks are cut over
    // positions: chunks of 5 straddle them), and Llama 4's query scale depends
    // on each position: chunks exercise their offsets.
    let chunked = whole.config.sliding_window.is_some()
        || whole.config.attention.linear.is_some()
        || whole.config.attention.block_index.is_some()
        || whole
            .config
            .attention
            .latent
            .as_ref()
            .is_some_and(|l| l.indexer.is_some() || l.position_scale.is_some());
    let decode = if chunked {
        for chunk in [1, 5] {
            let worst = in_chunks(&whole, &reference, chunk);
            println!("{family}/{layout} in chunks of {chunk}: {worst:.2e}");
            assert!(
                worst < tolerance,
                "{family}/{layout}: fed {chunk} at a time, logits differ from mlx-lm's by {worst}"
            );
        }
        24
    } else {
        4
    };
    let mut batch = LocalBatch::new(&whole, 4).unwrap();
    let (steps, worst) =
        super::batched::check_batched(&mut batch, &whole, &reference.prompt, decode, tolerance);
    println!("{family}/{layout} batched: {steps} steps, worst {worst:.2e}");
}

/// Feeds the reference's prompt and decode tokens `chunk` at a time through one cache and
/// returns the worst difference from mlx-lm's logits at every position, checking that each
/// sliding layer holds no more than its bound.
fn in_chunks(whole: &ModelShard, reference: &Reference, chunk: usize) -> f32 {
    let tokens: Vec<u32> = reference
        .prompt
        .iter()
        .chain(&reference.decode_tokens)
        .copied()
        .collect();
    let want: Vec<Vec<f32>> = reference
        .prefill
        .iter()
        .chain(&reference.decode)
        .cloned()
        .collect();
    let window = whole.config.sliding_window.as_ref();
    let mut cache = whole.new_cache();
    let mut got = Vec::new();
    for part in tokens.chunks(chunk) {
        let out = whole
            .forward(ShardInput::Tokens(part), &mut cache, false)
            .unwrap();
        got.extend(rows_of(&out));
        for (layer, held) in cache.layers.iter().enumerate() {
            let Some(window) = window else { break };
            if window.of_layer(layer).is_some() {
                assert!(
                    held.held() <= inference::kv_cache::held_bound(window.size) + chunk,
                    "layer {layer} holds {} positions",
                    held.held()
                );
            }
        }
    }
    assert!(
        window.is_none() || cache.layers.iter().any(|l| l.dropped() > 0),
        "no sliding layer forgot anything over {} positions",
        tokens.len()
    );
    // The reference's decode logits are those after each decode token: positions 12.. of
    // `tokens` give the prefill's last and then each decode step's.
    let n = reference.prompt.len();
    let mut worst = worst(&want[..n], &got[..n]);
    for (k, logits) in reference.decode.iter().enumerate() {
        worst = worst.max(max_abs_diff(logits, &got[n + k]));
    }
    worst
}
