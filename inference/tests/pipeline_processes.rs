//! Pipeline parallelism through the real MLX ring: 2 and 3 processes on loopback, each
//! holding a layer range, give the same logits as one process holding the whole model.
//!
//! Each test re-runs this binary as one child process per rank (`pipeline_child` does the work
//! when `SHOAL_PIPELINE_CHILD` is set). Rank 0 also loads the whole model and compares, step by
//! step, a prefill and greedy decode steps.

mod common;

use common::{max_abs_diff, temp_dir, write_tiny_model};
use inference::engine::{load_shard, LoadOptions};
use inference::pipeline::PipelineStage;
use inference::ring::{RingConfig, RingGroup};
use inference::ShardInput;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

const CHILD_ENV: &str = "SHOAL_PIPELINE_CHILD";
/// The same f32 operations in the same order on every path; activations cross the ring as f32.
const TOLERANCE: f32 = 1e-3;
const DECODE_STEPS: usize = 4;

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

fn to_host(a: &mlx_rs::Array) -> Vec<f32> {
    let a = a.reshape(&[-1]).unwrap();
    a.eval().unwrap();
    a.as_slice::<f32>().to_vec()
}

#[test]
fn pipeline_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    // model|rank|base_port|ranges "0-2,2-4"|prompt "1,2,3"
    let parts: Vec<&str> = spec.split('|').collect();
    let model = PathBuf::from(parts[0]);
    let rank: usize = parts[1].parse().unwrap();
    let base: u16 = parts[2].parse().unwrap();
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
    let config = RingConfig {
        rank,
        hosts: (0..size)
            .map(|r| vec![format!("127.0.0.1:{}", base + r as u16)])
            .collect(),
    };
    let dir = std::env::temp_dir().join(format!("shoal-pipeline-{}", std::process::id()));
    let group = RingGroup::join(&config, &dir, Duration::from_secs(60)).unwrap();
    let mut stage = PipelineStage::new(shard, group).unwrap();
    if rank > 0 {
        let steps = stage.serve().unwrap();
        println!("RANK {rank} SERVED {steps}");
        return;
    }

    let (whole, _) = load_shard(&model, &LoadOptions::default(), &mut |_, _| {}).unwrap();
    let mut cache = whole.new_cache();
    let mut worst = 0.0f32;
    let mut tokens = prompt.clone();
    let mut generated = Vec::new();
    for step in 0..=DECODE_STEPS {
        let want = to_host(
            &whole
                .forward(ShardInput::Tokens(&tokens), &mut cache, true)
                .unwrap(),
        );
        let got = to_host(&stage.forward(&tokens).unwrap());
        let diff = max_abs_diff(&want, &got);
        assert!(diff < TOLERANCE, "step {step}: logits differ by {diff}");
        worst = worst.max(diff);
        let next = argmax(&got);
        assert_eq!(next, argmax(&want), "step {step}: greedy tokens differ");
        generated.push(next);
        tokens = vec![next];
    }
    // A second request after a reset starts from an empty cache again.
    stage.reset().unwrap();
    let again = to_host(&stage.forward(&prompt).unwrap());
    let mut fresh = whole.new_cache();
    let want = to_host(
        &whole
            .forward(ShardInput::Tokens(&prompt), &mut fresh, true)
            .unwrap(),
    );
    assert!(max_abs_diff(&want, &again) < TOLERANCE, "after reset");
    stage.stop().unwrap();
    println!("RANK 0 OK max_diff={worst:e} tokens={generated:?}");
}

fn run_pipeline(model: &std::path::Path, ranges: &str, prompt: &str, slot: u16) -> String {
    let base = 42000 + (std::process::id() % 400) as u16 * 50 + slot * 8;
    let size = ranges.split(',').count();
    let children: Vec<_> = (0..size)
        .map(|rank| {
            Command::new(std::env::current_exe().unwrap())
                .args([
                    "pipeline_child",
                    "--exact",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(
                    CHILD_ENV,
                    format!("{}|{rank}|{base}|{ranges}|{prompt}", model.display()),
                )
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut report = String::new();
    for (rank, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let marker = if rank == 0 {
            "RANK 0 OK".to_string()
        } else {
            format!("RANK {rank} SERVED {}", DECODE_STEPS + 2)
        };
        assert!(
            out.status.success() && stdout.contains(&marker),
            "rank {rank} failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        if rank == 0 {
            report = stdout
                .lines()
                .find(|l| l.contains("RANK 0 OK"))
                .unwrap()
                .to_string();
        }
    }
    eprintln!("{ranges}: {report}");
    report
}

#[test]
fn tiny_llama_two_ranks_match_one_node() {
    let dir = temp_dir("pipeline-llama");
    write_tiny_model(&dir, "llama", 7, 64);
    run_pipeline(&dir, "0-2,2-4", "3,17,42,5,88", 0);
}

#[test]
fn tiny_qwen3_three_ranks_match_one_node() {
    let dir = temp_dir("pipeline-qwen3");
    write_tiny_model(&dir, "qwen3", 8, 64);
    run_pipeline(&dir, "0-1,1-2,2-4", "3,17,42,5,88", 1);
}

fn smollm2() -> PathBuf {
    let cache = std::env::var_os("SHOAL_CACHE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/shoal"));
    let path = cache.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.exists(),
        "{} is missing: run `cargo xtask setup`",
        path.display()
    );
    path
}

/// "<|im_start|>user\nWhat is the capital of France?" in SmolLM2's vocabulary.
const SMOLLM2_PROMPT: &str = "1,4093,198,1780,314,260,3575,282,4649,47";

#[test]
fn smollm2_two_ranks_match_one_node() {
    run_pipeline(&smollm2(), "0-15,15-30", SMOLLM2_PROMPT, 2);
}

#[test]
fn smollm2_three_ranks_match_one_node() {
    run_pipeline(&smollm2(), "0-10,10-20,20-30", SMOLLM2_PROMPT, 3);
}
