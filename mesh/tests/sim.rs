//! The replicated state under simulation: convergence, liveness, loss, partitions, bad input.

use mesh::proto::codec::{self, Message};
use mesh::proto::delta::{Delta, NodeDelta};
use mesh::proto::record::{signed_bytes, Authority, Record, SimAuthority};
use mesh::proto::sim::{Sim, SimConfig};
use mesh::{Event, NodeId};

fn died_events(sim: &Sim, victim: usize) -> usize {
    let id = sim.id(victim);
    sim.events()
        .iter()
        .filter(|(_, _, e)| *e == Event::Died(id))
        .count()
}

#[test]
fn thirty_nodes_converge_and_later_writes_spread() {
    let mut sim = Sim::new(SimConfig::lan(30, 1));
    let at = sim.run_until_true(100, 30_000, Sim::converged);
    assert!(
        at.is_some(),
        "30 nodes did not converge in 30 s of simulated time"
    );
    let now = sim.now_ms();
    sim.replica_mut(7)
        .set("runner/abc", "{\"state\":\"Ready\"}", now)
        .unwrap();
    assert!(!sim.converged());
    assert!(sim
        .run_until_true(50, now + 10_000, Sim::converged)
        .is_some());
    let author = sim.id(7);
    for i in 0..30 {
        let state = &sim.replica(i).state().nodes[&author];
        assert_eq!(
            state.records["runner/abc"].value.as_deref(),
            Some("{\"state\":\"Ready\"}")
        );
    }
    // Deletion replicates as a tombstone.
    let now = sim.now_ms();
    assert!(sim.replica_mut(7).delete("runner/abc", now));
    assert!(sim
        .run_until_true(50, now + 10_000, Sim::converged)
        .is_some());
    for i in 0..30 {
        let state = &sim.replica(i).state().nodes[&author];
        assert_eq!(state.records["runner/abc"].value, None);
    }
}

#[test]
fn identical_json_views_after_convergence() {
    let mut sim = Sim::new(SimConfig::lan(8, 2));
    assert!(sim.run_until_true(100, 20_000, Sim::converged).is_some());
    let reference = sim.replica(0).state().to_json().to_string();
    for i in 1..8 {
        assert_eq!(sim.replica(i).state().to_json().to_string(), reference);
    }
}

#[test]
fn a_killed_node_is_detected_expires_and_rejoins_with_a_new_generation() {
    let mut config = SimConfig::lan(12, 3);
    config.replica.dead_grace_ms = 20_000;
    let mut sim = Sim::new(config);
    assert!(sim.run_until_true(100, 20_000, Sim::converged).is_some());
    sim.run_until(25_000);
    sim.kill(4);
    let detected = sim.run_until_true(100, 60_000, |s| s.all_see_dead(4));
    let detected = detected.expect("death never detected by everyone");
    assert!(detected > 25_000);
    // After the grace period the records expire everywhere.
    sim.run_until(detected + 25_000);
    let id = sim.id(4);
    for i in (0..12).filter(|i| *i != 4) {
        assert!(
            !sim.replica(i).state().nodes.contains_key(&id),
            "node {i} kept the dead node"
        );
    }
    sim.restart(4);
    let now = sim.now_ms();
    assert!(sim
        .run_until_true(100, now + 20_000, Sim::converged)
        .is_some());
    for i in 0..12 {
        assert_eq!(sim.replica(i).state().nodes[&id].generation, 2);
        assert!(sim.replica(i).is_alive(&id));
    }
}

#[test]
fn no_false_death_for_thirty_seconds_under_half_loss() {
    let mut sim = Sim::new(SimConfig::lan(20, 4));
    assert!(sim.run_until_true(100, 20_000, Sim::converged).is_some());
    sim.set_loss(0.5);
    let start = sim.now_ms();
    sim.run_until(start + 30_000);
    let false_deaths = sim
        .events()
        .iter()
        .filter(|(t, _, e)| *t >= start && matches!(e, Event::Died(_)))
        .count();
    assert_eq!(false_deaths, 0);
}

#[test]
fn partitions_heal() {
    let mut sim = Sim::new(SimConfig::lan(10, 5));
    assert!(sim.run_until_true(100, 20_000, Sim::converged).is_some());
    let groups: Vec<u32> = (0..10).map(|i| u32::from(i >= 5)).collect();
    sim.partition(&groups);
    let now = sim.now_ms();
    sim.run_until(now + 15_000);
    // Each side sees the other side dead, and writes on one side stay there.
    assert!(!sim.replica(0).is_alive(&sim.id(9)));
    assert!(sim.replica(0).is_alive(&sim.id(1)));
    let now = sim.now_ms();
    sim.replica_mut(9)
        .set("download/m", "{\"done\":1}", now)
        .unwrap();
    sim.run_until(now + 3_000);
    assert!(!sim.replica(0).state().nodes[&sim.id(9)]
        .records
        .contains_key("download/m"));
    sim.heal();
    let now = sim.now_ms();
    assert!(sim
        .run_until_true(100, now + 20_000, Sim::converged)
        .is_some());
    assert!(sim.replica(0).state().nodes[&sim.id(9)]
        .records
        .contains_key("download/m"));
    assert!(sim.replica(0).is_alive(&sim.id(9)));
    assert!(died_events(&sim, 9) > 0);
}

#[test]
fn forged_records_are_dropped_and_counted() {
    let mut sim = Sim::new(SimConfig::lan(5, 6));
    assert!(sim.run_until_true(100, 20_000, Sim::converged).is_some());
    let victim = sim.id(1);
    let generation = sim.replica(2).state().nodes[&victim].generation;
    let max = sim.replica(2).state().nodes[&victim].max_version;
    // Node 3 writes a record claiming to be node 1's, signed with its own key.
    let forger = SimAuthority::new(sim.id(3));
    let value = Some("{\"evil\":true}");
    // Under the victim's real beat (as node 2 holds it), so only the record is forged; its
    // version is the beat's own, already held for another key.
    let beat = sim.replica(2).state().nodes[&victim].beat.clone();
    assert_eq!(beat.max_version, max);
    let signature = forger.sign(&signed_bytes(&victim, generation, "profile", max, value));
    let forged = NodeDelta {
        node: victim,
        beat,
        reset: false,
        from_version: max - 1,
        to_version: max,
        records: vec![(
            "profile".into(),
            Record {
                version: max,
                value: value.map(str::to_string),
                signature,
            },
        )],
    };
    let bytes = codec::encode(&Message::Broadcast(Delta {
        nodes: vec![forged],
    }));
    sim.inject_broadcast(2, bytes);
    let now = sim.now_ms();
    sim.run_until(now + 10);
    assert_eq!(sim.replica(2).stats().forged_records, 1);
    let held = &sim.replica(2).state().nodes[&victim];
    assert_eq!(held.max_version, max);
    assert!(!held.records["profile"]
        .value
        .as_deref()
        .unwrap()
        .contains("evil"));
}

#[test]
fn garbage_on_the_wire_never_panics() {
    let mut sim = Sim::new(SimConfig::lan(3, 7));
    let mut seed = 99u64;
    for len in 0..300usize {
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                (seed >> 56) as u8
            })
            .collect();
        sim.inject_broadcast(0, bytes.clone());
        let mut versioned = vec![codec::WIRE_VERSION];
        versioned.extend(bytes);
        sim.inject_broadcast(1, versioned);
    }
    assert!(sim.run_until_true(100, 20_000, Sim::converged).is_some());
    assert!(sim.replica(0).stats().malformed_messages > 250);
}

#[test]
fn large_writes_are_split_under_the_gossip_limit() {
    let mut sim = Sim::new(SimConfig::lan(6, 8));
    assert!(sim.run_until_true(100, 20_000, Sim::converged).is_some());
    let now = sim.now_ms();
    for i in 0..40 {
        let value = format!("\"{}\"", "d".repeat(900));
        sim.replica_mut(0)
            .set(&format!("download/{i}"), &value, now)
            .unwrap();
    }
    // One record over the gossip limit: it can only travel by anti-entropy.
    let huge = format!("\"{}\"", "h".repeat(10_000));
    sim.replica_mut(0).set("intent/huge", &huge, now).unwrap();
    assert!(sim
        .run_until_true(20, now + 10_000, Sim::converged)
        .is_some());
    assert!(
        sim.largest_broadcast() <= 3_800,
        "broadcast of {}",
        sim.largest_broadcast()
    );
    assert!(
        sim.replica(0).stats().oversized_for_gossip >= 1,
        "{:?}",
        sim.replica(0).stats()
    );
    let author = sim.id(0);
    for i in 1..6 {
        assert_eq!(sim.replica(i).state().nodes[&author].records.len(), 42);
    }
}

#[test]
fn writes_over_limits_are_refused() {
    let mut sim = Sim::new(SimConfig::lan(1, 9));
    let r = sim.replica_mut(0);
    assert!(r.set("", "1", 0).is_err());
    assert!(r.set(&"k".repeat(300), "1", 0).is_err());
    assert!(r.set("k", &"v".repeat(70_000), 0).is_err());
    let mut refused = false;
    for i in 0..20 {
        if r.set(&format!("k{i}"), &"v".repeat(60_000), 0).is_err() {
            refused = true;
        }
    }
    assert!(refused, "the per-author budget must stop unbounded growth");
    let _ = NodeId::from_index(0);
}

/// Two processes with one id (a copied data directory): the newer one learns of the older
/// one through a common peer and reports it; a restart (old process dead) is not reported.
#[test]
fn duplicate_ids_are_reported_to_the_newer_process() {
    use mesh::{Config, Replica};
    use std::sync::Arc;
    let shared = NodeId::from_index(1);
    let peer = NodeId::from_index(2);
    let make = |id: NodeId, generation: u64| {
        Replica::new(
            id,
            generation,
            Config::default(),
            Arc::new(SimAuthority::new(id)),
            7,
        )
    };
    let exchange = |a: &mut Replica, b: &mut Replica, now: u64| {
        let syn = a.syn();
        let synack = b.on_syn(a.id(), &syn, now).unwrap();
        let ack = a.on_synack(b.id(), &synack, now).unwrap();
        b.on_ack(a.id(), &ack, now).unwrap();
    };
    struct Nowhere;
    impl mesh::Transport for Nowhere {
        fn broadcast(&mut self, _: Vec<u8>) {}
        fn sync(&mut self, _: NodeId, _: Vec<u8>) {}
    }
    // A restart: the old process stops before the new one starts.
    let mut old = make(shared, 1);
    let mut b = make(peer, 1);
    for t in 0..10u64 {
        old.tick(t * 250, &mut Nowhere);
        exchange(&mut old, &mut b, t * 250);
    }
    let mut new = make(shared, 2);
    for t in 10..60u64 {
        new.tick(t * 250, &mut Nowhere);
        b.tick(t * 250, &mut Nowhere);
        exchange(&mut new, &mut b, t * 250);
    }
    assert!(!new
        .drain_events()
        .iter()
        .any(|e| matches!(e, Event::DuplicateId { .. })));
    // Both alive at once.
    let mut dup = make(shared, 3);
    let mut reported = Vec::new();
    for t in 60..120u64 {
        new.tick(t * 250, &mut Nowhere);
        dup.tick(t * 250, &mut Nowhere);
        exchange(&mut new, &mut b, t * 250);
        exchange(&mut dup, &mut b, t * 250 + 1);
        reported.extend(
            dup.drain_events()
                .into_iter()
                .filter(|e| matches!(e, Event::DuplicateId { .. })),
        );
    }
    assert_eq!(reported, vec![Event::DuplicateId { ours: 3, other: 2 }]);
    assert!(new
        .drain_events()
        .contains(&Event::DuplicateId { ours: 2, other: 3 }));
}

/// Broadcasts travel a bounded overlay: at 80 nodes with 5 neighbours each, a write reaches
/// everyone by gossip alone (anti-entropy off) in several hops, and most nodes receive it
/// once (duplicates prune links to lazy).
#[test]
fn gossip_takes_several_hops_over_a_bounded_overlay() {
    let mut config = SimConfig::lan(80, 10);
    config.replica.sync_fanout = 0;
    config.seed_peers = 0;
    let mut sim = Sim::new(config);
    for i in 0..80 {
        let degree = sim.neighbours(i).len();
        assert!((1..=5).contains(&degree), "node {i}: {degree} neighbours");
    }
    sim.run_until(2_000);
    let now = sim.now_ms();
    sim.replica_mut(3)
        .set("runner/x", "{\"state\":\"Ready\"}", now)
        .unwrap();
    sim.run_until(now + 3_000);
    let author = sim.id(3);
    for i in 0..80 {
        let held = sim.replica(i).state().nodes.get(&author);
        assert!(
            held.is_some_and(|s| s.records.contains_key("runner/x")),
            "node {i} did not get the write by gossip"
        );
    }
    let stats = sim.gossip_stats();
    assert!(stats.max_hops >= 3, "{stats:?}");
    assert!(stats.mean_hops() > 1.5, "{stats:?}");
    assert!(stats.delivered >= 79, "{stats:?}");
}

/// A crashed neighbour's links are replaced after the link timeout, so later broadcasts reach
/// every survivor over the overlay again.
#[test]
fn the_overlay_replaces_a_crashed_neighbour() {
    let mut config = SimConfig::lan(40, 11);
    config.replica.sync_fanout = 0;
    config.seed_peers = 0;
    let mut sim = Sim::new(config);
    sim.run_until(1_000);
    let victim = 5;
    let neighbours = sim.neighbours(victim);
    assert!(!neighbours.is_empty());
    sim.kill(victim);
    sim.run_until(1_000 + config_link_timeout() + 1_000);
    for n in &neighbours {
        assert!(
            !sim.neighbours(*n).contains(&victim),
            "node {n} kept the dead link"
        );
        assert!(
            sim.neighbours(*n).len() >= 4,
            "node {n} did not refill its view"
        );
    }
    let now = sim.now_ms();
    sim.replica_mut(7).set("runner/y", "1", now).unwrap();
    sim.run_until(now + 2_000);
    let author = sim.id(7);
    for i in (0..40).filter(|i| *i != victim) {
        assert!(sim.replica(i).state().nodes[&author]
            .records
            .contains_key("runner/y"));
    }
}

fn config_link_timeout() -> u64 {
    mesh::proto::sim::overlay::OverlayConfig::default().link_timeout_ms
}

/// One lossy link loses its messages; the others do not.
#[test]
fn a_lossy_link_drops_only_its_own_traffic() {
    let mut config = SimConfig::lan(2, 12);
    config.replica.sync_fanout = 1;
    let mut sim = Sim::new(config);
    sim.set_link_loss(0, 1, Some(1.0));
    sim.run_until(5_000);
    assert!(!sim.replica(0).state().nodes.contains_key(&sim.id(1)));
    assert_eq!(sim.traffic()[0].messages, 0);
    sim.set_link_loss(0, 1, None);
    let now = sim.now_ms();
    assert!(sim
        .run_until_true(50, now + 5_000, Sim::converged)
        .is_some());
}
