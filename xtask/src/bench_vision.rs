//! `cargo xtask bench vision [--rounds 5]`: time to first token for one 1024×1024 image,
//! shoal against mlx-vlm (issue 47), on the same model folder (the tiny Gemma 3 vision fixture
//! as f32, made by mlx-vlm at setup) and the same image file.
//!
//! One release node serves the folder in its own network namespace; the pinned mlx-vlm venv's
//! Python runs `xtask/scripts/bench_vision.py` in the same namespace, which makes the image
//! once (into `<cache>/fixtures/vision-bench/`), then alternates: a streamed OpenAI chat with
//! the image as a data URL to shoal, timed to the first content delta; mlx-vlm's own
//! processor and generation loop on the image file, timed to its first token (the model loaded
//! once, as a server holds it). One untimed warm-up of each, then `--rounds` rounds; the table
//! gives each side's median and range. It needs the fixtures (it never runs setup) and is not
//! part of the tests.

use crate::bench_concurrency::start_shoal;
use crate::e2e::json_line;
use crate::mlx_vlm_venv::{mlx_vlm_venv, MLX_VLM_VERSION};
use crate::paths::{cache_dir, workspace_root};
use crate::testbed::run_bounded;
use crate::util::run;
use serde_json::Value;
use std::time::Duration;

fn parse(args: &[String]) -> Result<usize, String> {
    match args {
        [] => Ok(5),
        [flag, n] if flag == "--rounds" => n
            .parse()
            .ok()
            .filter(|n| (1..=50).contains(n))
            .ok_or(format!("--rounds {n}: give a number from 1 to 50")),
        other => Err(format!("bench vision: unknown arguments {other:?}")),
    }
}

/// `(median, lowest, highest)` of `values`.
fn spread(values: &[f64]) -> (f64, f64, f64) {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let median = v.get(v.len() / 2).copied().unwrap_or(f64::NAN);
    let low = v.first().copied().unwrap_or(f64::NAN);
    let high = v.last().copied().unwrap_or(f64::NAN);
    (median, low, high)
}

/// Runs the benchmark and prints the table.
pub fn bench_vision(args: &[String]) -> Result<(), String> {
    let rounds = parse(args)?;
    let fixture = cache_dir().join("fixtures/vision/gemma3/f32");
    let reference = fixture.join("reference.json");
    let reference: Value = std::fs::read_to_string(&reference)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .ok_or(format!(
            "{} is missing: run `cargo xtask setup` first",
            reference.display()
        ))?;
    let question = reference["question"]
        .as_str()
        .unwrap_or("What is in this picture?");
    let python = mlx_vlm_venv()?;
    eprintln!("bench: building shoal (release) ...");
    run(crate::cargo().args(["build", "--release", "--package", "shoal", "--bin", "shoal"]))?;
    // Every round sends the same image: without the prompt cache off, rounds after the first
    // would reuse the image's positions instead of running the tower.
    let (tb, url) = start_shoal(
        "vis",
        vec![
            "--model".into(),
            fixture.display().to_string(),
            "--prompt-cache-tokens".into(),
            "0".into(),
        ],
    )?;
    let models = tb.get(0, "/v1/models")?;
    // The catalog lists other models too: the one placed is the one ready.
    let model = models["data"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["ready"] == true)
        .and_then(|m| m["id"].as_str())
        .ok_or(format!("no ready model listed: {models}"))?
        .to_string();
    let image = cache_dir().join("fixtures/vision-bench/image-1024.png");
    let script = workspace_root().join("xtask/scripts/bench_vision.py");
    let mut cmd = tb.command_in(0, &python);
    cmd.arg(&script)
        .arg(&url)
        .arg(&model)
        .arg(&fixture)
        .arg(&image)
        .arg(question)
        .arg(rounds.to_string())
        .env("HF_HUB_OFFLINE", "1");
    let out = run_bounded(cmd, Duration::from_secs(1800))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    for line in stdout.lines() {
        eprintln!("    | {line}");
    }
    let figures = json_line(&stdout, "mlx_vlm").filter(|_| stdout.contains("all passed"));
    let Some(figures) = figures else {
        return Err(format!(
            "the benchmark script failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            tb.log_tail(0, 30)
        ));
    };
    let list = |key: &str| -> Vec<f64> {
        figures[key]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_f64).collect())
            .unwrap_or_default()
    };
    let (shoal, vlm) = (spread(&list("shoal")), spread(&list("mlx_vlm")));
    println!();
    println!(
        "time to first token, one 1024×1024 PNG ({}), tiny Gemma 3 vision fixture (f32), {} \
         prompt tokens; median (range) of {rounds} alternating rounds",
        image.display(),
        figures["prompt_tokens"]
    );
    println!("{:<34} {:>10} {:>22}", "", "median", "range");
    for (name, (m, lo, hi)) in [
        ("shoal (OpenAI API, streamed)", shoal),
        (&*format!("mlx-vlm {MLX_VLM_VERSION} (generate loop)"), vlm),
    ] {
        println!(
            "{name:<34} {:>7.1} ms {:>9.1} – {:.1} ms",
            m * 1e3,
            lo * 1e3,
            hi * 1e3
        );
    }
    println!("ratio shoal / mlx-vlm: {:.2}", shoal.0 / vlm.0);
    drop(tb);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_and_spread() {
        assert_eq!(parse(&[]), Ok(5));
        assert_eq!(parse(&["--rounds".into(), "3".into()]), Ok(3));
        assert!(parse(&["--rounds".into(), "0".into()]).is_err());
        assert!(parse(&["--x".into()]).is_err());
        assert_eq!(spread(&[3.0, 1.0, 2.0]), (2.0, 1.0, 3.0));
    }
}
