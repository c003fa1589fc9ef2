//! `cargo bench -p placement`: `place` on full-mesh, ring and two-switch topologies of 4 to 64
//! nodes. Free memory varies from node to node (8 to 20 GB) and the model needs about a third
//! of the cluster's memory, so rings grow with the cluster (2 nodes of 4, about 17 of 64).
//! Figures: see the crate docs (`placement/src/lib.rs`, "Speed").

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use placement::fixture::*;
use placement::{place, Input};
use std::hint::black_box;

fn cluster(n: usize, topology: &str) -> Input {
    let rams: Vec<u64> = (0..n as u64)
        .map(|i| (8 + (i * 7919) % 13) * 1000 * MB)
        .collect();
    let total: u64 = rams.iter().sum();
    let nodes = numbered_nodes(&rams);
    let edges = match topology {
        "full_mesh" => full_mesh(&nodes),
        "ring" => ring(&nodes),
        _ => two_switch(&nodes),
    };
    input(nodes, edges, model(1000, total / 3), pipeline())
}

fn bench_place(c: &mut Criterion) {
    for topology in ["full_mesh", "ring", "two_switch"] {
        let mut group = c.benchmark_group(format!("place/{topology}"));
        for n in [4usize, 8, 16, 32, 64] {
            let input = cluster(n, topology);
            let outcome = match place(&input) {
                Ok(p) => format!("{} ranks", p.ranks.len()),
                Err(e) => e.code().to_string(),
            };
            eprintln!("{topology} n={n}: {outcome}");
            group.bench_with_input(BenchmarkId::from_parameter(n), &input, |b, input| {
                b.iter(|| place(black_box(input)))
            });
        }
        group.finish();
    }
    // Growth past the range, and the error path (the model fits nowhere: the search
    // runs again per filter stage to name the error).
    let mut group = c.benchmark_group("place/full_mesh_more");
    for n in [128usize, 256] {
        let input = cluster(n, "full_mesh");
        group.bench_with_input(BenchmarkId::from_parameter(n), &input, |b, input| {
            b.iter(|| place(black_box(input)))
        });
    }
    let mut too_big = cluster(64, "full_mesh");
    too_big.model.storage_bytes = u64::MAX;
    eprintln!(
        "full_mesh n=64, model too big: {:?}",
        place(&too_big).map(|_| ()).map_err(|e| e.code())
    );
    group.bench_with_input(BenchmarkId::new("too_big", 64), &too_big, |b, input| {
        b.iter(|| place(black_box(input)))
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(std::time::Duration::from_millis(300))
        .measurement_time(std::time::Duration::from_secs(1));
    targets = bench_place
}
criterion_main!(benches);
