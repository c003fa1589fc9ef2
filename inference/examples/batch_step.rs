//! `cargo run --release -p inference --example batch_step`: the time of one batched decode
//! step of the SmolLM2 fixture (f32, the whole model in this process) at several batch sizes,
//! each sequence after a 128-token prefill. What a step costs per added sequence is what
//! limits batching's throughput; profile this (e.g. with `perf record`) to see where it goes.
//!
//! `SIZES=1,4,8,16` picks the batch sizes, `STEPS=20` the timed steps per size;
//! `SHOAL_DTYPE=quantized` runs the fixture's weights quantized (its Q4_1 repacked as 4-bit
//! affine), with shoal's CPU kernels unless `SHOAL_QMM=mlx` asks for MLX's. `MODEL=path` runs
//! another model file (a K-quant fixture, say) instead of the fixture.

use inference::batch::{BatchForward, BatchPart, LocalBatch};
use inference::{Engine, WeightFormat};
use std::time::Instant;

fn list(name: &str, default: &[usize]) -> Vec<usize> {
    std::env::var(name)
        .ok()
        .and_then(|v| v.split(',').map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| default.to_vec())
}

fn main() -> inference::Result<()> {
    let format = WeightFormat::default_for_backend();
    let model = std::env::var_os("MODEL").map_or_else(kit::dirs::default_model_path, Into::into);
    let engine = Engine::load(model, Some(format))?;
    println!("{format:?} weights");
    let steps = list("STEPS", &[20])[0].max(1);
    let prompt: Vec<u32> = (0..128).map(|i| 100 + i).collect();
    let next = [42u32];
    for n in list("SIZES", &[1, 4, 8, 16]) {
        let mut batch = LocalBatch::new(&engine.model, n)?;
        let slots = (0..n)
            .map(|_| batch.open())
            .collect::<inference::Result<Vec<_>>>()?;
        for &slot in &slots {
            batch.step(&[BatchPart {
                slot,
                tokens: &prompt,
                wants_logits: true,
                images: Vec::new(),
                mrope: None,
            }])?;
        }
        let parts: Vec<BatchPart<'_>> = slots
            .iter()
            .map(|&slot| BatchPart {
                slot,
                tokens: &next,
                wants_logits: true,
                images: Vec::new(),
                mrope: None,
            })
            .collect();
        for _ in 0..3 {
            batch.step(&parts)?;
        }
        let started = Instant::now();
        for _ in 0..steps {
            batch.step(&parts)?;
        }
        let ms = started.elapsed().as_secs_f64() * 1000.0 / steps as f64;
        println!(
            "{n:>3} sequences: {ms:7.1} ms/step, {:6.1} tok/s",
            n as f64 * 1000.0 / ms
        );
    }
    Ok(())
}
