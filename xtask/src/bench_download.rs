//! `cargo xtask bench download [--repeat 3] [--release]`: hub download time of
//! `shoal download` against `huggingface_hub`'s `snapshot_download` (pinned in pyenv.rs), from
//! the same test hub (`shoal-test-hub`, the SmolLM2 fixture split into three safetensors files),
//! the hub in one network namespace and the client in another, alternating, each run into an
//! empty cache; printed side by side with the ratio.
//!
//! The fixture's Hugging Face form is made by the download tests
//! (`cargo test --test hub_download`); the venv by `cargo xtask pyenv`.

use crate::paths::target_dir;
use kit::netns::{Netns, Spec};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub const REPO: &str = "HuggingFaceTB/SmolLM2-135M-Instruct";

pub fn fixture() -> Result<PathBuf, String> {
    let dir = kit::dirs::cache_dir()
        .join("hf-fixture")
        .join("SmolLM2-135M-Instruct-bf16-3");
    if dir.join("model.safetensors.index.json").is_file() {
        Ok(dir)
    } else {
        Err(format!(
            "{} is missing: run `cargo test --test hub_download` once to make it",
            dir.display()
        ))
    }
}

pub fn build(release: bool) -> Result<(PathBuf, PathBuf), String> {
    let shoal = crate::testbed::build_shoal(release)?;
    let mut hub = crate::cargo();
    hub.args([
        "build",
        "--package",
        "shoal-hub",
        "--features",
        "test-hub",
        "--bin",
        "shoal-test-hub",
    ]);
    if release {
        hub.arg("--release");
    }
    crate::util::run(&mut hub)?;
    let dir = target_dir().join(if release { "release" } else { "debug" });
    Ok((shoal, dir.join("shoal-test-hub")))
}

/// Runs `cmd`, returning its wall time; an error if it fails.
fn timed(mut cmd: Command, what: &str) -> Result<Duration, String> {
    let start = Instant::now();
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{what}: {e}"))?;
    let took = start.elapsed();
    if !out.status.success() {
        return Err(format!(
            "{what} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(took)
}

/// `cargo xtask bench download`.
pub fn bench_download(args: &[String]) -> Result<(), String> {
    let mut repeat = 3;
    let mut release = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--repeat" => {
                repeat = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("--repeat needs a number")?
            }
            "--release" => release = true,
            other => return Err(format!("bench download: unknown flag {other}")),
        }
    }
    kit::netns::available()?;
    let repo = fixture()?;
    let python = kit::dirs::venv_python();
    let probe = Command::new(&python)
        .args(["-c", "import huggingface_hub"])
        .status();
    if !probe.is_ok_and(|s| s.success()) {
        return Err("huggingface_hub is not in the venv: run `cargo xtask pyenv`".into());
    }
    let (shoal, test_hub) = build(release)?;
    let prefix = format!("bdl{}", std::process::id());
    let net = Netns::create(
        &prefix,
        &Spec {
            nodes: 2,
            ..Spec::default()
        },
    )?;
    let (hub_node, client) = (&net.nodes[0], &net.nodes[1]);
    let endpoint = format!("http://{}:8080", hub_node.ip());
    let mut server = hub_node
        .command(&test_hub.to_string_lossy())
        .args([
            "serve",
            &format!("{}:8080", hub_node.ip()),
            &format!("{}:8081", hub_node.ip()),
        ])
        .arg(format!("{REPO}={}", repo.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("starting the test hub: {e}"))?;
    // It prints its addresses once it listens.
    if let Some(out) = server.stdout.take() {
        use std::io::BufRead;
        let mut line = String::new();
        let _ = std::io::BufReader::new(out).read_line(&mut line);
    }
    let scratch = std::env::temp_dir().join(&prefix);
    let script =
        format!("from huggingface_hub import snapshot_download\nsnapshot_download('{REPO}')");
    let mut rows = Vec::new();
    let result = (|| {
        for run in 1..=repeat {
            let (a, b) = (
                scratch.join(format!("shoal{run}")),
                scratch.join(format!("hf{run}")),
            );
            let mut cmd = client.command(&shoal.to_string_lossy());
            cmd.args(["download", "--quiet", REPO])
                .env("HF_ENDPOINT", &endpoint)
                .env("HF_HUB_CACHE", &a);
            let s = timed(cmd, "shoal download")?;
            let mut cmd = client.command(&python.to_string_lossy());
            cmd.args(["-c", &script])
                .env("HF_ENDPOINT", &endpoint)
                .env("HF_HUB_CACHE", &b)
                .env("HF_HUB_DISABLE_XET", "1")
                .env("HF_HUB_DISABLE_PROGRESS_BARS", "1");
            let h = timed(cmd, "snapshot_download")?;
            rows.push((s, h));
            let _ = std::fs::remove_dir_all(&a);
            let _ = std::fs::remove_dir_all(&b);
        }
        Ok::<(), String>(())
    })();
    let _ = server.kill();
    let _ = server.wait();
    drop(net);
    let _ = std::fs::remove_dir_all(&scratch);
    result?;
    let bytes: u64 = std::fs::read_dir(&repo)
        .map_err(|e| e.to_string())?
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum();
    println!(
        "hub download of {REPO} ({:.1} MB, 7 files), hub and client in two namespaces ({}):",
        bytes as f64 / 1e6,
        if release { "release" } else { "debug" }
    );
    println!(
        "{:>4}  {:>14}  {:>22}  {:>8}",
        "run", "shoal download", "huggingface_hub 2.4.0", "speedup"
    );
    for (i, (s, h)) in rows.iter().enumerate() {
        println!(
            "{:>4}  {:>12.2} s  {:>20.2} s  {:>7.2}x",
            i + 1,
            s.as_secs_f64(),
            h.as_secs_f64(),
            h.as_secs_f64() / s.as_secs_f64().max(1e-9)
        );
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let s = median(rows.iter().map(|r| r.0.as_secs_f64()).collect());
    let h = median(rows.iter().map(|r| r.1.as_secs_f64()).collect());
    println!(
        "median  {s:>10.2} s  {h:>20.2} s  {:>7.2}x (goal >= 1.0x)",
        h / s.max(1e-9)
    );
    Ok(())
}
