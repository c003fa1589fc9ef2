//! Tensor parallelism through the real MLX ring: 2 and 3 processes on loopback, each holding a
//! slice of every layer's heads and MLP units, give the logits of one process holding it all.
//!
//! Each test re-runs this binary as one child process per rank (`tensor_parallel_child` works
//! when `SHOAL_TP_CHILD` is set). Every rank compares its (all-summed) logits with the whole
//! model's over a prefill and greedy decode steps.

mod common;

use common::{max_abs_diff, temp_dir, write_tiny_model};
use inference::engine::{load_shard, LoadOptions};
use inference::ring::{RingConfig, RingGroup};
use inference::ShardInput;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

const CHILD_ENV: &str = "SHOAL_TP_CHILD";
/// Partial sums are added in a different order than one matmul adds them: rounding differs.
const TOLERANCE: f32 = 1e-3;
const DECODE_STEPS: usize = 3;

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
    let a = a
        .reshape(&[-1])
        .unwrap()
        .as_dtype(mlx_rs::Dtype::Float32)
        .unwrap();
    a.eval().unwrap();
    a.as_slice::<f32>().to_vec()
}

#[test]
fn tensor_parallel_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    // model|rank|size|base_port|prompt "1,2,3"
    let parts: Vec<&str> = spec.split('|').collect();
    let model = PathBuf::from(parts[0]);
    let rank: usize = parts[1].parse().unwrap();
    let size: usize = parts[2].parse().unwrap();
    let base: u16 = parts[3].parse().unwrap();
    let prompt: Vec<u32> = parts[4].split(',').map(|t| t.parse().unwrap()).collect();

    let (whole, _) = load_shard(&model, &LoadOptions::default(), &mut |_, _| {}).unwrap();
    let (mine, _) = load_shard(&model, &LoadOptions::default(), &mut |_, _| {}).unwrap();
    let config = RingConfig {
        rank,
        hosts: (0..size)
            .map(|r| vec![format!("127.0.0.1:{}", base + r as u16)])
            .collect(),
    };
    let dir = std::env::temp_dir().join(format!("shoal-tp-{}", std::process::id()));
    let group = Arc::new(RingGroup::join(&config, &dir, Duration::from_secs(60)).unwrap());
    let sliced = mine.into_tensor_parallel(group).unwrap();

    let (mut whole_cache, mut cache) = (whole.new_cache(), sliced.new_cache());
    let mut tokens = prompt;
    let mut worst = 0.0f32;
    let mut generated = Vec::new();
    for step in 0..=DECODE_STEPS {
        let want = to_host(
            &whole
                .forward(ShardInput::Tokens(&tokens), &mut whole_cache, true)
                .unwrap(),
        );
        let got = to_host(
            &sliced
                .forward(ShardInput::Tokens(&tokens), &mut cache, true)
                .unwrap(),
        );
        let diff = max_abs_diff(&want, &got);
        assert!(
            diff < TOLERANCE,
            "rank {rank} step {step}: logits differ by {diff}"
        );
        worst = worst.max(diff);
        let next = argmax(&got);
        assert_eq!(
            next,
            argmax(&want),
            "rank {rank} step {step}: greedy tokens differ"
        );
        generated.push(next);
        tokens = vec![next];
    }
    println!("RANK {rank} OK max_diff={worst:e} tokens={generated:?}");
}

fn run_tensor_parallel(model: &std::path::Path, size: usize, prompt: &str, slot: u16) {
    let base = 46000 + (std::process::id() % 300) as u16 * 40 + slot * 8;
    let children: Vec<_> = (0..size)
        .map(|rank| {
            Command::new(std::env::current_exe().unwrap())
                .args([
                    "tensor_parallel_child",
                    "--exact",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(
                    CHILD_ENV,
                    format!("{}|{rank}|{size}|{base}|{prompt}", model.display()),
                )
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (rank, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains(&format!("RANK {rank} OK")),
            "rank {rank} failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        if let Some(line) = stdout.lines().find(|l| l.contains("OK max_diff")) {
            eprintln!("{size} ranks: {line}");
        }
    }
}

#[test]
fn tiny_llama_two_ranks_match_one_node() {
    let dir = temp_dir("tp-llama");
    write_tiny_model(&dir, "llama", 11, 64);
    run_tensor_parallel(&dir, 2, "3,17,42,5,88", 0);
}

#[test]
fn tiny_qwen3_two_ranks_match_one_node() {
    let dir = temp_dir("tp-qwen3");
    write_tiny_model(&dir, "qwen3", 12, 64);
    run_tensor_parallel(&dir, 2, "3,17,42,5,88", 1);
}

/// SmolLM2 has 9 query and 3 key/value heads: 3 ranks divide both (2 would not).
#[test]
fn smollm2_three_ranks_match_one_node() {
    let cache = std::env::var_os("SHOAL_CACHE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/shoal"));
    let model = cache.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        model.exists(),
        "{} is missing: run `cargo xtask setup`",
        model.display()
    );
    run_tensor_parallel(&model, 3, "1,4093,198,1780,314,260,3575,282,4649,47", 2);
}
