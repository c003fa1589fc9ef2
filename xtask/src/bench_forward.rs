//! `cargo xtask bench forward [-n N] [--tokens T] [--release]`: what answering through a node
//! that does not hold the model costs. Two nodes in network namespaces; node 1 serves the
//! SmolLM2 fixture, node 2 holds nothing. From node 2's namespace the `openai` client sends N
//! short greedy streams straight to node 1 and N through node 2 (forwarded over iroh),
//! interleaved, and prints time to first token and total latency, p50 and p90, for each, and
//! the difference: the latency forwarding adds. Both paths cross the bridge once on the way
//! to node 1, so the difference is the extra hop and the forwarding itself. Bounded: 2 nodes,
//! N (default 20, at most 200) requests per path, one at a time.

use crate::e2e::json_line;
use crate::testbed::{self, Poll, Testbed};
use kit::instances::instances_in_state;
use serde_json::Value;
use std::time::Duration;

struct Options {
    rounds: usize,
    tokens: usize,
    release: bool,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        rounds: 20,
        tokens: 2,
        release: false,
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
            "-n" => o.rounds = number("-n", 200)?,
            "--tokens" => o.tokens = number("--tokens", 16)?,
            "--release" => o.release = true,
            other => return Err(format!("bench forward: unknown argument `{other}`")),
        }
    }
    Ok(o)
}

/// Runs the benchmark.
pub fn bench_forward(args: &[String]) -> Result<(), String> {
    let o = parse(args)?;
    testbed::catch_ctrl_c()?;
    let binary = testbed::build_shoal(o.release)?;
    eprintln!("starting 2 nodes in namespaces; node 1 serves the default model ...");
    let mut tb = Testbed::start("fwd", 2, &binary, |i| {
        if i == 0 {
            vec!["--model".into(), "default".into()]
        } else {
            Vec::new()
        }
    })?;
    let result = measure(&mut tb, &o);
    if result.is_err() {
        eprintln!("node logs:\n{}", tb.all_logs(20));
    }
    result
}

fn measure(tb: &mut Testbed, o: &Options) -> Result<(), String> {
    let ids = tb.node_ids(Duration::from_secs(30))?;
    tb.wait_mesh(&ids, Duration::from_secs(30))?;
    let holder = ids[0].clone();
    tb.wait_for(
        "node 2 sees the model ready on node 1",
        Duration::from_secs(120),
        Duration::from_millis(500),
        |tb| {
            tb.check_alive(0)?;
            tb.check_alive(1)?;
            let state = match tb.get(1, "/state") {
                Ok(state) => state,
                Err(e) => return Ok(Poll::Waiting(e)),
            };
            let ready = instances_in_state(&state)
                .into_iter()
                .any(|i| i.ready && i.rank_nodes == [holder.clone()]);
            Ok(if ready {
                Poll::Ready(())
            } else {
                Poll::Waiting("no ready instance on node 1 in node 2's state".into())
            })
        },
    )?;
    eprintln!(
        "measuring {} rounds of max_tokens {} (direct to node 1, and through node 2) ...",
        o.rounds, o.tokens
    );
    let out = tb.client(
        1,
        &[
            "forward".into(),
            "default".into(),
            tb.url(0),
            tb.url(1),
            o.rounds.to_string(),
            o.tokens.to_string(),
        ],
        Duration::from_secs(60 + 10 * o.rounds as u64),
    )?;
    let figures = json_line(&out, "added_ms").ok_or("the client printed no figures")?;
    println!("{}", table(&figures));
    Ok(())
}

/// The figures as a table.
fn table(f: &Value) -> String {
    let ms = |path: [&str; 3]| {
        f[path[0]][path[1]][path[2]]
            .as_f64()
            .map_or("-".to_string(), |v| format!("{v:.1}"))
    };
    let mut out = format!(
        "forwarding, {} requests per path, max_tokens {} (ms):\n{:<22} {:>9} {:>9} {:>11} {:>11}\n",
        f["n"], f["max_tokens"], "", "TTFT p50", "TTFT p90", "total p50", "total p90"
    );
    for (label, key) in [
        ("direct to node 1", "direct"),
        ("through node 2", "forwarded"),
        ("added by forwarding", "added_ms"),
    ] {
        out.push_str(&format!(
            "{label:<22} {:>9} {:>9} {:>11} {:>11}\n",
            ms([key, "ttft", "p50_ms"]),
            ms([key, "ttft", "p90_ms"]),
            ms([key, "total", "p50_ms"]),
            ms([key, "total", "p90_ms"]),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn arguments_are_bounded() {
        let o = parse(&[]).unwrap();
        assert_eq!((o.rounds, o.tokens, o.release), (20, 2, false));
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let o = parse(&args(&["-n", "5", "--tokens", "4", "--release"])).unwrap();
        assert_eq!((o.rounds, o.tokens, o.release), (5, 4, true));
        assert!(parse(&args(&["-n", "0"])).is_err());
        assert!(parse(&args(&["-n", "100000"])).is_err());
        assert!(parse(&args(&["--what"])).is_err());
    }

    #[test]
    fn the_table_shows_each_path() {
        let p = |a: f64, b: f64| json!({"p50_ms": a, "p90_ms": b});
        let f = json!({
            "direct": {"ttft": p(100.0, 120.0), "total": p(200.0, 230.0)},
            "forwarded": {"ttft": p(104.5, 126.0), "total": p(205.0, 240.0)},
            "added_ms": {"ttft": p(4.5, 6.0), "total": p(5.0, 10.0)},
            "n": 20, "max_tokens": 2,
        });
        let t = table(&f);
        assert!(t.contains("added by forwarding"), "{t}");
        assert!(
            t.lines()
                .any(|l| l.starts_with("added by forwarding") && l.contains("4.5")),
            "{t}"
        );
    }
}
