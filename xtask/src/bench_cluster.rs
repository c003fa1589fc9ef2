//! `cargo xtask bench cluster [--nodes 1,2,3] [--pp 128] [--tg 64] [--repeat 3] [--warmup 1]
//! [--sharding pipeline|tensor|both] [--release]`: `shoal bench` on clusters of 1, 2 and 3
//! nodes in network namespaces, with the SmolLM2 fixture, and the per-token overhead of each
//! extra rank. For each size a fresh cluster starts (no model), `shoal bench` runs in node 1's
//! namespace against node 1 for the placements spanning exactly that many nodes, and the
//! cluster is torn down. On one machine more ranks cannot be faster (they share the cores);
//! what the figures show is what a rank boundary costs.

use crate::testbed::{self, Testbed};
use serde_json::Value;
use std::time::Duration;

struct Options {
    sizes: Vec<usize>,
    pp: String,
    tg: String,
    repeat: usize,
    warmup: usize,
    sharding: String,
    release: bool,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        sizes: vec![1, 2, 3],
        pp: "128".into(),
        tg: "64".into(),
        repeat: 3,
        warmup: 1,
        sharding: "pipeline".into(),
        release: false,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().cloned().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--nodes" => {
                let v = value("--nodes")?;
                o.sizes = v
                    .split(',')
                    .map(|n| n.trim().parse().ok().filter(|n| (1..=8).contains(n)))
                    .collect::<Option<Vec<usize>>>()
                    .filter(|s| !s.is_empty())
                    .ok_or(format!(
                        "--nodes {v}: give cluster sizes from 1 to 8, like 1,2,3"
                    ))?;
            }
            "--pp" => o.pp = value("--pp")?,
            "--tg" => o.tg = value("--tg")?,
            "--repeat" => {
                let v = value("--repeat")?;
                o.repeat = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=20).contains(n))
                    .ok_or(format!("--repeat {v}: give 1 to 20"))?;
            }
            "--warmup" => {
                let v = value("--warmup")?;
                o.warmup = v
                    .parse()
                    .ok()
                    .filter(|n| *n <= 10)
                    .ok_or(format!("--warmup {v}: give 0 to 10"))?;
            }
            "--sharding" => o.sharding = value("--sharding")?,
            "--release" => o.release = true,
            other => return Err(format!("bench cluster: unknown argument `{other}`")),
        }
    }
    Ok(o)
}

/// One size's rows as `shoal bench --json-out` wrote them.
struct Measured {
    nodes: usize,
    rows: Vec<Value>,
}

/// Runs the benchmark.
pub fn bench_cluster(args: &[String]) -> Result<(), String> {
    let o = parse(args)?;
    testbed::catch_ctrl_c()?;
    let binary = testbed::build_shoal(o.release)?;
    let mut measured = Vec::new();
    let mut failures = Vec::new();
    for &n in &o.sizes {
        eprintln!("== {n} node(s): starting a fresh cluster in namespaces ...");
        let mut tb = Testbed::start("bench", n, &binary, |_| Vec::new())?;
        match bench_size(&mut tb, &binary, &o, n) {
            Ok(rows) => measured.push(Measured { nodes: n, rows }),
            Err(e) => {
                testbed::check_interrupt()?;
                eprintln!("{n} node(s) failed: {e}\nnode logs:\n{}", tb.all_logs(15));
                failures.push(format!("{n} node(s): {e}"));
            }
        }
    }
    println!("{}", summary(&measured));
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}

fn bench_size(
    tb: &mut Testbed,
    binary: &std::path::Path,
    o: &Options,
    n: usize,
) -> Result<Vec<Value>, String> {
    let ids = tb.node_ids(Duration::from_secs(30))?;
    tb.wait_mesh(&ids, Duration::from_secs(30))?;
    let json_out = tb.log_dir().join(format!("bench-{n}.json"));
    let args: Vec<String> = [
        "bench",
        "--api",
        &tb.url(0),
        "--model",
        "default",
        "--pp",
        &o.pp,
        "--tg",
        &o.tg,
        "--min-nodes",
        &n.to_string(),
        "--max-nodes",
        &n.to_string(),
        "--sharding",
        &o.sharding,
        "--repeat",
        &o.repeat.to_string(),
        "--warmup",
        &o.warmup.to_string(),
        "--timeout",
        "300",
        "--json-out",
        &json_out.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    tb.run_in(0, binary, &args, Duration::from_secs(900))?;
    let text = std::fs::read_to_string(&json_out)
        .map_err(|e| format!("cannot read {}: {e}", json_out.display()))?;
    let doc: Value = serde_json::from_str(&text)
        .map_err(|e| format!("{} is not JSON: {e}", json_out.display()))?;
    Ok(doc["rows"].as_array().cloned().unwrap_or_default())
}

/// The figures of every size side by side, with the per-token cost of each extra rank
/// against the one-node row of the same sharding, prompt and generation length.
fn summary(measured: &[Measured]) -> String {
    let mean = |row: &Value, key: &str| row[key]["mean"].as_f64();
    let sd = |row: &Value, key: &str| row[key]["sd"].as_f64().unwrap_or(0.0);
    let mut out = format!(
        "{:<9} {:>5} {:>5} {:>4} {:>17} {:>15} {:>9} {:>22}\n",
        "sharding",
        "nodes",
        "pp",
        "tg",
        "prompt tok/s",
        "gen tok/s",
        "ms/token",
        "ms/token per extra rank"
    );
    let mut all: Vec<(usize, &Value)> = measured
        .iter()
        .flat_map(|m| m.rows.iter().map(move |r| (m.nodes, r)))
        .collect();
    all.sort_by_key(|(n, r)| {
        (
            r["sharding"].as_str().unwrap_or("").to_string(),
            r["pp"].as_u64(),
            r["tg"].as_u64(),
            *n,
        )
    });
    for &(n, row) in &all {
        let ms_per_token = mean(row, "generation_tps").map(|t| 1000.0 / t);
        let base = all.iter().find(|(m, r)| {
            *m == 1
                && r["pp"] == row["pp"]
                && r["tg"] == row["tg"]
                && r["sharding"] == row["sharding"]
        });
        let base_ms = base
            .and_then(|(_, r)| mean(r, "generation_tps"))
            .map(|t| 1000.0 / t);
        let per_rank = match (ms_per_token, base_ms) {
            (Some(ms), Some(base)) if n > 1 => format!("{:+.2}", (ms - base) / (n - 1) as f64),
            _ => "-".into(),
        };
        let show = |key: &str| {
            mean(row, key).map_or("-".into(), |m| format!("{m:.2} ± {:.2}", sd(row, key)))
        };
        out.push_str(&format!(
            "{:<9} {:>5} {:>5} {:>4} {:>17} {:>15} {:>9} {:>22}\n",
            row["sharding"].as_str().unwrap_or("?"),
            n,
            row["pp"].to_string(),
            row["tg"].to_string(),
            show("prompt_tps"),
            show("generation_tps"),
            ms_per_token.map_or("-".into(), |m| format!("{m:.1}")),
            per_rank
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn row(gen: f64) -> Value {
        json!({"sharding": "pipeline", "pp": 128, "tg": 64,
               "prompt_tps": {"mean": 150.0, "sd": 2.0}, "generation_tps": {"mean": gen, "sd": 0.1}})
    }

    #[test]
    fn overhead_per_extra_rank_is_against_one_node() {
        let measured = vec![
            Measured {
                nodes: 3,
                rows: vec![row(5.0)],
            },
            Measured {
                nodes: 1,
                rows: vec![row(10.0)],
            },
            Measured {
                nodes: 2,
                rows: vec![row(8.0)],
            },
        ];
        let text = summary(&measured);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[1].contains("100.0") && lines[1].trim_end().ends_with('-'),
            "{text}"
        );
        // 2 nodes: 125 ms - 100 ms over 1 extra rank; 3 nodes: (200 - 100) / 2.
        assert!(lines[2].trim_end().ends_with("+25.00"), "{text}");
        assert!(lines[3].trim_end().ends_with("+50.00"), "{text}");
    }

    #[test]
    fn arguments_parse_and_refuse() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let o = parse(&[]).unwrap();
        assert_eq!(o.sizes, vec![1, 2, 3]);
        let o = parse(&args(&["--nodes", "2,3", "--tg", "32", "--repeat", "2"])).unwrap();
        assert_eq!((o.sizes, o.tg.as_str(), o.repeat), (vec![2, 3], "32", 2));
        assert!(parse(&args(&["--nodes", "0"])).is_err());
        assert!(parse(&args(&["--nodes", ""])).is_err());
        assert!(parse(&args(&["--repeat", "x"])).is_err());
        assert!(parse(&args(&["--bogus"])).is_err());
    }
}
