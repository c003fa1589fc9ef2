//! Seeded tiny random Llama, Qwen2 and Qwen3 models: sharding by layer range, KV-cache
//! decoding, generation controls, and bad input.

mod common;

use common::{host, max_abs_diff, temp_dir, write_tiny_model};
use inference::generate::generate;
use inference::loader::{load_shard, LoadOptions};
use inference::sequence_forward::{Forward, LocalForward};
use inference::{
    Engine, FinishReason, GenerateRequest, InferenceError, Prompt, SamplingParams, ShardInput,
    WeightFormat,
};
use std::ops::ControlFlow;

const PROMPT: [u32; 7] = [3, 17, 42, 5, 88, 9, 60];
/// f32 throughout: the same operations in the same order, so differences are rounding only.
const TOLERANCE: f32 = 1e-4;

fn options(layers: Option<std::ops::Range<usize>>) -> LoadOptions {
    LoadOptions {
        layers,
        format: Some(WeightFormat::F32),
    }
}

fn whole_vs_two_shards(arch: &str, seed: u64) {
    let dir = temp_dir(&format!("shards-{arch}"));
    write_tiny_model(&dir, arch, seed, 64);
    let (whole, _) = load_shard(&dir, &options(None), &mut |_, _| {}).unwrap();
    let mut cache = whole.new_cache();
    let want = host(
        &whole
            .forward(ShardInput::Tokens(&PROMPT), &mut cache, false)
            .unwrap(),
    );
    assert_eq!(want.len(), PROMPT.len() * 96);

    let (first, _) = load_shard(&dir, &options(Some(0..1)), &mut |_, _| {}).unwrap();
    let (second, _) = load_shard(&dir, &options(Some(1..4)), &mut |_, _| {}).unwrap();
    assert!(first.is_first() && !first.is_last() && second.is_last() && !second.is_first());
    let (mut c1, mut c2) = (first.new_cache(), second.new_cache());
    let hidden = first
        .forward(ShardInput::Tokens(&PROMPT), &mut c1, false)
        .unwrap();
    assert_eq!(hidden.shape(), &[1, PROMPT.len() as i32, 64]);
    let got = host(
        &second
            .forward(ShardInput::Hidden(hidden), &mut c2, false)
            .unwrap(),
    );
    let diff = max_abs_diff(&want, &got);
    assert!(
        diff < TOLERANCE,
        "{arch}: whole vs sharded logits differ by {diff}"
    );
    // The logits are not trivially equal (e.g. all zero).
    let spread = want.iter().cloned().fold(f32::MIN, f32::max)
        - want.iter().cloned().fold(f32::MAX, f32::min);
    assert!(spread > 0.5, "{arch}: logits spread {spread}");

    // Decoding one more token through both shards with their caches agrees too.
    let next = [11u32];
    let a = host(
        &whole
            .forward(ShardInput::Tokens(&next), &mut cache, false)
            .unwrap(),
    );
    let h = first
        .forward(ShardInput::Tokens(&next), &mut c1, false)
        .unwrap();
    let b = host(
        &second
            .forward(ShardInput::Hidden(h), &mut c2, false)
            .unwrap(),
    );
    assert!(max_abs_diff(&a, &b) < TOLERANCE);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn llama_whole_and_sharded_agree() {
    whole_vs_two_shards("llama", 1);
}

#[test]
fn qwen3_whole_and_sharded_agree() {
    whole_vs_two_shards("qwen3", 2);
}

#[test]
fn qwen2_whole_and_sharded_agree() {
    whole_vs_two_shards("qwen2", 3);
}

#[test]
fn cached_decoding_matches_a_full_forward_pass() {
    for arch in ["llama", "qwen3"] {
        let dir = temp_dir(&format!("cache-{arch}"));
        write_tiny_model(&dir, arch, 4, 64);
        let (m, _) = load_shard(&dir, &options(None), &mut |_, _| {}).unwrap();
        let mut full_cache = m.new_cache();
        let full = host(
            &m.forward(ShardInput::Tokens(&PROMPT), &mut full_cache, false)
                .unwrap(),
        );
        let mut cache = m.new_cache();
        m.forward(ShardInput::Tokens(&PROMPT[..4]), &mut cache, false)
            .unwrap();
        for (i, &t) in PROMPT.iter().enumerate().skip(4) {
            let step = host(
                &m.forward(ShardInput::Tokens(&[t]), &mut cache, true)
                    .unwrap(),
            );
            let row = &full[i * 96..(i + 1) * 96];
            let diff = max_abs_diff(row, &step);
            assert!(diff < TOLERANCE, "{arch} position {i}: {diff}");
        }
        assert_eq!(cache.len(), PROMPT.len());
        std::fs::remove_dir_all(&dir).ok();
    }
}

#[test]
fn quantized_weights_stay_close_to_f32() {
    let dir = temp_dir("quantized");
    write_tiny_model(&dir, "qwen3", 5, 64);
    let (f, _) = load_shard(&dir, &options(None), &mut |_, _| {}).unwrap();
    let (b, _) = load_shard(
        &dir,
        &LoadOptions {
            layers: None,
            format: Some(WeightFormat::Bf16),
        },
        &mut |_, _| {},
    )
    .unwrap();
    let a = host(
        &f.forward(ShardInput::Tokens(&PROMPT), &mut f.new_cache(), true)
            .unwrap(),
    );
    let c = host(
        &b.forward(ShardInput::Tokens(&PROMPT), &mut b.new_cache(), true)
            .unwrap(),
    );
    let diff = max_abs_diff(&a, &c);
    assert!(diff < 0.25, "bf16 vs f32 logits differ by {diff}");
    std::fs::remove_dir_all(&dir).ok();
}

fn tiny_engine(name: &str, context: usize) -> (Engine, std::path::PathBuf) {
    let dir = temp_dir(name);
    write_tiny_model(&dir, "llama", 6, context);
    (Engine::load(&dir, Some(WeightFormat::F32)).unwrap(), dir)
}

#[test]
fn generation_honours_max_tokens_seed_stop_tokens_and_cancellation() {
    let (engine, dir) = tiny_engine("generate", 64);
    let mut req = GenerateRequest::new(Prompt::Tokens(PROMPT.to_vec()), 8);
    req.ignore_eos = true;
    let greedy = engine
        .generate(&req, |_| ControlFlow::Continue(()))
        .unwrap();
    assert_eq!(greedy.completion_tokens(), 8);
    assert_eq!(greedy.finish_reason, FinishReason::Length);
    assert_eq!(greedy.prompt_tokens, PROMPT.len());
    assert!(greedy.logprobs.iter().all(|&l| l <= 0.0 && l.is_finite()));
    // Greedy is deterministic.
    assert_eq!(
        engine
            .generate(&req, |_| ControlFlow::Continue(()))
            .unwrap()
            .tokens,
        greedy.tokens
    );

    // Seeded sampling is reproducible.
    req.sampling = SamplingParams {
        temperature: 1.5,
        seed: Some(9),
        ..Default::default()
    };
    let a = engine
        .generate(&req, |_| ControlFlow::Continue(()))
        .unwrap();
    let b = engine
        .generate(&req, |_| ControlFlow::Continue(()))
        .unwrap();
    assert_eq!(a.tokens, b.tokens);

    // A stop token ends generation right there.
    req.sampling = SamplingParams::default();
    req.stop_token_ids = vec![greedy.tokens[2]];
    let stopped = engine
        .generate(&req, |_| ControlFlow::Continue(()))
        .unwrap();
    assert_eq!(stopped.finish_reason, FinishReason::Stop);
    assert_eq!(stopped.tokens.last(), Some(&greedy.tokens[2]));
    assert!(stopped.tokens.len() <= 3);

    // Cancelling from the callback stops after that token.
    req.stop_token_ids.clear();
    let mut seen = 0;
    let cancelled = engine
        .generate(&req, |_| {
            seen += 1;
            if seen == 3 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap();
    assert_eq!(cancelled.finish_reason, FinishReason::Cancelled);
    assert_eq!(cancelled.completion_tokens(), 3);

    // A stop string cuts the text before it.
    let text = greedy.text.clone();
    let words: Vec<&str> = text.split_whitespace().collect();
    assert!(words.len() >= 4, "{text:?}");
    req.stop = vec![words[3].to_owned()];
    let cut = engine
        .generate(&req, |_| ControlFlow::Continue(()))
        .unwrap();
    assert_eq!(cut.finish_reason, FinishReason::Stop);
    assert_eq!(cut.text, text[..text.find(words[3]).unwrap()]);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_prompt_longer_than_the_context_is_a_clear_error() {
    let (engine, dir) = tiny_engine("context", 8);
    let req = GenerateRequest::new(Prompt::Tokens(vec![5; 9]), 4);
    let err = engine
        .generate(&req, |_| ControlFlow::Continue(()))
        .unwrap_err();
    assert!(
        matches!(
            err,
            InferenceError::PromptTooLong {
                prompt_tokens: 9,
                context_length: 8
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("shorten the prompt"));
    // max_tokens is bounded by what is left of the context.
    let mut req = GenerateRequest::new(Prompt::Tokens(vec![5; 5]), 100);
    req.ignore_eos = true;
    assert_eq!(
        engine
            .generate(&req, |_| ControlFlow::Continue(()))
            .unwrap()
            .completion_tokens(),
        3
    );
    // Token ids outside the vocabulary are refused.
    let req = GenerateRequest::new(Prompt::Tokens(vec![5000]), 1);
    assert!(matches!(
        engine.generate(&req, |_| ControlFlow::Continue(())),
        Err(InferenceError::InvalidRequest(_))
    ));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_models_give_clear_errors() {
    let missing = load_shard(
        std::path::Path::new("/nonexistent/model.gguf"),
        &options(None),
        &mut |_, _| {},
    );
    assert!(matches!(missing, Err(InferenceError::Io { .. })));

    let dir = temp_dir("bad");
    write_tiny_model(&dir, "llama", 7, 64);
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    config["model_type"] = "gpt_neox".into();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let err = load_shard(&dir, &options(None), &mut |_, _| {})
        .err()
        .unwrap();
    assert!(
        matches!(err, InferenceError::UnsupportedArchitecture { ref name, .. } if name == "gpt_neox"),
        "{err}"
    );

    std::fs::write(dir.join("config.json"), "{not json").unwrap();
    assert!(matches!(
        load_shard(&dir, &options(None), &mut |_, _| {}),
        Err(InferenceError::BadModel { .. })
    ));

    config["model_type"] = "llama".into();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let err = load_shard(&dir, &options(Some(2..9)), &mut |_, _| {})
        .err()
        .unwrap();
    assert!(matches!(err, InferenceError::BadLayerRange { .. }), "{err}");
    let err = load_shard(&dir, &options(Some(3..3)), &mut |_, _| {})
        .err()
        .unwrap();
    assert!(matches!(err, InferenceError::BadLayerRange { .. }), "{err}");

    // Weights of the wrong shape.
    config["intermediate_size"] = 100.into();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let err = load_shard(&dir, &options(None), &mut |_, _| {})
        .err()
        .unwrap();
    assert!(matches!(err, InferenceError::BadTensor { .. }), "{err}");
    std::fs::remove_dir_all(&dir).ok();

    // Not a GGUF file at all, and a GGUF header cut short.
    let dir = temp_dir("bad-gguf");
    let p = dir.join("x.gguf");
    std::fs::write(&p, b"hello world, not a model").unwrap();
    assert!(matches!(
        load_shard(&p, &options(None), &mut |_, _| {}),
        Err(InferenceError::BadGguf { .. })
    ));
    let mut header = b"GGUF".to_vec();
    header.extend(3u32.to_le_bytes());
    header.extend(1u64.to_le_bytes());
    header.extend(1u64.to_le_bytes());
    header.extend(u64::MAX.to_le_bytes()); // a key length far past the end
    std::fs::write(&p, &header).unwrap();
    let err = load_shard(&p, &options(None), &mut |_, _| {})
        .err()
        .unwrap();
    assert!(
        matches!(err, InferenceError::BadGguf { .. }) && err.to_string().contains("truncated"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_cache_grows_past_its_first_buffer() {
    let dir = temp_dir("cache-grow");
    write_tiny_model(&dir, "qwen3", 13, 512);
    let (m, _) = load_shard(&dir, &options(None), &mut |_, _| {}).unwrap();
    let tokens: Vec<u32> = (0..262u32).map(|i| (i * 37 + 5) % 96).collect();
    let full = host(
        &m.forward(ShardInput::Tokens(&tokens), &mut m.new_cache(), false)
            .unwrap(),
    );
    let mut cache = m.new_cache();
    m.forward(ShardInput::Tokens(&tokens[..250]), &mut cache, false)
        .unwrap();
    for (i, &t) in tokens.iter().enumerate().skip(250) {
        let step = host(
            &m.forward(ShardInput::Tokens(&[t]), &mut cache, true)
                .unwrap(),
        );
        let diff = max_abs_diff(&full[i * 96..(i + 1) * 96], &step);
        assert!(diff < TOLERANCE, "position {i}: {diff}");
    }
    assert_eq!(cache.len(), 262);
    std::fs::remove_dir_all(&dir).ok();
}

/// The host-sampling path only: wraps [`LocalForward`] without its device-side greedy choice.
struct HostLogitsOnly<'a>(LocalForward<'a>);

impl Forward for HostLogitsOnly<'_> {
    fn config(&self) -> &inference::ModelConfig {
        self.0.config()
    }
    fn forward(&mut self, tokens: &[u32]) -> inference::Result<Vec<f32>> {
        self.0.forward(tokens)
    }
    fn reset(&mut self) -> inference::Result<()> {
        self.0.reset()
    }
}

/// Greedy requests choose on the device, one step ahead; the tokens, log-probabilities, stop
/// handling and the count of generated tokens must be those of host-side sampling.
#[test]
fn device_greedy_matches_host_sampling() {
    for (arch, seed) in [("llama", 21), ("qwen3", 22)] {
        let dir = temp_dir(&format!("device-greedy-{arch}"));
        write_tiny_model(&dir, arch, seed, 64);
        let engine = Engine::load(&dir, Some(WeightFormat::F32)).unwrap();
        let mut req = GenerateRequest::new(Prompt::Tokens(PROMPT.to_vec()), 12);
        req.ignore_eos = true;
        let run = |req: &GenerateRequest, device: bool| {
            let mut local = LocalForward::new(&engine.model).unwrap();
            let mut host_only;
            let forward: &mut dyn Forward = if device {
                &mut local
            } else {
                host_only = HostLogitsOnly(local);
                &mut host_only
            };
            generate(forward, &engine.tokenizer, req, |_| {
                ControlFlow::Continue(())
            })
            .unwrap()
        };
        let (on_device, on_host) = (run(&req, true), run(&req, false));
        assert_eq!(on_device.tokens, on_host.tokens, "{arch}");
        assert_eq!(on_device.completion_tokens(), 12);
        let diff = max_abs_diff(&on_device.logprobs, &on_host.logprobs);
        assert!(diff < TOLERANCE, "{arch}: logprobs differ by {diff}");

        // A stop token ends both at the same place, although the device ran one step ahead.
        req.stop_token_ids = vec![on_host.tokens[4]];
        let (on_device, on_host) = (run(&req, true), run(&req, false));
        assert_eq!(on_device.tokens, on_host.tokens, "{arch}");
        assert_eq!(on_device.finish_reason, FinishReason::Stop);
        std::fs::remove_dir_all(&dir).ok();
    }
}
