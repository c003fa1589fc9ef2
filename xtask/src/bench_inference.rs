//! `cargo xtask bench inference`: shoal against mlx-lm (and llama.cpp) on the SmolLM2 fixture,
//! with shoal's two CPU forms of the 4-bit file side by side (expanded to f32, and kept 4-bit
//! on shoal's quantized kernel), one stream and [`STREAMS`] streams at once (those rows:
//! `bench_streams.rs`).
//!
//! Same weights (the fixture dequantized to f32, exported as a Hugging Face folder for
//! mlx-lm), same 128 prompt token ids, 128 generated tokens, greedy, end-of-text ignored,
//! same threads. mlx-lm runs from the pinned venv (see `mlx_lm_venv.rs`: the MLX that shoal
//! links, so both sides run the same kernels), with the system OpenBLAS preloaded, in its
//! fastest configuration (f32) and its default one (bf16, the dtype of the published
//! checkpoint). Medians of `SHOAL_BENCH_RUNS` rounds
//! (default 3); each round runs every contender once, interleaved, so background load hits
//! them alike. llama.cpp's `llama-bench` (its 4-bit weights as stored, CPU) joins the rounds
//! when available: `--with-llama-cpp` builds it on first use from the llama.cpp sources that the
//! pinned `llama-cpp-python` sdist vendors (see `reference.rs`) into
//! `<cache>/llama.cpp-<version>/`; without the flag a build already there is used (never another
//! `llama-bench`: its version would not be the pinned one). The versions measured are printed
//! with the table.

use crate::bench_figures::{json_number, measure, median, Figures};
use crate::bench_streams::{self, STREAMS};
use crate::llama_cpp;
use crate::mlx_build::MLX_VERSION;
use crate::mlx_lm_venv::{mlx_lm_venv, requirements as mlx_lm_requirements, MLX_LM_VERSION};
use crate::paths::{cache_dir, default_model, target_dir};
use crate::reference::LLAMA_CPP_PYTHON_VERSION;
use crate::util::{run, Step};
use std::path::{Path, PathBuf};
use std::process::Command;

const PROMPT_TOKENS: usize = 128;
const GENERATED_TOKENS: usize = 128;

const MLX_LM_SCRIPT: &str = r#"
import json, resource, sys, time
from pathlib import Path
import mlx.core as mx
from mlx_lm.utils import load_model
from mlx_lm.generate import generate_step

path, dtype, ids_file, gen = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
loaded = load_model(Path(path))
model = loaded[0] if isinstance(loaded, tuple) else loaded
if dtype == "bf16":
    model.set_dtype(mx.bfloat16)
mx.eval(model.parameters())
prompt = mx.array(json.loads(Path(ids_file).read_text()))
start = time.perf_counter()
n = 0
for token, _ in generate_step(prompt, model, max_tokens=gen):
    if n == 0:
        prompt_time = time.perf_counter() - start
        decode_start = time.perf_counter()
    n += 1
decode_time = time.perf_counter() - decode_start
print(json.dumps({
    "prompt_tokens": int(prompt.size),
    "prompt_tps": int(prompt.size) / prompt_time,
    "generation_tokens": n,
    "generation_tps": (n - 1) / decode_time,
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
}))
"#;

pub(crate) fn openblas_library() -> Option<PathBuf> {
    [
        "/lib/x86_64-linux-gnu/libopenblas.so.0",
        "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
        "/lib/aarch64-linux-gnu/libopenblas.so.0",
        "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
}

/// The fixture as an f32 Hugging Face folder under `bench` (what mlx-lm reads), exported
/// with the release build's `export_hf` example on first use.
pub(crate) fn f32_folder(bench: &Path, release: &Path) -> Result<PathBuf, String> {
    let folder = bench.join("smollm2-f32");
    if !folder.join("model.safetensors").exists() {
        eprintln!("bench: exporting the fixture as a Hugging Face folder for mlx-lm ...");
        run(Command::new(release.join("examples").join("export_hf"))
            .arg(default_model())
            .arg(&folder)
            .arg("f32"))?;
    }
    Ok(folder)
}

/// Builds llama.cpp's `llama-bench` from the sources in the pinned sdist (see
/// [`crate::llama_cpp`]); a second call finds it built.
fn build_llama_bench() -> Result<PathBuf, String> {
    let step = Step::new(
        1,
        1,
        "llama.cpp llama-bench (from the llama-cpp-python sdist)",
    );
    if llama_cpp::is_built("llama-bench") {
        let bin = llama_cpp::tool_path("llama-bench");
        step.cached(&bin.display().to_string());
        return Ok(bin);
    }
    let bin = llama_cpp::build_tool(
        &step,
        "llama-bench",
        "about 8 CPU-minutes: 5 on 2 idle cores",
    )?;
    step.done(&bin.display().to_string());
    Ok(bin)
}

/// The `llama-bench` to measure: built on demand with `--with-llama-cpp`, else an earlier
/// build in the cache (both from the pinned sources).
fn find_llama_bench(build: bool) -> Result<Option<PathBuf>, String> {
    if build {
        return build_llama_bench().map(Some);
    }
    Ok(llama_cpp::is_built("llama-bench").then(|| llama_cpp::tool_path("llama-bench")))
}

/// The 1-minute load average (`/proc/loadavg`), or `?`.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

/// Reads `"key": "text"` from a one-line JSON object.
fn json_string(line: &str, key: &str) -> Option<String> {
    let at = line.find(&format!("\"{key}\""))? + key.len() + 2;
    let rest = line[at..].trim_start().strip_prefix(':')?.trim_start();
    let rest = rest.strip_prefix('"')?;
    Some(rest[..rest.find('"')?].to_owned())
}

/// The llama.cpp build `llama-bench` reports in its JSON lines (`build_number`, `build_commit`).
fn llama_cpp_build(stdout: &str) -> Option<String> {
    let line = stdout.lines().find(|l| l.contains("\"build_commit\""))?;
    let commit = json_string(line, "build_commit")?;
    Some(match json_number(line, "build_number") {
        Some(n) => format!("b{n} ({commit})"),
        None => commit,
    })
}

/// The pinned peers, as the table's heading names them.
fn versions_line(mlx: Option<&(String, String)>, llama_cpp: Option<&str>) -> String {
    let mlx = match mlx {
        Some((mlx, lm)) => format!("mlx {mlx} (cpu) + mlx-lm {lm}"),
        None => format!("mlx-lm not measured (pinned: mlx {MLX_VERSION}, mlx-lm {MLX_LM_VERSION})"),
    };
    let llama = match llama_cpp {
        Some(build) => format!(
            "llama.cpp {build} from llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}"
        ),
        None => format!(
            "llama.cpp not measured (pinned: the one in llama-cpp-python {LLAMA_CPP_PYTHON_VERSION})"
        ),
    };
    format!("versions: {mlx}; {llama}")
}

/// Runs `llama-bench` once (one prompt run and one generation run) and reads its JSON lines.
fn measure_llama_bench(cmd: &mut Command) -> Result<Figures, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot start {:?}: {e}", cmd.get_program()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut figures = Figures {
        build: llama_cpp_build(&stdout),
        ..Figures::default()
    };
    for line in stdout.lines().filter(|l| l.trim_start().starts_with('{')) {
        let (Some(prompt), Some(gen), Some(tps)) = (
            json_number(line, "n_prompt"),
            json_number(line, "n_gen"),
            json_number(line, "avg_ts"),
        ) else {
            continue;
        };
        if gen == 0.0 && prompt > 0.0 {
            figures.prompt_tps = tps;
        } else if prompt == 0.0 && gen > 0.0 {
            figures.generation_tps = tps;
        }
    }
    if figures.prompt_tps == 0.0 || figures.generation_tps == 0.0 {
        return Err(format!(
            "llama-bench printed no figures ({}); stderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(figures)
}

/// Runs the benchmark and prints the table. `args`: `--with-llama-cpp` to build llama.cpp's
/// `llama-bench` (once, into the cache) and measure it alongside.
pub fn bench_inference(args: &[String]) -> Result<(), String> {
    let mut with_llama_cpp = false;
    for arg in args {
        match arg.as_str() {
            "--with-llama-cpp" => with_llama_cpp = true,
            "--versions" => {
                // The pinned peers, without measuring anything.
                println!("{}", versions_line(None, None));
                println!("venv requirements: {}", mlx_lm_requirements().join(" "));
                return Ok(());
            }
            other => {
                return Err(format!(
                    "bench inference: unknown argument `{other}` (known: --with-llama-cpp, \
                     --versions)"
                ))
            }
        }
    }
    crate::setup::setup()?;
    let llama_bench = find_llama_bench(with_llama_cpp)?;
    let batched_bench = bench_streams::find_batched_bench(with_llama_cpp)?;
    let model = default_model();
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
    let release = target_dir().join("release");
    let shoal = release.join("shoal");
    let bench = cache_dir().join("bench");
    std::fs::create_dir_all(&bench).map_err(|e| e.to_string())?;
    let folder = f32_folder(&bench, &release)?;
    // Fixed, spread-out token ids (as mlx-lm's own benchmark uses arbitrary ids).
    let ids: Vec<String> = (0..PROMPT_TOKENS)
        .map(|i| ((i * 7919) % 48000 + 100).to_string())
        .collect();
    let ids_file = bench.join("prompt-ids.json");
    std::fs::write(&ids_file, format!("[{}]", ids.join(","))).map_err(|e| e.to_string())?;
    let script = bench.join("bench_mlx_lm.py");
    std::fs::write(&script, MLX_LM_SCRIPT).map_err(|e| e.to_string())?;
    let (mlx_python, mlx_versions) = match mlx_lm_venv() {
        Ok((python, versions)) => (Some(python), Some(versions)),
        Err(e) => {
            eprintln!("bench: mlx-lm is unavailable ({e}); measuring shoal alone");
            (None, None)
        }
    };
    let openblas = openblas_library();
    let runs: usize = std::env::var("SHOAL_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(3);
    let gen = GENERATED_TOKENS.to_string();

    /// How a contender prints its figures.
    #[derive(Clone, Copy, PartialEq)]
    enum Reader {
        /// One JSON line with `prompt_tps`, `generation_tps`, `peak_rss_mb`.
        Json,
        LlamaBench,
        LlamaBatchedBench,
    }
    type Contender = (&'static str, usize, Reader, Box<dyn Fn() -> Command>);
    // `shoal generate` on the fixture, in the weight form `dtype` names, with the CPU kernel's
    // x rounding `qmm` names (`SHOAL_QMM`: `None` the default, x in f32). `streams` > 1: that
    // many sequences at once (`--streams`).
    let shoal_generate = |dtype: &'static str,
                          qmm: Option<&'static str>,
                          streams: usize|
     -> Box<dyn Fn() -> Command> {
        let (shoal, ids_file, gen) = (shoal.clone(), ids_file.clone(), gen.clone());
        Box::new(move || {
            let mut c = Command::new(&shoal);
            c.env("SHOAL_DTYPE", dtype);
            if let Some(q) = qmm {
                c.env("SHOAL_QMM", q);
            }
            c.args([
                "generate",
                "--model",
                "default",
                "--ignore-eos",
                "--json-stats",
                "--max-tokens",
                &gen,
                "--token-ids",
            ])
            .arg(&ids_file);
            if streams > 1 {
                c.arg("--streams").arg(streams.to_string());
            }
            c
        })
    };
    let mut contenders: Vec<Contender> = Vec::new();
    for streams in [1, STREAMS] {
        contenders.push((
            if streams == 1 {
                "shoal f32 (SHOAL_DTYPE=f32)"
            } else {
                "shoal f32, 8 streams"
            },
            streams,
            Reader::Json,
            shoal_generate("f32", None, streams),
        ));
        // The same file kept 4-bit (Q4_1 repacked as MLX affine 4-bit), its products on
        // shoal's CPU kernel (`native/kernels`): an eighth of f32's weight bytes.
        contenders.push((
            if streams == 1 {
                "shoal 4-bit (the default)"
            } else {
                "shoal 4-bit, 8 streams"
            },
            streams,
            Reader::Json,
            shoal_generate("quantized", None, streams),
        ));
        // Decode-sized products on int8 x (`inference::cpu_kernels`).
        contenders.push((
            if streams == 1 {
                "shoal 4-bit, SHOAL_QMM=int8"
            } else {
                "shoal 4-bit, int8 x, 8 streams"
            },
            streams,
            Reader::Json,
            shoal_generate("quantized", Some("int8"), streams),
        ));
    }
    if let Some(py) = &mlx_python {
        for (label, dtype) in [
            ("mlx-lm f32 + OpenBLAS (fastest)", "f32"),
            ("mlx-lm bf16 (default)", "bf16"),
        ] {
            let (py, script, folder, ids_file, gen, openblas) = (
                py.clone(),
                script.clone(),
                folder.clone(),
                ids_file.clone(),
                gen.clone(),
                openblas.clone(),
            );
            contenders.push((
                label,
                1,
                Reader::Json,
                Box::new(move || {
                    let mut c = Command::new(&py);
                    c.arg(&script)
                        .arg(&folder)
                        .arg(dtype)
                        .arg(&ids_file)
                        .arg(&gen);
                    if let Some(lib) = &openblas {
                        c.env("LD_PRELOAD", lib);
                    }
                    c
                }),
            ));
        }
    }
    if let Some(py) = &mlx_python {
        let batch_script = bench.join("bench_mlx_lm_batch.py");
        std::fs::write(&batch_script, bench_streams::MLX_LM_BATCH_SCRIPT)
            .map_err(|e| e.to_string())?;
        let (py, folder, ids_file, gen, openblas) = (
            py.clone(),
            folder.clone(),
            ids_file.clone(),
            gen.clone(),
            openblas.clone(),
        );
        contenders.push((
            "mlx-lm f32 + OpenBLAS, 8 streams",
            STREAMS,
            Reader::Json,
            Box::new(move || {
                let mut c = Command::new(&py);
                c.arg(&batch_script)
                    .arg(&folder)
                    .arg(&ids_file)
                    .arg(&gen)
                    .arg(STREAMS.to_string());
                if let Some(lib) = &openblas {
                    c.env("LD_PRELOAD", lib);
                }
                c
            }),
        ));
    }
    let threads = std::env::var("OPENBLAS_NUM_THREADS").unwrap_or_else(|_| "default".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    if let Some(bin) = &llama_bench {
        // As many threads as OpenBLAS gives MLX (all cores unless OPENBLAS_NUM_THREADS says),
        // and one: llama.cpp's threads spin while they wait, so on a machine shared with other
        // work one thread can beat all of them by 5x. Both rows are shown.
        let all: usize = threads.parse().unwrap_or(cores).max(1);
        let mut variants: Vec<(&'static str, usize)> = vec![("llama.cpp Q4_1, all threads", all)];
        if all > 1 {
            variants.push(("llama.cpp Q4_1, 1 thread", 1));
        }
        for (label, n) in variants {
            let (bin, model, gen) = (bin.clone(), model.clone(), gen.clone());
            contenders.push((
                label,
                1,
                Reader::LlamaBench,
                Box::new(move || {
                    let mut c = Command::new(&bin);
                    c.arg("-m")
                        .arg(&model)
                        .args(["-p", &PROMPT_TOKENS.to_string(), "-n", &gen])
                        .args(["-t", &n.to_string(), "-r", "1", "-o", "jsonl"]);
                    c
                }),
            ));
        }
    }
    if let Some(bin) = &batched_bench {
        let all: usize = threads.parse().unwrap_or(cores).max(1);
        let mut variants: Vec<(&'static str, usize)> =
            vec![("llama.cpp Q4_1, 8 streams, all threads", all)];
        if all > 1 {
            variants.push(("llama.cpp Q4_1, 8 streams, 1 thread", 1));
        }
        for (label, n) in variants {
            let (bin, model) = (bin.clone(), model.clone());
            contenders.push((
                label,
                STREAMS,
                Reader::LlamaBatchedBench,
                Box::new(move || {
                    bench_streams::batched_bench_command(
                        &bin,
                        &model,
                        PROMPT_TOKENS,
                        GENERATED_TOKENS,
                        n,
                    )
                }),
            ));
        }
    }
    // Other work on the machine skews every figure: the load average goes with the table.
    let load_before = load_average();
    let mut results: Vec<Vec<Figures>> = vec![Vec::new(); contenders.len()];
    for round in 1..=runs {
        for (i, (label, _, reader, make)) in contenders.iter().enumerate() {
            eprintln!("bench: round {round}/{runs}: {label} ...");
            let figures = match reader {
                Reader::Json => measure(&mut make())?,
                Reader::LlamaBench => measure_llama_bench(&mut make())?,
                Reader::LlamaBatchedBench => bench_streams::measure_batched_bench(&mut make())?,
            };
            results[i].push(figures);
        }
    }
    println!();
    println!("SmolLM2-135M-Instruct (Q4_1 GGUF), {PROMPT_TOKENS}-token prompt, {GENERATED_TOKENS} generated per stream, greedy, EOS ignored; with {STREAMS} streams, prompt and gen tok/s are all streams' together");
    println!("median of {runs} interleaved rounds; {cores} cores; OPENBLAS_NUM_THREADS={threads}; load average {load_before} before, {} after", load_average());
    let llama_cpp_build = results.iter().flatten().find_map(|f| f.build.clone());
    println!(
        "{}",
        versions_line(mlx_versions.as_ref(), llama_cpp_build.as_deref())
    );
    println!(
        "{:<40} {:>13} {:>13} {:>12} {:>18}",
        "", "prompt tok/s", "gen tok/s", "peak RSS MB", "shoal 4-bit / row"
    );
    for streams in [1, STREAMS] {
        // Each group is compared with shoal's 4-bit form at the same number of streams.
        let gen_of = |i: usize| median(results[i].iter().map(|f| f.generation_tps).collect());
        let Some(reference) = contenders
            .iter()
            .position(|(label, s, ..)| *s == streams && label.starts_with("shoal 4-bit"))
        else {
            continue;
        };
        let shoal_gen = gen_of(reference);
        for (i, ((label, s, ..), figs)) in contenders.iter().zip(&results).enumerate() {
            if *s != streams {
                continue;
            }
            let p = median(figs.iter().map(|f| f.prompt_tps).collect());
            let g = gen_of(i);
            let m = median(figs.iter().map(|f| f.peak_rss_mb).collect());
            // llama.cpp reports no memory figure.
            let m = if m > 0.0 {
                format!("{m:.0}")
            } else {
                "-".into()
            };
            println!(
                "{label:<40} {p:>13.1} {g:>13.2} {m:>12} {:>17.2}x",
                shoal_gen / g
            );
        }
    }
    if llama_bench.is_none() {
        println!("llama.cpp: not measured here (`cargo xtask bench inference --with-llama-cpp` builds llama-bench once: about 8 CPU-minutes)");
    }
    if with_llama_cpp {
        // Through HTTP as users run both: llama-server on the same GGUF files.
        crate::bench_llama_server::server_tables(&crate::bench_llama_server::Options::default())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peers_are_pinned_and_printed() {
        let [mlx, lm] = mlx_lm_requirements();
        assert_eq!(mlx, format!("mlx[cpu]=={}", crate::mlx_build::MLX_VERSION));
        assert_eq!(lm, "mlx-lm==0.32.2");
        let measured = ("0.32.2".to_owned(), "0.32.2".to_owned());
        let line = versions_line(Some(&measured), Some("b6660 (a1b2c3d)"));
        assert_eq!(
            line,
            "versions: mlx 0.32.2 (cpu) + mlx-lm 0.32.2; llama.cpp b6660 (a1b2c3d) from \
             llama-cpp-python 0.3.36"
        );
        assert!(versions_line(None, None).contains("pinned: mlx 0.32.2, mlx-lm 0.32.2"));
        let jsonl = r#"{"build_commit": "a1b2c3d", "build_number": 6660, "n_prompt": 128}"#;
        assert_eq!(llama_cpp_build(jsonl).as_deref(), Some("b6660 (a1b2c3d)"));
        assert_eq!(
            json_string(jsonl, "build_commit").as_deref(),
            Some("a1b2c3d")
        );
    }

    #[test]
    fn llama_bench_json_lines_give_prompt_and_generation_speed() {
        let mut cmd = Command::new("printf");
        cmd.arg(concat!(
            r#"{"build_commit": "x", "n_prompt": 128, "n_gen": 0, "avg_ts": 301.5, "stddev_ts": 0.0}\n"#,
            r#"{"build_commit": "x", "n_prompt": 0, "n_gen": 128, "avg_ts": 112.25, "stddev_ts": 0.0}\n"#
        ));
        let f = measure_llama_bench(&mut cmd).unwrap();
        assert_eq!((f.prompt_tps, f.generation_tps), (301.5, 112.25));
        assert_eq!(f.build.as_deref(), Some("x"));
        assert!(measure_llama_bench(&mut Command::new("true")).is_err());
    }
}
