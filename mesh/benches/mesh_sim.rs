//! Simulated mesh benchmarks: 10, 50 and 100 nodes with the default protocol settings.
//! Prints, per cluster size: time for a cold cluster to converge, time for one write to reach
//! every node, steady-state traffic per node (bytes/s and messages/s received; every message
//! is received by exactly one node, so this is also the average sent), time until every node
//! sees a crashed node as dead, and false deaths during 30 s of 50% message loss. The bounds
//! are quickwit chitchat's published test bounds. Run: `cargo xtask bench mesh`.

use mesh::sim::{Sim, SimConfig};
use mesh::Event;

struct Figures {
    nodes: usize,
    cold_convergence_ms: u64,
    write_spread_ms: u64,
    kib_per_s: f64,
    messages_per_s: f64,
    death_detection_ms: u64,
    false_deaths: usize,
}

fn measure(nodes: usize, seed: u64) -> Figures {
    let mut sim = Sim::new(SimConfig::lan(nodes, seed));
    let cold = sim
        .run_until_true(50, 120_000, Sim::converged)
        .expect("cluster did not converge in 120 s");
    // Steady state: 20 s of traffic after a warm-up.
    sim.run_until(cold + 10_000);
    sim.reset_traffic();
    let start = sim.now_ms();
    sim.run_until(start + 20_000);
    let secs = 20.0;
    let total_bytes: u64 = sim.traffic().iter().map(|t| t.bytes).sum();
    let total_messages: u64 = sim.traffic().iter().map(|t| t.messages).sum();
    let kib_per_s = total_bytes as f64 / nodes as f64 / secs / 1024.0;
    let messages_per_s = total_messages as f64 / nodes as f64 / secs;
    // One write reaching everyone.
    let now = sim.now_ms();
    sim.replica_mut(nodes / 2)
        .set("runner/bench", "{\"state\":\"Ready\"}", now)
        .expect("small write");
    let spread = sim
        .run_until_true(10, now + 60_000, Sim::converged)
        .expect("write did not spread")
        - now;
    // A crash.
    let now = sim.now_ms();
    let victim = nodes - 1;
    sim.kill(victim);
    let detected = sim
        .run_until_true(50, now + 120_000, |s| s.all_see_dead(victim))
        .expect("death not detected")
        - now;
    // 30 s of 50% loss among the survivors.
    sim.run_until(sim.now_ms() + 5_000);
    sim.set_loss(0.5);
    let start = sim.now_ms();
    sim.run_until(start + 30_000);
    let false_deaths = sim
        .events()
        .iter()
        .filter(|(t, _, e)| *t >= start && matches!(e, Event::Died(id) if *id != sim.id(victim)))
        .count();
    Figures {
        nodes,
        cold_convergence_ms: cold,
        write_spread_ms: spread,
        kib_per_s,
        messages_per_s,
        death_detection_ms: detected,
        false_deaths,
    }
}

fn main() {
    // `cargo bench` passes `--bench`; nothing to parse.
    println!(
        "mesh simulation (gossip every 250 ms, sync fanout 3, phi threshold 6, 1-5 ms latency)"
    );
    println!(
        "{:>6} {:>12} {:>12} {:>10} {:>10} {:>12} {:>14}",
        "nodes", "cold conv s", "write s", "KiB/s/node", "msgs/s/nd", "death det s", "false deaths"
    );
    let mut all_ok = true;
    for nodes in [10, 50, 100] {
        let f = measure(nodes, 42);
        let bandwidth_bound = if nodes <= 10 { 15.0 } else { 120.0 };
        let ok = f.kib_per_s < bandwidth_bound
            && f.messages_per_s < 50.0
            && f.false_deaths == 0
            && (nodes < 100 || f.death_detection_ms < 10_000);
        all_ok &= ok;
        println!(
            "{:>6} {:>12.2} {:>12.2} {:>10.1} {:>10.1} {:>12.2} {:>14}  {}",
            f.nodes,
            f.cold_convergence_ms as f64 / 1000.0,
            f.write_spread_ms as f64 / 1000.0,
            f.kib_per_s,
            f.messages_per_s,
            f.death_detection_ms as f64 / 1000.0,
            f.false_deaths,
            if ok {
                "within chitchat's bounds"
            } else {
                "OUTSIDE chitchat's bounds"
            }
        );
    }
    println!(
        "bounds: < 15 KB/s/node at 10 nodes, < 120 KB/s at 100, < 50 msgs/s/node, death < 10 s at 100 nodes, no false death under 50% loss for 30 s: {}",
        if all_ok { "all held" } else { "NOT all held" }
    );
}
