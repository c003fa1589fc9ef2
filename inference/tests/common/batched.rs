//! A batched scenario any [`BatchForward`] can run, checked against the whole model running
//! each sequence alone: sequences of different lengths join at different steps, one is
//! prefilled in chunks (no logits from its first chunk), one is cancelled midway, and a
//! sequence that joins later reuses an ended one's slot. Greedy tokens must be equal and logits close.

use super::{argmax, max_abs_diff};
use inference::batch::{BatchForward, BatchPart, RingBatch, Slot};
use inference::sequence_forward::last_logits_to_host;
use inference::stage::Stage;
use inference::{ModelShard, ShardInput};

/// One sequence of the scenario.
struct Script {
    prompt: Vec<u32>,
    /// The step it joins at.
    join: usize,
    /// Its prompt goes in chunks of at most this many tokens.
    chunk: usize,
    /// The step at which it is cancelled (it is never compared).
    cancel: Option<usize>,
}

/// Where a running sequence is.
struct Running {
    script: usize,
    slot: Slot,
    prefilled: usize,
    generated: Vec<u32>,
    logits: Vec<Vec<f32>>,
}

/// Five sequences built from `prompt` (lengths differ; the third is cancelled, the fifth
/// joins after it and takes an ended sequence's slot).
fn scripts(prompt: &[u32]) -> Vec<Script> {
    let reversed: Vec<u32> = prompt.iter().rev().copied().collect();
    let longer: Vec<u32> = prompt.iter().chain(reversed.iter()).copied().collect();
    let short: Vec<u32> = prompt.iter().take(3).copied().collect();
    vec![
        Script {
            prompt: longer.clone(),
            join: 0,
            chunk: longer.len().div_ceil(2),
            cancel: None,
        },
        Script {
            prompt: reversed.clone(),
            join: 1,
            chunk: usize::MAX,
            cancel: None,
        },
        Script {
            prompt: prompt.to_vec(),
            join: 1,
            chunk: usize::MAX,
            cancel: Some(3),
        },
        Script {
            prompt: short,
            join: 2,
            chunk: usize::MAX,
            cancel: None,
        },
        Script {
            prompt: prompt.to_vec(),
            join: 4,
            chunk: usize::MAX,
            cancel: None,
        },
    ]
}

/// `prompt` alone on the whole model, greedy: `decode` tokens and the logits each came from.
fn alone(whole: &ModelShard, prompt: &[u32], decode: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut cache = whole.new_cache();
    let (mut tokens, mut out, mut logits) = (prompt.to_vec(), Vec::new(), Vec::new());
    for _ in 0..decode {
        let step = whole
            .forward(ShardInput::Tokens(&tokens), &mut cache, true)
            .unwrap();
        let host = last_logits_to_host(&step).unwrap();
        let next = argmax(&host);
        out.push(next);
        logits.push(host);
        tokens = vec![next];
    }
    (out, logits)
}

/// Runs the scenario of `prompt` through `forward` and checks every sequence that was not
/// cancelled against `whole` alone: same `decode` greedy tokens, logits within `tolerance`.
/// Returns the number of steps run and the worst logit difference.
pub fn check_batched(
    forward: &mut dyn BatchForward,
    whole: &ModelShard,
    prompt: &[u32],
    decode: usize,
    tolerance: f32,
) -> (usize, f32) {
    // Batched against alone to float rounding: x stays f32 (see `inference::cpu_kernels`).
    inference::cpu_kernels::round_x_to_int8(false);
    let scripts = scripts(prompt);
    let mut running: Vec<Running> = Vec::new();
    let mut finished: Vec<Running> = Vec::new();
    let mut step = 0;
    let mut slots_seen = Vec::new();
    while finished.len() + scripts.iter().filter(|s| s.cancel.is_some()).count() < scripts.len() {
        for (i, s) in scripts.iter().enumerate() {
            if s.join == step {
                let slot = forward.open().unwrap();
                slots_seen.push(slot);
                running.push(Running {
                    script: i,
                    slot,
                    prefilled: 0,
                    generated: Vec::new(),
                    logits: Vec::new(),
                });
            }
        }
        running.retain(|r| {
            let cancelled = scripts[r.script].cancel == Some(step);
            if cancelled {
                forward.close(r.slot);
            }
            !cancelled
        });
        let inputs: Vec<(Vec<u32>, bool)> = running
            .iter()
            .map(|r| {
                let s = &scripts[r.script];
                if r.prefilled < s.prompt.len() {
                    let end = (r.prefilled + s.chunk).min(s.prompt.len());
                    (s.prompt[r.prefilled..end].to_vec(), end == s.prompt.len())
                } else {
                    (vec![*r.generated.last().unwrap()], true)
                }
            })
            .collect();
        let parts: Vec<BatchPart<'_>> = running
            .iter()
            .zip(&inputs)
            .map(|(r, (tokens, wants_logits))| BatchPart {
                slot: r.slot,
                tokens,
                wants_logits: *wants_logits,
                images: Vec::new(),
                mrope: None,
            })
            .collect();
        let mut logits = forward.step(&parts).unwrap().into_iter();
        for (r, (tokens, wants)) in running.iter_mut().zip(&inputs) {
            let s = &scripts[r.script];
            if r.prefilled < s.prompt.len() {
                r.prefilled += tokens.len();
            }
            if *wants {
                let l = logits.next().expect("logits of every part that wants them");
                r.generated.push(argmax(&l));
                r.logits.push(l);
            }
        }
        assert!(
            logits.next().is_none(),
            "step {step}: more logits than asked"
        );
        let (done, still): (Vec<Running>, Vec<Running>) = running
            .into_iter()
            .partition(|r| r.generated.len() == decode);
        for r in &done {
            forward.close(r.slot);
        }
        finished.extend(done);
        running = still;
        step += 1;
        assert!(step < 100, "the scenario does not end");
    }
    // Distributed stages number slots from the lowest free one: the last sequence joined
    // after others ended and took one of their slots (the cancelled one's, or a finished
    // one's when that is lower), so the ranks' caches of a reused slot must start fresh. (The
    // whole model in one process, which hands caches out, numbers slots afresh.)
    assert!(
        forward.keeps_caches() || slots_seen[..4].contains(&slots_seen[4]),
        "an ended sequence's slot is reused: {slots_seen:?}"
    );
    let mut worst = 0.0f32;
    for r in &finished {
        let s = &scripts[r.script];
        let (want, want_logits) = alone(whole, &s.prompt, decode);
        assert_eq!(
            r.generated,
            want,
            "sequence {} (prompt of {}, joined at step {}): batched tokens differ from alone",
            r.script,
            s.prompt.len(),
            s.join
        );
        for (got, want) in r.logits.iter().zip(&want_logits) {
            let diff = max_abs_diff(got, want);
            assert!(
                diff < tolerance,
                "sequence {}: logits differ by {diff}",
                r.script
            );
            worst = worst.max(diff);
        }
    }
    (step, worst)
}

/// Checks the ranks' reports of a batched scenario (`outputs[rank]` is each rank's stdout):
/// rank 0 printed `RANK 0 BATCHED steps=N ...` and every other rank served exactly N steps.
/// Returns rank 0's report.
pub fn check_served(outputs: &[String]) -> String {
    let report = outputs[0]
        .lines()
        .find(|l| l.contains("RANK 0 BATCHED"))
        .unwrap_or_else(|| panic!("rank 0 did not finish: {}", outputs[0]))
        .to_string();
    let steps = report
        .split("steps=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_else(|| panic!("no step count in {report}"));
    for (rank, stdout) in outputs.iter().enumerate().skip(1) {
        let served = format!("RANK {rank} SERVED {steps}");
        assert!(
            stdout.contains(&served),
            "rank {rank} ({served}?): {stdout}"
        );
    }
    report
}

/// Rank 0 of a multi-rank instance: runs the scenario through [`RingBatch`] over `stage`,
/// stops the other ranks and prints `RANK 0 BATCHED steps=N max_diff=D` for
/// [`check_served`].
pub fn drive(
    stage: &mut dyn Stage,
    whole: &ModelShard,
    prompt: &[u32],
    decode: usize,
    tolerance: f32,
) {
    let (steps, worst) = {
        let mut batch = RingBatch::new(stage, 8);
        check_batched(&mut batch, whole, prompt, decode, tolerance)
    };
    stage.stop().unwrap();
    println!("RANK 0 BATCHED steps={steps} max_diff={worst:e}");
}
