//! `cargo xtask bench concurrency [--streams 1,4,8,16,32] [--tokens 128] [--no-mlx-lm]
//! [--pipeline] [--moe | --moe-hybrid] [--quantized]`:
//! many users at once. One shoal node serving the fixture (in a network namespace, with
//! `--max-sequences` as large as the most streams) and mlx-lm's server (`mlx_lm.server`,
//! the pinned mlx-lm in its own venv, the same fixture as f32 with the system OpenBLAS, its
//! batching on: `--decode-concurrency` and `--prompt-concurrency`) in the same namespace.
//! For each number of streams, alternating shoal then mlx-lm, that many streaming greedy
//! chats of exactly `--tokens` tokens start together (distinct prompts; shoal ignores its end
//! tokens, mlx-lm is biased against them), and the table gives, per server, the aggregate
//! generated tokens per second (all tokens over the wall time), the time to first token p50
//! and p99, and the ratio shoal/mlx-lm. With `--pipeline`, two nodes in two namespaces serve
//! the fixture as a 2-rank pipeline (placed with `min_nodes: 2`) and only shoal runs (mlx-lm
//! has no pipeline across machines): the rows show batching across ranks, each number of
//! streams against the single stream. With `--rounds N` the whole alternation runs N times
//! and each row gives the median round (by tok/s) of each server: this machine's speed drifts
//! by 20% within minutes. A connection the server resets before answering is retried by the
//! load client (as the official clients do) and counted. `cargo xtask bench prompt-cache` is in
//! [`crate::bench_prompt_cache`]. With `--moe` both servers run a 4-bit Mixture-of-Experts
//! model of realistic proportions ([`crate::bench_moe`]) from the same folder, and the table
//! adds each server's resident memory; `--moe-hybrid` runs the Qwen3.5-MoE pattern instead
//! (Gated DeltaNet layers with a full-attention layer every fourth, a shared expert);
//! `--quantized` makes shoal keep the weights quantized
//! (`SHOAL_DTYPE=quantized`) instead of the CPU default's choice. Not part of CI (minutes on
//! two cores).

use crate::bench_inference::{f32_folder, openblas_library};
use crate::e2e::json_line;
use crate::mlx_lm_venv::mlx_lm_venv;
use crate::paths::{cache_dir, target_dir};
use crate::testbed::{self, Poll, Testbed, API_PORT};
use crate::util::run;
use kit::instances::instances_in_state;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::Duration;

/// Where mlx-lm's server listens, in the node's namespace.
pub(crate) const MLX_PORT: u16 = 8080;
/// The name mlx-lm's server gives the model of its `--model` flag.
pub(crate) const MLX_MODEL: &str = "default_model";

struct Options {
    streams: Vec<usize>,
    tokens: usize,
    mlx_lm: bool,
    pipeline: bool,
    rounds: usize,
    moe: Option<crate::bench_moe::MoeShape>,
    quantized: bool,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        streams: vec![1, 4, 8, 16, 32],
        tokens: 128,
        mlx_lm: true,
        pipeline: false,
        rounds: 1,
        moe: None,
        quantized: false,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--streams" => {
                let list = it.next().ok_or("--streams needs a list, e.g. 1,4,8")?;
                o.streams = list
                    .split(',')
                    .map(|n| n.trim().parse().ok().filter(|n| (1..=64).contains(n)))
                    .collect::<Option<Vec<usize>>>()
                    .ok_or(format!(
                        "--streams {list}: numbers from 1 to 64, comma-separated"
                    ))?;
            }
            "--tokens" => {
                let n = it.next().ok_or("--tokens needs a number")?;
                o.tokens = n
                    .parse()
                    .ok()
                    .filter(|n| (1..=1024).contains(n))
                    .ok_or(format!("--tokens {n}: give a number from 1 to 1024"))?;
            }
            "--rounds" => {
                let n = it.next().ok_or("--rounds needs a number")?;
                o.rounds = n
                    .parse()
                    .ok()
                    .filter(|n| (1..=9).contains(n))
                    .ok_or(format!("--rounds {n}: give a number from 1 to 9"))?;
            }
            "--no-mlx-lm" => o.mlx_lm = false,
            "--pipeline" => o.pipeline = true,
            "--moe" => o.moe = Some(crate::bench_moe::MoeShape::Qwen3Moe),
            "--moe-hybrid" => o.moe = Some(crate::bench_moe::MoeShape::Qwen35Moe),
            "--quantized" => o.quantized = true,
            other => return Err(format!("bench concurrency: unknown argument `{other}`")),
        }
    }
    Ok(o)
}

/// A peer server started in a namespace; killed (by its pid) when dropped.
pub(crate) struct Peer(pub(crate) Child);

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The release `shoal` and the exporter, built; the release directory.
pub(crate) fn build_release() -> Result<PathBuf, String> {
    eprintln!("bench: building shoal and the exporter (release) ...");
    run(crate::cargo().args([
        "build",
        "--release",
        "--package",
        "shoal",
        "--bin",
        "shoal",
        "--package",
        "inference",
        "--example",
        "export_hf",
    ]))?;
    Ok(target_dir().join("release"))
}

/// Starts `mlx_lm.server` on the f32 fixture in node 0's namespace, batching up to
/// `concurrency` sequences; waits until it answers.
pub(crate) fn start_mlx_lm(
    tb: &Testbed,
    release: &std::path::Path,
    concurrency: usize,
    model: Option<&std::path::Path>,
) -> Result<(Peer, String), String> {
    let bench = cache_dir().join("bench");
    std::fs::create_dir_all(&bench).map_err(|e| e.to_string())?;
    let folder = match model {
        Some(m) => m.to_path_buf(),
        None => f32_folder(&bench, release)?,
    };
    let (python, (mlx, lm)) = mlx_lm_venv()?;
    let log = tb.log_dir().join("mlx-lm-server.log");
    let file = std::fs::File::create(&log).map_err(|e| e.to_string())?;
    let mut cmd = tb.command_in(0, &python);
    cmd.args(["-m", "mlx_lm.server", "--model"])
        .arg(&folder)
        .args(["--host", "0.0.0.0", "--port", &MLX_PORT.to_string()])
        .args(["--decode-concurrency", &concurrency.to_string()])
        .args(["--prompt-concurrency", &concurrency.clamp(1, 8).to_string()])
        .stdin(Stdio::null())
        .stdout(file.try_clone().map_err(|e| e.to_string())?)
        .stderr(file);
    if let Some(lib) = openblas_library() {
        cmd.env("LD_PRELOAD", lib);
    }
    cmd.env("PYTHONPATH", crate::bench_moe::mlx_lm_patch_dir()?);
    let started = spawn_peer(tb, cmd, "mlx_lm.server", MLX_PORT, &log)?;
    eprintln!("bench: mlx_lm.server ready (mlx {mlx}, mlx-lm {lm})");
    Ok(started)
}

/// Spawns the peer server `cmd` (`name`, listening on `port` in node 0's namespace, logging
/// to `log`) and waits until its OpenAI API answers; its URL. A peer that does not come up
/// fails with the tail of its log.
pub(crate) fn spawn_peer(
    tb: &Testbed,
    mut cmd: std::process::Command,
    name: &str,
    port: u16,
    log: &std::path::Path,
) -> Result<(Peer, String), String> {
    let peer = Peer(
        cmd.spawn()
            .map_err(|e| format!("cannot start {name}: {e}"))?,
    );
    let url = format!("http://127.0.0.1:{port}/v1");
    tb.script(
        0,
        "bench_load.py",
        &["wait".into(), url.clone(), "240".into()],
        Duration::from_secs(250),
    )
    .map_err(|e| {
        let tail = std::fs::read_to_string(log).unwrap_or_default();
        format!("{e}\n{name}'s log:\n{tail}")
    })?;
    Ok((peer, url))
}

/// Starts one node serving the default model with `extra` flags; waits until it is ready.
pub(crate) fn start_shoal(tag: &str, extra: Vec<String>) -> Result<(Testbed, String), String> {
    testbed::catch_ctrl_c()?;
    let binary = target_dir().join("release").join("shoal");
    let mut tb = Testbed::start(tag, 1, &binary, move |_| {
        let mut args = Vec::new();
        if !extra.iter().any(|a| a == "--model") {
            args.extend(["--model".to_string(), "default".to_string()]);
        }
        args.extend(extra.iter().cloned());
        args
    })?;
    tb.wait_for(
        "the default model ready",
        Duration::from_secs(240),
        Duration::from_millis(500),
        |tb| {
            tb.check_alive(0)?;
            let state = match tb.get(0, "/state") {
                Ok(state) => state,
                Err(e) => return Ok(Poll::Waiting(e)),
            };
            Ok(if instances_in_state(&state).iter().any(|i| i.ready) {
                Poll::Ready(())
            } else {
                Poll::Waiting("no ready instance yet".into())
            })
        },
    )?;
    Ok((tb, format!("http://127.0.0.1:{API_PORT}/v1")))
}

/// Starts two nodes and places the default model on both as a 2-rank pipeline; waits until
/// it is ready. Node 0 is where the load goes.
fn start_pipeline(extra: Vec<String>) -> Result<(Testbed, String), String> {
    testbed::catch_ctrl_c()?;
    let binary = target_dir().join("release").join("shoal");
    let mut tb = Testbed::start("concpp", 2, &binary, move |_| extra.clone())?;
    let ids = tb.node_ids(Duration::from_secs(60))?;
    tb.wait_mesh(&ids, Duration::from_secs(90))?;
    let ranks = tb.place_pipeline(2)?;
    if ranks != 2 {
        return Err(format!("the pipeline was placed on {ranks} ranks, not 2"));
    }
    eprintln!("bench: a 2-rank pipeline placed; waiting for it to be ready ...");
    crate::soak::wait_ready(&mut tb, Duration::from_secs(300))?;
    Ok((tb, format!("http://127.0.0.1:{API_PORT}/v1")))
}

/// The end-token ids of the exported fixture (from its `config.json`), for mlx-lm's
/// `logit_bias`: with them out of reach it generates exactly the tokens asked for, as shoal
/// does with `ignore_eos`.
fn end_tokens(folder: &std::path::Path) -> Vec<u64> {
    let config: Value = std::fs::read_to_string(folder.join("config.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    let mut ids: Vec<u64> = match &config["eos_token_id"] {
        Value::Number(n) => n.as_u64().into_iter().collect(),
        Value::Array(a) => a.iter().filter_map(Value::as_u64).collect(),
        _ => Vec::new(),
    };
    // SmolLM2's chat end (`<|im_end|>`) and text end (`<|endoftext|>`).
    for id in [0, 2] {
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    ids
}

/// One run's figures.
#[derive(Clone, Copy, Default)]
pub(crate) struct Figures {
    pub(crate) tps: f64,
    pub(crate) p50: f64,
    pub(crate) p99: f64,
    /// Prompt tokens of every stream over the time until the last stream's first token:
    /// the prompts' throughput (all of them are in by then). 0 when the server gave no usage.
    pub(crate) prompt_tps: f64,
    /// Connections the server reset or refused before answering, tried again.
    pub(crate) retried: u64,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn figures(line: &Value) -> Result<Figures, String> {
    let wall = line["wall"].as_f64().ok_or("no wall time")?;
    let generated = line["generated"].as_f64().ok_or("no token count")?;
    let mut ttft: Vec<f64> = line["ttft"]
        .as_array()
        .ok_or("no ttft list")?
        .iter()
        .filter_map(Value::as_f64)
        .collect();
    ttft.sort_by(f64::total_cmp);
    let prompt_tokens = line["prompt_tokens"].as_f64().unwrap_or(0.0);
    let last_first_token = ttft.last().copied().unwrap_or(0.0);
    Ok(Figures {
        tps: generated / wall.max(1e-9),
        p50: percentile(&ttft, 0.5),
        p99: percentile(&ttft, 0.99),
        prompt_tps: prompt_tokens / last_first_token.max(1e-9),
        retried: line["retried"].as_u64().unwrap_or(0),
    })
}

/// The round with the median rate of `runs` (the lower middle of an even count).
pub(crate) fn median_round(runs: &[Figures]) -> Option<Figures> {
    let mut sorted = runs.to_vec();
    sorted.sort_by(|a, b| a.tps.total_cmp(&b.tps));
    sorted.get(sorted.len().saturating_sub(1) / 2).copied()
}

/// `n` streams of `tokens` against `model` at `url` with `extra` in each body.
pub(crate) fn load(
    tb: &Testbed,
    (url, model): (&str, &str),
    n: usize,
    tokens: usize,
    extra: &Value,
) -> Result<Figures, String> {
    let out = tb.script(
        0,
        "bench_load.py",
        &[
            "streams".into(),
            url.into(),
            model.into(),
            n.to_string(),
            tokens.to_string(),
            extra.to_string(),
        ],
        Duration::from_secs(900),
    )?;
    figures(&json_line(&out, "ttft").ok_or("the load client printed no figures")?)
}

/// Runs the benchmark and prints the table.
pub fn bench_concurrency(args: &[String]) -> Result<(), String> {
    let o = parse(args)?;
    crate::setup::setup()?;
    let release = build_release()?;
    let most = o.streams.iter().copied().max().unwrap_or(1);
    let mut limits = vec![
        "--max-sequences".into(),
        most.to_string(),
        "--max-queue".into(),
        (2 * most).to_string(),
    ];
    let moe_folder = match o.moe {
        Some(shape) => Some(crate::bench_moe::moe_bench_model(shape)?),
        None => None,
    };
    if let Some(folder) = &moe_folder {
        let parent = folder.parent().unwrap_or(folder);
        limits.extend([
            "--models-dir".into(),
            parent.display().to_string(),
            "--model".into(),
            folder.display().to_string(),
        ]);
    }
    if o.quantized {
        // The node's runners inherit it.
        std::env::set_var("SHOAL_DTYPE", "quantized");
    }
    let (tb, shoal_url) = if o.pipeline {
        start_pipeline(limits)?
    } else {
        start_shoal("conc", limits)?
    };
    let result = (|| {
        let mlx = if o.mlx_lm && !o.pipeline {
            Some(start_mlx_lm(&tb, &release, most, moe_folder.as_deref())?)
        } else {
            None
        };
        let folder = moe_folder
            .clone()
            .unwrap_or_else(|| cache_dir().join("bench").join("smollm2-f32"));
        let memory = resident_memory(&tb, mlx.as_ref().map(|(peer, _)| peer.0.id()));
        let bias: serde_json::Map<String, Value> = end_tokens(&folder)
            .into_iter()
            .map(|id| (id.to_string(), json!(-100)))
            .collect();
        let shoal_extra = json!({"ignore_eos": true});
        // A node started with `--model PATH` serves it under that path.
        let shoal_model = moe_folder
            .as_ref()
            .map_or("default".to_string(), |f| f.display().to_string());
        let mlx_extra = json!({ "logit_bias": bias });
        let mut shoal_runs: Vec<Vec<Figures>> = vec![Vec::new(); o.streams.len()];
        let mut mlx_runs: Vec<Vec<Result<Figures, String>>> = vec![Vec::new(); o.streams.len()];
        for round in 1..=o.rounds {
            for (i, &n) in o.streams.iter().enumerate() {
                testbed::check_interrupt()?;
                eprintln!(
                    "bench: round {round}/{}: {n} streams on shoal ...",
                    o.rounds
                );
                let s = load(&tb, (&shoal_url, &shoal_model), n, o.tokens, &shoal_extra)?;
                shoal_runs[i].push(s);
                if let Some((_, url)) = &mlx {
                    eprintln!(
                        "bench: round {round}/{}: {n} streams on mlx-lm ...",
                        o.rounds
                    );
                    // The peer failing a row is a figure too; the table still prints.
                    mlx_runs[i].push(load(&tb, (url, MLX_MODEL), n, o.tokens, &mlx_extra));
                }
            }
        }
        let rows: Vec<Row> = o
            .streams
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let s = median_round(&shoal_runs[i]).unwrap_or_default();
                let m = mlx.as_ref().map(|_| {
                    let ok: Vec<Figures> =
                        mlx_runs[i].iter().filter_map(|r| r.clone().ok()).collect();
                    median_round(&ok).ok_or_else(|| {
                        mlx_runs[i]
                            .iter()
                            .find_map(|r| r.clone().err())
                            .unwrap_or_default()
                    })
                });
                (n, s, m)
            })
            .collect();
        print_table(&o, &rows);
        if let Some(folder) = &moe_folder {
            let files = crate::bench_moe::weight_bytes(folder) as f64 / 1e6;
            let (shoal, peer) = memory;
            let mb =
                |b: Option<u64>| b.map_or("?".to_string(), |b| format!("{:.0} MB", b as f64 / 1e6));
            println!(
                "resident after loading: shoal's runner {} ({}), mlx_lm.server {}; weight files {files:.0} MB",
                mb(shoal),
                if o.quantized { "weights kept quantized" } else { "the CPU default's form" },
                mb(peer)
            );
        }
        Ok(())
    })();
    if result.is_err() {
        eprintln!("node log:\n{}", tb.all_logs(30));
    }
    result
}

/// Resident memory of node 0's runner and of the peer server (`peer` pid), once loaded.
pub(crate) fn resident_memory(tb: &Testbed, peer: Option<u32>) -> (Option<u64>, Option<u64>) {
    use crate::bench_moe::{is_runner, resident_bytes};
    let runner = tb
        .pids(0)
        .into_iter()
        .filter(|&p| is_runner(p))
        .filter_map(resident_bytes)
        .max();
    (runner, peer.and_then(resident_bytes))
}

/// One row: the number of streams, shoal's figures, and mlx-lm's (or why it failed).
type Row = (usize, Figures, Option<Result<Figures, String>>);

fn print_table(o: &Options, rows: &[Row]) {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!();
    let layout = if o.pipeline {
        "a 2-rank pipeline over two namespaced nodes"
    } else {
        "one node"
    };
    let model = o.moe.map_or(
        "SmolLM2-135M-Instruct as f32",
        crate::bench_moe::MoeShape::describe,
    );
    println!(
        "{model} on {layout}, {} greedy tokens per stream, streams started together; {cores} \
         cores; median of {} round(s)",
        o.tokens, o.rounds
    );
    println!(
        "{:>7} | {:>11} {:>9} {:>9} {:>8} | {:>11} {:>9} {:>9} {:>8} | {:>11}",
        "streams",
        "shoal tok/s",
        "TTFT p50",
        "TTFT p99",
        "prompt/s",
        "mlx-lm tok/s",
        "TTFT p50",
        "TTFT p99",
        "prompt/s",
        "shoal/mlx-lm"
    );
    let single = rows.iter().find(|r| r.0 == 1).map(|r| r.1.tps);
    for (n, s, m) in rows {
        let dash = || "-".to_string();
        let (mt, m50, m99, mp, ratio) = match m {
            Some(Err(_)) => ("failed".into(), dash(), dash(), dash(), dash()),
            Some(Ok(m)) => (
                format!("{:.1}", m.tps),
                format!("{:.2} s", m.p50),
                format!("{:.2} s", m.p99),
                format!("{:.1}", m.prompt_tps),
                format!("{:.2}x", s.tps / m.tps),
            ),
            None => (dash(), dash(), dash(), dash(), dash()),
        };
        println!(
            "{n:>7} | {:>11.1} {:>9} {:>9} {:>8.1} | {mt:>12} {m50:>9} {m99:>9} {mp:>8} | \
             {ratio:>11}",
            s.tps,
            format!("{:.2} s", s.p50),
            format!("{:.2} s", s.p99),
            s.prompt_tps,
        );
    }
    if let Some(one) = single {
        for (n, s, _) in rows.iter().filter(|r| r.0 > 1) {
            println!(
                "shoal at {n} streams: {:.2}x its single-stream rate",
                s.tps / one
            );
        }
    }
    for (n, s, m) in rows {
        if let Some(Err(e)) = m {
            println!("mlx-lm at {n} streams failed: {e}");
        }
        let peer = match m {
            Some(Ok(m)) => m.retried,
            _ => 0,
        };
        if s.retried + peer > 0 {
            println!(
                "{n} streams: connections reset before an answer and tried again: shoal {}, \
                 mlx-lm {peer}",
                s.retried
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_and_figures() {
        let o = parse(&[
            "--streams".into(),
            "1,8".into(),
            "--tokens".into(),
            "16".into(),
        ])
        .unwrap();
        assert_eq!(
            (o.streams, o.tokens, o.mlx_lm, o.pipeline),
            (vec![1, 8], 16, true, false)
        );
        assert!(parse(&["--pipeline".into()]).unwrap().pipeline);
        assert!(parse(&["--streams".into(), "0".into()]).is_err());
        assert!(parse(&["--bogus".into()]).is_err());
        let f = figures(
            &json!({"wall": 2.0, "generated": 256, "ttft": [0.5, 0.1, 0.3],
                                "prompt_tokens": 60}),
        )
        .unwrap();
        assert_eq!(
            (f.tps, f.p50, f.p99, f.prompt_tps),
            (128.0, 0.3, 0.5, 120.0)
        );
        let rate = |tps| Figures {
            tps,
            ..Figures::default()
        };
        let median = median_round(&[rate(3.0), rate(1.0), rate(2.0)]).unwrap();
        assert_eq!(median.tps, 2.0);
        assert!(median_round(&[]).is_none());
        assert_eq!(parse(&["--rounds".into(), "3".into()]).unwrap().rounds, 3);
        assert!(parse(&["--rounds".into(), "0".into()]).is_err());
        assert!(figures(&json!({"wall": 1.0})).is_err());
    }
}
