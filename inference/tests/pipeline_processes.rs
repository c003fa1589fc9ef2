//! Pipeline parallelism through the real MLX ring: 2 and 3 processes, each in its own network
//! namespace (on loopback when not root), each holding a layer range, give the same logits as
//! one process holding the whole model.
//!
//! Each test re-runs this binary as one child process per rank (the ignored `pipeline_child`,
//! run with `--ignored` and `SHOAL_PIPELINE_CHILD` set, does the work). Rank 0 also loads the
//! whole model and compares, step by step, a prefill and greedy decode steps.

mod common;

use common::{
    argmax, hosts_field, max_abs_diff, parse_hosts_field, run_ranks, smollm2, temp_dir,
    write_tiny_model, RankNet,
};
use inference::batch::{OneSequence, RingBatch};
use inference::loader::{load_shard, LoadOptions};
use inference::pipeline::PipelineStage;
use inference::ring::{RingConfig, RingGroup};
use inference::sequence_forward::{last_logits_to_host, Forward};
use inference::stage::Stage;
use inference::vision::ReadImagePrompt;
use inference::vision::VisionTower;
use inference::{
    ChatImage, ChatMessage, GenerateRequest, ImagePrompt, Prompt, ShardInput, TemplateInput,
};
use std::path::PathBuf;
use std::time::Duration;

const CHILD_ENV: &str = "SHOAL_PIPELINE_CHILD";
/// One sequence: the same f32 operations in the same order on every path, and activations
/// cross the ring as f32, so its logits are those of one process exactly (max |Δ| = 0).
const EXACT: f32 = 0.0;
/// A batch: its rows go through operations of other shapes than one sequence alone (one
/// matmul over several rows, a masked attention over padded rows), which round differently.
const BATCHED_TOLERANCE: f32 = 1e-3;
const DECODE_STEPS: usize = 4;

/// One rank's process, not a test of its own: ignored in a plain run (so it is never counted
/// as passing), run by its parent test with `--ignored --exact` and its spec in `CHILD_ENV`.
#[test]
#[ignore = "one rank's process: its parent test runs it"]
fn pipeline_child() {
    // The ranks' logits are compared with one process's to float rounding: x stays f32 (the
    // int8 x of decode-sized CPU products turns a float-order difference into a different
    // rounding step, up to its bound: see `inference::cpu_kernels`).
    inference::cpu_kernels::round_x_to_int8(false);
    let spec = std::env::var(CHILD_ENV).unwrap_or_else(|_| {
        panic!("a rank's process: run only by its parent test, with {CHILD_ENV} set")
    });
    // model|rank|hosts (JSON)|ranges "0-2,2-4"|prompt "1,2,3"|single or batched
    let parts: Vec<&str> = spec.split('|').collect();
    let model = PathBuf::from(parts[0]);
    let rank: usize = parts[1].parse().unwrap();
    let hosts = parse_hosts_field(parts[2]);
    let ranges: Vec<std::ops::Range<usize>> = parts[3]
        .split(',')
        .map(|r| {
            let (a, b) = r.split_once('-').unwrap();
            a.parse().unwrap()..b.parse().unwrap()
        })
        .collect();
    let prompt: Vec<u32> = parts[4].split(',').map(|t| t.parse().unwrap()).collect();
    let size = ranges.len();

    let (shard, _) = load_shard(
        &model,
        &LoadOptions {
            layers: Some(ranges[rank].clone()),
            format: None,
        },
        &mut |_, _| {},
    )
    .unwrap();
    assert_eq!(hosts.len(), size);
    let config = RingConfig { rank, hosts };
    let dir = std::env::temp_dir().join(format!("shoal-pipeline-{}", std::process::id()));
    let group = RingGroup::join(&config, &dir, Duration::from_secs(60)).unwrap();
    let mut stage = PipelineStage::new(shard, group).unwrap();
    if rank > 0 {
        let steps = stage.serve().unwrap();
        println!("RANK {rank} SERVED {steps}");
        return;
    }

    if parts[5] == "vision" {
        let report = vision_over_the_ring(&mut stage, &model);
        stage.stop().unwrap();
        println!("RANK 0 OK {report}");
        return;
    }
    let (whole, _) = load_shard(&model, &LoadOptions::default(), &mut |_, _| {}).unwrap();
    if parts[5] == "batched" {
        common::batched::drive(&mut stage, &whole, &prompt, DECODE_STEPS, BATCHED_TOLERANCE);
        return;
    }
    // One sequence runs through the ring's one protocol: a batch of one.
    let mut one = OneSequence::new(RingBatch::new(&mut stage, 1)).unwrap();
    let mut cache = whole.new_cache();
    let mut worst = 0.0f32;
    let mut tokens = prompt.clone();
    let mut generated = Vec::new();
    for step in 0..=DECODE_STEPS {
        let want = last_logits_to_host(
            &whole
                .forward(ShardInput::Tokens(&tokens), &mut cache, true)
                .unwrap(),
        )
        .unwrap();
        let got = one.forward(&tokens).unwrap();
        let diff = max_abs_diff(&want, &got);
        assert!(diff <= EXACT, "step {step}: logits differ by {diff}");
        worst = worst.max(diff);
        let next = argmax(&got);
        assert_eq!(next, argmax(&want), "step {step}: greedy tokens differ");
        generated.push(next);
        tokens = vec![next];
    }
    // A second request after a reset starts from an empty cache again.
    one.reset().unwrap();
    let again = one.forward(&prompt).unwrap();
    let mut fresh = whole.new_cache();
    let want = last_logits_to_host(
        &whole
            .forward(ShardInput::Tokens(&prompt), &mut fresh, true)
            .unwrap(),
    )
    .unwrap();
    let diff = max_abs_diff(&want, &again);
    assert!(diff <= EXACT, "after reset: logits differ by {diff}");
    drop(one);
    stage.stop().unwrap();
    println!("RANK 0 OK max_diff={worst:e} tokens={generated:?}");
}

/// Rank 0 of a Qwen3.5 vision model (the mlx-vlm fixture folder `dir`): the batcher with the
/// tower over the ring, every test image in one batch, each prompt rendered and expanded as a
/// node does. Every rank's attention must place the image tokens by the spans the step plans
/// carry: each answer must be mlx-vlm's, token for token. Returns the report line.
fn vision_over_the_ring(stage: &mut PipelineStage, dir: &std::path::Path) -> String {
    use inference::batch::{BatchEvent, BatchLimits, Batcher};
    let tower = VisionTower::load(dir, stage.shard())
        .unwrap()
        .expect("a tower");
    let tokenizer = inference::loader::open_model(dir).unwrap().tokenizer;
    let vision = ImagePrompt::read(dir, &tokenizer).unwrap().unwrap();
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let root = common::vision_fixtures();
    let mut requests = Vec::new();
    let mut wanted = Vec::new();
    for (name, answer) in reference["answers"].as_object().unwrap() {
        let path = match name.as_str() {
            "big.png" => dir.parent().unwrap().join("big.png"),
            other => root.join("images").join(other),
        };
        let image = ChatImage {
            data: std::fs::read(path).unwrap(),
            ..ChatImage::default()
        };
        let messages = vec![ChatMessage {
            images: vec![image.clone()],
            ..ChatMessage::new("user", reference["question"].as_str().unwrap())
        }];
        let text = tokenizer
            .render_chat(&TemplateInput {
                messages: &messages,
                add_generation_prompt: true,
                ..TemplateInput::default()
            })
            .unwrap();
        let ids = tokenizer
            .encode(
                &vision
                    .expand_images(&text, std::slice::from_ref(&image))
                    .unwrap(),
            )
            .unwrap();
        let want: Vec<u32> = answer["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect();
        let mut request = GenerateRequest::new(Prompt::Tokens(ids), want.len());
        request.images = vec![image];
        requests.push(request);
        wanted.push((name.clone(), want));
    }
    let limits = BatchLimits {
        max_sequences: 4,
        kv_tokens: 4096,
    };
    let mut b = Batcher::new(Box::new(RingBatch::new(stage, 4)), &tokenizer, limits)
        .with_vision(Some(&tower));
    for (i, r) in requests.iter().enumerate() {
        b.submit(i as u64, r).unwrap();
    }
    let mut got: Vec<Vec<u32>> = vec![Vec::new(); requests.len()];
    let mut done = 0;
    while done < requests.len() {
        for (id, event) in b.step().unwrap() {
            match event {
                BatchEvent::Token { token, .. } => got[id as usize].push(token),
                BatchEvent::Done(_) => done += 1,
                BatchEvent::Failed { message, .. } => panic!("request {id}: {message}"),
                _ => {}
            }
        }
    }
    for ((name, want), got) in wanted.iter().zip(&got) {
        assert_eq!(got, want, "{name}: not mlx-vlm's answer over the ring");
    }
    format!("vision answers={}", wanted.len())
}

/// Runs the ranks of `ranges` (`single`: rank 0 checks one sequence step by step;
/// `batched`: the batched scenario; `vision`: Qwen3.5 images) and checks what every rank
/// reports.
fn run_pipeline(model: &std::path::Path, ranges: &str, prompt: &str, slot: u16, mode: &str) {
    let base = 42000 + (std::process::id() % 400) as u16 * 50 + slot * 8;
    let size = ranges.split(',').count();
    // Two digits: a tag must not begin another's (creating namespaces removes those whose
    // names begin with the tag, so `pp1` would remove `pp17`'s while it runs).
    let net = RankNet::new(&format!("pp{slot:02}"), size, base);
    let specs: Vec<String> = (0..size)
        .map(|rank| {
            let hosts = hosts_field(&net.hosts(rank));
            format!(
                "{}|{rank}|{hosts}|{ranges}|{prompt}|{mode}",
                model.display()
            )
        })
        .collect();
    let outputs = run_ranks(&net, "pipeline_child", CHILD_ENV, &specs, "");
    let report = if mode == "batched" {
        common::batched::check_served(&outputs)
    } else if mode == "vision" {
        for (rank, stdout) in outputs.iter().enumerate().skip(1) {
            assert!(
                stdout.contains(&format!("RANK {rank} SERVED")),
                "rank {rank}: {stdout}"
            );
        }
        outputs[0]
            .lines()
            .find(|l| l.contains("RANK 0 OK"))
            .unwrap_or_else(|| panic!("rank 0 did not finish: {}", outputs[0]))
            .to_string()
    } else {
        // The others served the prefill, the decode steps and the request after the reset.
        for (rank, stdout) in outputs.iter().enumerate().skip(1) {
            let served = format!("RANK {rank} SERVED {}", DECODE_STEPS + 2);
            assert!(stdout.contains(&served), "rank {rank}: {stdout}");
        }
        outputs[0]
            .lines()
            .find(|l| l.contains("RANK 0 OK"))
            .unwrap_or_else(|| panic!("rank 0 did not finish: {}", outputs[0]))
            .to_string()
    };
    let place = if net.in_namespaces() {
        "namespaces"
    } else {
        "loopback"
    };
    eprintln!("{ranges} ({place}): {report}");
}

#[test]
fn tiny_llama_two_ranks_match_one_node() {
    let dir = temp_dir("pipeline-llama");
    write_tiny_model(&dir, "llama", 7, 64);
    run_pipeline(&dir, "0-2,2-4", "3,17,42,5,88", 0, "single");
}

#[test]
fn tiny_qwen3_three_ranks_match_one_node() {
    let dir = temp_dir("pipeline-qwen3");
    write_tiny_model(&dir, "qwen3", 8, 64);
    run_pipeline(&dir, "0-1,1-2,2-4", "3,17,42,5,88", 1, "single");
}

#[test]
fn smollm2_two_ranks_match_one_node() {
    run_pipeline(
        &smollm2(),
        "0-15,15-30",
        common::SMOLLM2_PROMPT,
        2,
        "single",
    );
}

#[test]
fn smollm2_three_ranks_match_one_node() {
    run_pipeline(
        &smollm2(),
        "0-10,10-20,20-30",
        common::SMOLLM2_PROMPT,
        3,
        "single",
    );
}

#[test]
fn tiny_qwen3_three_ranks_batch_like_one_node_alone() {
    let dir = temp_dir("pipeline-batch-qwen3");
    write_tiny_model(&dir, "qwen3", 9, 64);
    run_pipeline(&dir, "0-1,1-2,2-4", "3,17,42,5,88,7", 4, "batched");
}

#[test]
fn smollm2_two_ranks_batch_like_one_node_alone() {
    run_pipeline(
        &smollm2(),
        "0-15,15-30",
        common::SMOLLM2_PROMPT,
        5,
        "batched",
    );
}

/// Qwen3.5's images over a 2-rank pipeline (each rank a Gated DeltaNet layer and an attention
/// layer): the image tokens' M-RoPE spans travel in the step plans, and every answer is
/// mlx-vlm's.
#[test]
fn qwen3_5_vision_two_ranks_answer_images_as_mlx_vlm_does() {
    let dir = common::vision_fixtures().join("qwen3_5/f32");
    run_pipeline(&dir, "0-2,2-4", "0", 6, "vision");
}
