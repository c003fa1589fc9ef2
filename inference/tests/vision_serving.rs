//! Images as the runner serves them (issue 47), against mlx-vlm's fixtures
//! (`kit::dirs::vision_fixtures_dir`, made by `cargo xtask setup`):
//!
//! - a chat whose user turn holds an image renders, through the fixture's chat template and
//!   the image-token expansion ([`inference::ImagePrompt`]), to exactly mlx-vlm's prompt ids;
//! - the batcher (the runner's only path) with the vision tower answers each test image as
//!   mlx-vlm does, token for token, the three images in one batch and the prompt chunked so
//!   that a chunk boundary cuts the image span; the reference image's sequence gets mlx-vlm's
//!   logits there (f32 within 1e-4, 4-bit within 1e-3);
//! - the prompt cache keys image spans by the image's content hash: a follow-up turn with the
//!   same image reuses the first turn's state with the same answer as without the cache;
//!   with another image (the same token ids) it reuses none of it and answers as without the
//!   cache.

mod common;

use common::vision_fixtures as root;
use inference::vision::ReadImagePrompt;

use inference::batch::{BatchEvent, BatchForward, BatchLimits, BatchPart, Batcher, LocalBatch};
use inference::batch::{PromptCache, Slot};
use inference::kv_cache::KvCache;
use inference::loader::{load_shard, open_model, LoadOptions};
use inference::vision::VisionTower;
use inference::{
    ChatImage, ChatMessage, GenerateRequest, ImagePrompt, ModelConfig, Prompt, TemplateInput,
    WeightFormat,
};
use mlx_rs::Array;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::Path;
use std::rc::Rc;

fn reference(dir: &Path) -> (Vec<u32>, serde_json::Value) {
    let arrays = Array::load_safetensors(dir.join("reference.safetensors")).unwrap();
    let ids = arrays["input_ids"].as_dtype(mlx_rs::Dtype::Int32).unwrap();
    ids.eval().unwrap();
    let ids = ids.as_slice::<i32>().iter().map(|&t| t as u32).collect();
    let json = std::fs::read_to_string(dir.join("reference.json")).unwrap();
    (ids, serde_json::from_str(&json).unwrap())
}

fn image(name: &str) -> ChatImage {
    ChatImage {
        data: std::fs::read(root().join("images").join(name)).unwrap(),
        width: 0,
        height: 0,
    }
}

fn user_turn(images: Vec<ChatImage>, question: &str) -> Vec<ChatMessage> {
    vec![ChatMessage {
        images,
        ..ChatMessage::new("user", question)
    }]
}

/// The chat's prompt ids as the node renders them: template, expansion, tokenizer.
fn prompt_ids(dir: &Path, messages: &[ChatMessage]) -> Vec<u32> {
    let tokenizer = open_model(dir).unwrap().tokenizer;
    let text = tokenizer
        .render_chat(&TemplateInput {
            messages,
            add_generation_prompt: true,
            ..TemplateInput::default()
        })
        .unwrap();
    let images = messages.iter().map(|m| m.images.len()).sum();
    let vision = ImagePrompt::read(dir, &tokenizer)
        .unwrap()
        .expect("the fixture has a tower");
    tokenizer
        .encode(&vision.expand(&text, images).unwrap())
        .unwrap()
}

#[test]
fn a_chat_with_an_image_renders_to_mlx_vlms_prompt_ids() {
    let dir = root().join("gemma3/f32");
    let (want, json) = reference(&dir);
    let question = json["question"].as_str().unwrap();
    let got = prompt_ids(&dir, &user_turn(vec![image("square.png")], question));
    assert_eq!(got, want);
    // Not equal by accident: without the image the prompt holds no image span.
    let text_only = prompt_ids(&dir, &user_turn(vec![], question));
    assert_ne!(text_only, want);
    // A template that placed fewer images than were sent is refused, not padded.
    let tokenizer = open_model(&dir).unwrap().tokenizer;
    let vision = ImagePrompt::read(&dir, &tokenizer).unwrap().unwrap();
    assert!(vision.expand("no image here", 1).is_err());
}

/// The slots a batch opened, in order, and the first logits each slot's sequence got (those of
/// its prompt's last position).
#[derive(Default)]
struct FirstLogits {
    opened: Vec<Slot>,
    logits: BTreeMap<Slot, Vec<f32>>,
}

/// [`LocalBatch`] whose steps take at most `step` tokens: prompt chunks end inside the image
/// span. It records each sequence's first logits.
struct Chunked<'a> {
    inner: LocalBatch<'a>,
    step: usize,
    seen: Rc<RefCell<FirstLogits>>,
}

impl BatchForward for Chunked<'_> {
    fn config(&self) -> &ModelConfig {
        self.inner.config()
    }
    fn max_sequences(&self) -> usize {
        self.inner.max_sequences()
    }
    fn step_tokens(&self) -> usize {
        self.step
    }
    fn open(&mut self) -> inference::Result<Slot> {
        let slot = self.inner.open()?;
        self.seen.borrow_mut().opened.push(slot);
        Ok(slot)
    }
    fn close(&mut self, slot: Slot) {
        self.inner.close(slot)
    }
    fn keeps_caches(&self) -> bool {
        true
    }
    fn open_from(&mut self, cache: KvCache) -> inference::Result<Slot> {
        self.inner.open_from(cache)
    }
    fn take(&mut self, slot: Slot) -> Option<KvCache> {
        self.inner.take(slot)
    }
    fn step(&mut self, parts: &[BatchPart<'_>]) -> inference::Result<Vec<Vec<f32>>> {
        let logits = self.inner.step(parts)?;
        let mut seen = self.seen.borrow_mut();
        let wanting = parts.iter().filter(|p| p.wants_logits);
        for (part, row) in wanting.zip(&logits) {
            seen.logits.entry(part.slot).or_insert_with(|| row.clone());
        }
        Ok(logits)
    }
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

fn served_like_mlx_vlm(layout: &str, format: WeightFormat, tolerance: f32) {
    inference::cpu_kernels::round_x_to_int8(false);
    let dir = root().join("gemma3").join(layout);
    let (prompt, json) = reference(&dir);
    let first_image = json["image_positions"][0].as_u64().unwrap() as usize;
    let (shard, tokenizer) = load_shard(
        &dir,
        &LoadOptions {
            layers: None,
            format: Some(format),
        },
        &mut |_, _| {},
    )
    .unwrap();
    let tower = VisionTower::load(&dir, &shard).unwrap().expect("a tower");
    let answers = json["answers"].as_object().unwrap();
    let names: Vec<&String> = answers.keys().collect();
    let want = |name: &str| -> Vec<u32> {
        answers[name]["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect()
    };
    let request = |name: &str| {
        let mut r = GenerateRequest::new(Prompt::Tokens(prompt.clone()), want(name).len());
        r.images = vec![image(name)];
        r
    };
    let limits = BatchLimits {
        max_sequences: 4,
        kv_tokens: 4096,
    };
    let mut cache = PromptCache::<KvCache>::new(2048);
    // The first chunk ends two positions into the image span.
    let seen = Rc::new(RefCell::new(FirstLogits::default()));
    let forward = Chunked {
        inner: LocalBatch::new(&shard, 4).unwrap(),
        step: first_image + 2,
        seen: seen.clone(),
    };
    let mut b = Batcher::new(Box::new(forward), &tokenizer, limits)
        .with_prompt_cache(&mut cache)
        .with_vision(Some(&tower));
    // Every image in one batch.
    let requests: Vec<GenerateRequest> = names.iter().map(|n| request(n)).collect();
    let got = run(&mut b, &requests);
    for (i, name) in names.iter().enumerate() {
        eprintln!("gemma3/{layout} {name}: {:?}", got[&(i as u64)]);
        assert_eq!(got[&(i as u64)].0, want(name), "{layout}: {name}");
    }
    // mlx-vlm's logits of the prompt's last position with the reference image, against those
    // the batch gave that image's sequence beside the two others (requests are admitted in
    // order, so request i has the i-th slot opened).
    let at = names
        .iter()
        .position(|n| n.as_str() == json["image"].as_str().unwrap())
        .expect("the reference image among the answers");
    let seen = seen.borrow();
    let got = &seen.logits[&seen.opened[at]];
    let expected = Array::load_safetensors(dir.join("reference.safetensors")).unwrap()["logits"]
        .as_dtype(mlx_rs::Dtype::Float32)
        .unwrap();
    expected.eval().unwrap();
    let expected = expected.as_slice::<f32>();
    let last = &expected[expected.len() - got.len()..];
    let gap = got
        .iter()
        .zip(last)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    eprintln!("gemma3/{layout}: logits inside a batch of 3 within {gap:e} of mlx-vlm's");
    assert!(
        gap <= tolerance,
        "{layout}: logits in a batch differ by {gap}"
    );
    // A follow-up turn: the first turn's whole context (prompt, then the answer as fed) and
    // more, in a fresh cache that holds only the first turn with square.png. Another image
    // (the same token ids) reuses at most the text before its span (keyed by token ids alone
    // it would reuse all of it: square.png's state under wide.png's turn); the same image
    // reuses the whole first turn. Each answers as it does without any prompt cache.
    let answer = want("square.png");
    let mut follow_up = prompt.clone();
    follow_up.extend(&answer[..answer.len() - 1]);
    follow_up.extend([answer[answer.len() - 1], 2, 198, 1, 4093, 198, 1780, 314]);
    let turn = |name: &str| {
        let mut r = GenerateRequest::new(Prompt::Tokens(follow_up.clone()), 4);
        r.images = vec![image(name)];
        r
    };
    let cold = |name: &str| {
        let bare = LocalBatch::new(&shard, 1).unwrap();
        let mut b = Batcher::new(Box::new(bare), &tokenizer, limits).with_vision(Some(&tower));
        run(&mut b, &[turn(name)])[&0].clone()
    };
    let (square_cold, wide_cold) = (cold("square.png"), cold("wide.png"));
    let mut cache = PromptCache::<KvCache>::new(2048);
    let forward = LocalBatch::new(&shard, 4).unwrap();
    let mut b = Batcher::new(Box::new(forward), &tokenizer, limits)
        .with_prompt_cache(&mut cache)
        .with_vision(Some(&tower));
    assert_eq!(run(&mut b, &[request("square.png")])[&0].0, answer);
    let wide = run(&mut b, &[turn("wide.png")]);
    eprintln!(
        "gemma3/{layout}: follow-up with another image: {:?}",
        wide[&0]
    );
    assert!(wide[&0].1 <= first_image, "{layout}: {:?}", wide[&0]);
    assert_eq!(wide[&0].0, wide_cold.0, "{layout}: another image");
    let square = run(&mut b, &[turn("square.png")]);
    assert_eq!(
        square[&0],
        (square_cold.0.clone(), prompt.len() + answer.len() - 1),
        "{layout}: the same image reuses the first turn"
    );
    // A request with images where no tower runs is refused, never served as text.
    let bare = LocalBatch::new(&shard, 1).unwrap();
    let mut text_only = Batcher::new(Box::new(bare), &tokenizer, limits);
    let e = text_only.submit(0, &request("wide.png")).unwrap_err();
    assert!(e.to_string().contains("does not accept images"), "{e}");
}

#[test]
fn the_batcher_answers_each_image_as_mlx_vlm_does_f32() {
    served_like_mlx_vlm("f32", WeightFormat::F32, 1e-4);
}

#[test]
fn the_batcher_answers_each_image_as_mlx_vlm_does_q4() {
    served_like_mlx_vlm("q4", WeightFormat::Quantized, 1e-3);
}

/// What placement counts for the tower is what its files hold: the parameters of every
/// `vision_tower.*` and `multi_modal_projector.*` tensor of the Hugging Face folder, in float32.
#[test]
fn the_towers_counted_bytes_are_its_parameters_in_f32() {
    let dir = root().join("gemma3/hf");
    let weights = Array::load_safetensors(dir.join("model.safetensors")).unwrap();
    let stored: u64 = weights
        .iter()
        .filter(|(name, _)| {
            name.starts_with("vision_tower.") || name.starts_with("multi_modal_projector.")
        })
        .map(|(_, a)| a.size() as u64)
        .sum();
    let tokenizer = open_model(&dir).unwrap().tokenizer;
    let vision = ImagePrompt::read(&dir, &tokenizer).unwrap().unwrap();
    assert!(stored > 0);
    assert_eq!(vision.tower_bytes, 4 * stored);
    // A text-only Gemma 3 (mlx-lm's `gemma3_text` fixture) has no tower: it takes no images.
    let text_only = kit::dirs::family_fixture_dir("gemma3_text", "hf");
    let tokenizer = open_model(&text_only).unwrap().tokenizer;
    assert_eq!(ImagePrompt::read(&text_only, &tokenizer).unwrap(), None);
}
