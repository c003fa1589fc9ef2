//! `cargo xtask soak [--minutes 10] [--nodes 3] [--clients 3] [--seed 1] [--release]`: a
//! bounded soak of a real cluster (not part of CI). Nodes in network namespaces run the
//! SmolLM2 fixture as a pipeline over two of them; client threads send streaming chats to
//! random nodes without pause while a chaos thread kills a random node (SIGKILL) every 30-60 s
//! and starts it again 10-20 s later (same identity). At the end it prints requests sent,
//! completed, errored (by reason) and **lost**, and each node's memory at start and end.
//!
//! A request is *lost* when it neither completes nor says it failed: no event for
//! [`SILENT_LIMIT`], or a body that ends without `[DONE]` from a node that stayed up. A node
//! killed under a request is an error the client sees (its connection breaks), not a loss.
//! The run fails if any request is lost, or if a node that was not killed exited.
//!
//! Every random choice (which node a chat goes to, which node is killed, the pauses) comes
//! from one seeded generator per thread, so a run can be repeated.

use crate::testbed::{build_shoal, check_interrupt, pause, Testbed};
use kit::blocking::{Blocking, Next};
use kit::sse::SseEvent;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Longest wait for the next event of a stream before the request counts as lost.
const SILENT_LIMIT: Duration = Duration::from_secs(90);

/// A small seeded generator (SplitMix64): reproducible choices without a dependency.
struct Seeded(u64);

impl Seeded {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn between(&mut self, low_s: u64, high_s: u64) -> Duration {
        Duration::from_secs(low_s + self.below(high_s - low_s + 1))
    }
}

/// What one request came to.
enum Outcome {
    Completed,
    Errored(String),
    Lost(String),
}

/// The tallies every thread adds to.
#[derive(Default)]
struct Tally {
    sent: u64,
    completed: u64,
    errored: BTreeMap<String, u64>,
    lost: Vec<String>,
}

struct Options {
    minutes: u64,
    nodes: usize,
    clients: usize,
    seed: u64,
    release: bool,
}

fn options(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        minutes: 10,
        nodes: 3,
        clients: 3,
        seed: 1,
        release: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut number = |name: &str| -> Result<u64, String> {
            it.next()
                .and_then(|v| v.parse().ok())
                .ok_or(format!("{name} needs a number"))
        };
        match a.as_str() {
            "--minutes" => o.minutes = number("--minutes")?,
            "--nodes" => o.nodes = number("--nodes")? as usize,
            "--clients" => o.clients = number("--clients")? as usize,
            "--seed" => o.seed = number("--seed")?,
            "--release" => o.release = true,
            other => return Err(format!("soak: unknown flag {other}")),
        }
    }
    if o.nodes < 2 || o.clients == 0 || o.minutes == 0 {
        return Err("soak needs --nodes 2 or more, --clients and --minutes above 0".into());
    }
    Ok(o)
}

/// Resident memory of a process in MB (`VmRSS`), if it runs.
fn rss_mb(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

/// Node `i`'s memory: its `shoal` process, everything in its namespace (its runners too), and
/// how many processes run there besides the node (its runners).
fn memory(testbed: &Testbed, i: usize) -> (Option<f64>, f64, usize) {
    let node = testbed.pid(i).and_then(rss_mb);
    let pids = testbed.pids(i);
    let all = pids.iter().copied().filter_map(rss_mb).sum();
    (node, all, pids.len().saturating_sub(1))
}

/// Waits until node 0 lists the instance ready (a re-placement after the last kill settles).
pub(crate) fn wait_ready(testbed: &mut Testbed, limit: Duration) -> Result<(), String> {
    testbed.wait_for(
        "the instance is ready",
        limit,
        Duration::from_millis(500),
        |tb| {
            let models = tb.get(0, "/v1/models").unwrap_or_default();
            let ready = models["data"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|m| m["id"] == "default" && m["ready"] == true);
            Ok(if ready {
                crate::testbed::Poll::Ready(())
            } else {
                crate::testbed::Poll::Waiting("not ready".into())
            })
        },
    )
}

/// One streaming chat to `api`; `killed` tells whether the node was killed meanwhile.
fn one_chat(api: &Blocking, n: u64, killed: impl Fn() -> bool) -> Outcome {
    let request = json!({
        "model": "default",
        "messages": [{"role": "user", "content": format!("Say something about the number {n}.")}],
        "max_tokens": 24,
        "temperature": 0.7,
        "seed": n,
        "stream": true,
    });
    let mut stream = match api.chat_stream(&request, Duration::from_secs(30)) {
        Ok(stream) => stream,
        Err(e) => {
            let reason = match e.status {
                Some(status) => format!("HTTP {status}"),
                None if killed() => "node killed".to_string(),
                None => "no answer (node down or restarting)".to_string(),
            };
            return Outcome::Errored(reason);
        }
    };
    let mut error: Option<String> = None;
    loop {
        match stream.next(SILENT_LIMIT) {
            Next::Event(SseEvent::Done) => {
                return match error {
                    Some(e) => Outcome::Errored(e),
                    None => Outcome::Completed,
                }
            }
            Next::Event(SseEvent::Data(data)) => {
                if error.is_none() && data.contains("\"error\"") {
                    let v: Value = serde_json::from_str(&data).unwrap_or_default();
                    let message = v["error"]["message"].as_str().unwrap_or("error event");
                    // The reason's first words name its kind; the rest is detail.
                    let kind: String = message
                        .split_whitespace()
                        .take(10)
                        .collect::<Vec<_>>()
                        .join(" ");
                    error = Some(format!("stream error: {kind}"));
                }
            }
            Next::Silent => {
                return Outcome::Lost(format!("no event for {} s", SILENT_LIMIT.as_secs()))
            }
            Next::End { .. } | Next::Broken(_) if killed() => {
                return Outcome::Errored("node killed mid-stream".into());
            }
            Next::End { cut_off } => {
                return Outcome::Lost(format!(
                    "the body ended without [DONE] (cut off: {cut_off}) from a node that stayed up"
                ))
            }
            Next::Broken(e) => {
                return Outcome::Lost(format!("broke from a node that stayed up: {e}"))
            }
        }
    }
}

/// `cargo xtask soak`.
pub fn soak(args: &[String]) -> Result<(), String> {
    let o = options(args)?;
    crate::testbed::catch_ctrl_c()?;
    let binary = build_shoal(o.release)?;
    let mut testbed = Testbed::start("soak", o.nodes, &binary, |_| Vec::new())?;
    let ids = testbed.node_ids(Duration::from_secs(60))?;
    testbed.wait_mesh(&ids, Duration::from_secs(90))?;
    let ranks = testbed.place_pipeline(2)?;
    eprintln!("placed: {ranks} ranks; waiting for it to be ready");
    wait_ready(&mut testbed, Duration::from_secs(300))?;
    let start_memory: Vec<(Option<f64>, f64, usize)> =
        (0..o.nodes).map(|i| memory(&testbed, i)).collect();
    eprintln!(
        "soaking for {} minutes: {} clients, a node killed every 30-60 s (seed {})",
        o.minutes, o.clients, o.seed
    );

    let tally = Arc::new(Mutex::new(Tally::default()));
    let kills: Arc<Vec<AtomicU64>> = Arc::new((0..o.nodes).map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let apis: Vec<kit::client::Api> = (0..o.nodes).map(|i| testbed.api(i)).collect();
    let mut clients = Vec::new();
    for c in 0..o.clients {
        let (tally, kills, stop, apis) = (tally.clone(), kills.clone(), stop.clone(), apis.clone());
        let mut rng = Seeded(o.seed.wrapping_mul(1000) + c as u64);
        clients.push(std::thread::spawn(move || {
            let clients: Vec<Blocking> = apis.into_iter().map(Blocking::new).collect();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let target = rng.below(clients.len() as u64) as usize;
                let before = kills[target].load(Ordering::Relaxed);
                n += 1;
                let outcome = one_chat(&clients[target], n, || {
                    kills[target].load(Ordering::Relaxed) != before
                });
                let mut t = tally.lock().unwrap_or_else(|e| e.into_inner());
                t.sent += 1;
                match outcome {
                    Outcome::Completed => t.completed += 1,
                    Outcome::Errored(reason) => *t.errored.entry(reason).or_default() += 1,
                    Outcome::Lost(why) => t.lost.push(format!("to node {}: {why}", target + 1)),
                }
                drop(t);
                // A refused request comes back at once: do not spin on a node that is down.
                std::thread::sleep(Duration::from_millis(200));
            }
        }));
    }

    let mut rng = Seeded(o.seed);
    let end = Instant::now() + Duration::from_secs(o.minutes * 60);
    let mut events = Vec::new();
    let started = Instant::now();
    let result = (|| {
        while Instant::now() < end {
            pause(
                rng.between(30, 60)
                    .min(end.saturating_duration_since(Instant::now())),
            )?;
            if Instant::now() >= end {
                break;
            }
            for i in 0..o.nodes {
                testbed.check_alive(i)?;
            }
            let victim = rng.below(o.nodes as u64) as usize;
            kills[victim].fetch_add(1, Ordering::Relaxed);
            testbed.forget(victim);
            let at = started.elapsed().as_secs();
            let down = rng.between(10, 20);
            eprintln!(
                "[{at:>4} s] killed node {}, back in {} s",
                victim + 1,
                down.as_secs()
            );
            pause(down)?;
            testbed.restart(victim)?;
            events.push(format!(
                "{at} s: node {} killed, restarted {} s later",
                victim + 1,
                down.as_secs()
            ));
            check_interrupt()?;
        }
        Ok::<(), String>(())
    })();
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        let _ = c.join();
    }
    // The last re-placement settles (old runners stopped, the new ones loaded) before the
    // memory is read.
    let settled = wait_ready(&mut testbed, Duration::from_secs(180));
    pause(Duration::from_secs(5))?;
    let end_memory: Vec<(Option<f64>, f64, usize)> =
        (0..o.nodes).map(|i| memory(&testbed, i)).collect();
    let t = tally.lock().unwrap_or_else(|e| e.into_inner());
    let errored: u64 = t.errored.values().sum();
    println!(
        "soak: {} nodes, {} clients, {:.1} minutes, seed {}",
        o.nodes,
        o.clients,
        started.elapsed().as_secs_f64() / 60.0,
        o.seed
    );
    for e in &events {
        println!("  {e}");
    }
    println!(
        "requests: {} sent, {} completed, {} errored, {} lost",
        t.sent,
        t.completed,
        errored,
        t.lost.len()
    );
    for (reason, count) in &t.errored {
        println!("  errored {count:>5} x {reason}");
    }
    for l in &t.lost {
        println!("  LOST: {l}");
    }
    println!(
        "memory (MB)      shoal start   shoal end   namespace start   namespace end   runners start/end"
    );
    let mb = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
    for i in 0..o.nodes {
        println!(
            "  node {:<8} {:>12} {:>11} {:>17.0} {:>15.0} {:>13}/{}",
            i + 1,
            mb(start_memory[i].0),
            mb(end_memory[i].0),
            start_memory[i].1,
            end_memory[i].1,
            start_memory[i].2,
            end_memory[i].2
        );
    }
    println!("(a node restarted during the soak starts again from a fresh process)");
    result?;
    settled?;
    if !t.lost.is_empty() {
        return Err(format!(
            "{} request(s) lost; logs in {}",
            t.lost.len(),
            testbed.log_dir().display()
        ));
    }
    if t.completed == 0 {
        return Err("no request completed".into());
    }
    Ok(())
}
