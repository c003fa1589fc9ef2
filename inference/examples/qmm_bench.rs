//! One decode-sized product (2048 → 5632) timed in one run, alternating: shoal's CPU kernel
//! (`inference::cpu_kernels`) for every layout it serves (MLX's 4- and 8-bit groups of 64, and
//! the layouts GGUF files repack into: Q4_K 4-bit/32, Q5_K and Q5_0 5-bit/32, Q6_K 6-bit/16,
//! Q3_K 3-bit/16, Q2_K 2-bit/16, f32 scales and biases), MLX's CPU `quantized_matmul` where
//! MLX takes the layout, and the f32 product with resident f32 weights (OpenBLAS), at 1, 8 and
//! 64 rows. GB/s is the bytes each form reads (packed words, scales and biases; f32 weights)
//! over its time. Medians of 15 rounds, each a fresh evaluation. "shoal" is the fastest path
//! (int8 x below 32 rows for 4 and 8 bits, as `SHOAL_QMM=int8` runs), "exact x" the same
//! product with x kept in f32 (the default).
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

fn time(f: &dyn Fn() -> Array) -> f64 {
    let t = Instant::now();
    f().eval().unwrap();
    t.elapsed().as_secs_f64() * 1e3
}

fn main() {
    let (k, n) = (2048i32, 5632i32);
    let w32 = random::normal::<f32>(&[n, k], None, None, None).unwrap();
    w32.eval().unwrap();
    let f32_bytes = w32.nbytes() as f64;
    println!("{k} → {n}; f32 weights {:.1} MB", f32_bytes / 1e6);
    println!("| layout | bytes MB | rows | shoal ms | shoal GB/s | exact x ms | MLX qmm ms | f32 BLAS ms | f32 GB/s | shoal / f32 time |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let layouts = [
        ("MLX 4-bit/64", 4, 64),
        ("MLX 8-bit/64", 8, 64),
        ("Q4_K → 4-bit/32", 4, 32),
        ("Q5_K, Q5_0 → 5-bit/32", 5, 32),
        ("Q6_K → 6-bit/16", 6, 16),
        ("Q3_K → 3-bit/16", 3, 16),
        ("Q2_K → 2-bit/16", 2, 16),
    ];
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    for (name, bits, group) in layouts {
        let words: Vec<u32> = (0..(n * k * bits / 32) as usize)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u32
            })
            .collect();
        let packed = Array::from_slice(&words, &[n, k * bits / 32]);
        let scales = random::uniform::<_, f32>(0.0, 0.01, &[n, k / group], None).unwrap();
        let biases = random::uniform::<_, f32>(-0.1, 0.1, &[n, k / group], None).unwrap();
        mlx_rs::transforms::eval([&packed, &scales, &biases]).unwrap();
        let bytes = (packed.nbytes() + scales.nbytes() + biases.nbytes()) as f64;
        let spec = QuantSpec {
            group_size: group,
            bits,
            mode: QuantMode::Affine,
        };
        let mlx_reads = inference::cpu_kernels::mlx_reads(spec);
        for rows in [1, 8, 64] {
            let x = random::normal::<f32>(&[rows, k], None, None, None).unwrap();
            x.eval().unwrap();
            let (mut a, mut b, mut c, mut e) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for _ in 0..15 {
                b.push(time(&|| {
                    affine_product(&x, &packed, &scales, &biases, spec, KernelIsa::Best).unwrap()
                }));
                e.push(time(&|| {
                    affine_product(&x, &packed, &scales, &biases, spec, KernelIsa::Exact).unwrap()
                }));
                if mlx_reads {
                    a.push(time(&|| {
                        ops::quantized_matmul(&x, &packed, &scales, &biases, true, group, bits)
                            .unwrap()
                    }));
                }
                c.push(time(&|| {
                    ops::matmul(&x, w32.transpose_axes(&[1, 0]).unwrap()).unwrap()
                }));
            }
            let (b, c, e) = (median(b), median(c), median(e));
            let mlx = if mlx_reads {
                format!("{:.2}", median(a))
            } else {
                "—".to_owned()
            };
            println!(
                "| {name} | {:.1} | {rows} | {b:.2} | {:.1} | {e:.2} | {mlx} | {c:.2} | {:.1} | {:.2} |",
                bytes / 1e6,
                bytes / b / 1e6,
                f32_bytes / c / 1e6,
                b / c
            );
        }
    }
}
