//! What the inference benchmarks read from their contenders: one measurement's figures, the
//! JSON lines shoal, mlx-lm's scripts and llama.cpp's tools print, and medians of rounds
//! (`bench_inference.rs`, `bench_streams.rs`).

use std::process::Command;

/// One measurement.
#[derive(Clone, Default)]
pub(crate) struct Figures {
    pub prompt_tps: f64,
    pub generation_tps: f64,
    pub peak_rss_mb: f64,
    /// The build that ran, where the contender reports one (llama.cpp).
    pub build: Option<String>,
}

/// Reads `"key": number` from a one-line JSON object (enough for the lines we print).
pub(crate) fn json_number(line: &str, key: &str) -> Option<f64> {
    let at = line.find(&format!("\"{key}\""))? + key.len() + 2;
    let rest = line[at..].trim_start().strip_prefix(':')?.trim_start();
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '-' | 'e' | 'E' | '+')))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// Runs a contender that prints one JSON line of figures (`prompt_tps`, `generation_tps`,
/// `peak_rss_mb`) and reads it.
pub(crate) fn measure(cmd: &mut Command) -> Result<Figures, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot start {:?}: {e}", cmd.get_program()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .ok_or_else(|| {
            format!(
                "{:?} printed no figures; stderr:\n{}",
                cmd.get_program(),
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
    let get = |k| json_number(line, k).ok_or_else(|| format!("no `{k}` in {line}"));
    Ok(Figures {
        prompt_tps: get("prompt_tps")?,
        generation_tps: get("generation_tps")?,
        peak_rss_mb: get("peak_rss_mb").unwrap_or(0.0),
        build: None,
    })
}

/// The median (NaN for none).
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_read_from_json_lines() {
        let line = r#"{"generation_tps":16.5,"peak_rss_mb": 594.7, "prompt_tps":2.7e2}"#;
        assert_eq!(json_number(line, "generation_tps"), Some(16.5));
        assert_eq!(json_number(line, "peak_rss_mb"), Some(594.7));
        assert_eq!(json_number(line, "prompt_tps"), Some(270.0));
        assert_eq!(json_number(line, "missing"), None);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
    }
}
