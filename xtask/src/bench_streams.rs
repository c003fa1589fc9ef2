//! The several-streams rows of `cargo xtask bench inference`: the same prompt decoded as
//! [`STREAMS`] sequences at once by shoal (`shoal generate --streams`, the batching loop a
//! node runs), by mlx-lm (its `BatchGenerator`, the loop of `mlx_lm.server`) and by llama.cpp
//! (`llama-batched-bench`, built from the pinned sources like `llama-bench`). Each reports the
//! prompt speed of all streams together and their combined decode speed.

use crate::bench_figures::{json_number, Figures};
use crate::llama_cpp;
use crate::util::Step;
use std::path::PathBuf;
use std::process::Command;

/// Sequences decoded together in these rows.
pub const STREAMS: usize = 8;

/// mlx-lm's batched generation of one prompt as `STREAMS` sequences, end-of-text ignored
/// (no stop tokens), timed by `BatchGenerator`'s own statistics.
pub const MLX_LM_BATCH_SCRIPT: &str = r#"
import json, resource, sys
from pathlib import Path
import mlx.core as mx
from mlx_lm.utils import load_model
from mlx_lm.generate import BatchGenerator

path, ids_file, gen, streams = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
loaded = load_model(Path(path))
model = loaded[0] if isinstance(loaded, tuple) else loaded
mx.eval(model.parameters())
prompt = json.loads(Path(ids_file).read_text())
generator = BatchGenerator(model, stop_tokens=[])
generator.insert([list(prompt) for _ in range(streams)], [gen] * streams)
with generator.stats() as stats:
    while generator.next_generated():
        pass
generator.close()
print(json.dumps({
    "streams": streams,
    "prompt_tps": stats.prompt_tps,
    "generation_tps": stats.generation_tps,
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
}))
"#;

/// llama.cpp's `llama-batched-bench`, built on demand (`build`) or found built, from the
/// pinned sources (one build directory with `llama-bench`: the second tool takes a minute).
pub fn find_batched_bench(build: bool) -> Result<Option<PathBuf>, String> {
    const TOOL: &str = "llama-batched-bench";
    if llama_cpp::is_built(TOOL) {
        return Ok(Some(llama_cpp::tool_path(TOOL)));
    }
    if !build {
        return Ok(None);
    }
    let step = Step::new(
        1,
        1,
        "llama.cpp llama-batched-bench (from the llama-cpp-python sdist)",
    );
    let bin = llama_cpp::build_tool(&step, TOOL, "about a minute after llama-bench")?;
    step.done(&bin.display().to_string());
    Ok(Some(bin))
}

/// `llama-batched-bench` for `STREAMS` sequences of a `prompt`-token prompt and `gen`
/// tokens each, on `threads` threads, with JSON lines out.
pub fn batched_bench_command(
    bin: &PathBuf,
    model: &PathBuf,
    prompt: usize,
    gen: usize,
    threads: usize,
) -> Command {
    let mut c = Command::new(bin);
    let context = STREAMS * (prompt + gen) + 64;
    c.arg("-m")
        .arg(model)
        .args(["-c", &context.to_string()])
        .args(["-npp", &prompt.to_string()])
        .args(["-ntg", &gen.to_string()])
        .args(["-npl", &STREAMS.to_string()])
        .args(["-t", &threads.to_string()])
        .args(["--output-format", "jsonl"]);
    c
}

/// Runs `llama-batched-bench` once and reads its JSON line: `speed_pp` (all prompts) and
/// `speed_tg` (all streams' tokens over the decode time).
pub fn measure_batched_bench(cmd: &mut Command) -> Result<Figures, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot start {:?}: {e}", cmd.get_program()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    batched_bench_figures(&stdout).ok_or_else(|| {
        format!(
            "llama-batched-bench printed no figures ({}); stderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The figures of `llama-batched-bench`'s JSON line for [`STREAMS`] sequences.
fn batched_bench_figures(stdout: &str) -> Option<Figures> {
    let line = stdout.lines().find(|l| {
        l.trim_start().starts_with('{') && json_number(l, "pl") == Some(STREAMS as f64)
    })?;
    Some(Figures {
        prompt_tps: json_number(line, "speed_pp")?,
        generation_tps: json_number(line, "speed_tg")?,
        peak_rss_mb: 0.0,
        build: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batched_bench_json_lines_give_prompt_and_decode_speed() {
        let stdout = "{\"n_kv_max\": 2112, \"n_batch\": 2048, \"n_ubatch\": 512, \
            \"flash_attn\": 0, \"is_pp_shared\": 0, \"n_gpu_layers\": 0, \"n_threads\": 1, \
            \"n_threads_batch\": 1, \"pp\": 128, \"tg\": 128, \"pl\": 8, \"n_kv\": 2048, \
            \"t_pp\": 4.2, \"speed_pp\": 243.8, \"t_tg\": 9.1, \"speed_tg\": 112.5, \"t\": 13.3, \
            \"speed\": 154.0}\n";
        let f = batched_bench_figures(stdout).unwrap();
        assert_eq!((f.prompt_tps, f.generation_tps), (243.8, 112.5));
        assert!(batched_bench_figures("| PP | TG |\n").is_none());
        // A line for another stream count is not this row's.
        assert!(batched_bench_figures(&stdout.replace("\"pl\": 8", "\"pl\": 1")).is_none());
    }
}
