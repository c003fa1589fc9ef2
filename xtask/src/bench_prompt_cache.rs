//! `cargo xtask bench prompt-cache [--words 700] [--rounds 3]`: what the prompt cache saves
//! on the second turn of a long conversation. Two shoal nodes serve the fixture, each alone in
//! its own network namespace: one with the prompt cache (the default), one with
//! `--prompt-cache-tokens 0`. Each round sends both the same two-turn chat (a first turn of
//! about `--words` words, ~1,000 tokens by default; the notes differ between rounds), in
//! turn; the table gives the second turn's median time to first token on each, their ratio
//! (the goal is at most 1/3) and the `cached_tokens` the cached node reported. Not part of CI.

use crate::bench_concurrency::{build_release, start_shoal};
use crate::e2e::json_line;
use crate::testbed::{self, Testbed};
use serde_json::Value;
use std::time::Duration;

struct Options {
    words: usize,
    rounds: usize,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        words: 700,
        rounds: 3,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut number = |name: &str, max: usize| -> Result<usize, String> {
            let value = it.next().ok_or(format!("{name} needs a number"))?;
            value
                .parse()
                .ok()
                .filter(|n| (1..=max).contains(n))
                .ok_or(format!("{name} {value}: give a number from 1 to {max}"))
        };
        match arg.as_str() {
            "--words" => o.words = number("--words", 4000)?,
            "--rounds" => o.rounds = number("--rounds", 20)?,
            other => return Err(format!("bench prompt-cache: unknown argument `{other}`")),
        }
    }
    Ok(o)
}

/// One two-turn chat against `tb`'s node; the client's JSON line.
fn turns(tb: &Testbed, url: &str, words: usize, salt: usize) -> Result<Value, String> {
    let out = tb.script(
        0,
        "bench_load.py",
        &[
            "turns".into(),
            url.into(),
            "default".into(),
            words.to_string(),
            "32".into(),
            salt.to_string(),
        ],
        Duration::from_secs(600),
    )?;
    json_line(&out, "second_ttft").ok_or("the load client printed no figures".into())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Runs the benchmark and prints the table.
pub fn bench_prompt_cache(args: &[String]) -> Result<(), String> {
    let o = parse(args)?;
    crate::setup::setup()?;
    build_release()?;
    let (cached, url) = start_shoal("pcon", Vec::new())?;
    let (plain, _) = start_shoal("pcoff", vec!["--prompt-cache-tokens".into(), "0".into()])?;
    let mut with = Vec::new();
    let mut without = Vec::new();
    let mut reported = Vec::new();
    let mut prompt = 0;
    for round in 1..=o.rounds {
        testbed::check_interrupt()?;
        eprintln!("bench: round {round}/{}: with the cache ...", o.rounds);
        let on = turns(&cached, &url, o.words, round)?;
        eprintln!("bench: round {round}/{}: without ...", o.rounds);
        let off = turns(&plain, &url, o.words, round)?;
        let ttft = |v: &Value| v["second_ttft"].as_f64().ok_or(format!("no ttft in {v}"));
        with.push(ttft(&on)?);
        without.push(ttft(&off)?);
        reported.push(on["cached_tokens"].as_u64().unwrap_or(0));
        if off["cached_tokens"].as_u64().unwrap_or(0) != 0 {
            return Err(format!(
                "the node without a cache reported cached tokens: {off}"
            ));
        }
        prompt = on["second_prompt_tokens"].as_u64().unwrap_or(0);
    }
    let (a, b) = (median(with), median(without));
    println!();
    println!(
        "SmolLM2-135M-Instruct as f32: second turn of a {prompt}-token conversation, median \
         of {} rounds",
        o.rounds
    );
    println!("{:<26} {:>14} {:>14}", "", "time to first", "cached tokens");
    println!("{:<26} {:>12.3} s {:>14}", "with the prompt cache", a, {
        let mut r = reported.clone();
        r.sort_unstable();
        r[r.len() / 2]
    });
    println!("{:<26} {:>12.3} s {:>14}", "--prompt-cache-tokens 0", b, 0);
    println!("ratio: {:.3} (goal: at most 0.333)", a / b);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options() {
        let o = parse(&["--words".into(), "100".into()]).unwrap();
        assert_eq!((o.words, o.rounds), (100, 3));
        assert!(parse(&["--rounds".into(), "0".into()]).is_err());
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
    }
}
