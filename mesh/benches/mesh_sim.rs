//! Simulated mesh benchmarks: 10, 50 and 100 nodes with the default protocol settings, each
//! over 5 seeds (the median and the worst seed are printed).
//!
//! Every node writes what a real node holds once its probes ran: its profile (a
//! [`HostProfile`], as JSON) and one verified edge ([`EdgeRecord`]) to each other node, so the
//! state grows as nodes². Records carry 64-byte signatures and 32-byte node ids; broadcasts
//! travel the simulated gossip overlay (5 neighbours per node, several hops).
//!
//! Prints, per cluster size: time for a cold cluster to converge, time for one write to reach
//! every node, steady-state traffic per node (bytes/s and messages/s received; every message
//! is received by exactly one node, so this is also the average sent), the hops a broadcast
//! took, time until every node sees a crashed node as dead, and false deaths during 30 s of
//! 50% message loss. The bounds are quickwit chitchat's published test bounds. Run: `cargo
//! xtask bench mesh`.

use mesh::host::interfaces::{Interface, InterfaceKind};
use mesh::host::probe::{edge_key, EdgeRecord};
use mesh::host::profile::{HostProfile, PROFILE_KEY};
use mesh::proto::sim::{Sim, SimConfig};
use mesh::{Event, NodeId};
use placement::{ComputeBackend, Edge, Link};
use std::net::{IpAddr, Ipv4Addr};

/// What to run: `--nodes 10,50,100` (cluster sizes) and `--seeds 5` (seeds 1..=N), after
/// `cargo xtask bench mesh` (or `cargo bench -p mesh --bench mesh_sim --`).
struct Options {
    sizes: Vec<usize>,
    seeds: Vec<u64>,
}

fn options() -> Result<Options, String> {
    let mut options = Options {
        sizes: vec![10, 50, 100],
        seeds: (1..=5).collect(),
    };
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    while let Some(arg) = args.next() {
        let value = args
            .next()
            .ok_or_else(|| format!("{arg} needs a value (--nodes 10,50,100 | --seeds 5)"))?;
        match arg.as_str() {
            "--nodes" => {
                options.sizes = value
                    .split(',')
                    .map(|n| {
                        n.trim()
                            .parse()
                            .map_err(|_| format!("--nodes: `{n}` is not a count"))
                    })
                    .collect::<Result<_, _>>()?;
            }
            "--seeds" => {
                let n: u64 = value
                    .parse()
                    .map_err(|_| format!("--seeds: `{value}` is not a count"))?;
                options.seeds = (1..=n.max(1)).collect();
            }
            other => {
                return Err(format!(
                    "unknown option {other} (--nodes 10,50,100 | --seeds 5)"
                ))
            }
        }
    }
    Ok(options)
}

fn ip_of(node: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(
        10,
        99,
        (node / 250) as u8,
        (node % 250 + 1) as u8,
    ))
}

/// A real node's records: its profile and an edge to every other node on the LAN.
fn real_records(node: usize, nodes: usize, _generation: u64) -> Vec<(String, String)> {
    let profile = HostProfile {
        name: format!("shoal-node-{node:03}"),
        os: "linux".into(),
        os_version: "6.8.0-48-generic".into(),
        cpu: "AMD EPYC 7763 64-Core Processor".into(),
        cpu_cores: 64,
        memory_total: 256 << 30,
        memory_available: 201 << 30,
        backends: vec![ComputeBackend::MlxCpu],
        gpus: vec![],
        interfaces: vec![Interface::new(
            "enp65s0f0",
            match ip_of(node) {
                IpAddr::V4(ip) => ip,
                IpAddr::V6(_) => unreachable!(),
            },
            16,
            InterfaceKind::Ethernet,
        )],
        api_port: 52415,
        version: "0.1.0".into(),
        protocol: 1,
    };
    let me = NodeId::from_index(node as u64);
    let mut records = vec![(
        PROFILE_KEY.to_string(),
        serde_json::to_string(&profile).expect("a profile serializes"),
    )];
    for other in (0..nodes).filter(|o| *o != node) {
        let to = NodeId::from_index(other as u64);
        let edge = EdgeRecord {
            edge: Edge {
                from: me.to_string(),
                to: to.to_string(),
                link: Link::Ip(ip_of(other)),
            },
            remote_interface: "enp65s0f0".into(),
            remote_kind: InterfaceKind::Ethernet,
            local_interface: Some("enp65s0f0".into()),
            local_kind: Some(InterfaceKind::Ethernet),
        };
        records.push((
            edge_key(&to, ip_of(other)),
            serde_json::to_string(&edge).expect("an edge serializes"),
        ));
    }
    records
}

#[derive(Debug, Clone, Copy)]
struct Figures {
    cold_convergence_ms: u64,
    write_spread_ms: u64,
    kib_per_s: f64,
    messages_per_s: f64,
    mean_hops: f64,
    max_hops: u32,
    death_detection_ms: u64,
    false_deaths: usize,
    state_kib: f64,
}

fn measure(nodes: usize, seed: u64) -> Figures {
    let mut config = SimConfig::lan(nodes, seed);
    config.records = real_records;
    let mut sim = Sim::new(config);
    let cold = sim
        .run_until_true(50, 120_000, Sim::converged)
        .expect("cluster did not converge in 120 s");
    let state_bytes: usize = sim
        .replica(0)
        .state()
        .nodes
        .values()
        .map(|s| s.size())
        .sum();
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
    // One write reaching everyone, and the hops its broadcast took.
    let before = sim.gossip_stats();
    let now = sim.now_ms();
    sim.replica_mut(nodes / 2)
        .set("runner/bench", "{\"state\":\"Ready\"}", now)
        .expect("small write");
    let spread = sim
        .run_until_true(10, now + 60_000, Sim::converged)
        .expect("write did not spread")
        - now;
    sim.run_until(sim.now_ms() + 1_000);
    let after = sim.gossip_stats();
    let delivered = after.delivered - before.delivered;
    let mean_hops = (after.hop_sum - before.hop_sum) as f64 / delivered.max(1) as f64;
    // A crash; the survivors' probes then remove their edges to it.
    let now = sim.now_ms();
    let victim = nodes - 1;
    sim.kill(victim);
    let detected = sim
        .run_until_true(50, now + 120_000, |s| s.all_see_dead(victim))
        .expect("death not detected")
        - now;
    let now = sim.now_ms();
    let key = edge_key(&sim.id(victim), ip_of(victim));
    for survivor in 0..victim {
        sim.replica_mut(survivor).delete(&key, now);
    }
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
        cold_convergence_ms: cold,
        write_spread_ms: spread,
        kib_per_s,
        messages_per_s,
        mean_hops,
        max_hops: after.max_hops,
        death_detection_ms: detected,
        false_deaths,
        state_kib: state_bytes as f64 / 1024.0,
    }
}

/// The median and the largest of `values`.
fn median_and_worst(mut values: Vec<f64>) -> (f64, f64) {
    values.sort_by(f64::total_cmp);
    (values[values.len() / 2], values[values.len() - 1])
}

fn main() {
    let Options { sizes, seeds } = match options() {
        Ok(options) => options,
        Err(e) => {
            eprintln!("mesh_sim: {e}");
            std::process::exit(2);
        }
    };
    println!(
        "mesh simulation (gossip every 250 ms over a 5-neighbour overlay, sync fanout 3, \
         phi threshold 6, 1-5 ms latency; profile + an edge to every node per author; \
         seeds {seeds:?}: median / worst)"
    );
    println!(
        "{:>5} {:>9} {:>13} {:>13} {:>13} {:>11} {:>9} {:>13} {:>7}",
        "nodes",
        "state KiB",
        "cold conv s",
        "write s",
        "KiB/s/node",
        "msgs/s/nd",
        "hops avg",
        "death det s",
        "false"
    );
    let mut all_ok = true;
    for &nodes in &sizes {
        let runs: Vec<Figures> = seeds
            .iter()
            .map(|seed| {
                let started = std::time::Instant::now();
                let figures = measure(nodes, *seed);
                eprintln!(
                    "  {nodes} nodes, seed {seed}: {:.1} s of CPU time",
                    started.elapsed().as_secs_f64()
                );
                figures
            })
            .collect();
        let pick = |f: fn(&Figures) -> f64| median_and_worst(runs.iter().map(f).collect());
        let cold = pick(|f| f.cold_convergence_ms as f64 / 1000.0);
        let write = pick(|f| f.write_spread_ms as f64 / 1000.0);
        let kib = pick(|f| f.kib_per_s);
        let msgs = pick(|f| f.messages_per_s);
        let hops = pick(|f| f.mean_hops);
        let max_hops = runs.iter().map(|f| f.max_hops).max().unwrap_or(0);
        let death = pick(|f| f.death_detection_ms as f64 / 1000.0);
        let false_deaths: usize = runs.iter().map(|f| f.false_deaths).max().unwrap_or(0);
        let state = runs[0].state_kib;
        let bandwidth_bound = if nodes <= 10 { 15.0 } else { 120.0 };
        let ok = kib.1 < bandwidth_bound
            && msgs.1 < 50.0
            && false_deaths == 0
            && (nodes < 100 || death.1 < 10.0);
        all_ok &= ok;
        println!(
            "{:>5} {:>9.0} {:>6.2}/{:<6.2} {:>6.2}/{:<6.2} {:>6.1}/{:<6.1} {:>5.0}/{:<5.0} {:>4.1}/{:<4} {:>6.2}/{:<6.2} {:>7}  {}",
            nodes,
            state,
            cold.0,
            cold.1,
            write.0,
            write.1,
            kib.0,
            kib.1,
            msgs.0,
            msgs.1,
            hops.0,
            max_hops,
            death.0,
            death.1,
            false_deaths,
            if ok {
                "within chitchat's bounds"
            } else {
                "OUTSIDE chitchat's bounds"
            }
        );
    }
    println!(
        "hops: mean hops of one write's broadcast (median seed) / most hops any broadcast took (all seeds)"
    );
    println!(
        "bounds (worst seed): < 15 KB/s/node at 10 nodes, < 120 KB/s at 100, < 50 msgs/s/node, death < 10 s at 100 nodes, no false death under 50% loss for 30 s: {}",
        if all_ok { "all held" } else { "NOT all held" }
    );
}
