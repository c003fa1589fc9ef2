//! `cargo xtask <command>`: the developer entry points of shoal. Run `cargo xtask help`.

mod bench_cluster;
mod bench_concurrency;
mod bench_download;
mod bench_figures;
mod bench_forward;
mod bench_inference;
mod bench_llama_server;
mod bench_moe;
mod bench_peer_copy;
mod bench_prompt_cache;
mod bench_streams;
mod bench_structured;
mod bench_vision;
mod cluster;
mod dialect_fixtures;
mod e2e;
mod family_fixtures;
mod kquants;
mod llama_cpp;
mod mlx_build;
mod mlx_lm_venv;
mod mlx_vlm_venv;
mod moe_gguf;
mod paths;
mod pyenv;
mod pypi;
mod real_tokenizers;
mod reference;
mod setup;
mod soak;
mod testbed;
mod util;
mod vision_fixtures;

use paths::{target_dir, workspace_root};
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use util::run;

const HELP: &str = "\
cargo xtask <command> [args]

Commands:
  setup            prepare native dependencies (Debian packages, MLX, patched mlx-sys,
                   model fixture) into the cache; idempotent
  build            setup, then build the release binary; prints its path as the last line
  dist [--debug] [--out DIR]
                   build, then pack the binary and the libraries it loads into a
                   relocatable shoal-VERSION-ARCH-linux.tar.gz (target/dist by default)
                   with SHA256SUMS: copy it to another machine, unpack, run ./shoal
  run [ARGS]       build, then run one node serving the default model on
                   http://127.0.0.1:52415 (extra ARGS go to `shoal`)
  pyenv            create or update the Python venv with the pinned openai client (part
                   of setup); prints its interpreter as the last line
  vision-fixtures  make (or find made) the vision fixtures with the pinned mlx-vlm (part of
                   setup; needs the family fixtures' tokenizer)
  moe-gguf-fixtures
                   make (or find made) the MoE GGUF fixtures with llama.cpp's converter,
                   llama-quantize and libllama (part of setup)
  test [ARGS]      setup, then every test of the workspace, then e2e (ARGS go to
                   `cargo test`; with ARGS, e2e is skipped). A test that cannot run
                   fails; with SHOAL_ALLOW_SKIP=1 it is skipped, and the skips are
                   listed at the end
  e2e [--release]  3 nodes in namespaces: one model across all 3, chat through each, kill
                   the middle rank's node mid-stream, re-placement on the survivors
  cluster -n N [--extra-link A,B]... [--release] [-- SHOAL ARGS]
                   N nodes in network namespaces on a bridge (10.99.0.x), until Ctrl-C
  cluster --down   remove namespaces left by a killed cluster run
  bench mesh [--nodes 10,50,100] [--seeds 5]
                   simulated mesh benchmarks (default: 10/50/100 nodes, 5 seeds): bandwidth,
                   messages, convergence, death detection, loss
  bench inference [--with-llama-cpp]
                   shoal vs mlx-lm on the SmolLM2 fixture; with the flag also llama.cpp's
                   llama-bench, built once into the cache from the pinned sdist, and
                   `bench llama-server`'s tables
  bench llama-server [--rounds 3] [--tokens 128] [--only dense|moe]
                   shoal vs llama-server through their OpenAI streaming APIs on the same
                   GGUF, alternating: SmolLM2 Q4_K_M at 1 and 16 streams, a Qwen3-MoE-shaped
                   Q4_K_M (64 experts, top-8, ~1.35 B parameters, made once by llama.cpp's
                   converter) at 1 and 8; aggregate tok/s, TTFT, resident memory
  bench forward [-n N] [--tokens T]
                   latency a forwarded request adds (2 nodes in namespaces)
  bench download [--repeat 3] [--release]
                   `shoal download` vs huggingface_hub's snapshot_download from the
                   test hub, in namespaces, alternating
  bench peer-copy [--repeat 3] [--release]
                   a peer copy of the model between two nodes vs plain TCP of the same
                   bytes over the same link, in namespaces, alternating
  bench cluster [--nodes 1,2,3] [--pp 128] [--tg 64] [--repeat 3]
                   `shoal bench` on 1, 2 and 3 nodes in namespaces, with the
                   per-token overhead of each extra rank
  bench concurrency [--streams 1,4,8,16,32] [--tokens 128] [--rounds 1] [--no-mlx-lm]
                   [--pipeline] [--moe | --moe-hybrid] [--quantized]
                   many streams at once: shoal vs mlx_lm.server (its batching on), one
                   node in a namespace, alternating; aggregate tok/s, TTFT p50/p99;
                   --rounds N: the median of N alternating rounds;
                   --pipeline: shoal alone on a 2-rank pipeline over two namespaced nodes;
                   --moe: both on a 4-bit Qwen3-MoE of 1.9 B parameters (made once by
                   mlx-lm), with each server's resident memory; --moe-hybrid: the same
                   on a 4-bit Qwen3.5-MoE of 1.4 B parameters (Gated DeltaNet layers, a
                   full-attention layer every fourth); --quantized: shoal keeps
                   the weights quantized instead of the CPU default's choice
  bench structured [--streams 16] [--tokens 128] [--rounds 3]
                   constrained decoding's cost: the same streams alternating, unconstrained
                   and under a JSON Schema response_format; aggregate tok/s and TTFT
  bench prompt-cache [--words 700] [--rounds 3]
                   second turn of a ~1,000-token chat: time to first token with the
                   prompt cache and without (--prompt-cache-tokens 0)
  bench vision [--rounds 5]
                   time to first token for one 1024×1024 image: shoal (one node in a
                   namespace, OpenAI API) vs mlx-vlm's generate loop on the same Gemma 3
                   fixture folder and image file, alternating
  soak [--minutes 10] [--nodes 3] [--clients 3] [--seed 1] [--release]
                   a bounded soak (not in CI): chats to random nodes while random nodes
                   are killed and restarted; prints sent/completed/errored/lost and each
                   node's memory at start and end; fails if any request is lost
  help             this text

Environment:
  SHOAL_CACHE_DIR   cache root (default $XDG_CACHE_HOME/shoal or ~/.cache/shoal)
  CARGO_TARGET_DIR  build directory (default <cache>/target, shared across clones)
  SHOAL_ALLOW_SKIP  1: tests that cannot run (no root, no fixture) are skipped and
                    counted instead of failing (never set in CI)
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (command, rest) = match args.split_first() {
        Some((c, rest)) => (c.as_str(), rest),
        None => ("help", &[][..]),
    };
    let result = match command {
        "setup" => setup::setup(),
        "build" => build().map(|path| println!("{path}")),
        "dist" => dist(rest),
        "run" => run_node(rest),
        "vision-fixtures" => {
            vision_fixtures::vision_fixtures(util::Step::new(1, 1, "vision fixtures (mlx-vlm)"))
        }
        "moe-gguf-fixtures" => {
            moe_gguf::moe_gguf_fixtures(util::Step::new(1, 1, "MoE GGUF fixtures (llama.cpp)"))
        }
        "pyenv" => pyenv::pyenv(util::Step::new(1, 1, "Python venv (openai client)"))
            .map(|python| println!("{}", python.display())),
        "test" => test(rest),
        "cluster" => cluster::cluster(rest),
        "e2e" => e2e::e2e(rest),
        "bench" => bench(rest),
        "soak" => soak::soak(rest),
        "help" | "--help" | "-h" => {
            print!("{HELP}");
            Ok(())
        }
        other => Err(format!("unknown command `{other}`\n\n{HELP}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A cargo command in the workspace root with the shared target directory.
fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(workspace_root())
        .env("CARGO_TARGET_DIR", target_dir());
    cmd
}

fn build() -> Result<String, String> {
    setup::setup()?;
    eprintln!("building shoal (release) ...");
    run(cargo().args(["build", "--release", "--package", "shoal", "--bin", "shoal"]))?;
    let path = target_dir().join("release").join("shoal");
    Ok(path.display().to_string())
}

/// `cargo xtask dist [--debug] [--out DIR]`: the relocatable tarball of a release build (of
/// the debug build with `--debug`, as the dist test packs it), under `target/dist` by default.
fn dist(args: &[String]) -> Result<(), String> {
    let debug = args.iter().any(|a| a == "--debug");
    let out = match args.iter().position(|a| a == "--out") {
        Some(i) => PathBuf::from(args.get(i + 1).ok_or("--out needs a folder")?),
        None => target_dir().join("dist"),
    };
    if let Some(other) = args
        .iter()
        .enumerate()
        .find(|(i, a)| *a != "--debug" && *a != "--out" && !(*i > 0 && args[i - 1] == "--out"))
    {
        return Err(format!("dist: unknown argument `{}`\n\n{HELP}", other.1));
    }
    let binary = if debug {
        setup::setup()?;
        run(cargo().args(["build", "--package", "shoal", "--bin", "shoal"]))?;
        target_dir().join("debug").join("shoal")
    } else {
        PathBuf::from(build()?)
    };
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let tarball = kit::release_tarball::package(&binary, &out, env!("CARGO_PKG_VERSION"))?;
    let size = std::fs::metadata(&tarball.path).map_or(0, |m| m.len());
    eprintln!(
        "bundled: {}\nneeds glibc {} or newer",
        tarball.bundled.join(", "),
        tarball.glibc
    );
    println!(
        "{} ({:.1} MB; SHA256SUMS beside it)",
        tarball.path.display(),
        size as f64 / 1e6
    );
    Ok(())
}

fn run_node(args: &[String]) -> Result<(), String> {
    let binary = build()?;
    eprintln!(
        "starting shoal with the default model; once it is ready, try:\n\n  \
         curl http://127.0.0.1:52415/v1/chat/completions -H 'Content-Type: application/json' \\\n    \
         -d '{{\"model\": \"default\", \"messages\": [{{\"role\": \"user\", \"content\": \"What is the capital of France?\"}}]}}'\n"
    );
    let mut cmd = Command::new(binary);
    cmd.args(["--model", "default"]).args(args);
    run(&mut cmd)
}

fn test(args: &[String]) -> Result<(), String> {
    setup::setup()?;
    eprintln!("running every test of the workspace ...");
    // Every test that cannot run and is allowed to skip leaves a line here.
    let skip_log = target_dir().join("shoal-skips.log");
    let _ = std::fs::remove_file(&skip_log);
    // --no-fail-fast: one failing test binary does not hide the others' results.
    let tested = run(cargo()
        .args(["test", "--workspace", "--no-fail-fast"])
        .args(args)
        .env("SHOAL_PYTHON", pyenv::venv_python())
        .env(kit::skip::LOG_VAR, &skip_log));
    let skips = kit::skip::read_log(&skip_log);
    let skipped = check_skips(&skips, kit::skip::allowed());
    if !args.is_empty() {
        eprintln!("(a subset of the tests was asked for: `cargo xtask e2e` not run)");
        return tested.and(skipped);
    }
    // The end-to-end check runs whatever the tests said, so a failing test does not hide it.
    eprintln!("running the end-to-end check (cargo xtask e2e) ...");
    // The binary `cargo test` just built for the integration tests: no second build.
    let e2e = e2e::e2e_with(Some(target_dir().join("debug").join("shoal")), false);
    let failures: Vec<String> = [("tests", tested), ("skips", skipped), ("e2e", e2e)]
        .into_iter()
        .filter_map(|(what, r)| r.err().map(|e| format!("{what}: {e}")))
        .collect();
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}

/// Prints the skips; with any and without `SHOAL_ALLOW_SKIP=1` (as in CI) the run fails, so
/// a green run means every test ran.
fn check_skips(skips: &[String], allowed: bool) -> Result<(), String> {
    let Some(summary) = kit::skip::summary(skips) else {
        return Ok(());
    };
    eprintln!("{summary}");
    if allowed {
        Ok(())
    } else {
        Err(format!(
            "{} test(s) skipped without {}=1: every test must run",
            skips.len(),
            kit::skip::ALLOW_VAR
        ))
    }
}

fn bench(args: &[String]) -> Result<(), String> {
    match args.first().map(String::as_str) {
        Some("mesh") => run(cargo()
            .args(["bench", "--package", "mesh", "--bench", "mesh_sim", "--"])
            .args(&args[1..])),
        Some("inference") => bench_inference::bench_inference(&args[1..]),
        Some("llama-server") => bench_llama_server::bench_llama_server(&args[1..]),
        Some("forward") => bench_forward::bench_forward(&args[1..]),
        Some("cluster") => bench_cluster::bench_cluster(&args[1..]),
        Some("download") => bench_download::bench_download(&args[1..]),
        Some("peer-copy") => bench_peer_copy::bench_peer_copy(&args[1..]),
        Some("concurrency") => bench_concurrency::bench_concurrency(&args[1..]),
        Some("structured") => bench_structured::bench_structured(&args[1..]),
        Some("prompt-cache") => bench_prompt_cache::bench_prompt_cache(&args[1..]),
        Some("vision") => bench_vision::bench_vision(&args[1..]),
        _ => Err(
            "bench: say what to measure: `cargo xtask bench mesh`, `inference`, \
                  `llama-server`, `forward`, `cluster`, `download`, `peer-copy`, \
                  `concurrency`, `structured`, `prompt-cache` or `vision`"
                .into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_fail_the_run_unless_allowed() {
        assert_eq!(check_skips(&[], false), Ok(()));
        let skips = vec!["mesh_cluster::t: network namespaces need root (run as root)".to_string()];
        let e = check_skips(&skips, false).unwrap_err();
        assert!(
            e.starts_with("1 test(s) skipped without SHOAL_ALLOW_SKIP=1"),
            "{e}"
        );
        assert_eq!(check_skips(&skips, true), Ok(()));
    }
}
