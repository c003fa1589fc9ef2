//! 1024x1024 f32 matmul through mlx-rs: shows which BLAS MLX's CPU backend reaches.
//!
//! Expected on a 2-core x86_64 machine: about 11 ms with OpenBLAS (2 threads), about 375 ms
//! with the reference BLAS that the MLX wheel bundles. `OPENBLAS_NUM_THREADS` changes it.
use criterion::{criterion_group, criterion_main, Criterion};
use mlx_rs::{ops, Array};

fn matmul_1024(c: &mut Criterion) {
    let a = mlx_rs::random::normal::<f32>(&[1024, 1024], None, None, None).unwrap();
    let b = mlx_rs::random::normal::<f32>(&[1024, 1024], None, None, None).unwrap();
    a.eval().unwrap();
    b.eval().unwrap();
    eprintln!(
        "BLAS in this process: {:?}",
        inference::platform::loaded_blas_libraries()
    );
    let mut group = c.benchmark_group("mlx_cpu");
    group.sample_size(20);
    group.bench_function("matmul_f32_1024x1024", |bench| {
        bench.iter(|| {
            let out: Array = ops::matmul(&a, &b).unwrap();
            out.eval().unwrap();
            out
        })
    });
    group.finish();
}

criterion_group!(benches, matmul_1024);
criterion_main!(benches);
