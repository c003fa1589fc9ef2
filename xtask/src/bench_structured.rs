//! `cargo xtask bench structured [--streams 16] [--tokens 128] [--rounds 3]`: what decoding
//! under a grammar costs a batch (issue 45). One shoal node serving the default fixture (in a
//! network namespace, `--max-sequences` as large as the streams); for each round, alternating,
//! `--streams` streaming greedy chats start together unconstrained, then the same chats each
//! with a JSON Schema `response_format`. Every stream generates exactly `--tokens` tokens
//! (`ignore_eos`; the schema asks for more array items than fit, so the grammar is live for
//! every token). The table gives each side's aggregate tokens per second and time to first
//! token (the median round), and their ratio. Not part of CI (minutes on two cores).

use crate::bench_concurrency::{build_release, load, median_round, start_shoal, Figures};
use serde_json::{json, Value};

struct Options {
    streams: usize,
    tokens: usize,
    rounds: usize,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        streams: 16,
        tokens: 128,
        rounds: 3,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut number = |range: std::ops::RangeInclusive<usize>| {
            let n = it.next().ok_or(format!("{arg} needs a number"))?;
            n.parse().ok().filter(|n| range.contains(n)).ok_or(format!(
                "{arg} {n}: give a number from {} to {}",
                range.start(),
                range.end()
            ))
        };
        match arg.as_str() {
            "--streams" => o.streams = number(1..=64)?,
            "--tokens" => o.tokens = number(1..=1024)?,
            "--rounds" => o.rounds = number(1..=9)?,
            other => return Err(format!("bench structured: unknown argument `{other}`")),
        }
    }
    Ok(o)
}

/// The constrained side's format: an object holding more short strings than `tokens` can
/// write, so the grammar never reaches its end inside the run.
fn schema(tokens: usize) -> Value {
    json!({
        "type": "json_schema",
        "json_schema": {"name": "notes", "strict": true, "schema": {
            "type": "object",
            "properties": {
                "title": {"type": "string", "maxLength": 40},
                "notes": {"type": "array", "minItems": tokens.min(1000),
                          "items": {"type": "string", "maxLength": 24}}
            },
            "required": ["title", "notes"],
            "additionalProperties": false
        }}
    })
}

/// Runs the benchmark and prints the table.
pub fn bench_structured(args: &[String]) -> Result<(), String> {
    let o = parse(args)?;
    crate::setup::setup()?;
    build_release()?;
    let limits = vec![
        "--max-sequences".into(),
        o.streams.to_string(),
        "--max-queue".into(),
        (2 * o.streams).to_string(),
    ];
    let (tb, url) = start_shoal("structured", limits)?;
    let result = (|| {
        let free = json!({"ignore_eos": true});
        let mut bound = free.clone();
        bound["response_format"] = schema(o.tokens);
        let (mut free_runs, mut bound_runs) = (Vec::new(), Vec::new());
        for round in 1..=o.rounds {
            for (side, extra, runs) in [
                ("unconstrained", &free, &mut free_runs),
                ("under a JSON Schema", &bound, &mut bound_runs),
            ] {
                crate::testbed::check_interrupt()?;
                eprintln!(
                    "bench: round {round}/{}: {} streams {side} ...",
                    o.rounds, o.streams
                );
                runs.push(load(&tb, (&url, "default"), o.streams, o.tokens, extra)?);
            }
        }
        let free = median_round(&free_runs).unwrap_or_default();
        let bound = median_round(&bound_runs).unwrap_or_default();
        print_table(&o, &free, &bound);
        Ok(())
    })();
    if result.is_err() {
        eprintln!("node log:\n{}", tb.all_logs(30));
    }
    result
}

fn print_table(o: &Options, free: &Figures, bound: &Figures) {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!();
    println!(
        "SmolLM2-135M-Instruct as f32 on one node, {} streams of {} greedy tokens started \
         together; {cores} cores; median of {} round(s)",
        o.streams, o.tokens, o.rounds
    );
    println!(
        "{:>20} | {:>11} {:>9} {:>9}",
        "", "agg tok/s", "TTFT p50", "TTFT p99"
    );
    for (name, f) in [("unconstrained", free), ("JSON Schema", bound)] {
        println!(
            "{name:>20} | {:>11.1} {:>9} {:>9}",
            f.tps,
            format!("{:.2} s", f.p50),
            format!("{:.2} s", f.p99)
        );
    }
    println!(
        "constrained / unconstrained: {:.2}x aggregate tokens per second",
        bound.tps / free.tps.max(1e-9)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_and_schema() {
        let o = parse(&["--streams".into(), "8".into()]).unwrap();
        assert_eq!((o.streams, o.tokens, o.rounds), (8, 128, 3));
        assert!(parse(&["--streams".into(), "0".into()]).is_err());
        assert!(parse(&["--what".into()]).is_err());
        let s = schema(128);
        assert_eq!(
            s["json_schema"]["schema"]["properties"]["notes"]["minItems"],
            128
        );
    }
}
