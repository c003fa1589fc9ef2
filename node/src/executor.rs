//! [`Executor`]: the node's face towards the control plane. On every node, a task that makes
//! this node's runners follow the state. The decisions are [`control::reconcile`] and
//! [`control::publish`] (pure, see the control crate); the executor turns the [`Node`] into
//! their plain input (the snapshot, this node's runners and models) and applies the effects
//! they return: writes and removals of this node's records, and runner processes started
//! (the `runners` crate's [`Supervisor`]), commanded and stopped.
//!
//! A pass runs on mesh changes, on a runner's state change, and every [`RECONCILE_PERIOD`].

use crate::node::Node;
use control::{short, Effect, Fetch, LocalRunners, ModelFile, Part, RunnerFacts};
use placement::RunnerStatus;
use runners::{LocalRunner, Supervisor};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often the reconciler runs without being woken.
pub const RECONCILE_PERIOD: Duration = Duration::from_millis(500);
/// How long a rank waits for its ring neighbours.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(120);
/// Applies the control plane's effects to a [`Node`] (see the module docs).
pub struct Executor {
    node: Arc<Node>,
    /// This node's `runner/<id>` records as last written.
    published: Mutex<BTreeMap<String, String>>,
}

impl Executor {
    /// The executor of `node`.
    pub fn new(node: Arc<Node>) -> Executor {
        Executor {
            node,
            published: Mutex::default(),
        }
    }

    /// Runs passes until `shutdown` fires.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut events = self.node.context.subscribe();
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
                () = self.node.wake.notified() => {}
                () = changed => {}
            }
            self.reconcile();
        }
    }

    /// One pass: decide ([`control::reconcile`]) and apply, then publish this node's runner
    /// records ([`control::publish`]).
    pub fn reconcile(&self) {
        let node = &*self.node;
        let snapshot = node.context.snapshot();
        {
            let mut runners = node.runners.lock();
            let models = snapshot
                .model_references()
                .into_iter()
                .map(|reference| {
                    let path = node.spec_of(&reference).path;
                    let fetch = if hub::ModelId::looks_like_id(&reference) {
                        Fetch::Hub(node.downloads.parts_of(&reference))
                    } else {
                        Fetch::No
                    };
                    let file = ModelFile {
                        path: path.display().to_string(),
                        ready: path.exists(),
                        fetch,
                    };
                    (reference, file)
                })
                .collect();
            let local = LocalRunners {
                runners: self.runner_facts(&snapshot, &runners),
                models,
            };
            for effect in control::reconcile(&snapshot, &local, &node.placements) {
                self.apply(effect, &mut runners);
            }
        }
        let instances = snapshot.instances(&node.placements);
        node.placements
            .retain(instances.values().map(|v| (v.record.id(), v.record.epoch)));
        self.publish_runners();
    }

    /// Applies one decision.
    fn apply(&self, effect: Effect, runners: &mut BTreeMap<String, LocalRunner>) {
        let node = &*self.node;
        let command = effect.command();
        match effect {
            Effect::WriteRecord { key, value } => {
                let value: Value = serde_json::from_str(&value).unwrap_or(Value::Null);
                if let Err(e) = node.context.write(&key, &value) {
                    tracing::warn!("cannot keep a copy of {key}: {e}");
                }
            }
            Effect::RemoveRecord { key } => {
                node.context.remove(&key);
            }
            Effect::Replace { next, dead } => {
                let dead: Vec<&str> = dead.iter().map(|d| short(d)).collect();
                let why = if dead.is_empty() {
                    "a rank of the ring hung"
                } else {
                    "a node holding a rank died"
                };
                match &node.placements.place(&next) {
                    Ok(p) => tracing::warn!(
                        instance = %next.id(), epoch = next.epoch, ?dead, ranks = p.ranks.len(),
                        "{why}: placing the instance again on the nodes that remain"
                    ),
                    Err(e) => tracing::warn!(
                        instance = %next.id(), epoch = next.epoch, ?dead,
                        "{why} and the nodes that remain cannot hold the instance: {e}"
                    ),
                }
                match serde_json::to_value(&next) {
                    Ok(value) => {
                        if let Err(e) = node.context.write(&next.key(), &value) {
                            tracing::error!("cannot record the re-placement: {e}");
                        }
                    }
                    Err(e) => tracing::error!("cannot encode the re-placement: {e}"),
                }
            }
            Effect::DropRunner { instance } => {
                if let Some(runner) = runners.remove(&instance) {
                    tracing::info!(instance = %instance, epoch = runner.epoch, "stopping this node's runner: the instance is gone or placed anew");
                    tokio::spawn(runner.stop());
                }
            }
            Effect::CreateRunner {
                instance,
                epoch,
                rank,
                ranks,
                model,
            } => {
                let mut runner = LocalRunner::new(epoch, rank, node.spec_of(&model), None);
                match Supervisor::start_idle(&node.runner_command) {
                    Ok(supervisor) => {
                        tracing::info!(instance = %instance, rank, ranks, pid = supervisor.pid(), "runner created");
                        let mut state = supervisor.state();
                        let wake = node.wake.clone();
                        tokio::spawn(async move {
                            while state.changed().await.is_ok() {
                                wake.notify_one();
                            }
                        });
                        runner.supervisor = Some(supervisor);
                        node.wake.notify_one();
                    }
                    Err(e) => {
                        runner.status = Some(RunnerStatus::Failed {
                            reason: format!(
                                "cannot start a runner process ({}): {e}",
                                node.runner_command.program.display()
                            ),
                        })
                    }
                }
                runners.insert(instance, runner);
            }
            Effect::Download { model, part } => {
                node.downloads
                    .start(&model, part, node.cluster(), node.wake.clone());
            }
            Effect::MarkFailed {
                instance,
                epoch,
                rank,
                model,
                reason,
            } => {
                tracing::error!(instance = %instance, "{reason}");
                let failed = RunnerStatus::Failed { reason };
                match runners.get_mut(&instance) {
                    Some(r) => r.stop_as(failed),
                    None => {
                        let model = node.spec_of(&model);
                        runners
                            .insert(instance, LocalRunner::new(epoch, rank, model, Some(failed)));
                    }
                }
            }
            Effect::Connect {
                ref instance, rank, ..
            }
            | Effect::Load {
                ref instance, rank, ..
            }
            | Effect::WarmUp { ref instance, rank } => {
                let Some(runner) = runners.get_mut(instance) else {
                    return;
                };
                let Some(supervisor) = runner.supervisor.clone() else {
                    return;
                };
                if let Some(command) = command {
                    runner.sent.insert(command);
                }
                match &effect {
                    Effect::Connect { hosts, .. } => {
                        tracing::info!(instance = %instance, rank, ?hosts, "runner: connect");
                        supervisor.connect(rank, hosts.clone(), CONNECT_TIMEOUT);
                    }
                    Effect::Load {
                        layers, sharding, ..
                    } => {
                        // Found again now: a model downloaded after the runner started has
                        // its snapshot folder only now.
                        runner.model = node.spec_of(&runner.model.reference);
                        supervisor.load_model(
                            &runner.model.path.to_string_lossy(),
                            Some(*layers),
                            *sharding,
                        );
                    }
                    _ => {
                        tracing::info!(instance = %instance, rank, "runner: warm up");
                        supervisor.warm_up();
                    }
                }
            }
            Effect::StopRunner {
                instance,
                status,
                reason,
            } => {
                if let Some(runner) = runners.get_mut(&instance) {
                    tracing::warn!(instance = %instance, rank = runner.rank, ?reason, "shutting this node's runner down");
                    runner.stop_as(status);
                }
            }
        }
    }

    /// The control plane's facts of this node's runners. A runner of a Hugging Face model has
    /// its model ready when the files of its rank's part are complete here (the snapshot
    /// folder exists as soon as the configuration is, long before the weights).
    fn runner_facts(
        &self,
        snapshot: &control::Snapshot,
        runners: &BTreeMap<String, LocalRunner>,
    ) -> BTreeMap<String, RunnerFacts> {
        let instances = snapshot.instances(&self.node.placements);
        runners
            .iter()
            .map(|(id, r)| {
                let mut facts = r.facts();
                if hub::ModelId::looks_like_id(&r.model.reference) {
                    let part = instances.get(id).and_then(|v| {
                        let placement = v.placement.as_ref().ok()?;
                        let n_layers = v.record.intent.input.model.n_layers as usize;
                        Part::of_rank(placement, r.rank, n_layers)
                    });
                    facts.model_ready =
                        part.is_some_and(|p| self.node.downloads.is_done(&r.model.reference, &p));
                }
                (id.clone(), facts)
            })
            .collect()
    }

    /// Writes the `runner/<id>` records that changed since they were last written.
    fn publish_runners(&self) {
        let snapshot = self.node.context.snapshot();
        let local = {
            let runners = self.node.runners.lock();
            LocalRunners {
                runners: self.runner_facts(&snapshot, &runners),
                models: BTreeMap::new(),
            }
        };
        let mut published = self.published.lock().unwrap_or_else(|e| e.into_inner());
        for effect in control::publish(&local, &published) {
            match effect {
                Effect::WriteRecord { key, value } => {
                    let json: Value = serde_json::from_str(&value).unwrap_or(Value::Null);
                    match self.node.context.write(&key, &json) {
                        Ok(()) => {
                            published.insert(key, value);
                        }
                        Err(e) => tracing::warn!("cannot publish {key}: {e}"),
                    }
                }
                Effect::RemoveRecord { key } => {
                    self.node.context.remove(&key);
                    published.remove(&key);
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::LocalOnly;
    use control::Author;
    use control::{DeletedRecord, InstanceRecord, DELETED_PREFIX, INSTANCE_PREFIX, RUNNER_PREFIX};
    use models::Cluster;
    use runners::RunnerCommand;

    /// The executor of node `a` whose runners are `/bin/false` (they exit at once) and whose
    /// default model is an existing (empty) file.
    fn backend(dir: &std::path::Path) -> (Arc<LocalOnly>, Executor) {
        let model = dir.join("model.gguf");
        std::fs::write(&model, b"").unwrap();
        let context = Arc::new(LocalOnly::new("a"));
        let node = Node::new(
            context.clone(),
            RunnerCommand {
                program: "/bin/false".into(),
                args: vec![],
                settings: runners::RunnerSettings::default(),
            },
            model,
            models::locate::ModelDirs::from_env(&[]),
        );
        (context, Executor::new(Arc::new(node)))
    }

    fn own(context: &LocalOnly, key: &str) -> Option<Value> {
        let snapshot = context.snapshot();
        let text = snapshot.authors["a"].records.get(key)?;
        serde_json::from_str(text).ok()
    }

    async fn settle(backend: &Executor) {
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
        let record = control::fixture::record(1, 4_000_000_000, 1);
        let id = record.id().to_string();
        context
            .write(
                &format!("{INSTANCE_PREFIX}{id}"),
                &serde_json::to_value(&record).unwrap(),
            )
            .unwrap();
        backend.reconcile();
        assert!(backend.node.runners.status(&id).is_some(), "runner created");
        // `/bin/false` exits: the runner fails and its record says so.
        settle(&backend).await;
        let runner = own(&context, &format!("{RUNNER_PREFIX}{id}")).expect("runner record");
        assert_eq!(runner["epoch"], 0);
        assert_eq!(runner["rank"], 0);
        assert!(runner["status"]["failed"].is_object(), "{runner}");
        // Six passes, one placement: the node keeps it.
        assert_eq!(
            backend.node.placements.computed(),
            1,
            "placed once, then kept"
        );
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
                        seq: 1,
                    })
                    .unwrap(),
                )]
                .into(),
            },
        );
        settle(&backend).await;
        assert!(backend.node.runners.status(&id).is_none());
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
        let record = control::fixture::record(2, 1_500_000_000, 2);
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
        let view = context
            .snapshot()
            .instances(&backend.node.placements)
            .remove(&id)
            .unwrap();
        assert_eq!(view.record, next);
        let placement = view.placement.as_ref().unwrap();
        assert_eq!(placement.ranks.len(), 1);
        assert_eq!(placement.ranks[0].node, "a");
        assert_ne!(placement.port, record.place().unwrap().port);
        backend.reconcile();
        let runners = backend.node.runners.lock();
        assert_eq!(runners.get(&id).map(|r| (r.epoch, r.rank)), Some((1, 0)));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
