//! The instance status by table: from the placement and each rank's runner (its record, or
//! this node's own runner, or a dead node), every node gives an instance the same `status`.

use control::fixture::{author, json, record};
use control::{PlacementCache, RunnerRecord, Snapshot, INSTANCE_PREFIX, RUNNER_PREFIX};
use placement::{InstanceStatus, RunnerStatus};

fn runner(rank: usize, status: RunnerStatus) -> String {
    json(&RunnerRecord {
        epoch: 0,
        rank,
        status,
        queued: 0,
        model_ready: true,
        hung: false,
    })
}

fn failed() -> RunnerStatus {
    RunnerStatus::Failed {
        reason: "out of memory".into(),
    }
}

#[test]
fn instance_status_table() {
    use InstanceStatus::*;
    use RunnerStatus::{Loading, Ready as R, Running};
    let loading = Loading {
        layers_loaded: 3,
        total: 30,
    };
    // (nodes, RAM each, min nodes, published status of each rank's runner, dead rank nodes,
    //  this node's own runner, expected)
    type Case = (
        usize,
        u64,
        u32,
        Vec<Option<RunnerStatus>>,
        Vec<usize>,
        Option<RunnerStatus>,
        InstanceStatus,
    );
    let cases: Vec<Case> = vec![
        // One rank, no runner yet: starting.
        (1, 4_000_000_000, 1, vec![None], vec![], None, Starting),
        // One rank loading, then ready, then running a request.
        (
            1,
            4_000_000_000,
            1,
            vec![Some(loading.clone())],
            vec![],
            None,
            Starting,
        ),
        (1, 4_000_000_000, 1, vec![Some(R)], vec![], None, Ready),
        (
            1,
            4_000_000_000,
            1,
            vec![Some(Running)],
            vec![],
            None,
            Ready,
        ),
        // This node's own runner counts over its published record.
        (
            1,
            4_000_000_000,
            1,
            vec![Some(loading.clone())],
            vec![],
            Some(R),
            Ready,
        ),
        (
            1,
            4_000_000_000,
            1,
            vec![Some(R)],
            vec![],
            Some(failed()),
            Failed,
        ),
        // A failed rank fails the instance.
        (
            1,
            4_000_000_000,
            1,
            vec![Some(failed())],
            vec![],
            None,
            Failed,
        ),
        // Two ranks: one ready is not enough; both serving is ready.
        (
            2,
            1_500_000_000,
            2,
            vec![Some(R), None],
            vec![],
            None,
            Starting,
        ),
        (
            2,
            1_500_000_000,
            2,
            vec![Some(R), Some(Running)],
            vec![],
            None,
            Ready,
        ),
        (
            2,
            1_500_000_000,
            2,
            vec![Some(R), Some(failed())],
            vec![],
            None,
            Failed,
        ),
        // A rank's node died: its runner counts as failed.
        (
            2,
            1_500_000_000,
            2,
            vec![Some(R), Some(R)],
            vec![1],
            None,
            Failed,
        ),
        // No node holds a 1 GB model: unplaceable, whatever the runners say.
        (1, 500_000_000, 1, vec![None], vec![], None, Unplaceable),
    ];
    for (i, (n, ram, min_nodes, ranks, dead, mine, expected)) in cases.into_iter().enumerate() {
        let r = record(n, ram, min_nodes);
        let rkey = format!("{RUNNER_PREFIX}{}", r.id());
        let nodes: Vec<String> = match r.place() {
            Ok(p) => p.ranks.iter().map(|r| r.node.clone()).collect(),
            Err(_) => vec!["a".into()],
        };
        // With a runner of its own, the first rank's node sees it; else a node without a rank.
        let me = match mine {
            Some(_) => nodes[0].clone(),
            None => "observer".to_string(),
        };
        let mut snapshot = Snapshot {
            settling: false,
            me: me.clone(),
            authors: [(me.clone(), author(true, &[]))].into(),
        };
        for (rank, node) in nodes.iter().enumerate() {
            let mut records = vec![];
            if node == "a" {
                records.push((format!("{INSTANCE_PREFIX}{}", r.id()), json(&r)));
            }
            if let Some(status) = &ranks[rank] {
                records.push((rkey.clone(), runner(rank, status.clone())));
            }
            let alive = !dead.contains(&rank);
            snapshot
                .authors
                .insert(node.clone(), author(alive, &records));
        }
        let view = snapshot
            .instances(&PlacementCache::default())
            .remove(r.id())
            .unwrap_or_else(|| panic!("case {i}: the instance is live"));
        assert_eq!(
            view.status(&snapshot, mine.as_ref()),
            expected,
            "case {i}: {ranks:?}, dead {dead:?}, mine {mine:?}"
        );
    }
}
