//! The reconciler: on every node, a task that makes this node's runners follow the state.
//!
//! On each pass (on mesh changes, on a runner's state change, and every
//! [`RECONCILE_PERIOD`]) it:
//! 1. **re-places** every instance with a rank on a dead node (writes the next epoch, see
//!    [`crate::intent`]);
//! 2. **cleans up** this node's own records: its copy of a deleted instance, and its deletion
//!    record once no copy of the instance is left;
//! 3. **stops** this node's runners of instances that are gone, whose epoch moved on, or
//!    where this node no longer holds the rank;
//! 4. for every instance where this node holds a rank, performs what
//!    [`placement::next_action`] says: create the runner, connect it to the ring, load its
//!    layers, warm it up, or shut it down (a sibling failed);
//! 5. **publishes** each runner's status as `runner/<instance id>` (only when it changed).

use crate::backend::NodeBackend;
use crate::intent::{RunnerRecord, DELETED_PREFIX, INSTANCE_PREFIX, RUNNER_PREFIX};
use crate::models::ModelSpec;
use crate::runner::Supervisor;
use crate::view::short;
use placement::{next_action, Action, RunnerStatus};
use serde_json::Value;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often the reconciler runs without being woken.
pub const RECONCILE_PERIOD: Duration = Duration::from_millis(500);
/// How long a rank waits for its ring neighbours.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a runner gets to exit before it is killed.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// This node's runner for its rank of one instance.
pub struct LocalRunner {
    /// The instance epoch it was started for.
    pub epoch: u32,
    /// Its rank.
    pub rank: usize,
    /// The model, as this node finds it.
    pub model: ModelSpec,
    /// The process, while it runs.
    supervisor: Option<Supervisor>,
    /// Overrides the process's state: shut down by plan, or failed before it could start.
    status: Option<RunnerStatus>,
    /// Lifecycle commands already sent (each is sent once).
    sent: BTreeSet<&'static str>,
}

impl LocalRunner {
    /// Its status as the plan and the state see it.
    pub fn status(&self) -> RunnerStatus {
        if let Some(status) = &self.status {
            return status.clone();
        }
        match &self.supervisor {
            Some(s) => s.current_state(),
            None => RunnerStatus::Shutdown,
        }
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.supervisor.as_ref().map(Supervisor::pid)
    }

    /// Requests queued or running on it.
    pub fn load(&self) -> usize {
        self.supervisor.as_ref().map_or(0, Supervisor::load)
    }

    /// Its supervisor, if the runner is ready for requests.
    pub fn ready_supervisor(&self) -> Option<Supervisor> {
        matches!(self.status(), RunnerStatus::Ready | RunnerStatus::Running)
            .then(|| self.supervisor.clone())
            .flatten()
    }

    /// Stops the process (if any) and waits for it.
    pub async fn stop(mut self) {
        if let Some(s) = self.supervisor.take() {
            s.shutdown(SHUTDOWN_GRACE).await;
        }
    }

    /// Stops the process in the background, keeping the entry with `status`.
    fn stop_as(&mut self, status: RunnerStatus) {
        self.status = Some(status);
        if let Some(s) = self.supervisor.take() {
            tokio::spawn(async move { s.shutdown(SHUTDOWN_GRACE).await });
        }
    }
}

/// Runs passes until `shutdown` fires.
pub async fn run(backend: Arc<NodeBackend>, shutdown: CancellationToken) {
    let mut events = backend.context.subscribe();
    let mut ticker = tokio::time::interval(RECONCILE_PERIOD);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let changed = async {
            match events.as_mut() {
                Some(rx) => loop {
                    match rx.recv().await {
                        Ok(mesh::Event::Changed(_))
                        | Ok(mesh::Event::Died(_))
                        | Ok(mesh::Event::Expired(_))
                        | Ok(mesh::Event::Revived(_))
                        | Ok(mesh::Event::Joined(_))
                        | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => return,
                        Ok(_) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                            std::future::pending::<()>().await
                        }
                    }
                },
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = ticker.tick() => {}
            () = backend.wake.notified() => {}
            () = changed => {}
        }
        backend.reconcile();
    }
}

impl NodeBackend {
    /// One pass (see the module docs).
    pub fn reconcile(&self) {
        let snapshot = self.context.snapshot();
        let me = snapshot.me.clone();
        let instances = snapshot.instances();

        // 1. Re-place instances that lost a rank's node; keep a copy of every instance this
        //    node holds a rank of, so that it outlives its creator.
        for view in instances.values() {
            let dead = view.dead_ranks(&snapshot);
            if dead.is_empty() {
                if view.rank_of(&me).is_some() {
                    let key = format!("{INSTANCE_PREFIX}{}", view.record.id());
                    let own = snapshot
                        .authors
                        .get(&me)
                        .and_then(|a| a.records.get(&key))
                        .and_then(|t| {
                            serde_json::from_str::<crate::intent::InstanceRecord>(t).ok()
                        });
                    if own.as_ref() != Some(&view.record) {
                        if let Ok(value) = serde_json::to_value(&view.record) {
                            if let Err(e) = self.context.write(&key, &value) {
                                tracing::warn!("cannot keep a copy of {key}: {e}");
                            }
                        }
                    }
                }
                continue;
            }
            let next = view.record.replaced(&dead);
            let dead: Vec<&str> = dead.iter().map(|d| short(d)).collect();
            match &next.place() {
                Ok(p) => tracing::warn!(
                    instance = %view.record.id(), epoch = next.epoch, ?dead, ranks = p.ranks.len(),
                    "a node holding a rank died: placing the instance again on the nodes that remain"
                ),
                Err(e) => tracing::warn!(
                    instance = %view.record.id(), epoch = next.epoch, ?dead,
                    "a node holding a rank died and the nodes that remain cannot hold the instance: {e}"
                ),
            }
            match serde_json::to_value(&next) {
                Ok(value) => {
                    if let Err(e) = self
                        .context
                        .write(&format!("{INSTANCE_PREFIX}{}", next.id()), &value)
                    {
                        tracing::error!("cannot record the re-placement: {e}");
                    }
                }
                Err(e) => tracing::error!("cannot encode the re-placement: {e}"),
            }
        }

        // 2. This node's own records of deleted instances.
        let deleted = snapshot.deleted();
        let copies = snapshot.instance_copies();
        if let Some(own) = snapshot.authors.get(&me) {
            for key in own.records.keys() {
                if let Some(id) = key.strip_prefix(INSTANCE_PREFIX) {
                    if deleted.contains(id) {
                        self.context.remove(key);
                    }
                } else if let Some(id) = key.strip_prefix(DELETED_PREFIX) {
                    if !copies.contains_key(id) {
                        self.context.remove(key);
                    }
                }
            }
        }

        // 3 and 4. Runners.
        {
            let mut runners = self.runners.lock().unwrap_or_else(|e| e.into_inner());
            let stale: Vec<String> = runners
                .iter()
                .filter(|(id, r)| match instances.get(*id) {
                    None => true,
                    Some(v) => v.record.epoch != r.epoch || v.rank_of(&me) != Some(r.rank),
                })
                .map(|(id, _)| id.clone())
                .collect();
            for id in stale {
                if let Some(runner) = runners.remove(&id) {
                    tracing::info!(instance = %id, epoch = runner.epoch, "stopping this node's runner: the instance is gone or placed anew");
                    tokio::spawn(runner.stop());
                }
            }
            for (id, view) in &instances {
                let (Some(rank), Ok(placement)) = (view.rank_of(&me), &view.placement) else {
                    continue;
                };
                let model = self.spec_of(&view.record.intent.model);
                let model_ready = model.path.exists();
                let mine = runners.get(id).map(LocalRunner::status);
                let plan = view.plan_input(&snapshot, rank, mine.as_ref(), model_ready);
                let action = next_action(&plan);
                let ring_size = placement.ranks.len();
                match action {
                    Action::Wait => {}
                    Action::CreateRunner => {
                        let mut runner = LocalRunner {
                            epoch: view.record.epoch,
                            rank,
                            model: model.clone(),
                            supervisor: None,
                            status: None,
                            sent: BTreeSet::new(),
                        };
                        match Supervisor::start_idle(&self.runner_command) {
                            Ok(supervisor) => {
                                tracing::info!(instance = %id, rank, ranks = ring_size, pid = supervisor.pid(), "runner created");
                                let mut state = supervisor.state();
                                let wake = self.wake.clone();
                                tokio::spawn(async move {
                                    while state.changed().await.is_ok() {
                                        wake.notify_one();
                                    }
                                });
                                runner.supervisor = Some(supervisor);
                                self.wake.notify_one();
                            }
                            Err(e) => {
                                runner.status = Some(RunnerStatus::Failed {
                                    reason: format!(
                                        "cannot start a runner process ({}): {e}",
                                        self.runner_command.program.display()
                                    ),
                                })
                            }
                        }
                        runners.insert(id.clone(), runner);
                    }
                    Action::Download => {
                        let reason = format!(
                            "model file {} is not on node {}; models other than `default` \
                             must be at the same path on every node of the instance",
                            model.path.display(),
                            short(&me)
                        );
                        tracing::error!(instance = %id, "{reason}");
                        let failed = RunnerStatus::Failed { reason };
                        match runners.get_mut(id) {
                            Some(r) => r.stop_as(failed),
                            None => {
                                runners.insert(
                                    id.clone(),
                                    LocalRunner {
                                        epoch: view.record.epoch,
                                        rank,
                                        model: model.clone(),
                                        supervisor: None,
                                        status: Some(failed),
                                        sent: BTreeSet::new(),
                                    },
                                );
                            }
                        }
                    }
                    Action::Connect | Action::Load | Action::WarmUp => {
                        let Some(runner) = runners.get_mut(id) else {
                            continue;
                        };
                        let Some(supervisor) = runner.supervisor.clone() else {
                            continue;
                        };
                        let r = &placement.ranks[rank];
                        match action {
                            Action::Connect if runner.sent.insert("connect") => {
                                let hosts: Vec<Vec<String>> = r_hosts(placement, rank);
                                tracing::info!(instance = %id, rank, ?hosts, "runner: connect");
                                supervisor.connect(rank, hosts, CONNECT_TIMEOUT);
                            }
                            Action::Load if runner.sent.insert("load") => {
                                supervisor.load_model(
                                    &model.path.to_string_lossy(),
                                    Some((r.start_layer as usize, r.end_layer as usize)),
                                    placement.sharding,
                                );
                            }
                            // A ring of one warms up inside `Load`.
                            Action::WarmUp if ring_size > 1 && runner.sent.insert("warm_up") => {
                                tracing::info!(instance = %id, rank, "runner: warm up");
                                supervisor.warm_up();
                            }
                            _ => {}
                        }
                    }
                    Action::ShutDown(reason) => {
                        if let Some(runner) = runners.get_mut(id) {
                            tracing::warn!(instance = %id, rank, ?reason, "shutting this node's runner down");
                            runner.stop_as(RunnerStatus::Shutdown);
                        }
                    }
                }
            }
        }

        // 5. Publish this node's runner records.
        self.publish_runners();
    }

    fn publish_runners(&self) {
        let wanted: Vec<(String, String)> = {
            let runners = self.runners.lock().unwrap_or_else(|e| e.into_inner());
            runners
                .iter()
                .filter_map(|(id, r)| {
                    let record = RunnerRecord {
                        epoch: r.epoch,
                        rank: r.rank,
                        status: r.status(),
                        queued: r.load(),
                        model_ready: r.model.path.exists(),
                    };
                    let text = serde_json::to_string(&record).ok()?;
                    Some((format!("{RUNNER_PREFIX}{id}"), text))
                })
                .collect()
        };
        let mut published = self.published.lock().unwrap_or_else(|e| e.into_inner());
        let keys: BTreeSet<String> = wanted.iter().map(|(k, _)| k.clone()).collect();
        for (key, text) in wanted {
            if published.get(&key) == Some(&text) {
                continue;
            }
            let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            match self.context.write(&key, &value) {
                Ok(()) => {
                    published.insert(key, text);
                }
                Err(e) => tracing::warn!("cannot publish {key}: {e}"),
            }
        }
        let gone: Vec<String> = published
            .keys()
            .filter(|k| !keys.contains(*k))
            .cloned()
            .collect();
        for key in gone {
            self.context.remove(&key);
            published.remove(&key);
        }
    }
}

/// Rank `rank`'s ring view as the runner protocol takes it: one address list per rank.
fn r_hosts(placement: &placement::Placement, rank: usize) -> Vec<Vec<String>> {
    placement.ranks[rank]
        .hosts
        .iter()
        .map(|h| vec![h.clone()])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{LocalOnly, NodeContext};
    use crate::intent::{DeletedRecord, InstanceRecord};
    use crate::runner::RunnerCommand;
    use crate::view::Author;

    /// A backend on node `a` whose runners are `/bin/false` (they exit at once) and whose
    /// default model is an existing (empty) file.
    fn backend(dir: &std::path::Path) -> (Arc<LocalOnly>, NodeBackend) {
        let model = dir.join("model.gguf");
        std::fs::write(&model, b"").unwrap();
        let context = Arc::new(LocalOnly::new("a"));
        let backend = NodeBackend::new(
            context.clone(),
            RunnerCommand {
                program: "/bin/false".into(),
                args: vec![],
                env: vec![],
            },
            model,
        );
        (context, backend)
    }

    fn own(context: &LocalOnly, key: &str) -> Option<Value> {
        let snapshot = context.snapshot();
        let text = snapshot.authors["a"].records.get(key)?;
        serde_json::from_str(text).ok()
    }

    async fn settle(backend: &NodeBackend) {
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            backend.reconcile();
        }
    }

    #[tokio::test]
    async fn a_rank_here_gets_a_runner_whose_failure_is_published_and_a_deletion_stops_it() {
        let dir = std::env::temp_dir().join(format!("shoal-reconcile-1-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (context, backend) = backend(&dir);
        let record = crate::intent::tests::record(1, 4_000_000_000, 1);
        let id = record.id().to_string();
        context
            .write(
                &format!("{INSTANCE_PREFIX}{id}"),
                &serde_json::to_value(&record).unwrap(),
            )
            .unwrap();
        backend.reconcile();
        assert!(backend.local_status(&id).is_some(), "runner created");
        // `/bin/false` exits: the runner fails and its record says so.
        settle(&backend).await;
        let runner = own(&context, &format!("{RUNNER_PREFIX}{id}")).expect("runner record");
        assert_eq!(runner["epoch"], 0);
        assert_eq!(runner["rank"], 0);
        assert!(runner["status"]["failed"].is_object(), "{runner}");
        // Another node deletes the instance: the runner and this node's records go.
        context.others.lock().unwrap().insert(
            "b".into(),
            Author {
                alive: true,
                dead: false,
                records: [(
                    format!("{DELETED_PREFIX}{id}"),
                    serde_json::to_string(&DeletedRecord {
                        instance_id: id.clone(),
                    })
                    .unwrap(),
                )]
                .into(),
            },
        );
        settle(&backend).await;
        assert!(backend.local_status(&id).is_none());
        assert!(own(&context, &format!("{RUNNER_PREFIX}{id}")).is_none());
        assert!(own(&context, &format!("{INSTANCE_PREFIX}{id}")).is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_dead_rank_node_makes_the_survivor_place_the_instance_again() {
        let dir = std::env::temp_dir().join(format!("shoal-reconcile-2-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (context, backend) = backend(&dir);
        // Two nodes with 1.5 GB each, a 1 GB model, at least 2 nodes: one rank on each; `b`
        // created it.
        let record = crate::intent::tests::record(2, 1_500_000_000, 2);
        let id = record.id().to_string();
        assert_eq!(record.place().unwrap().ranks.len(), 2);
        let mut b = Author {
            alive: true,
            dead: false,
            records: [(
                format!("{INSTANCE_PREFIX}{id}"),
                serde_json::to_string(&record).unwrap(),
            )]
            .into(),
        };
        context.others.lock().unwrap().insert("b".into(), b.clone());
        backend.reconcile();
        // This node keeps its own copy of an instance it holds a rank of.
        let copy: InstanceRecord =
            serde_json::from_value(own(&context, &format!("{INSTANCE_PREFIX}{id}")).unwrap())
                .unwrap();
        assert_eq!(copy, record);
        // `b` dies: this node writes epoch 1 without it.
        b.alive = false;
        b.dead = true;
        context.others.lock().unwrap().insert("b".into(), b);
        backend.reconcile();
        let next: InstanceRecord =
            serde_json::from_value(own(&context, &format!("{INSTANCE_PREFIX}{id}")).unwrap())
                .unwrap();
        assert_eq!(next.epoch, 1);
        assert_eq!(next.excluded, vec!["b".to_string()]);
        // Every node now computes the one-node placement on `a`, and `a` starts a runner for it.
        let view = context.snapshot().instances().remove(&id).unwrap();
        assert_eq!(view.record, next);
        let placement = view.placement.as_ref().unwrap();
        assert_eq!(placement.ranks.len(), 1);
        assert_eq!(placement.ranks[0].node, "a");
        assert_ne!(placement.port, record.place().unwrap().port);
        backend.reconcile();
        let runners = backend.runners.lock().unwrap();
        assert_eq!(runners.get(&id).map(|r| (r.epoch, r.rank)), Some((1, 0)));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn ring_views_become_one_address_list_per_rank() {
        let r = crate::intent::tests::record(3, 400_000_000, 3);
        let p = r.place().unwrap();
        let hosts = r_hosts(&p, 1);
        assert_eq!(hosts.len(), 3);
        assert_eq!(hosts[1], vec![format!("0.0.0.0:{}", p.port)]);
        assert!(hosts.iter().all(|h| h.len() == 1));
    }
}
