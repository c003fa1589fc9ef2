//! The ranks of a tensor-parallel test (`tests/tensor_parallel_processes.rs`,
//! `tests/tensor_parallel_hybrid.rs`): each test re-runs its own binary as one child process
//! per rank, in its own network namespace (on loopback when not root); every rank compares its
//! (all-summed) logits with the whole model's over a prefill and greedy decode steps, and on a
//! family fixture with mlx-lm's logits too. The batched runs drive several sequences through
//! `TensorStage` and `RingBatch` and compare each with the whole model running it alone.

use super::reference::{rows_of, worst, Reference};
use super::{argmax, host, hosts_field, max_abs_diff, parse_hosts_field, run_ranks, RankNet};
use inference::loader::{load_shard, LoadOptions};
use inference::ring::{RingConfig, RingGroup};
use inference::stage::Stage;
use inference::tensor_stage::TensorStage;
use inference::ShardInput;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub const CHILD_ENV: &str = "SHOAL_TP_CHILD";
/// Partial sums are added in a different order than one matmul adds them: rounding differs.
const TOLERANCE: f32 = 1e-3;
const DECODE_STEPS: usize = 3;

/// The work of one rank's process: each test binary that runs ranks has an ignored test
/// `tensor_parallel_child` calling this (so it is never counted as passing), run by its parent
/// test with `--ignored --exact` and its spec in `CHILD_ENV`.
pub fn child() {
    // The ranks' logits are compared with one process's to float rounding: x stays f32 (the
    // int8 x of decode-sized CPU products turns a float-order difference into a different
    // rounding step, up to its bound: see `inference::cpu_kernels`).
    inference::cpu_kernels::round_x_to_int8(false);
    let spec = std::env::var(CHILD_ENV).unwrap_or_else(|_| {
        panic!("a rank's process: run only by its parent test, with {CHILD_ENV} set")
    });
    // model|rank|hosts (JSON)|prompt "1,2,3"|single or batched|weight format
    // [|tolerance against mlx-lm's logits: `single` on a family fixture checks them too]
    let parts: Vec<&str> = spec.split('|').collect();
    let model = PathBuf::from(parts[0]);
    let rank: usize = parts[1].parse().unwrap();
    let hosts = parse_hosts_field(parts[2]);
    let prompt: Vec<u32> = parts[3].split(',').map(|t| t.parse().unwrap()).collect();
    let options = LoadOptions {
        layers: None,
        format: Some(parts[5].parse().unwrap()),
    };

    let (whole, _) = load_shard(&model, &options, &mut |_, _| {}).unwrap();
    let (mine, _) = load_shard(&model, &options, &mut |_, _| {}).unwrap();
    let config = RingConfig { rank, hosts };
    let dir = std::env::temp_dir().join(format!("shoal-tp-{}", std::process::id()));
    let group = Arc::new(RingGroup::join(&config, &dir, Duration::from_secs(60)).unwrap());
    let sliced = mine.into_tensor_parallel(group.clone()).unwrap();
    if parts[4] == "batched" {
        // Rank 0 drives the batched scenario through `RingBatch`; the others serve.
        let mut stage = TensorStage::new(sliced, group).unwrap();
        if rank > 0 {
            let steps = stage.serve().unwrap();
            println!("RANK {rank} SERVED {steps}");
            return;
        }
        super::batched::drive(&mut stage, &whole, &prompt, DECODE_STEPS, TOLERANCE);
        return;
    }

    let (mut whole_cache, mut cache) = (whole.new_cache(), sliced.new_cache());
    let mut tokens = prompt;
    let mut worst = 0.0f32;
    let mut generated = Vec::new();
    for step in 0..=DECODE_STEPS {
        let want = host(
            &whole
                .forward(ShardInput::Tokens(&tokens), &mut whole_cache, true)
                .unwrap(),
        );
        let got = host(
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
    if let Some(tolerance) = parts.get(6) {
        let (prefill, decode) = against_mlx_lm(&sliced, &model, tolerance.parse().unwrap());
        println!("RANK {rank} mlx-lm max_diff prefill={prefill:e} decode={decode:e}");
    }
    println!("RANK {rank} OK max_diff={worst:e} tokens={generated:?}");
}

/// Runs mlx-lm's prompt of fixture folder `model` through the tensor-parallel `sliced` model
/// (every position's logits), then its greedy tokens one at a time on the cache, and checks
/// both against mlx-lm's logits within `tolerance`; returns the worst differences.
fn against_mlx_lm(
    sliced: &inference::ModelShard,
    model: &std::path::Path,
    tolerance: f32,
) -> (f32, f32) {
    let reference = Reference::read(model);
    let mut cache = sliced.new_cache();
    let mut pass = |tokens: &[u32]| {
        rows_of(
            &sliced
                .forward(ShardInput::Tokens(tokens), &mut cache, false)
                .unwrap(),
        )
    };
    let prefill = pass(&reference.prompt);
    let decode: Vec<Vec<f32>> = reference
        .decode_tokens
        .iter()
        .map(|&t| pass(&[t]).remove(0))
        .collect();
    let (p, d) = (
        worst(&reference.prefill, &prefill),
        worst(&reference.decode, &decode),
    );
    assert!(p < tolerance, "prefill logits differ from mlx-lm's by {p}");
    assert!(d < tolerance, "decode logits differ from mlx-lm's by {d}");
    (p, d)
}

/// Runs `size` ranks (`single`: every rank checks one sequence; `batched`: rank 0 runs the
/// batched scenario) and checks what they report.
pub fn run_tensor_parallel(
    model: &std::path::Path,
    size: usize,
    prompt: &str,
    slot: u16,
    mode: &str,
) {
    run_tensor_parallel_as(model, size, prompt, slot, mode, "f32");
}

/// [`run_tensor_parallel`] with the weights in `format` (`f32`, `quantized`).
pub fn run_tensor_parallel_as(
    model: &std::path::Path,
    size: usize,
    prompt: &str,
    slot: u16,
    mode: &str,
    format: &str,
) {
    run_ranks_with(model, size, prompt, slot, &format!("{mode}|{format}"));
}

/// Two ranks of fixture `family`/`layout` (`hf`: f32; else quantized) in ring slot `slot`:
/// the whole model against its slices over a prompt and greedy steps, then mlx-lm's prompt and
/// tokens against mlx-lm's logits (f32 within 1e-4, quantized within 1e-3).
pub fn family_ring_matches_mlx_lm(family: &str, layout: &str, slot: u16) {
    let dir = kit::dirs::family_fixture_dir(family, layout);
    let (format, tolerance) = if layout == "hf" {
        ("f32", 1e-4)
    } else {
        ("quantized", 1e-3)
    };
    run_ranks_with(
        &dir,
        2,
        "3,17,42,5,88",
        slot,
        &format!("single|{format}|{tolerance}"),
    );
}

/// Runs `size` ranks with `tail` (`mode|format[|tolerance]`) ending their specs.
pub fn run_ranks_with(model: &std::path::Path, size: usize, prompt: &str, slot: u16, tail: &str) {
    let mode = tail.split('|').next().unwrap_or_default();
    let base = 46000 + (std::process::id() % 300) as u16 * 40 + slot * 8;
    // Two digits: a tag must not begin another's (creating namespaces removes those whose
    // names begin with the tag, so `tp1` would remove `tp17`'s while it runs).
    let net = RankNet::new(&format!("tp{slot:02}"), size, base);
    let specs: Vec<String> = (0..size)
        .map(|rank| {
            let hosts = hosts_field(&net.hosts(rank));
            format!("{}|{rank}|{hosts}|{prompt}|{tail}", model.display())
        })
        .collect();
    let place = if net.in_namespaces() {
        "namespaces"
    } else {
        "loopback"
    };
    if mode == "batched" {
        let outputs = run_ranks(&net, "tensor_parallel_child", CHILD_ENV, &specs, "");
        let report = super::batched::check_served(&outputs);
        eprintln!("{size} ranks ({place}): {report}");
        return;
    }
    for stdout in run_ranks(&net, "tensor_parallel_child", CHILD_ENV, &specs, "OK") {
        for line in stdout
            .lines()
            .filter(|l| l.contains("OK max_diff") || l.contains("mlx-lm max_diff"))
        {
            eprintln!("{size} ranks ({place}): {line}");
        }
    }
}

/// The 4-bit fixture of `family`; setup must have made it.
pub fn family_4bit(family: &str) -> PathBuf {
    let dir = kit::dirs::family_fixture_dir(family, "q4");
    assert!(
        dir.join("config.json").exists(),
        "{} is missing: run `cargo xtask setup`",
        dir.display()
    );
    dir
}
