//! Signed liveness under simulation: a member that relays another author's parts cannot change
//! what the others believe of that author — its generation, heartbeat, version range, a reset,
//! or a second process with its id — without the author's signature. Each case is an attack
//! a member could make before beats were signed (issue 19), now dropped and counted.

use mesh::proto::beat::Beat;
use mesh::proto::codec::{self, Message};
use mesh::proto::delta::{Delta, NodeDelta};
use mesh::proto::record::{Authority, SimAuthority};
use mesh::proto::sim::{Sim, SimConfig};
use mesh::{Event, NodeId};

/// A converged 5-node cluster; node 3 plays the forger against node 1, node 2 listens.
fn converged() -> Sim {
    let mut sim = Sim::new(SimConfig::lan(5, 11));
    assert!(sim.run_until_true(100, 20_000, Sim::converged).is_some());
    sim
}

/// A beat of `author` signed by node `signer`'s key (a forgery unless they are the same).
fn beat_signed_by(sim: &Sim, signer: usize, author: NodeId, template: &Beat) -> Beat {
    let authority = SimAuthority::new(sim.id(signer));
    let mut beat = template.clone();
    beat.signature = authority.sign(&beat.signed_bytes(&author));
    beat
}

fn part(node: NodeId, beat: Beat, reset: bool, from: u64, to: u64) -> NodeDelta {
    NodeDelta {
        node,
        beat,
        reset,
        from_version: from,
        to_version: to,
        records: Vec::new(),
    }
}

fn send(sim: &mut Sim, to: usize, part: NodeDelta) {
    let bytes = codec::encode(&Message::Broadcast(Delta { nodes: vec![part] }));
    sim.inject_broadcast(to, bytes);
    let now = sim.now_ms();
    sim.run_until(now + 10);
}

#[test]
fn a_forged_generation_cannot_wipe_an_authors_records() {
    let mut sim = converged();
    let victim = sim.id(1);
    let held = sim.replica(2).state().nodes[&victim].clone();
    assert!(!held.records.is_empty());
    // Before: an empty part with generation + 1 replaced everything node 2 held of node 1.
    let mut template = held.beat.clone();
    template.generation += 1;
    template.max_version = 0;
    let forged = beat_signed_by(&sim, 3, victim, &template);
    send(&mut sim, 2, part(victim, forged, true, 0, 0));
    let after = &sim.replica(2).state().nodes[&victim];
    assert_eq!(after.generation, held.generation);
    assert_eq!(after.records, held.records);
    assert_eq!(sim.replica(2).stats().forged_beats, 1);
}

#[test]
fn a_forged_heartbeat_cannot_keep_a_dead_node_alive() {
    let mut sim = converged();
    let victim = sim.id(1);
    sim.kill(1);
    let start = sim.now_ms();
    let mut template = sim.replica(2).state().nodes[&victim].beat.clone();
    // Node 3 keeps sending node 2 fresh heartbeats "from" node 1 every 200 ms.
    for step in 1..=60u64 {
        template.heartbeat += 1;
        let forged = beat_signed_by(&sim, 3, victim, &template);
        let max = template.max_version;
        send(&mut sim, 2, part(victim, forged, false, max, max));
        sim.run_until(start + step * 200);
    }
    assert!(
        !sim.replica(2).is_alive(&victim),
        "12 s of forged heartbeats kept a killed node alive"
    );
    assert!(sim.replica(2).stats().forged_beats >= 60);
}

#[test]
fn a_version_range_beyond_the_signed_one_is_refused() {
    let mut sim = converged();
    let victim = sim.id(1);
    let held = sim.replica(2).state().nodes[&victim].clone();
    // Claiming versions far past the author's: the receiver would never ask for the real
    // records at those versions again. The real beat does not cover it, a forged one fails.
    let real = held.beat.clone();
    send(
        &mut sim,
        2,
        part(victim, real.clone(), false, held.max_version, 1_000_000),
    );
    let mut template = real;
    template.max_version = 1_000_000;
    let forged = beat_signed_by(&sim, 3, victim, &template);
    send(
        &mut sim,
        2,
        part(victim, forged, false, held.max_version, 1_000_000),
    );
    let after = &sim.replica(2).state().nodes[&victim];
    assert_eq!(after.max_version, held.max_version);
    assert!(sim.replica(2).stats().malformed_messages >= 1);
    assert_eq!(sim.replica(2).stats().forged_beats, 1);
}

#[test]
fn a_reset_under_the_real_beat_must_carry_the_signed_records() {
    let mut sim = converged();
    let victim = sim.id(1);
    let held = sim.replica(2).state().nodes[&victim].clone();
    // A full copy "with nothing in it" under the author's real beat: before, node 2 dropped
    // every record of node 1 up to the beat's version.
    let real = held.beat.clone();
    let max = real.max_version;
    send(&mut sim, 2, part(victim, real, true, 0, max));
    let after = &sim.replica(2).state().nodes[&victim];
    assert_eq!(after.records, held.records);
    assert_eq!(after.max_version, held.max_version);
    assert_eq!(sim.replica(2).stats().unverified_resets, 1);
}

#[test]
fn records_left_out_of_a_claimed_range_are_noticed_and_repaired() {
    let mut sim = converged();
    let victim = sim.id(1);
    let now = sim.now_ms();
    sim.replica_mut(1)
        .set("runner/x", "{\"s\":1}", now)
        .unwrap();
    sim.replica_mut(1)
        .set("runner/y", "{\"s\":2}", now)
        .unwrap();
    let author = sim.replica(1).state().nodes[&victim].clone();
    let before = sim.replica(2).state().nodes[&victim].max_version;
    // Node 3 hands node 2 the author's real beat and range, but leaves runner/x out.
    let mut relayed = part(
        victim,
        author.beat.clone(),
        false,
        before,
        author.max_version,
    );
    relayed.records = author
        .records
        .iter()
        .filter(|(k, r)| r.version > before && k.as_str() != "runner/x")
        .map(|(k, r)| (k.clone(), r.clone()))
        .collect();
    relayed.records.sort_by_key(|(_, r)| r.version);
    send(&mut sim, 2, relayed);
    assert_eq!(sim.replica(2).stats().inconsistent_authors, 1);
    let now = sim.now_ms();
    assert!(sim
        .run_until_true(100, now + 10_000, Sim::converged)
        .is_some());
    let repaired = &sim.replica(2).state().nodes[&victim];
    assert_eq!(repaired.records, author.records);
}

/// For 10 s, sends node 1 a rising heartbeat of its own id under a new generation, signed by
/// `signer`'s key; answers how many duplicate-id reports node 1 made.
fn new_generation_of_node_1_signed_by(sim: &mut Sim, signer: usize) -> usize {
    let victim = sim.id(1);
    let mut template = sim.replica(1).own_beat().clone();
    template.generation += 1;
    let start = sim.now_ms();
    for step in 1..=40u64 {
        template.heartbeat += 1;
        let beat = beat_signed_by(sim, signer, victim, &template);
        send(sim, 1, part(victim, beat, false, 0, 0));
        sim.run_until(start + step * 250);
    }
    sim.events()
        .iter()
        .filter(|(_, i, e)| *i == 1 && matches!(e, Event::DuplicateId { .. }))
        .count()
}

#[test]
fn a_member_cannot_make_another_think_its_identity_is_copied() {
    // Before: a part of node 1's own id with another generation whose heartbeat kept rising
    // for 5 s made node 1 report a duplicate and exit.
    let mut sim = converged();
    assert_eq!(new_generation_of_node_1_signed_by(&mut sim, 3), 0);
    assert!(sim.replica(1).stats().forged_beats >= 40);
}

#[test]
fn a_real_second_process_with_the_same_id_is_still_reported() {
    // The same key signing another generation: a copied data directory.
    let mut sim = converged();
    assert!(new_generation_of_node_1_signed_by(&mut sim, 1) > 0);
}
