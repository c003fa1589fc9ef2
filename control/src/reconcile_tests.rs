//! Tests of the reconcile decisions ([`super`]): table cases of one node's effects.

use super::*;
use crate::fixture::record;

#[test]
fn ring_views_become_one_address_list_per_rank() {
    let r = record(3, 400_000_000, 3);
    let p = r.place().unwrap();
    let hosts = ring_hosts(&p, 1);
    assert_eq!(hosts.len(), 3);
    assert_eq!(hosts[1], vec![format!("0.0.0.0:{}", p.port)]);
    assert!(hosts.iter().all(|h| h.len() == 1));
}

#[test]
fn only_changed_runner_records_are_published_and_gone_ones_removed() {
    let facts = RunnerFacts {
        epoch: 0,
        rank: 0,
        status: RunnerStatus::Idle,
        process: true,
        sent: BTreeSet::new(),
        queued: 0,
        model_ready: true,
        hung: false,
    };
    let local = LocalRunners {
        runners: [("x".to_string(), facts)].into(),
        models: BTreeMap::new(),
    };
    let effects = publish(&local, &BTreeMap::new());
    let [Effect::WriteRecord { key, value }] = effects.as_slice() else {
        panic!("{effects:?}");
    };
    assert_eq!(key, "runner/x");
    let mut published: BTreeMap<String, String> = [(key.clone(), value.clone())].into();
    assert_eq!(publish(&local, &published), vec![]);
    published.insert("runner/gone".into(), "{}".into());
    assert_eq!(
        publish(&local, &published),
        vec![Effect::RemoveRecord {
            key: "runner/gone".into()
        }]
    );
}

#[test]
fn a_hub_models_rank_downloads_its_part_then_connects_or_fails_with_the_reason() {
    let mut r = record(1, 4_000_000_000, 1);
    r.intent.model = "org/name".into();
    let snapshot = Snapshot {
        settling: false,
        me: "a".into(),
        authors: [(
            "a".to_string(),
            crate::fixture::author(true, &[(r.key(), crate::fixture::json(&r))]),
        )]
        .into(),
    };
    let idle = RunnerFacts {
        epoch: 0,
        rank: 0,
        status: RunnerStatus::Idle,
        process: true,
        sent: BTreeSet::new(),
        queued: 0,
        model_ready: false,
        hung: false,
    };
    let part = Part::Layers {
        start: 0,
        end: 30,
        n_layers: 30,
    };
    let with = |parts: BTreeMap<Part, FetchState>| LocalRunners {
        runners: [(r.id().to_string(), idle.clone())].into(),
        models: [(
            "org/name".to_string(),
            ModelFile {
                path: "/hf/models--org--name/snapshots/x".into(),
                // The snapshot folder exists (config and tokenizer), the weights may not.
                ready: true,
                fetch: Fetch::Hub(parts),
            },
        )]
        .into(),
    };
    let cache = PlacementCache::new();
    let only = |local: &LocalRunners| {
        let effects = reconcile(&snapshot, local, &cache);
        effects
            .into_iter()
            .filter(|e| !matches!(e, Effect::WriteRecord { .. }))
            .collect::<Vec<_>>()
    };
    let download = Effect::Download {
        model: "org/name".into(),
        part,
    };
    assert_eq!(only(&with(BTreeMap::new())), vec![download.clone()]);
    assert_eq!(
        only(&with([(part, FetchState::Running)].into())),
        vec![download]
    );
    let failed = only(&with(
        [(part, FetchState::Failed("hub down".into()))].into(),
    ));
    let [Effect::MarkFailed { reason, .. }] = failed.as_slice() else {
        panic!("{failed:?}");
    };
    assert!(
        reason.contains("hub down") && reason.contains("layers-0-30-of-30"),
        "{reason}"
    );
    let done = only(&with([(part, FetchState::Done)].into()));
    assert!(
        matches!(done.as_slice(), [Effect::Connect { .. }]),
        "{done:?}"
    );
}

#[test]
fn an_instance_whose_runner_hung_is_placed_again_and_other_failures_are_not() {
    let r = record(1, 4_000_000_000, 1);
    let snapshot = Snapshot {
        settling: false,
        me: "a".into(),
        authors: [(
            "a".to_string(),
            crate::fixture::author(true, &[(r.key(), crate::fixture::json(&r))]),
        )]
        .into(),
    };
    let failed = |reason: &str, epoch: u32, hung: bool| LocalRunners {
        runners: [(
            r.id().to_string(),
            RunnerFacts {
                epoch,
                rank: 0,
                status: RunnerStatus::Failed {
                    reason: reason.into(),
                },
                process: false,
                sent: BTreeSet::new(),
                queued: 0,
                model_ready: true,
                hung,
            },
        )]
        .into(),
        models: BTreeMap::new(),
    };
    let cache = PlacementCache::new();
    let replaced = |local: &LocalRunners| {
        reconcile(&snapshot, local, &cache)
            .into_iter()
            .filter_map(|e| match e {
                Effect::Replace { next, dead } => Some((next.epoch, dead)),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    let hung = "hung: no step finished in 60 s";
    assert_eq!(replaced(&failed(hung, 0, true)), vec![(1, vec![])]);
    assert_eq!(
        replaced(&failed("model loading timed out after 60 s", 0, false)),
        vec![]
    );
    // A hung runner of an earlier epoch does not count.
    assert_eq!(replaced(&failed(hung, 7, true)), vec![]);
    // The other nodes learn it from the published record.
    let published: Vec<RunnerRecord> = publish(&failed(hung, 0, true), &BTreeMap::new())
        .into_iter()
        .filter_map(|e| match e {
            Effect::WriteRecord { value, .. } => serde_json::from_str(&value).ok(),
            _ => None,
        })
        .collect();
    assert!(published.len() == 1 && published[0].hung, "{published:?}");
}

/// Right after a peer returns (settling), a runner of another epoch than the effective copy is
/// kept and left alone: the copy may be the cut-off side's passing one (partition_under_load
/// saw the larger side's runner dropped 8 ms after the heal, and the instance failed). Once
/// settled it is dropped; a runner of a deleted instance is dropped at once either way.
#[test]
fn while_settling_a_runner_of_another_epoch_is_kept() {
    let r = record(1, 4_000_000_000, 1);
    let snapshot = |settling: bool| Snapshot {
        settling,
        me: "a".into(),
        authors: [(
            "a".to_string(),
            crate::fixture::author(true, &[(r.key(), crate::fixture::json(&r))]),
        )]
        .into(),
    };
    let running = |id: &str, epoch: u32| LocalRunners {
        runners: [(
            id.to_string(),
            RunnerFacts {
                epoch,
                rank: 0,
                status: RunnerStatus::Ready,
                process: true,
                sent: BTreeSet::new(),
                queued: 0,
                model_ready: true,
                hung: false,
            },
        )]
        .into(),
        models: BTreeMap::new(),
    };
    let cache = PlacementCache::new();
    let effects = |settling: bool, local: &LocalRunners| {
        reconcile(&snapshot(settling), local, &cache)
            .into_iter()
            .filter(|e| !matches!(e, Effect::WriteRecord { .. }))
            .map(|e| format!("{e:?}"))
            .collect::<Vec<_>>()
    };
    let other_epoch = running(r.id(), r.epoch + 1);
    assert_eq!(effects(true, &other_epoch), Vec::<String>::new());
    let settled = effects(false, &other_epoch);
    assert!(
        settled.iter().any(|e| e.starts_with("DropRunner")),
        "{settled:?}"
    );
    let gone = effects(true, &running("deleted-instance", 0));
    assert!(gone.iter().any(|e| e.starts_with("DropRunner")), "{gone:?}");
}
