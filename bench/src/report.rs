//! Figures of `shoal bench`: one measured request ([`Sample`], the kit's), the mean and spread of several
//! ([`MeanSd`]), one line of the table per placement × prompt size × generation length
//! ([`Row`]), and the table and JSON they print as.

use serde_json::{json, Value};
use std::fmt::Write as _;

pub use kit::timing::Sample;

/// Mean and sample standard deviation (n − 1; 0 for a single value).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MeanSd {
    pub mean: f64,
    pub sd: f64,
    pub n: usize,
}

impl MeanSd {
    /// `None` for no values.
    pub fn of(values: &[f64]) -> Option<MeanSd> {
        let n = values.len();
        if n == 0 {
            return None;
        }
        let mean = values.iter().sum::<f64>() / n as f64;
        let sd = if n < 2 {
            0.0
        } else {
            (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
        };
        Some(MeanSd { mean, sd, n })
    }

    fn show(stat: Option<MeanSd>) -> String {
        stat.map_or("-".into(), |s| format!("{:.2} ± {:.2}", s.mean, s.sd))
    }

    fn to_json(stat: Option<MeanSd>) -> Value {
        stat.map_or(
            Value::Null,
            |s| json!({"mean": s.mean, "sd": s.sd, "n": s.n}),
        )
    }
}

/// One placement, prompt size and generation length, with every measured request.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// `pipeline` or `tensor`.
    pub sharding: String,
    /// Nodes the instance spans.
    pub nodes: usize,
    /// The instance measured.
    pub instance_id: String,
    /// Asked prompt size (the actual one is in the samples).
    pub pp: u32,
    /// Tokens generated per request.
    pub tg: u32,
    pub samples: Vec<Sample>,
}

impl Row {
    /// Prompt tokens per second over the samples.
    pub fn prompt_tps(&self) -> Option<MeanSd> {
        MeanSd::of(
            &self
                .samples
                .iter()
                .filter_map(Sample::prompt_tps)
                .collect::<Vec<_>>(),
        )
    }

    /// Generation tokens per second over the samples.
    pub fn generation_tps(&self) -> Option<MeanSd> {
        MeanSd::of(
            &self
                .samples
                .iter()
                .filter_map(Sample::generation_tps)
                .collect::<Vec<_>>(),
        )
    }

    /// Time to first token in milliseconds over the samples.
    pub fn ttft_ms(&self) -> Option<MeanSd> {
        MeanSd::of(
            &self
                .samples
                .iter()
                .map(|s| s.ttft_s * 1000.0)
                .collect::<Vec<_>>(),
        )
    }

    /// The prompt sizes the server counted (all equal when the prompt was the same).
    fn prompt_tokens(&self) -> String {
        let mut sizes: Vec<u64> = self.samples.iter().map(|s| s.prompt_tokens).collect();
        sizes.sort_unstable();
        sizes.dedup();
        match sizes.as_slice() {
            [] => "-".into(),
            [one] => one.to_string(),
            [first, .., last] => format!("{first}-{last}"),
        }
    }

    /// Everything about the row, samples included.
    pub fn to_json(&self) -> Value {
        json!({
            "sharding": self.sharding,
            "nodes": self.nodes,
            "instance_id": self.instance_id,
            "pp": self.pp,
            "tg": self.tg,
            "prompt_tps": MeanSd::to_json(self.prompt_tps()),
            "generation_tps": MeanSd::to_json(self.generation_tps()),
            "ttft_ms": MeanSd::to_json(self.ttft_ms()),
            "samples": self.samples.iter().map(|s| s.to_json()).collect::<Vec<_>>(),
        })
    }
}

/// The table printed at the end: one line per row, mean ± sd.
pub fn table(rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<9} {:>5} {:>6} {:>5} {:>7} {:>18} {:>18} {:>18} {:>3}",
        "sharding", "nodes", "pp", "tg", "prompt", "prompt tok/s", "gen tok/s", "TTFT ms", "n"
    );
    for row in rows {
        let _ = writeln!(
            out,
            "{:<9} {:>5} {:>6} {:>5} {:>7} {:>18} {:>18} {:>18} {:>3}",
            row.sharding,
            row.nodes,
            row.pp,
            row.tg,
            row.prompt_tokens(),
            MeanSd::show(row.prompt_tps()),
            MeanSd::show(row.generation_tps()),
            MeanSd::show(row.ttft_ms()),
            row.samples.len()
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(prompt: u64, completion: u64, ttft: f64, decode: f64) -> Sample {
        Sample {
            prompt_tokens: prompt,
            completion_tokens: completion,
            ttft_s: ttft,
            decode_s: decode,
        }
    }

    #[test]
    fn rates_follow_exo_bench_definitions() {
        let s = sample(128, 65, 0.5, 2.0);
        assert_eq!(s.prompt_tps(), Some(256.0));
        assert_eq!(s.generation_tps(), Some(32.0)); // (65 - 1) / 2
        assert_eq!(sample(128, 1, 0.5, 0.0).generation_tps(), None);
        assert_eq!(sample(128, 8, 0.0, 1.0).prompt_tps(), None);
    }

    #[test]
    fn mean_and_sample_sd() {
        let s = MeanSd::of(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]).unwrap();
        assert_eq!(s.mean, 5.0);
        assert!((s.sd - (32.0f64 / 7.0).sqrt()).abs() < 1e-12, "{}", s.sd);
        assert_eq!(MeanSd::of(&[3.0]).unwrap().sd, 0.0);
        assert_eq!(MeanSd::of(&[]), None);
    }

    #[test]
    fn table_and_json_carry_every_figure() {
        let row = Row {
            sharding: "pipeline".into(),
            nodes: 2,
            instance_id: "i-1".into(),
            pp: 128,
            tg: 64,
            samples: vec![sample(130, 64, 0.5, 3.5), sample(130, 64, 0.52, 3.5)],
        };
        let text = table(std::slice::from_ref(&row));
        let line = text.lines().nth(1).unwrap();
        assert!(line.starts_with("pipeline"), "{line}");
        assert!(line.contains(" 130 "), "{line}");
        assert!(line.contains("18.00 ± 0.00"), "{line}"); // 63 / 3.5
        let json = row.to_json();
        assert_eq!(json["samples"].as_array().unwrap().len(), 2);
        assert_eq!(json["generation_tps"]["mean"], 18.0);
        assert_eq!(json["nodes"], 2);
        let mixed = Row {
            samples: vec![sample(129, 4, 1.0, 1.0), sample(131, 4, 1.0, 1.0)],
            ..row
        };
        assert_eq!(mixed.prompt_tokens(), "129-131");
    }
}
