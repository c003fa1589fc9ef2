//! The control plane by table: every case builds the state that several nodes see as plain
//! data, runs the one pure `reconcile` on each node, and checks that every node computes the
//! same instances and placements and that each node decides exactly the listed effects.

use control::fixture::{named_cluster_input, record};
use control::{
    reconcile, Author, Effect, InstanceRecord, Intent, LifecycleCommand, LocalRunners, ModelFile,
    PlacementCache, RunnerFacts, RunnerRecord, Snapshot, DELETED_PREFIX, INSTANCE_PREFIX,
    RUNNER_PREFIX,
};
use placement::{RunnerStatus, ShutdownReason};
use std::collections::{BTreeMap, BTreeSet};

const NODES: [&str; 4] = ["a", "b", "c", "d"];
const ID: &str = "default-1";

/// What every node holds: records by author, who is dead, and each node's runners.
#[derive(Clone, Default)]
struct World {
    records: BTreeMap<String, BTreeMap<String, String>>,
    dead: BTreeSet<String>,
    runners: BTreeMap<String, BTreeMap<String, RunnerFacts>>,
}

impl World {
    fn new() -> World {
        let mut world = World::default();
        for n in NODES {
            world.records.insert(n.into(), BTreeMap::new());
            world.runners.insert(n.into(), BTreeMap::new());
        }
        world
    }

    fn write(&mut self, author: &str, key: &str, value: String) {
        self.records
            .get_mut(author)
            .unwrap()
            .insert(key.into(), value);
    }

    fn remove(&mut self, author: &str, key: &str) {
        self.records.get_mut(author).unwrap().remove(key);
    }

    /// The state as node `me` sees it: every author, the dead ones marked.
    fn snapshot(&self, me: &str) -> Snapshot {
        Snapshot {
            settling: false,
            me: me.into(),
            authors: self
                .records
                .iter()
                .map(|(id, records)| {
                    let dead = id != me && self.dead.contains(id);
                    let author = Author {
                        alive: !dead,
                        dead,
                        records: records.clone(),
                    };
                    (id.clone(), author)
                })
                .collect(),
        }
    }

    fn local(&self, me: &str) -> LocalRunners {
        LocalRunners {
            runners: self.runners[me].clone(),
            models: [(
                "default".to_string(),
                ModelFile {
                    path: "/models/default.gguf".into(),
                    ready: true,
                    fetch: control::Fetch::No,
                },
            )]
            .into(),
        }
    }

    fn live(&self) -> Vec<&'static str> {
        NODES
            .into_iter()
            .filter(|n| !self.dead.contains(*n))
            .collect()
    }

    /// Node `node` runs rank `rank` of `record`, ready, and has published it.
    fn ready_runner(&mut self, node: &str, record: &InstanceRecord, rank: usize) {
        let facts = RunnerFacts {
            epoch: record.epoch,
            rank,
            status: RunnerStatus::Ready,
            process: true,
            sent: [
                LifecycleCommand::Connect,
                LifecycleCommand::Load,
                LifecycleCommand::WarmUp,
            ]
            .into(),
            queued: 0,
            model_ready: true,
            hung: false,
        };
        self.set_runner(node, record.id(), facts);
    }

    fn set_runner(&mut self, node: &str, id: &str, facts: RunnerFacts) {
        let published = RunnerRecord::from(&facts);
        self.write(node, &format!("{RUNNER_PREFIX}{id}"), json(&published));
        self.runners.get_mut(node).unwrap().insert(id.into(), facts);
    }
}

/// The effective record of instance `ID` as node `me` computes it.
fn effective_on(world: &World, me: &str) -> InstanceRecord {
    world
        .snapshot(me)
        .instances(&PlacementCache::new())
        .remove(ID)
        .unwrap()
        .record
}

fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap()
}

fn key(id: &str) -> String {
    format!("{INSTANCE_PREFIX}{id}")
}

fn copy(record: &InstanceRecord) -> Effect {
    Effect::WriteRecord {
        key: record.key(),
        value: json(record),
    }
}

fn create(record: &InstanceRecord, rank: usize, ranks: usize) -> Effect {
    Effect::CreateRunner {
        instance: record.id().into(),
        epoch: record.epoch,
        rank,
        ranks,
        model: "default".into(),
    }
}

fn stop(id: &str, failed_rank: usize) -> Effect {
    Effect::StopRunner {
        instance: id.into(),
        status: RunnerStatus::Shutdown,
        reason: ShutdownReason::SiblingFailed { rank: failed_rank },
    }
}

fn drop_runner(id: &str) -> Effect {
    Effect::DropRunner {
        instance: id.into(),
    }
}

/// Four nodes of 400 MB, a 1 GB model: three ranks, on a, b and c.
fn three_ranks() -> InstanceRecord {
    record(4, 400_000_000, 1)
}

/// A steady instance: created by a, kept by its ranks a, b, c, every runner ready.
fn steady() -> (World, InstanceRecord) {
    let r = three_ranks();
    let mut world = World::new();
    for (rank, node) in ["a", "b", "c"].into_iter().enumerate() {
        world.write(node, &key(ID), json(&r));
        world.ready_runner(node, &r, rank);
    }
    (world, r)
}

/// Runs `reconcile` on every live node: checks that all compute the same instances and
/// placements, and that each decides `expected[node]` (nothing when not listed).
fn check(name: &str, world: &World, expected: &BTreeMap<&str, Vec<Effect>>) {
    let mut views = Vec::new();
    for me in world.live() {
        let cache = PlacementCache::new();
        let snapshot = world.snapshot(me);
        let effects = reconcile(&snapshot, &world.local(me), &cache);
        let want = expected.get(me).cloned().unwrap_or_default();
        assert_eq!(effects, want, "case `{name}`, node {me}");
        let instances: Vec<(InstanceRecord, String)> = snapshot
            .instances(&cache)
            .into_values()
            .map(|v| (v.record, format!("{:?}", v.placement)))
            .collect();
        views.push((me, instances));
    }
    for (me, view) in &views {
        assert_eq!(view, &views[0].1, "case `{name}`: node {me} disagrees");
    }
}

/// Every live node decides on the same world, then the record effects (and dropped
/// runners) are applied (the other runner effects aside).
fn apply_records(world: &mut World) {
    let decided: Vec<(&str, Vec<Effect>)> = world
        .live()
        .into_iter()
        .map(|me| {
            let effects = reconcile(
                &world.snapshot(me),
                &world.local(me),
                &PlacementCache::new(),
            );
            (me, effects)
        })
        .collect();
    for (me, effects) in decided {
        for effect in effects {
            match effect {
                Effect::WriteRecord { key, value } => world.write(me, &key, value),
                Effect::RemoveRecord { key } => world.remove(me, &key),
                Effect::Replace { next, .. } => world.write(me, &next.key(), json(&next)),
                Effect::DropRunner { instance } => {
                    world.runners.get_mut(me).unwrap().remove(&instance);
                }
                _ => {}
            }
        }
    }
}

#[test]
fn the_control_plane_by_table() {
    let r = three_ranks();
    let p = r.place().unwrap();
    let ranks: Vec<&str> = p.ranks.iter().map(|r| r.node.as_str()).collect();
    assert_eq!(ranks, ["a", "b", "c"]);

    // 1. Instance created: a wrote it; every rank node creates its runner, and the ranks
    //    other than the creator keep a copy; d holds no rank and does nothing.
    let mut created = World::new();
    created.write("a", &key(ID), json(&r));
    check(
        "instance created",
        &created,
        &[
            ("a", vec![create(&r, 0, 3)]),
            ("b", vec![copy(&r), create(&r, 1, 3)]),
            ("c", vec![copy(&r), create(&r, 2, 3)]),
        ]
        .into(),
    );

    // 2. A rank's node dies: every live node writes the same next epoch without it, and the
    //    surviving ranks shut their runners down (a ring cannot be re-formed).
    let (mut died, _) = steady();
    died.dead.insert("c".into());
    let next = r.replaced(&["c".to_string()].into());
    let replace = Effect::Replace {
        next: Box::new(next.clone()),
        dead: vec!["c".into()],
    };
    check(
        "rank node dies",
        &died,
        &[
            ("a", vec![replace.clone(), stop(ID, 2)]),
            ("b", vec![replace.clone(), stop(ID, 2)]),
            ("d", vec![replace.clone()]),
        ]
        .into(),
    );
    //    Once written, epoch 1 is placed on a, b and d: the old runners are dropped and new
    //    ones created at epoch 1.
    apply_records(&mut died);
    let p1 = next.place().unwrap();
    let ranks1: Vec<&str> = p1.ranks.iter().map(|r| r.node.as_str()).collect();
    assert_eq!(ranks1, ["a", "b", "d"]);
    assert_ne!(p1.port, p.port);
    check(
        "rank node dies, next pass",
        &died,
        &[
            ("a", vec![drop_runner(ID), create(&next, 0, 3)]),
            ("b", vec![drop_runner(ID), create(&next, 1, 3)]),
            ("d", vec![create(&next, 2, 3)]),
        ]
        .into(),
    );

    // 3. A runner failed: every other rank stops, and every node reports the instance failed.
    let (mut failed, _) = steady();
    failed.set_runner(
        "b",
        ID,
        RunnerFacts {
            epoch: 0,
            rank: 1,
            status: RunnerStatus::Failed {
                reason: "out of memory".into(),
            },
            process: false,
            sent: [LifecycleCommand::Connect].into(),
            queued: 0,
            model_ready: true,
            hung: false,
        },
    );
    check(
        "runner failed",
        &failed,
        &[("a", vec![stop(ID, 1)]), ("c", vec![stop(ID, 1)])].into(),
    );
    for me in failed.live() {
        let snapshot = failed.snapshot(me);
        let view = snapshot
            .instances(&PlacementCache::new())
            .remove(ID)
            .unwrap();
        let mine = failed.runners[me].get(ID).map(|r| r.status.clone());
        let failure = view.failure(&snapshot, mine.as_ref()).expect("failed");
        assert!(
            failure.starts_with("rank 1 on node b: out of memory"),
            "{failure}"
        );
        assert!(!view.is_ready(&snapshot, mine.as_ref()));
    }

    // 4. Deleted by another node: d writes the deletion; every rank node drops its runner and
    //    its copy; d keeps its deletion after the last copy is gone (a stale copy elsewhere
    //    must not bring the instance back), until it has KEEP_DELETIONS newer settled ones:
    //    then the oldest go first.
    let (mut deleted, _) = steady();
    deleted.write(
        "d",
        &format!("{DELETED_PREFIX}{ID}"),
        json(&control::DeletedRecord {
            instance_id: ID.into(),
            seq: 1,
        }),
    );
    let gone = vec![Effect::RemoveRecord { key: key(ID) }, drop_runner(ID)];
    check(
        "instance deleted by another node",
        &deleted,
        &[("a", gone.clone()), ("b", gone.clone()), ("c", gone)].into(),
    );
    apply_records(&mut deleted);
    check(
        "instance deleted, copies gone: d keeps its deletion",
        &deleted,
        &BTreeMap::new(),
    );
    for seq in 2..=(control::KEEP_DELETIONS as u64 + 2) {
        let id = format!("older-{seq:04}");
        deleted.write(
            "d",
            &format!("{DELETED_PREFIX}{id}"),
            json(&control::DeletedRecord {
                instance_id: id.clone(),
                seq,
            }),
        );
    }
    check(
        "more settled deletions than d keeps: its two oldest go",
        &deleted,
        &[(
            "d",
            vec![
                Effect::RemoveRecord {
                    key: format!("{DELETED_PREFIX}{ID}"),
                },
                Effect::RemoveRecord {
                    key: format!("{DELETED_PREFIX}older-0002"),
                },
            ],
        )]
        .into(),
    );

    // 5. Epoch bump seen from elsewhere: b wrote epoch 1 without c (c is not seen dead here):
    //    a's epoch-0 runner is stale and stopped, a new one is created at epoch 1, the new
    //    ranks keep copies of epoch 1, and c, left out, brings its epoch-0 copy up to it.
    let (mut bumped, _) = steady();
    bumped.write("b", &key(ID), json(&next));
    check(
        "epoch bump",
        &bumped,
        &[
            ("a", vec![copy(&next), drop_runner(ID), create(&next, 0, 3)]),
            ("b", vec![drop_runner(ID), create(&next, 1, 3)]),
            ("c", vec![copy(&next), drop_runner(ID)]),
            ("d", vec![copy(&next), create(&next, 2, 3)]),
        ]
        .into(),
    );
}

/// An intent `id` created by `by` on the four nodes of 700 MB (a 1 GB model: two ranks).
fn intent(id: &str, by: &str) -> InstanceRecord {
    let names: Vec<String> = NODES.iter().map(|n| n.to_string()).collect();
    InstanceRecord::new(Intent {
        instance_id: id.into(),
        model: "default".into(),
        model_id: "default".into(),
        created_by: by.into(),
        input: named_cluster_input(&names, 700_000_000, 1, id),
    })
}

#[test]
fn concurrent_intents_resolve_the_same_on_every_node() {
    // Two instances created at once by a and d: independent, both placed identically on every
    // node, listed in id order; each rank node creates both runners.
    let x = intent("x-a", "a");
    let y = intent("y-d", "d");
    let mut world = World::new();
    world.write("a", &key("x-a"), json(&x));
    world.write("d", &key("y-d"), json(&y));
    let px = x.place().unwrap();
    let py = y.place().unwrap();
    let nodes = |p: &placement::Placement| -> Vec<String> {
        p.ranks.iter().map(|r| r.node.clone()).collect()
    };
    assert_eq!(nodes(&px), ["a", "b"]);
    assert_eq!(nodes(&py), ["a", "b"]);
    assert_ne!(px.port, py.port, "each instance its own ring port");
    check(
        "two concurrent intents",
        &world,
        &[
            ("a", vec![copy(&y), create(&x, 0, 2), create(&y, 0, 2)]),
            (
                "b",
                vec![copy(&x), copy(&y), create(&x, 1, 2), create(&y, 1, 2)],
            ),
        ]
        .into(),
    );

    // Two concurrent re-placements of one instance at the same epoch: b saw c die, d saw b
    // and c die (or: the two sides of a partition). Every node takes the same copy (fewer
    // exclusions wins, then the exclusions' ids), whichever author wrote which.
    let r = intent(ID, "a");
    let by_b = r.replaced(&["c".to_string()].into());
    let by_d = r.replaced(&["b".to_string(), "c".to_string()].into());
    for (first, second) in [(&by_b, &by_d), (&by_d, &by_b)] {
        let mut world = World::new();
        world.write("a", &key(ID), json(&r));
        world.write("b", &key(ID), json(first));
        world.write("d", &key(ID), json(second));
        let mut winners = BTreeSet::new();
        for me in NODES {
            winners.insert(json(&effective_on(&world, me)));
        }
        assert_eq!(winners, [json(&by_b)].into(), "one winner on every node");
    }
    let winner = by_b.place().unwrap();
    assert_eq!(nodes(&winner), ["a", "b"]);
    let mut world = World::new();
    world.write("b", &key(ID), json(&by_b));
    world.write("d", &key(ID), json(&by_d));
    check(
        "two concurrent copies",
        &world,
        &[
            ("a", vec![copy(&by_b), create(&by_b, 0, 2)]),
            ("b", vec![create(&by_b, 1, 2)]),
            // d's copy lost: d brings it up to the effective one (no stale copy lingers).
            ("d", vec![copy(&by_b)]),
        ]
        .into(),
    );
}

#[test]
fn a_node_left_out_waits_while_it_settles_after_the_others_come_back() {
    // Epoch 1 left c out (the others saw it cut off) and is placed on a, b and d. c hears
    // from b and d again before a's heartbeat reaches it: a still looks dead to c.
    let r = three_ranks();
    let next = r.replaced(&["c".to_string()].into());
    let mut world = World::new();
    for (rank, node) in ["a", "b", "d"].into_iter().enumerate() {
        world.write(node, &key(ID), json(&next));
        world.ready_runner(node, &next, rank);
    }
    world.write("c", &key(ID), json(&r));
    world.dead.insert("a".into());
    let mut snapshot = world.snapshot("c");

    // Right after the others came back, c does not re-place what it was left out of.
    snapshot.settling = true;
    let effects = reconcile(&snapshot, &world.local("c"), &PlacementCache::new());
    assert!(
        !effects.iter().any(|e| matches!(e, Effect::Replace { .. })),
        "c re-placed while settling: {effects:?}"
    );

    // Once settled, a dead a is a dead rank: c writes the next epoch without a (and keeps c
    // out), as every node would.
    snapshot.settling = false;
    let effects = reconcile(&snapshot, &world.local("c"), &PlacementCache::new());
    let replaced: Vec<&InstanceRecord> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::Replace { next, .. } => Some(next.as_ref()),
            _ => None,
        })
        .collect();
    assert_eq!(replaced.len(), 1, "{effects:?}");
    assert_eq!(replaced[0].epoch, 2);
    assert_eq!(replaced[0].excluded, ["a", "c"]);
}

#[test]
fn after_a_heal_the_side_that_kept_more_nodes_wins_however_many_epochs_the_other_went_through() {
    // A partition cut d off from a, b and c, which wrote epoch 1 without d. Alone, d saw a
    // die first (epoch 1 without a), then b (epoch 2), then c (epoch 3). d's epoch 3
    // descends from its own line, not from the majority's: the copy that kept more nodes
    // stands on every node, and d brings its copy up to it.
    let names: Vec<String> = NODES.iter().map(|n| n.to_string()).collect();
    let r = InstanceRecord::new(Intent {
        instance_id: ID.into(),
        model: "default".into(),
        model_id: "default".into(),
        created_by: "a".into(),
        input: named_cluster_input(&names, 2_000_000_000, 1, ID),
    });
    let one = |id: &str| -> BTreeSet<String> { [id.to_string()].into() };
    let majority = r.replaced(&one("d"));
    let first = r.replaced(&one("a"));
    let third = first.replaced(&one("b")).replaced(&one("c"));
    assert!(third.supersedes(&first) && !third.supersedes(&majority));
    assert_eq!((majority.epoch, third.epoch), (1, 3));
    let mut world = World::new();
    for me in ["a", "b", "c"] {
        world.write(me, &key(ID), json(&majority));
    }
    world.write("d", &key(ID), json(&third));
    for me in NODES {
        assert_eq!(effective_on(&world, me), majority, "node {me}");
    }
    let effects = reconcile(
        &world.snapshot("d"),
        &world.local("d"),
        &PlacementCache::new(),
    );
    assert!(effects.contains(&copy(&majority)), "{effects:?}");
    // A stale copy of d's line does not change that either.
    assert_eq!(
        control::effective([&first, &majority, &third]),
        Some(&majority)
    );
}
