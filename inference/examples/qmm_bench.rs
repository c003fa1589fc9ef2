//! One quantized product timed three ways, alternating in one run: MLX's CPU
//! `quantized_matmul`, shoal's CPU kernel (`inference::cpu_kernels`) and dequantizing and
//! the f32 product (OpenBLAS), as shoal runs prefill-sized products. Medians of 30 rounds, each a fresh evaluation.
//!
//! `cargo run --release -p inference --example qmm_bench` (not in CI: timings).

use inference::cpu_kernels::{affine_product, KernelIsa};
use inference::quantized::{QuantMode, QuantSpec};
use mlx_rs::{ops, random, Array};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    println!("| in → out | bits | rows | MLX qmm ms | shoal ms | dequantize + f32 ms | MLX GB/s | shoal GB/s | shoal/MLX |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for (k, n) in [(2048, 5632), (576, 1536)] {
        for bits in [4, 8] {
            let group = 64;
            let w = random::normal::<f32>(&[n, k], None, None, None).unwrap();
            let (packed, scales, biases) = ops::quantize(&w, group, bits).unwrap();
            mlx_rs::transforms::eval([&packed, &scales, &biases]).unwrap();
            let bytes = (packed.nbytes() + scales.nbytes() + biases.nbytes()) as f64;
            let spec = QuantSpec {
                group_size: group,
                bits,
                mode: QuantMode::Affine,
            };
            for rows in [1, 4, 16, 64] {
                let x = random::normal::<f32>(&[rows, k], None, None, None).unwrap();
                x.eval().unwrap();
                let time = |f: &dyn Fn() -> Array| {
                    let t = Instant::now();
                    f().eval().unwrap();
                    t.elapsed().as_secs_f64() * 1e3
                };
                let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
                for _ in 0..30 {
                    a.push(time(&|| {
                        ops::quantized_matmul(&x, &packed, &scales, &biases, true, group, bits)
                            .unwrap()
                    }));
                    b.push(time(&|| {
                        affine_product(&x, &packed, &scales, &biases, spec, KernelIsa::Best)
                            .unwrap()
                    }));
                    // f32 as a prefill runs it: dequantize, then OpenBLAS.
                    c.push(time(&|| {
                        let w = ops::dequantize(&packed, &scales, &biases, group, bits).unwrap();
                        ops::matmul(&x, w.transpose_axes(&[1, 0]).unwrap()).unwrap()
                    }));
                }
                let (a, b, c) = (median(a), median(b), median(c));
                println!(
                    "| {k} → {n} | {bits} | {rows} | {a:.2} | {b:.2} | {c:.2} | {:.1} | {:.1} | {:.1}x |",
                    bytes / a / 1e6,
                    bytes / b / 1e6,
                    a / b
                );
            }
        }
    }
}
