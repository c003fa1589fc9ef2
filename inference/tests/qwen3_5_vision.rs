//! Qwen3.5's vision path against mlx-vlm itself (issue 47): `cargo xtask setup` makes a tiny
//! random-weight Qwen3.5 vision model with mlx-vlm's own classes (`qwen3_5/{hf,f32,q4}` under
//! `kit::dirs::vision_fixtures_dir`), with its processor's patches and grid of each test image
//! and, per folder, mlx-vlm's prompt ids, image features, M-RoPE position ids, logits at every
//! position of a prompt holding an image, and greedy answers.
//!
//! shoal must give: the same patches and grids (the pixel budget's resize included), the same
//! prompt ids from the chat, the same positions, the same features (within 1e-4), the same
//! logits on one rank and split in two stages (f32 within 1e-4, 4-bit within 1e-3), the same
//! greedy answers through its decode steps (the positions after the image shifted), and
//! through the batcher beside a text-only sequence, with the prompt cache reusing a follow-up
//! turn's image prefix.

mod common;

use common::{argmax, host, max_abs_diff, vision_fixtures as fixtures};
use inference::batch::{BatchEvent, BatchLimits, Batcher, LocalBatch, PromptCache};
use inference::kv_cache::KvCache;
use inference::loader::{load_shard, open_model, LoadOptions};
use inference::models::qwen3_5_vision::Qwen3_5Vision;
use inference::models::qwen_image_processor::QwenImageProcessor;
use inference::models::shard::ModelShard;
use inference::vision::ReadImagePrompt;
use inference::vision::{splice, PromptImages, VisionTower};
use inference::weights::SafetensorsSource;
use inference::{
    ChatImage, ChatMessage, GenerateRequest, ImagePrompt, Prompt, ShardInput, TemplateInput,
    WeightFormat,
};
use mlx_rs::Array;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

fn arrays(path: &Path) -> HashMap<String, Array> {
    Array::load_safetensors(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn ints(a: &Array) -> Vec<i64> {
    let a = a.as_dtype(mlx_rs::Dtype::Int32).unwrap();
    a.eval().unwrap();
    a.as_slice::<i32>().iter().map(|&v| i64::from(v)).collect()
}

fn folder(layout: &str) -> PathBuf {
    fixtures().join("qwen3_5").join(layout)
}

/// Where each test image lives (`big.png`, past the budget, beside the family's folders).
fn image_path(name: &str) -> PathBuf {
    match name {
        "big.png" => fixtures().join("qwen3_5/big.png"),
        other => fixtures().join("images").join(other),
    }
}

fn image(name: &str) -> ChatImage {
    ChatImage {
        data: std::fs::read(image_path(name)).unwrap(),
        width: 0,
        height: 0,
    }
}

fn reference_json(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap()
}

fn prompt_of(dir: &Path) -> Vec<u32> {
    ints(&arrays(&dir.join("reference.safetensors"))["input_ids"])
        .into_iter()
        .map(|t| t as u32)
        .collect()
}

#[test]
fn qwen3_5s_image_processor_gives_mlx_vlms_patches_and_grids() {
    let processor = QwenImageProcessor::read(&folder("hf")).expect("preprocessor config");
    let reference = arrays(&fixtures().join("qwen3_5/pixel_values.safetensors"));
    let names: Vec<&String> = reference.keys().filter(|k| !k.ends_with(".grid")).collect();
    assert_eq!(names.len(), 4, "{names:?}");
    for name in names {
        let got = processor
            .process(&std::fs::read(image_path(name)).unwrap())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let grid = ints(&reference[&format!("{name}.grid")]);
        assert_eq!(
            [got.grid.0, got.grid.1, got.grid.2].map(i64::from),
            grid[..],
            "{name}"
        );
        let gap = max_abs_diff(&got.values, &host(&reference[name.as_str()]));
        eprintln!("qwen3_5 {name}: grid {grid:?}, largest patch-value gap {gap:e}");
        // PNG: the same bytes after PIL's resize, the same f32 arithmetic. JPEG: the decoders
        // may round a sample differently (a step is 2/255 after normalisation).
        let limit = if name.ends_with(".png") {
            1e-6
        } else {
            4.0 * 2.0 / 255.0 + 1e-6
        };
        assert!(gap <= limit, "{name}: gap {gap} over {limit}");
    }
}

/// The chat's prompt ids as the node renders them: template, expansion, tokenizer.
fn prompt_ids(dir: &Path, images: Vec<ChatImage>, question: &str) -> Vec<u32> {
    let tokenizer = open_model(dir).unwrap().tokenizer;
    let messages = vec![ChatMessage {
        images: images.clone(),
        ..ChatMessage::new("user", question)
    }];
    let text = tokenizer
        .render_chat(&TemplateInput {
            messages: &messages,
            add_generation_prompt: true,
            ..TemplateInput::default()
        })
        .unwrap();
    let vision = ImagePrompt::read(dir, &tokenizer)
        .unwrap()
        .expect("the fixture has a tower");
    tokenizer
        .encode(&vision.expand_images(&text, &images).unwrap())
        .unwrap()
}

#[test]
fn a_chat_with_an_image_renders_to_mlx_vlms_prompt_ids_and_positions() {
    let dir = folder("f32");
    let json = reference_json(&dir);
    let question = json["question"].as_str().unwrap();
    let want = prompt_of(&dir);
    assert_eq!(prompt_ids(&dir, vec![image("square.png")], question), want);
    // The image's size sets its token count: 200×150 is past the budget, resized to 128×96,
    // 6×8 patches, 12 merged tokens.
    let big = prompt_ids(&dir, vec![image("big.png")], question);
    assert_eq!(big.len(), want.len() - 4 + 12);
    let tokenizer = open_model(&dir).unwrap().tokenizer;
    let vision = ImagePrompt::read(&dir, &tokenizer).unwrap().unwrap();
    let e = vision
        .expand_images("no image here", &[image("square.png")])
        .unwrap_err();
    assert!(e.contains("placed 0 images"), "{e}");
    let corrupt = ChatImage {
        data: b"not an image".to_vec(),
        ..ChatImage::default()
    };
    assert!(vision
        .expand_images(&format!("a {} b", vision.image), &[corrupt])
        .is_err());
    // The positions shoal gives the prompt are mlx-vlm's (t, h, w) position ids.
    let (shard, _) = load_shard(&dir, &LoadOptions::default(), &mut |_, _| {}).unwrap();
    let tower = VisionTower::load(&dir, &shard).unwrap().expect("a tower");
    let images = tower.encode(&want, &[image("square.png")]).unwrap();
    let spans = images.mrope().expect("M-RoPE spans");
    let reference = ints(&arrays(&dir.join("reference.safetensors"))["position_ids"]);
    let n = want.len();
    for i in 0..n {
        let got = spans.position(i);
        let expected = [reference[i], reference[n + i], reference[2 * n + i]];
        assert_eq!(got, expected, "position {i}");
    }
}

fn load(dir: &Path, format: WeightFormat, layers: Option<std::ops::Range<usize>>) -> ModelShard {
    load_shard(
        dir,
        &LoadOptions {
            layers,
            format: Some(format),
        },
        &mut |_, _| {},
    )
    .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
    .0
}

/// The prompt's embeddings with `images` spliced in, on the embedding shard.
fn embedded(shard: &ModelShard, tokens: &[u32], images: &PromptImages) -> Array {
    splice(shard.embed(tokens).unwrap(), &images.runs(0..tokens.len())).unwrap()
}

/// One folder: features, and the logits of the prompt on one rank and as 2 stages.
fn check(layout: &str, format: WeightFormat, tolerance: f32) {
    inference::cpu_kernels::round_x_to_int8(false);
    let dir = folder(layout);
    let reference = arrays(&dir.join("reference.safetensors"));
    let shard = load(&dir, format, None);
    let mut source = SafetensorsSource::open(&dir, &shard.config).unwrap();
    let vision = Qwen3_5Vision::load(&dir, &mut source)
        .unwrap()
        .expect("a tower");
    let patches = vision
        .processor
        .process(&std::fs::read(image_path("square.png")).unwrap())
        .unwrap();
    assert!(max_abs_diff(&patches.values, &host(&reference["pixel_values"])) <= 1e-6);
    let features = vision.features(&patches).unwrap();
    let feature_gap = max_abs_diff(&host(&features), &host(&reference["image_features"]));
    let tokens = prompt_of(&dir);
    let tower = VisionTower::load(&dir, &shard).unwrap().unwrap();
    let images = tower.encode(&tokens, &[image("square.png")]).unwrap();
    let spans = images.mrope().cloned();
    let mut cache = shard.new_cache();
    cache.set_mrope(spans.clone());
    let logits = shard
        .forward(
            ShardInput::Hidden(embedded(&shard, &tokens, &images)),
            &mut cache,
            false,
        )
        .unwrap();
    let want = host(&reference["logits"]);
    let logit_gap = max_abs_diff(&host(&logits), &want);
    // The stages of a layer split: the first embeds and splices, every stage's cache knows
    // the spans.
    let layers = shard.config.num_layers;
    let (first, second) = (
        load(&dir, format, Some(0..layers / 2)),
        load(&dir, format, Some(layers / 2..layers)),
    );
    let (mut c1, mut c2) = (first.new_cache(), second.new_cache());
    c1.set_mrope(spans.clone());
    c2.set_mrope(spans);
    let hidden = first
        .forward(
            ShardInput::Hidden(embedded(&first, &tokens, &images)),
            &mut c1,
            false,
        )
        .unwrap();
    let split = second
        .forward(ShardInput::Hidden(hidden), &mut c2, false)
        .unwrap();
    let split_gap = max_abs_diff(&host(&split), &want);
    // Not passing without the image's positions: plain positions move the logits.
    let flat = shard
        .forward(
            ShardInput::Hidden(embedded(&shard, &tokens, &images)),
            &mut shard.new_cache(),
            false,
        )
        .unwrap();
    let flat_gap = max_abs_diff(&host(&flat), &want);
    eprintln!(
        "qwen3_5/{layout}: features within {feature_gap:e}, logits within {logit_gap:e} on \
         one rank and {split_gap:e} as 2 stages ({} positions); {flat_gap:e} without M-RoPE",
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
    assert!(
        split_gap <= tolerance,
        "{layout}: 2 stages differ by {split_gap}"
    );
    assert!(
        flat_gap > 10.0 * tolerance,
        "{layout}: M-RoPE changes nothing ({flat_gap})"
    );
}

#[test]
fn qwen3_5_f32_with_an_image_gives_mlx_vlms_features_and_logits() {
    check("f32", WeightFormat::F32, 1e-4);
}

#[test]
fn qwen3_5_hf_layout_with_an_image_gives_mlx_vlms_features_and_logits() {
    check("hf", WeightFormat::F32, 1e-4);
}

#[test]
fn qwen3_5_q4_with_an_image_gives_mlx_vlms_features_and_logits() {
    check("q4", WeightFormat::Quantized, 1e-3);
}

fn answers(dir: &Path) -> BTreeMap<String, Vec<u32>> {
    reference_json(dir)["answers"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, a)| {
            let tokens = a["tokens"].as_array().unwrap();
            let tokens = tokens.iter().map(|t| t.as_u64().unwrap() as u32).collect();
            (name.clone(), tokens)
        })
        .collect()
}

/// The chat's prompt for each test image (its token count follows the image's size).
fn prompt_for(dir: &Path, name: &str) -> Vec<u32> {
    let question = reference_json(dir)["question"].as_str().unwrap().to_owned();
    prompt_ids(dir, vec![image(name)], &question)
}

/// mlx-vlm's greedy answer for each test image through shoal's prefill and decode steps on
/// one KV cache: positions after the image continue shifted.
fn greedy_answers(layout: &str, format: WeightFormat) {
    inference::cpu_kernels::round_x_to_int8(false);
    let dir = folder(layout);
    let shard = load(&dir, format, None);
    let tower = VisionTower::load(&dir, &shard).unwrap().unwrap();
    let all = answers(&dir);
    assert_eq!(all.len(), 4);
    for (name, want) in &all {
        let tokens = prompt_for(&dir, name);
        let images = tower.encode(&tokens, &[image(name)]).unwrap();
        let mut cache = shard.new_cache();
        cache.set_mrope(images.mrope().cloned());
        let mut logits = shard
            .forward(
                ShardInput::Hidden(embedded(&shard, &tokens, &images)),
                &mut cache,
                true,
            )
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
        eprintln!("qwen3_5/{layout} {name}: {got:?}");
        assert_eq!(&got, want, "{layout}: {name}");
    }
}

#[test]
fn qwen3_5_f32_answers_each_image_as_mlx_vlm_does() {
    greedy_answers("f32", WeightFormat::F32);
}

#[test]
fn qwen3_5_q4_answers_each_image_as_mlx_vlm_does() {
    greedy_answers("q4", WeightFormat::Quantized);
}

/// Tokens and cached prompt positions of each request, run together to the end.
fn run(b: &mut Batcher<'_>, requests: &[GenerateRequest]) -> BTreeMap<u64, (Vec<u32>, usize)> {
    for (i, r) in requests.iter().enumerate() {
        b.submit(i as u64, r).unwrap();
    }
    let mut out: BTreeMap<u64, (Vec<u32>, usize)> = BTreeMap::new();
    let mut done = 0;
    for _ in 0..1000 {
        for (id, event) in b.step().unwrap() {
            let entry = out.entry(id).or_default();
            match event {
                BatchEvent::Token { token, .. } => entry.0.push(token),
                BatchEvent::Cached { tokens } => entry.1 = tokens,
                BatchEvent::Done(_) => done += 1,
                BatchEvent::Failed { message, .. } => panic!("request {id}: {message}"),
            }
        }
        if done == requests.len() {
            assert!(b.is_idle());
            return out;
        }
    }
    panic!("the batch never finished");
}

/// The batcher (the runner's path): every image in one batch beside a text-only sequence,
/// each answering as alone; a follow-up turn with the same image reuses the first turn's
/// state and answers as without the prompt cache.
fn batched(layout: &str, format: WeightFormat) {
    inference::cpu_kernels::round_x_to_int8(false);
    let dir = folder(layout);
    let (shard, tokenizer) = load_shard(
        &dir,
        &LoadOptions {
            layers: None,
            format: Some(format),
        },
        &mut |_, _| {},
    )
    .unwrap();
    let tower = VisionTower::load(&dir, &shard).unwrap().unwrap();
    let all = answers(&dir);
    let request = |name: &str, len: usize| {
        let mut r = GenerateRequest::new(Prompt::Tokens(prompt_for(&dir, name)), len);
        r.images = vec![image(name)];
        r
    };
    let limits = BatchLimits {
        max_sequences: 8,
        kv_tokens: 4096,
    };
    // Text alone, as it answers by itself (one sequence).
    let words: Vec<u32> = prompt_of(&dir)
        .into_iter()
        .filter(|t| !(49152..=49155).contains(t))
        .collect();
    let text = GenerateRequest::new(Prompt::Tokens(words), 6);
    let alone = {
        let bare = LocalBatch::new(&shard, 1).unwrap();
        let mut b = Batcher::new(Box::new(bare), &tokenizer, limits);
        run(&mut b, std::slice::from_ref(&text))[&0].0.clone()
    };
    let mut requests: Vec<GenerateRequest> = all.iter().map(|(n, w)| request(n, w.len())).collect();
    requests.push(text);
    let forward = LocalBatch::new(&shard, 8).unwrap();
    let mut b = Batcher::new(Box::new(forward), &tokenizer, limits).with_vision(Some(&tower));
    let got = run(&mut b, &requests);
    for (i, (name, want)) in all.iter().enumerate() {
        eprintln!("qwen3_5/{layout} batched {name}: {:?}", got[&(i as u64)].0);
        assert_eq!(&got[&(i as u64)].0, want, "{layout}: {name} in a batch");
    }
    assert_eq!(
        got[&(all.len() as u64)].0,
        alone,
        "{layout}: the text beside"
    );
    // A follow-up turn: the first turn's prompt and answer, then more.
    let prompt = prompt_for(&dir, "square.png");
    let answer = &all["square.png"];
    let mut follow_up = prompt.clone();
    follow_up.extend(answer);
    follow_up.extend([2, 198, 1, 4093, 198, 1780, 314]);
    let turn = || {
        let mut r = GenerateRequest::new(Prompt::Tokens(follow_up.clone()), 4);
        r.images = vec![image("square.png")];
        r
    };
    let cold = {
        let bare = LocalBatch::new(&shard, 1).unwrap();
        let mut b = Batcher::new(Box::new(bare), &tokenizer, limits).with_vision(Some(&tower));
        run(&mut b, &[turn()])[&0].clone()
    };
    let mut cache = PromptCache::<KvCache>::new(2048);
    let forward = LocalBatch::new(&shard, 4).unwrap();
    let mut b = Batcher::new(Box::new(forward), &tokenizer, limits)
        .with_prompt_cache(&mut cache)
        .with_vision(Some(&tower));
    assert_eq!(
        &run(&mut b, &[request("square.png", answer.len())])[&0].0,
        answer
    );
    let warm = run(&mut b, &[turn()]);
    eprintln!(
        "qwen3_5/{layout}: follow-up reused {} of {} positions: {:?} (cold {:?})",
        warm[&0].1,
        follow_up.len(),
        warm[&0].0,
        cold.0
    );
    assert!(warm[&0].1 > prompt.len(), "{layout}: nothing reused");
    assert_eq!(warm[&0].0, cold.0, "{layout}: the follow-up's answer");
}

#[test]
fn the_batcher_answers_each_image_as_mlx_vlm_does_f32() {
    batched("f32", WeightFormat::F32);
}

#[test]
fn the_batcher_answers_each_image_as_mlx_vlm_does_q4() {
    batched("q4", WeightFormat::Quantized);
}

/// What placement counts for the tower is what its files hold, in f32.
#[test]
fn the_towers_counted_bytes_are_its_parameters_in_f32() {
    let dir = folder("hf");
    let weights = Array::load_safetensors(dir.join("model.safetensors")).unwrap();
    let stored: u64 = weights
        .iter()
        .filter(|(name, _)| name.starts_with("model.visual."))
        .map(|(_, a)| a.size() as u64)
        .sum();
    let tokenizer = open_model(&dir).unwrap().tokenizer;
    let vision = ImagePrompt::read(&dir, &tokenizer).unwrap().unwrap();
    assert!(stored > 0);
    assert_eq!(vision.tower_bytes, 4 * stored);
    // mlx-lm's Qwen3.5 fixture keeps `vision_config` but not the tower (as a text-only
    // conversion does): it takes text only, from the prompt to the runner.
    let text_only = kit::dirs::family_fixture_dir("qwen3_5", "q4");
    let tokenizer = open_model(&text_only).unwrap().tokenizer;
    assert_eq!(ImagePrompt::read(&text_only, &tokenizer).unwrap(), None);
    let (shard, _) = load_shard(&text_only, &LoadOptions::default(), &mut |_, _| {}).unwrap();
    assert!(VisionTower::load(&text_only, &shard).unwrap().is_none());
}
