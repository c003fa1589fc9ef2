//! MLX's ring backend through `inference::ring`, with real processes on loopback.
//!
//! Each test re-runs this test binary as N child processes (one rank each): the ignored
//! `ring_child` test, run with `--ignored` and `SHOAL_RING_CHILD` set, does the work.

use inference::ring::{RingConfig, RingError, RingGroup};
use mlx_rs::{ops, Array, Dtype};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "SHOAL_RING_CHILD";

/// Ports per test, offset by the process id so parallel runs of the suite do not collide.
fn base_port(test_slot: u16) -> u16 {
    40000 + (std::process::id() % 500) as u16 * 40 + test_slot * 8
}

fn hosts(n: usize, base: u16) -> Vec<Vec<String>> {
    (0..n)
        .map(|r| vec![format!("127.0.0.1:{}", base + r as u16)])
        .collect()
}

/// One rank's process, not a test of its own: ignored in a plain run (so it is never counted
/// as passing), run by its parent test with `--ignored --exact` and its spec in `CHILD_ENV`.
#[test]
#[ignore = "one rank's process: its parent test runs it"]
fn ring_child() {
    let spec = std::env::var(CHILD_ENV).unwrap_or_else(|_| {
        panic!("a rank's process: run only by its parent test, with {CHILD_ENV} set")
    });
    let parts: Vec<&str> = spec.split(',').collect();
    let (mode, rank, size, base) = (
        parts[0],
        parts[1].parse::<usize>().unwrap(),
        parts[2].parse::<usize>().unwrap(),
        parts[3].parse::<u16>().unwrap(),
    );
    let config = RingConfig {
        rank,
        hosts: hosts(size, base),
    };
    let dir = std::env::temp_dir().join(format!("shoal-ring-test-{}", std::process::id()));
    if mode == "lonely" {
        let err = RingGroup::join(&config, &dir, Duration::from_secs(3))
            .expect_err("a ring whose neighbour never comes must not form");
        println!("LONELY {err}");
        // The join thread stays blocked inside MLX; leave without waiting for it.
        std::process::exit(match err {
            RingError::Timeout { .. } | RingError::Join(_) => 0,
            _ => 3,
        });
    }
    let group = RingGroup::join(&config, &dir, Duration::from_secs(60)).expect("join the ring");
    assert_eq!((group.rank(), group.size()), (rank, size));

    let mine = Array::from_slice(&[(rank + 1) as f32; 4], &[4]);
    let sum = group.all_sum(&mine).unwrap();
    sum.eval().unwrap();
    let want = (size * (size + 1) / 2) as f32;
    assert_eq!(sum.as_slice::<f32>(), &[want; 4]);

    let gathered = group
        .all_gather(&Array::from_slice(&[rank as i32], &[1]))
        .unwrap();
    gathered.eval().unwrap();
    let want: Vec<i32> = (0..size as i32).collect();
    assert_eq!(gathered.as_slice::<i32>(), want.as_slice());

    // A pipeline: rank 0 starts, every next rank adds one, the last rank checks.
    let value = if rank == 0 {
        Array::from_slice(&[1.0f32, 2.0, 3.0], &[3])
    } else {
        let got = group.recv(&[3], Dtype::Float32, rank - 1).unwrap();
        ops::add(&got, Array::from_f32(1.0)).unwrap()
    };
    if rank + 1 < size {
        group.send(&value, rank + 1).unwrap().eval().unwrap();
    } else {
        value.eval().unwrap();
        let step = (size - 1) as f32;
        assert_eq!(
            value.as_slice::<f32>(),
            &[1.0 + step, 2.0 + step, 3.0 + step]
        );
    }
    // Not a neighbour (in rings of 4+) or itself: refused without touching MLX.
    assert!(group.send(&value, rank).is_err());
    println!("RANK {rank} OK");
}

fn spawn_rank(mode: &str, rank: usize, size: usize, base: u16) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "ring_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, format!("{mode},{rank},{size},{base}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn run_ring(size: usize, slot: u16) {
    let base = base_port(slot);
    let children: Vec<_> = (0..size)
        .map(|r| spawn_rank("ring", r, size, base))
        .collect();
    let started = Instant::now();
    for (rank, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains(&format!("RANK {rank} OK")),
            "rank {rank} of {size} failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    eprintln!("ring of {size} done in {:?}", started.elapsed());
}

#[test]
fn two_ranks_sum_gather_and_pipeline() {
    run_ring(2, 0);
}

#[test]
fn three_ranks_sum_gather_and_pipeline() {
    run_ring(3, 1);
}

#[test]
fn a_missing_neighbour_is_reported_not_waited_for_forever() {
    let started = Instant::now();
    let out = spawn_rank("lonely", 0, 2, base_port(2))
        .wait_with_output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("LONELY"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("rank 1"),
        "the error names the neighbour: {stdout}"
    );
    assert!(started.elapsed() < Duration::from_secs(40));
}
