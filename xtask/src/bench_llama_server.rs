//! `cargo xtask bench llama-server [--rounds 3] [--tokens 128] [--only dense|moe]` (and the
//! last table of `cargo xtask bench inference --with-llama-cpp`): shoal against llama-server,
//! both through their OpenAI streaming endpoints, on the same GGUF file, as a Linux user
//! without a GPU would choose between them (issue 46).
//!
//! Two files: the SmolLM2-135M-Instruct fixture quantized to Q4_K_M by `llama-quantize`
//! (the K-quant fixtures of `kquants.rs`; real weights) at 1 and 16 streams, and a
//! Mixture-of-Experts GGUF of Qwen3-30B-A3B's proportions scaled to this machine (made once
//! by `scripts/moe_gguf_bench_model.py` with llama.cpp's own converter and `llama-quantize`:
//! 64 experts of which 8 run, about 1.35 B parameters, Q4_K_M) at 1 and 8 streams. One shoal
//! node (in a network namespace, `--max-sequences` as large as the most streams) and
//! llama-server (built once from the pinned sdist's sources, `-np` as many slots as the most
//! streams, `-t` this machine's cores) in the same namespace; for each number of streams,
//! alternating shoal then llama-server, that many streaming greedy chats of exactly
//! `--tokens` tokens (`ignore_eos`, which both honour) start together; each row is the median
//! round of each server (`--rounds`). The table adds each server's resident memory after the
//! run and the file's size. Not part of CI (minutes on two cores).

use crate::bench_concurrency::{
    load, median_round, resident_memory, spawn_peer, start_shoal, Figures, Peer,
};
use crate::llama_cpp;
use crate::moe_gguf;
use crate::paths::cache_dir;
use crate::reference::LLAMA_CPP_PYTHON_VERSION;
use crate::testbed::{self, Testbed};
use crate::util::{run, Step};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Stdio;

/// Where llama-server listens, in the node's namespace.
const LLAMA_PORT: u16 = 8081;
const SCRIPT: &str = include_str!("../scripts/moe_gguf_bench_model.py");
/// The tiny fixtures' writer, which the bench model's script imports.
const FIXTURES_SCRIPT: &str = include_str!("../scripts/moe_gguf_fixtures.py");

/// What to measure.
#[derive(Debug, PartialEq)]
pub(crate) struct Options {
    pub(crate) rounds: usize,
    pub(crate) tokens: usize,
    pub(crate) dense: bool,
    pub(crate) moe: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            rounds: 3,
            tokens: 128,
            dense: true,
            moe: true,
        }
    }
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options::default();
    let mut it = args.iter();
    let number = |flag: &str, v: Option<&String>, most: usize| -> Result<usize, String> {
        v.and_then(|v| v.parse().ok())
            .filter(|n| (1..=most).contains(n))
            .ok_or(format!("{flag} needs a number from 1 to {most}"))
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--rounds" => o.rounds = number("--rounds", it.next(), 20)?,
            "--tokens" => o.tokens = number("--tokens", it.next(), 4096)?,
            "--only" => match it.next().map(String::as_str) {
                Some("dense") => o.moe = false,
                Some("moe") => o.dense = false,
                _ => return Err("--only needs `dense` or `moe`".into()),
            },
            other => {
                return Err(format!(
                    "bench llama-server: unknown argument `{other}` (known: --rounds N, \
                     --tokens N, --only dense|moe)"
                ))
            }
        }
    }
    Ok(o)
}

/// One file's case: what it is, the file, the numbers of streams.
struct Case {
    label: &'static str,
    file: PathBuf,
    streams: &'static [usize],
}

/// `cargo xtask bench llama-server`.
pub fn bench_llama_server(args: &[String]) -> Result<(), String> {
    let o = parse(args)?;
    crate::setup::setup()?;
    crate::bench_concurrency::build_release()?;
    server_tables(&o)
}

/// Builds what is missing (llama-server, the MoE file) and prints one table per file.
pub(crate) fn server_tables(o: &Options) -> Result<(), String> {
    let server = find_llama_server()?;
    let mut cases = Vec::new();
    if o.dense {
        cases.push(Case {
            label: "SmolLM2-135M-Instruct Q4_K_M (K-quant, dense; llama-quantize)",
            file: cache_dir()
                .join("kquants")
                .join("SmolLM2-135M-Instruct.Q4_K_M.gguf"),
            streams: &[1, 16],
        });
    }
    if o.moe {
        cases.push(Case {
            label: "Qwen3-MoE-shaped Q4_K_M (64 experts, top-8, 12 x 1024, ~1.35 B params; \
                    convert_hf_to_gguf + llama-quantize)",
            file: moe_bench_file()?,
            streams: &[1, 8],
        });
    }
    for case in &cases {
        if !case.file.exists() {
            return Err(format!(
                "{} is missing: run `cargo xtask setup`",
                case.file.display()
            ));
        }
        one_case(o, case, &server)?;
    }
    Ok(())
}

/// The `llama-server` binary, built once into the cache (the first build compiles its HTTP
/// server and chat code beside what `llama-bench` built).
fn find_llama_server() -> Result<PathBuf, String> {
    const TOOL: &str = "llama-server";
    if llama_cpp::is_built(TOOL) {
        return Ok(llama_cpp::tool_path(TOOL));
    }
    let step = Step::new(
        1,
        1,
        "llama.cpp llama-server (from the llama-cpp-python sdist)",
    );
    let bin = llama_cpp::build_tool(
        &step,
        TOOL,
        "about 12 minutes on 2 idle cores, less after llama-bench",
    )?;
    step.done(&bin.display().to_string());
    Ok(bin)
}

/// The MoE bench file, made once into `<cache>/bench/` (a stamp names the scripts and the
/// sdist, so a changed shape is made again).
fn moe_bench_file() -> Result<PathBuf, String> {
    let dir = cache_dir().join("bench");
    let file = dir.join("qwen3-moe-bench.Q4_K_M.gguf");
    let stamp_path = dir.join("qwen3-moe-bench.Q4_K_M.gguf.shoal-ok");
    let stamp = format!(
        "script={}\nfixtures={}\nllama-cpp-python={LLAMA_CPP_PYTHON_VERSION}\n",
        moe_gguf::fnv(SCRIPT),
        moe_gguf::fnv(FIXTURES_SCRIPT),
    );
    if file.exists() && std::fs::read_to_string(&stamp_path).ok().as_deref() == Some(&stamp) {
        return Ok(file);
    }
    let step = Step::new(
        1,
        1,
        "a Qwen3-MoE-shaped Q4_K_M GGUF (llama.cpp's converter)",
    );
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let families = kit::dirs::moe_gguf_fixtures_dir().with_file_name("families");
    let tokenizer = crate::family_fixtures::smollm2_tokenizer(&step, &families)?;
    let quantize = llama_cpp::quantize_tool(&step)?;
    let python = moe_gguf::convert_venv(&step)?;
    let work = cache_dir().join(format!("gguf-bench-work-{LLAMA_CPP_PYTHON_VERSION}"));
    let src = moe_gguf::extract_sources(&step, &work)?;
    std::fs::write(work.join("moe_gguf_bench_model.py"), SCRIPT).map_err(|e| e.to_string())?;
    std::fs::write(work.join("moe_gguf_fixtures.py"), FIXTURES_SCRIPT)
        .map_err(|e| e.to_string())?;
    step.progress(
        "writing 1.35 B random parameters, converting to f16 and quantizing to Q4_K_M (about \
         4 minutes on 2 idle cores, 8 GB of memory and 5.5 GB of disk while it runs)",
    );
    let _ = std::fs::remove_file(&stamp_path);
    run(std::process::Command::new(&python)
        .arg(work.join("moe_gguf_bench_model.py"))
        .arg(&file)
        .arg("--tokenizer")
        .arg(&tokenizer)
        .arg("--llama-cpp")
        .arg(&src)
        .arg("--quantize")
        .arg(&quantize)
        .env("PYTHONPATH", src.join("gguf-py")))?;
    std::fs::write(&stamp_path, stamp).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(&work);
    step.done(&file.display().to_string());
    Ok(file)
}

/// Starts llama-server on `file` in node 0's namespace with `slots` parallel sequences of
/// `per_slot` tokens each; waits until it answers.
fn start_llama_server(
    tb: &Testbed,
    server: &Path,
    file: &Path,
    slots: usize,
    per_slot: usize,
) -> Result<(Peer, String), String> {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let log = tb.log_dir().join("llama-server.log");
    let out = std::fs::File::create(&log).map_err(|e| e.to_string())?;
    let mut cmd = tb.command_in(0, server);
    cmd.arg("-m")
        .arg(file)
        .args(["--host", "127.0.0.1", "--port", &LLAMA_PORT.to_string()])
        .args(["-t", &cores.to_string(), "-tb", &cores.to_string()])
        .args(["-np", &slots.to_string()])
        .args(["-c", &(slots * per_slot).to_string()])
        .args(["--no-webui", "--cont-batching"])
        .stdin(Stdio::null())
        .stdout(out.try_clone().map_err(|e| e.to_string())?)
        .stderr(out);
    spawn_peer(tb, cmd, "llama-server", LLAMA_PORT, &log)
}

fn one_case(o: &Options, case: &Case, server: &Path) -> Result<(), String> {
    let most = case.streams.iter().copied().max().unwrap_or(1);
    let parent = case.file.parent().unwrap_or(Path::new("/"));
    let extra = vec![
        "--max-sequences".into(),
        most.to_string(),
        "--max-queue".into(),
        (2 * most).to_string(),
        "--models-dir".into(),
        parent.display().to_string(),
        "--model".into(),
        case.file.display().to_string(),
    ];
    eprintln!("bench: {} ...", case.label);
    let (tb, shoal_url) = start_shoal("llsrv", extra)?;
    let result = (|| {
        // Each slot holds a short prompt (~30 tokens) and the generated tokens.
        let (peer, llama_url) = start_llama_server(&tb, server, &case.file, most, o.tokens + 128)?;
        let body = json!({"ignore_eos": true});
        let shoal_model = case.file.display().to_string();
        let mut rows = Vec::new();
        let mut runs: Vec<(Vec<Figures>, Vec<Figures>)> = vec![Default::default(); most + 1];
        for round in 1..=o.rounds {
            for &n in case.streams {
                testbed::check_interrupt()?;
                eprintln!(
                    "bench: round {round}/{}: {n} streams on shoal ...",
                    o.rounds
                );
                runs[n]
                    .0
                    .push(load(&tb, (&shoal_url, &shoal_model), n, o.tokens, &body)?);
                eprintln!(
                    "bench: round {round}/{}: {n} streams on llama-server ...",
                    o.rounds
                );
                runs[n]
                    .1
                    .push(load(&tb, (&llama_url, "default"), n, o.tokens, &body)?);
            }
        }
        for &n in case.streams {
            let shoal = median_round(&runs[n].0).unwrap_or_default();
            let llama = median_round(&runs[n].1).unwrap_or_default();
            rows.push((n, shoal, llama));
        }
        let memory = resident_memory(&tb, Some(peer.0.id()));
        print_table(o, case, &rows, memory, server_version(&tb, server));
        Ok(())
    })();
    if result.is_err() {
        eprintln!("node log:\n{}", tb.all_logs(30));
    }
    result
}

/// llama-server's `--version` line (its build number and commit).
fn server_version(tb: &Testbed, server: &Path) -> String {
    tb.command_in(0, server)
        .arg("--version")
        .output()
        .ok()
        .map(|o| {
            let text = String::from_utf8_lossy(&o.stderr).into_owned()
                + &String::from_utf8_lossy(&o.stdout);
            text.lines()
                .find(|l| l.starts_with("version"))
                .unwrap_or("")
                .to_string()
        })
        .unwrap_or_default()
}

fn print_table(
    o: &Options,
    case: &Case,
    rows: &[(usize, Figures, Figures)],
    (shoal_rss, llama_rss): (Option<u64>, Option<u64>),
    version: String,
) {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let file_mb = std::fs::metadata(&case.file).map_or(0.0, |m| m.len() as f64 / 1e6);
    println!();
    println!(
        "{} ({file_mb:.0} MB), both through OpenAI streaming chat, {} greedy tokens per \
         stream, streams started together; {cores} cores; median of {} round(s); \
         llama-server {version} (llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}'s sources)",
        case.label, o.tokens, o.rounds
    );
    println!(
        "{:>7} | {:>11} {:>9} {:>9} | {:>12} {:>9} {:>9} | {:>12}",
        "streams",
        "shoal tok/s",
        "TTFT p50",
        "TTFT p99",
        "llama tok/s",
        "TTFT p50",
        "TTFT p99",
        "shoal/llama"
    );
    for (n, s, l) in rows {
        println!(
            "{n:>7} | {:>11.1} {:>9} {:>9} | {:>12.1} {:>9} {:>9} | {:>11.2}x",
            s.tps,
            format!("{:.2} s", s.p50),
            format!("{:.2} s", s.p99),
            l.tps,
            format!("{:.2} s", l.p50),
            format!("{:.2} s", l.p99),
            s.tps / l.tps.max(1e-9),
        );
    }
    let mb = |b: Option<u64>| b.map_or("?".to_string(), |b| format!("{:.0} MB", b as f64 / 1e6));
    println!(
        "resident after the run: shoal's runner {} ({:.2}x the file), llama-server {}; file \
         {file_mb:.0} MB",
        mb(shoal_rss),
        shoal_rss.map_or(0.0, |b| b as f64 / 1e6 / file_mb.max(1e-9)),
        mb(llama_rss),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options() {
        assert_eq!(parse(&[]).unwrap(), Options::default());
        let o = parse(&["--only".into(), "moe".into(), "--rounds".into(), "5".into()]).unwrap();
        assert_eq!((o.dense, o.moe, o.rounds), (false, true, 5));
        assert!(parse(&["--only".into(), "x".into()]).is_err());
        assert!(parse(&["--rounds".into(), "0".into()]).is_err());
        assert!(parse(&["--bogus".into()]).is_err());
    }
}
