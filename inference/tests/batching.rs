//! Continuous batching on the real SmolLM2 fixture (f32, one process): prompts of different
//! lengths joining at different steps give the same greedy tokens batched as alone; a
//! cancelled sequence leaves the others intact; a seeded sampled request gives the same
//! tokens in a batch; a KV budget smaller than the batch preempts and still answers right; a
//! second turn of a long chat starts from the first turn's state in the prompt cache and
//! answers as it would without it; a sliding-window model (the Gemma 3 fixture) reuses only
//! what its sliding layers still hold; two sequences of one batch with different `logit_bias`
//! and `top_logprobs` each get their own.

use inference::batch::{BatchEvent, BatchLimits, Batcher, LocalBatch, PromptCache};
use inference::kv_cache::KvCache;
use inference::{
    ChatMessage, Engine, FinishReason, GenerateRequest, Prompt, TokenLogprobs, WeightFormat,
};
use std::collections::BTreeMap;
use std::ops::ControlFlow;

mod common;

use common::smollm2_f32 as engine;

fn chat(text: &str, max_tokens: usize) -> GenerateRequest {
    let mut r = GenerateRequest::new(
        Prompt::Chat(vec![ChatMessage::new("user", text)]),
        max_tokens,
    );
    r.ignore_eos = true;
    r
}

const QUESTIONS: [&str; 4] = [
    "What is the capital of France?",
    "Hi",
    "Write a long story about a lighthouse keeper who finds a message in a bottle, with many \
     details about the sea, the weather, the village and the people who live there.",
    "List three colours.",
];

/// Tokens and completions of each request, run by a batcher that admits request `i` at step
/// `joins[i]` (and cancels `cancel` = (id, at step) if given).
fn run_batch(
    e: &Engine,
    requests: &[GenerateRequest],
    joins: &[usize],
    limits: BatchLimits,
    cancel: Option<(u64, usize)>,
) -> BTreeMap<u64, (Vec<u32>, String, inference::Completion)> {
    let forward = LocalBatch::new(&e.model, limits.max_sequences).unwrap();
    let mut b = Batcher::new(Box::new(forward), &e.tokenizer, limits);
    let mut tokens: BTreeMap<u64, (Vec<u32>, String)> = BTreeMap::new();
    let mut done = BTreeMap::new();
    let mut step = 0;
    while done.len() < requests.len() {
        for (i, r) in requests.iter().enumerate() {
            if joins[i] == step {
                b.submit(i as u64, r).unwrap();
            }
        }
        if cancel.is_some_and(|(_, at)| at == step) {
            assert!(b.cancel(cancel.unwrap().0));
        }
        for (id, ev) in b.step().unwrap() {
            match ev {
                BatchEvent::Token { token, text, .. } => {
                    let t = tokens.entry(id).or_default();
                    t.0.push(token);
                    t.1.push_str(&text);
                }
                BatchEvent::Done(c) => {
                    let (t, text) = tokens.remove(&id).unwrap_or_default();
                    done.insert(id, (t, text, c));
                }
                BatchEvent::Failed { message, .. } => panic!("request {id} failed: {message}"),
                BatchEvent::Cached { .. } => panic!("no prompt cache here"),
            }
        }
        step += 1;
        assert!(step < 10_000, "the batch never finished");
    }
    assert!(b.is_idle());
    done
}

fn alone(e: &Engine, r: &GenerateRequest) -> (Vec<u32>, inference::Completion) {
    let mut toks = Vec::new();
    let c = e
        .generate(r, |t| {
            toks.push(t.token);
            ControlFlow::Continue(())
        })
        .unwrap();
    (c.tokens.clone(), c)
}

const ROOMY: BatchLimits = BatchLimits {
    max_sequences: 8,
    kv_tokens: 8192,
};

#[test]
fn greedy_batched_equals_alone_for_prompts_joining_at_different_steps() {
    let e = engine();
    let requests: Vec<GenerateRequest> = QUESTIONS.iter().map(|q| chat(q, 24)).collect();
    let solo: Vec<_> = requests.iter().map(|r| alone(&e, r)).collect();
    let batched = run_batch(&e, &requests, &[0, 0, 3, 7], ROOMY, None);
    for (i, (tokens, completion)) in solo.iter().enumerate() {
        let (bt, btext, bc) = &batched[&(i as u64)];
        assert_eq!(bt, tokens, "request {i}: streamed tokens");
        assert_eq!(&bc.tokens, tokens, "request {i}");
        assert_eq!(bc.text, completion.text, "request {i}");
        assert_eq!(btext, &completion.text, "request {i}: streamed text");
        assert_eq!(bc.finish_reason, FinishReason::Length);
        assert_eq!(bc.prompt_tokens, completion.prompt_tokens);
        for (a, b) in bc.logprobs.iter().zip(&completion.logprobs) {
            assert!((a - b).abs() < 1e-3, "request {i}: logprob {a} vs {b}");
        }
    }
    assert!(solo[0].1.prompt_tokens != solo[2].1.prompt_tokens);
}

#[test]
fn a_cancelled_sequence_leaves_the_others_intact() {
    let e = engine();
    let requests: Vec<GenerateRequest> = QUESTIONS[..3].iter().map(|q| chat(q, 20)).collect();
    let solo: Vec<_> = requests.iter().map(|r| alone(&e, r)).collect();
    let batched = run_batch(&e, &requests, &[0, 0, 1], ROOMY, Some((1, 6)));
    let (_, _, cancelled) = &batched[&1];
    assert_eq!(cancelled.finish_reason, FinishReason::Cancelled);
    assert!(cancelled.tokens.len() < 20);
    assert_eq!(cancelled.tokens[..], solo[1].0[..cancelled.tokens.len()]);
    for i in [0u64, 2] {
        assert_eq!(batched[&i].2.tokens, solo[i as usize].0, "request {i}");
    }
}

#[test]
fn a_seeded_sampled_request_is_reproducible_in_a_batch() {
    let e = engine();
    let mut seeded = chat("Tell me a joke.", 24);
    seeded.sampling.temperature = 0.9;
    seeded.sampling.top_p = 0.95;
    seeded.sampling.seed = Some(42);
    let solo = alone(&e, &seeded).0;
    let mut requests: Vec<GenerateRequest> = QUESTIONS[..3].iter().map(|q| chat(q, 24)).collect();
    requests.insert(1, seeded.clone());
    let batched = run_batch(&e, &requests, &[0, 2, 0, 5], ROOMY, None);
    assert_eq!(batched[&1].2.tokens, solo);
    // And another seed gives other tokens (the test can fail).
    seeded.sampling.seed = Some(7);
    assert_ne!(alone(&e, &seeded).0, solo);
}

#[test]
fn a_small_kv_budget_preempts_and_still_answers_the_same() {
    let e = engine();
    let requests: Vec<GenerateRequest> = QUESTIONS.iter().map(|q| chat(q, 16)).collect();
    let solo: Vec<_> = requests.iter().map(|r| alone(&e, r)).collect();
    let total: usize = solo.iter().map(|(t, c)| c.prompt_tokens + t.len()).sum();
    let tight = BatchLimits {
        max_sequences: 4,
        kv_tokens: total / 2,
    };
    let batched = run_batch(&e, &requests, &[0, 0, 0, 0], tight, None);
    for (i, (tokens, _)) in solo.iter().enumerate() {
        assert_eq!(&batched[&(i as u64)].2.tokens, tokens, "request {i}");
    }
}

/// One request through a fresh batcher over `cache` (as the runner makes one per batch):
/// its completion and the `Cached` event's count, if one came.
fn run_cached(
    e: &Engine,
    cache: &mut PromptCache<KvCache>,
    request: &GenerateRequest,
) -> (inference::Completion, Option<usize>) {
    let forward = LocalBatch::new(&e.model, 4).unwrap();
    let mut b = Batcher::new(Box::new(forward), &e.tokenizer, ROOMY).with_prompt_cache(cache);
    b.submit(1, request).unwrap();
    let mut cached = None;
    for _ in 0..10_000 {
        for (_, ev) in b.step().unwrap() {
            match ev {
                BatchEvent::Cached { tokens } => {
                    assert!(cached.is_none(), "one Cached event at most");
                    cached = Some(tokens);
                }
                BatchEvent::Done(c) => return (c, cached),
                BatchEvent::Failed { message, .. } => panic!("failed: {message}"),
                BatchEvent::Token { .. } => {}
            }
        }
    }
    panic!("the request never finished");
}

#[test]
fn a_second_turn_reuses_the_first_turns_kv_and_answers_the_same() {
    let e = engine();
    let long = "Here are my notes about lighthouses. ".repeat(8)
        + &QUESTIONS[2].repeat(7)
        + " Summarise them in one sentence.";
    let first = vec![ChatMessage::new("user", &long)];
    let turn1 = GenerateRequest::new(Prompt::Chat(first.clone()), 20);
    let mut cache: PromptCache<KvCache> = PromptCache::new(4096);
    let (c1, none) = run_cached(&e, &mut cache, &turn1);
    assert_eq!(none, None, "nothing was cached before the first turn");
    assert!(
        c1.prompt_tokens >= 300,
        "{} prompt tokens",
        c1.prompt_tokens
    );
    assert_eq!(cache.len(), 1);
    assert_eq!(cache.tokens(), c1.prompt_tokens + c1.tokens.len() - 1);

    let mut second = first;
    second.push(ChatMessage::new("assistant", &c1.text));
    second.push(ChatMessage::new(
        "user",
        "And what is the capital of France?",
    ));
    let turn2 = GenerateRequest::new(Prompt::Chat(second), 16);
    let (cached, reused) = run_cached(&e, &mut cache, &turn2);
    let reused = reused.expect("the second turn reused the first one's state");
    assert!(
        reused >= c1.prompt_tokens,
        "{reused} of {}",
        c1.prompt_tokens
    );
    assert!(reused < cached.prompt_tokens);
    assert_eq!(cached.cached_tokens, reused);

    let (tokens, fresh) = alone(&e, &turn2);
    assert_eq!(fresh.cached_tokens, 0);
    assert_eq!(cached.tokens, tokens);
    assert_eq!(cached.text, fresh.text);
    for (a, b) in cached.logprobs.iter().zip(&fresh.logprobs) {
        assert!(
            (a - b).abs() < 1e-3,
            "logprob {a} with the cache vs {b} without"
        );
    }
    // The second turn's state replaced the first (it extends it).
    assert_eq!(cache.len(), 1);

    // Another second turn: it shares only the first turn with the entry, which is cut to
    // that prefix (and was not changed by the turn that used it before).
    let mut other = match &turn2.prompt {
        Prompt::Chat(m) => m[..2].to_vec(),
        _ => unreachable!(),
    };
    other.push(ChatMessage::new("user", "Name three colours."));
    let turn3 = GenerateRequest::new(Prompt::Chat(other), 16);
    let (c3, reused3) = run_cached(&e, &mut cache, &turn3);
    let reused3 = reused3.expect("the first turn is still cached");
    assert!(reused3 >= c1.prompt_tokens && reused3 < c3.prompt_tokens);
    let (tokens3, fresh3) = alone(&e, &turn3);
    assert_eq!(c3.tokens, tokens3);
    for (a, b) in c3.logprobs.iter().zip(&fresh3.logprobs) {
        assert!(
            (a - b).abs() < 1e-3,
            "logprob {a} with the cache vs {b} without"
        );
    }
    assert_eq!(cache.len(), 2, "two turns that part after the first");

    // A disabled cache reuses and keeps nothing.
    let mut off: PromptCache<KvCache> = PromptCache::new(0);
    let (c, none) = run_cached(&e, &mut off, &turn2);
    assert_eq!((none, c.cached_tokens), (None, 0));
    assert_eq!(c.tokens, tokens);
    assert!(off.is_empty());
}

#[test]
fn logit_bias_and_top_logprobs_are_each_sequences_own_in_a_batch() {
    let e = engine();
    let forced = e.tokenizer.encode(" Paris").unwrap()[0];
    let mut biased = chat("List three colours.", 6);
    biased.sampling.logit_bias = [(forced, 100.0)].into();
    biased.sampling.top_logprobs = 5;
    let plain = chat(QUESTIONS[0], 6);
    let plain_alone = alone(&e, &plain).0;
    // The biased one alone: its tokens and each token's alternatives.
    let mut biased_alone: Vec<TokenLogprobs> = Vec::new();
    let c = e
        .generate(&biased, |t| {
            biased_alone.extend(t.top_logprobs.cloned());
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(c.tokens, vec![forced; 6], "+100 forces the token");
    assert_eq!(biased_alone.len(), 6);

    let forward = LocalBatch::new(&e.model, 4).unwrap();
    let mut b = Batcher::new(Box::new(forward), &e.tokenizer, ROOMY);
    b.submit(0, &biased).unwrap();
    b.submit(1, &plain).unwrap();
    let mut tokens: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    let mut tops: BTreeMap<u64, Vec<Option<TokenLogprobs>>> = BTreeMap::new();
    let mut done = 0;
    for _ in 0..1000 {
        for (id, ev) in b.step().unwrap() {
            match ev {
                BatchEvent::Token {
                    token,
                    top_logprobs,
                    ..
                } => {
                    tokens.entry(id).or_default().push(token);
                    tops.entry(id).or_default().push(top_logprobs);
                }
                BatchEvent::Done(_) => done += 1,
                BatchEvent::Failed { message, .. } => panic!("request {id} failed: {message}"),
                BatchEvent::Cached { .. } => panic!("no prompt cache here"),
            }
        }
        if done == 2 {
            break;
        }
    }
    assert_eq!(done, 2, "both finished");
    assert_eq!(tokens[&0], vec![forced; 6], "the bias is the biased one's");
    assert_eq!(tokens[&1], plain_alone, "and not the other's");
    assert!(
        tops[&1].iter().all(Option::is_none),
        "no alternatives asked"
    );
    let batched: Vec<TokenLogprobs> = tops[&0].iter().flatten().cloned().collect();
    assert_eq!(batched.len(), 6);
    let forced_text = e.tokenizer.decode(&[forced], false).unwrap();
    for (step, (got, want)) in batched.iter().zip(&biased_alone).enumerate() {
        assert_eq!(
            got.text, forced_text,
            "step {step}: the sampled token's own text"
        );
        assert_eq!(got.top.len(), 5, "step {step}");
        assert!(
            got.top.windows(2).all(|w| w[0].logprob >= w[1].logprob),
            "step {step}: most likely first: {:?}",
            got.top
        );
        let total: f32 = got.top.iter().map(|t| t.logprob.exp()).sum();
        assert!(total <= 1.0 + 1e-4, "step {step}: {total}");
        let ids = |l: &TokenLogprobs| l.top.iter().map(|t| t.token).collect::<Vec<_>>();
        assert_eq!(ids(got), ids(want), "step {step}: batched as alone");
        for (g, w) in got.top.iter().zip(&want.top) {
            assert!(
                (g.logprob - w.logprob).abs() < 1e-3,
                "step {step}: {g:?} vs {w:?}"
            );
            assert_eq!(g.text, e.tokenizer.decode(&[g.token], false).unwrap());
        }
    }
}

/// Gemma 3's layout with a window of 8 (the family fixture): the prompt cache's entry of a
/// long first turn has forgotten most of its sliding layers' positions. A second turn that
/// extends it starts from it; a turn that shares only the chat's opening cannot (its sliding
/// layers no longer hold that prefix's window) and runs from scratch. Both answer as alone.
#[test]
fn a_sliding_window_model_reuses_what_its_cache_still_holds() {
    let dir = kit::dirs::family_fixture_dir("gemma3_text", "hf");
    assert!(
        dir.join("reference.safetensors").exists(),
        "{} is missing: run `cargo xtask setup`",
        dir.display()
    );
    let e = Engine::load(dir, Some(WeightFormat::F32)).unwrap();
    let window = e
        .model
        .config
        .sliding_window
        .clone()
        .expect("gemma3 slides");
    let first = vec![ChatMessage::new("user", QUESTIONS[2].repeat(2))];
    let mut turn1 = GenerateRequest::new(Prompt::Chat(first.clone()), 12);
    turn1.ignore_eos = true;
    let mut cache: PromptCache<KvCache> = PromptCache::new(4096);
    let (c1, none) = run_cached(&e, &mut cache, &turn1);
    assert_eq!(none, None);
    assert!(c1.prompt_tokens > 10 * window.size, "{}", c1.prompt_tokens);
    assert_eq!(cache.len(), 1, "the first turn's state is kept");

    let mut second = first.clone();
    second.push(ChatMessage::new("assistant", &c1.text));
    second.push(ChatMessage::new("user", "And the capital of France?"));
    let mut turn2 = GenerateRequest::new(Prompt::Chat(second), 8);
    turn2.ignore_eos = true;
    let (c2, reused) = run_cached(&e, &mut cache, &turn2);
    let reused = reused.expect("the second turn extends the first");
    assert!(
        reused >= c1.prompt_tokens,
        "{reused} of {}",
        c1.prompt_tokens
    );
    let (tokens2, _) = alone(&e, &turn2);
    assert_eq!(c2.tokens, tokens2);

    // Only the chat's opening in common: a few tokens, long forgotten by the sliding layers.
    let mut turn3 = GenerateRequest::new(
        Prompt::Chat(vec![ChatMessage::new("user", "List three colours.")]),
        8,
    );
    turn3.ignore_eos = true;
    let (c3, reused3) = run_cached(&e, &mut cache, &turn3);
    assert_eq!(
        reused3, None,
        "a prefix the sliding layers forgot is not reused"
    );
    assert_eq!(c3.cached_tokens, 0);
    let (tokens3, _) = alone(&e, &turn3);
    assert_eq!(c3.tokens, tokens3);
}

/// Qwen3.5's linear layers hold a recurrent state that cannot be taken back: the prompt cache
/// reuses an entry only where it ends. A second request that extends the first one's tokens
/// starts from its state; one that shares only part of them runs from scratch (the state
/// has folded in what follows). Both answer exactly as alone.
#[test]
fn a_hybrid_model_reuses_a_cached_state_only_where_it_ends() {
    reuses_a_cached_state_only_where_it_ends("qwen3_5");
}

/// The same for Kimi K3: KDA states and the latent attention's cache restored together, the
/// attention residuals' blocks made again from the restored caches' outputs.
#[test]
fn kimi_k3_reuses_a_cached_state_only_where_it_ends() {
    reuses_a_cached_state_only_where_it_ends("kimi_k3");
}

/// A prompt-cache entry of family `family`'s f32 fixture, reused by a request that extends it
/// and not by one that parts from it within (see the tests above).
fn reuses_a_cached_state_only_where_it_ends(family: &str) {
    let dir = kit::dirs::family_fixture_dir(family, "hf");
    assert!(
        dir.join("reference.safetensors").exists(),
        "{} is missing: run `cargo xtask setup`",
        dir.display()
    );
    let e = Engine::load(dir, Some(WeightFormat::F32)).unwrap();
    let prompt: Vec<u32> = (0..40).map(|i| (i * 7919) % 48000 + 100).collect();
    let mut turn1 = GenerateRequest::new(Prompt::Tokens(prompt.clone()), 6);
    turn1.ignore_eos = true;
    let mut cache: PromptCache<KvCache> = PromptCache::new(4096);
    let (c1, none) = run_cached(&e, &mut cache, &turn1);
    assert_eq!(none, None);
    assert_eq!(cache.len(), 1, "the first request's state is kept");
    // The entry holds the prompt and every generated token but the last (never fed).
    let held = prompt.len() + c1.tokens.len() - 1;
    assert_eq!(cache.tokens(), held);

    // Extends the entry: its state is reused whole.
    let mut extended = prompt.clone();
    extended.extend(&c1.tokens[..c1.tokens.len() - 1]);
    extended.extend([500, 9000, 31000]);
    let mut turn2 = GenerateRequest::new(Prompt::Tokens(extended), 6);
    turn2.ignore_eos = true;
    let (c2, reused) = run_cached(&e, &mut cache, &turn2);
    assert_eq!(reused, Some(held), "the state at the entry's end is reused");
    let (tokens2, fresh2) = alone(&e, &turn2);
    assert_eq!(c2.tokens, tokens2);
    for (a, b) in c2.logprobs.iter().zip(&fresh2.logprobs) {
        assert!(
            (a - b).abs() < 1e-4,
            "logprob {a} with the state vs {b} without"
        );
    }

    // Shares 30 of the prompt's tokens with the entries, then parts: no state is at 30.
    let mut parted = prompt[..30].to_vec();
    parted.extend([777, 888]);
    let mut turn3 = GenerateRequest::new(Prompt::Tokens(parted), 6);
    turn3.ignore_eos = true;
    let (c3, reused3) = run_cached(&e, &mut cache, &turn3);
    assert_eq!(reused3, None, "a recurrent state is not cut back");
    assert_eq!(c3.cached_tokens, 0);
    let (tokens3, _) = alone(&e, &turn3);
    assert_eq!(c3.tokens, tokens3);
}

/// Gemma 4 E2B's shape (the family fixture): per-layer inputs, and KV-shared layers that keep
/// no keys of their own but follow their source layer's cache. The prompt cache's entry of a
/// first request is reused by a second that extends it (the shared layers follow their
/// sources' restored caches), and both answer exactly as alone.
#[test]
fn kv_shared_layers_reuse_a_cached_prompt_through_their_sources() {
    let dir = kit::dirs::family_fixture_dir("gemma4_text_e2b", "hf");
    assert!(
        dir.join("reference.safetensors").exists(),
        "{} is missing: run `cargo xtask setup`",
        dir.display()
    );
    let e = Engine::load(dir, Some(WeightFormat::F32)).unwrap();
    let prompt: Vec<u32> = (0..40).map(|i| (i * 7919) % 48000 + 100).collect();
    let mut turn1 = GenerateRequest::new(Prompt::Tokens(prompt.clone()), 6);
    turn1.ignore_eos = true;
    let mut cache: PromptCache<KvCache> = PromptCache::new(4096);
    let (c1, none) = run_cached(&e, &mut cache, &turn1);
    assert_eq!(none, None);
    let (tokens1, _) = alone(&e, &turn1);
    assert_eq!(c1.tokens, tokens1);
    let held = prompt.len() + c1.tokens.len() - 1;
    assert_eq!(cache.tokens(), held);

    let mut extended = prompt.clone();
    extended.extend(&c1.tokens[..c1.tokens.len() - 1]);
    extended.extend([500, 9000, 31000]);
    let mut turn2 = GenerateRequest::new(Prompt::Tokens(extended), 6);
    turn2.ignore_eos = true;
    let (c2, reused) = run_cached(&e, &mut cache, &turn2);
    assert_eq!(reused, Some(held), "the entry is reused whole");
    let (tokens2, fresh2) = alone(&e, &turn2);
    assert_eq!(c2.tokens, tokens2);
    for (a, b) in c2.logprobs.iter().zip(&fresh2.logprobs) {
        assert!(
            (a - b).abs() < 1e-4,
            "logprob {a} with the cache vs {b} without"
        );
    }
}
