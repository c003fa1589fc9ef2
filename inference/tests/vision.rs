//! The vision models against mlx-vlm itself (issue 47): `cargo xtask setup` makes a tiny
//! random-weight Gemma 3 vision model with mlx-vlm's own classes and a few synthetic images
//! (`kit::dirs::vision_fixtures_dir`), with the image processor's pixel values of each image
//! (transformers' Gemma 3 processor, as mlx-vlm loads it) and, for each folder (`hf`, `f32`,
//! `q4`), mlx-vlm's image features and logits at every position of a prompt holding an image.
//!
//! shoal must give: the same pixel values (PNG bit for bit, JPEG within the decoders'
//! rounding), the same image features, and the same logits with the image embeddings spliced
//! into the prompt on one rank and as a 2-stage layer split (f32 within 1e-4, 4-bit within
//! 1e-3).

mod common;

use common::{argmax, host, max_abs_diff, vision_fixtures as fixtures};
use inference::loader::{load_shard, LoadOptions};
use inference::models::gemma3_vision::Gemma3Vision;
use inference::models::image_processor::ImageProcessor;
use inference::weights::SafetensorsSource;
use inference::{ShardInput, WeightFormat};
use mlx_rs::Array;
use std::collections::HashMap;
use std::path::Path;

fn arrays(path: &Path) -> HashMap<String, Array> {
    Array::load_safetensors(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn gemma3s_image_processor_gives_the_references_pixel_values() {
    let root = fixtures();
    let processor = ImageProcessor::read(&root.join("gemma3/hf")).expect("preprocessor config");
    let reference = arrays(&root.join("gemma3/pixel_values.safetensors"));
    assert_eq!(reference.len(), 3, "{:?}", reference.keys());
    for (name, expected) in &reference {
        let bytes = std::fs::read(root.join("images").join(name)).unwrap();
        let got = processor
            .process(&bytes)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let gap = max_abs_diff(&got, &host(expected));
        eprintln!("{name}: largest pixel-value gap to transformers {gap:e}");
        // PNG: bit for bit. JPEG: the decoders may round an 8-bit sample differently (one
        // step is 2/255 after normalisation); a few steps at most.
        let limit = if name.ends_with(".png") {
            0.0
        } else {
            4.0 * 2.0 / 255.0 + 1e-6
        };
        assert!(gap <= limit, "{name}: gap {gap} over {limit}");
    }
}

/// One folder: pixel values, the tower's features and the logits of the prompt, one rank.
fn check(layout: &str, format: WeightFormat, tolerance: f32) {
    inference::cpu_kernels::round_x_to_int8(false);
    let root = fixtures();
    let dir = root.join("gemma3").join(layout);
    let reference = arrays(&dir.join("reference.safetensors"));
    let get = |k: &str| {
        reference
            .get(k)
            .unwrap_or_else(|| panic!("{layout}: no `{k}` in the reference"))
    };
    let load = |layers: Option<std::ops::Range<usize>>| {
        load_shard(
            &dir,
            &LoadOptions {
                layers,
                format: Some(format),
            },
            &mut |_, _| {},
        )
        .unwrap_or_else(|e| panic!("{layout}: {e}"))
        .0
    };
    let shard = load(None);
    let mut source = SafetensorsSource::open(&dir, &shard.config).unwrap();
    let vision = Gemma3Vision::load(&dir, &mut source)
        .unwrap()
        .expect("a vision model");
    let image = std::fs::read(root.join("images/square.png")).unwrap();
    let pixels = vision.pixel_values(&[&image]).unwrap();
    assert_eq!(
        max_abs_diff(&host(&pixels), &host(get("pixel_values"))),
        0.0
    );
    let features = vision.features(&pixels).unwrap();
    let feature_gap = max_abs_diff(&host(&features), &host(get("image_features")));
    let ids = get("input_ids").as_dtype(mlx_rs::Dtype::Int32).unwrap();
    ids.eval().unwrap();
    let tokens: Vec<u32> = ids.as_slice::<i32>().iter().map(|&t| t as u32).collect();
    let embedded = vision.embed_prompt(&shard, &tokens, &features).unwrap();
    let mut cache = shard.new_cache();
    let logits = shard
        .forward(ShardInput::Hidden(embedded), &mut cache, false)
        .unwrap();
    let want = host(get("logits"));
    let got = host(&logits);
    let logit_gap = max_abs_diff(&got, &want);
    eprintln!(
        "gemma3/{layout}: image features within {feature_gap:e}, logits within {logit_gap:e} \
         of mlx-vlm ({} positions)",
        tokens.len()
    );
    assert!(
        feature_gap <= 1e-4,
        "{layout}: features differ by {feature_gap}"
    );
    assert!(
        logit_gap <= tolerance,
        "{layout}: logits differ by {logit_gap}"
    );
    // A 2-stage layer split: the first stage embeds (and splices), the second is a plain text
    // stage fed hidden states.
    let layers = shard.config.num_layers;
    let (first, second) = (load(Some(0..layers / 2)), load(Some(layers / 2..layers)));
    let embedded = vision.embed_prompt(&first, &tokens, &features).unwrap();
    let hidden = first
        .forward(ShardInput::Hidden(embedded), &mut first.new_cache(), false)
        .unwrap();
    let split = second
        .forward(ShardInput::Hidden(hidden), &mut second.new_cache(), false)
        .unwrap();
    let split_gap = max_abs_diff(&host(&split), &want);
    eprintln!("gemma3/{layout}: as 2 stages, logits within {split_gap:e}");
    assert!(
        split_gap <= tolerance,
        "{layout}: 2 stages differ by {split_gap}"
    );
    // Not a test that passes without the image: the image positions' logits move when the
    // features are left out (text embeddings of the image token instead).
    let plain = shard
        .forward(ShardInput::Tokens(&tokens), &mut shard.new_cache(), false)
        .unwrap();
    let without = max_abs_diff(&host(&plain), &want);
    assert!(
        without > 100.0 * tolerance,
        "{layout}: the image changes nothing ({without})"
    );
}

#[test]
fn gemma3_f32_with_an_image_gives_mlx_vlms_logits() {
    check("f32", WeightFormat::F32, 1e-4);
}

#[test]
fn gemma3_hf_layout_with_an_image_gives_mlx_vlms_logits() {
    check("hf", WeightFormat::F32, 1e-4);
}

#[test]
fn gemma3_q4_with_an_image_gives_mlx_vlms_logits() {
    check("q4", WeightFormat::Quantized, 1e-3);
}

/// mlx-vlm's greedy answer for each test image, token for token, through shoal's prefill (the
/// image spliced in) and decode steps on its KV cache: the resized RGBA PNG and the JPEG too.
fn greedy_answers(layout: &str, format: WeightFormat) {
    inference::cpu_kernels::round_x_to_int8(false);
    let root = fixtures();
    let dir = root.join("gemma3").join(layout);
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let prompt = arrays(&dir.join("reference.safetensors"))["input_ids"]
        .as_dtype(mlx_rs::Dtype::Int32)
        .unwrap();
    prompt.eval().unwrap();
    let tokens: Vec<u32> = prompt.as_slice::<i32>().iter().map(|&t| t as u32).collect();
    let options = LoadOptions {
        layers: None,
        format: Some(format),
    };
    let (shard, _) = load_shard(&dir, &options, &mut |_, _| {}).unwrap();
    let mut source = SafetensorsSource::open(&dir, &shard.config).unwrap();
    let vision = Gemma3Vision::load(&dir, &mut source).unwrap().unwrap();
    let answers = reference["answers"].as_object().expect("answers");
    assert_eq!(answers.len(), 3);
    let mut distinct = std::collections::HashSet::new();
    for (image, answer) in answers {
        let want: Vec<u32> = answer["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect();
        let bytes = std::fs::read(root.join("images").join(image)).unwrap();
        let features = vision
            .features(&vision.pixel_values(&[&bytes]).unwrap())
            .unwrap();
        let mut cache = shard.new_cache();
        let embedded = vision.embed_prompt(&shard, &tokens, &features).unwrap();
        let mut logits = shard
            .forward(ShardInput::Hidden(embedded), &mut cache, true)
            .unwrap();
        let mut got = Vec::new();
        while got.len() < want.len() {
            let next = argmax(&host(&logits));
            if next == 0 || next == 2 {
                break;
            }
            got.push(next);
            logits = shard
                .forward(ShardInput::Tokens(&[next]), &mut cache, true)
                .unwrap();
        }
        eprintln!("gemma3/{layout} {image}: {got:?}");
        assert_eq!(got, want, "{layout}: {image}");
        distinct.insert(got);
    }
    assert!(
        distinct.len() > 1,
        "{layout}: every image gave the same answer"
    );
}

#[test]
fn gemma3_f32_answers_each_image_as_mlx_vlm_does() {
    greedy_answers("f32", WeightFormat::F32);
}

#[test]
fn gemma3_q4_answers_each_image_as_mlx_vlm_does() {
    greedy_answers("q4", WeightFormat::Quantized);
}
