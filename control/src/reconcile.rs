//! The reconcile decisions: what this node must do so that its records and runners follow
//! the state. [`reconcile`] and [`publish`] are pure; the node's executor applies the
//! [`Effect`]s they return (mesh writes, runner processes) and the simulation applies them
//! to plain data.
//!
//! One pass of [`reconcile`], in this order:
//! 1. **re-place** every instance with a rank on a dead node, or a rank whose runner hung
//!    (failed [`RunnerRecord::hung`]: the step deadline passed) ([`Effect::Replace`], the next
//!    epoch, see [`crate::intent`]), except on a node the instance excluded while it is
//!    [`Snapshot::settling`]; keep this node's own copy of every instance it holds a rank
//!    of, so that the instance outlives its creator, and bring any copy it holds up to
//!    the effective one;
//! 2. **clean up** this node's own records: its copy of a deleted instance, and its deletion
//!    record once no copy of the instance is left;
//! 3. **drop** this node's runners of instances that are gone, whose epoch moved on, or where
//!    this node no longer holds the rank;
//! 4. for every instance where this node holds a rank, do what [`placement::next_action`]
//!    says: create the runner, connect it to the ring, load its layers, warm it up (each
//!    command once, see [`RunnerFacts::sent`]; a ring of one warms up inside `Load`), fail it
//!    when the model is missing, or shut it down (a sibling failed).
//!
//! Then, once the executor has applied those, [`publish`] says which `runner/<id>` records
//! to write or remove: only those that changed since they were last written.

use crate::cache::PlacementCache;
use crate::fetch::{Fetch, FetchState, Part};
use crate::intent::{
    DeletedRecord, InstanceRecord, RunnerRecord, DELETED_PREFIX, INSTANCE_PREFIX, KEEP_DELETIONS,
    RUNNER_PREFIX,
};
use crate::snapshot::Snapshot;
use crate::view::{short, InstanceView};
use placement::{next_action, Action, Placement, RunnerStatus, Sharding, ShutdownReason};
use std::collections::{BTreeMap, BTreeSet};

/// Whether a rank's runner of `view`'s epoch failed by its step deadline (its record's or,
/// for this node's own rank, its facts' `hung`): such an instance is placed again, as one
/// with a dead node is, since fresh runner processes on the same nodes can serve it. `mine`
/// is this node's own runner of the instance, if it has one.
fn has_hung_rank(view: &InstanceView, snapshot: &Snapshot, mine: Option<&RunnerFacts>) -> bool {
    let mine = mine.filter(|r| r.epoch == view.record.epoch);
    view.rank_statuses(snapshot, mine.map(|r| &r.status))
        .iter()
        .any(|(node, record)| match record {
            Some(_) if *node == snapshot.me => mine.is_some_and(|r| r.hung),
            Some(record) => record.hung,
            None => false,
        })
}

/// A lifecycle command sent to a runner; each is sent at most once per runner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LifecycleCommand {
    /// Join the ring.
    Connect,
    /// Load the rank's layers.
    Load,
    /// Run a first generation.
    WarmUp,
}

/// What the control plane knows of one of this node's runners.
#[derive(Clone, Debug, PartialEq)]
pub struct RunnerFacts {
    /// The instance epoch it was started for.
    pub epoch: u32,
    /// Its rank.
    pub rank: usize,
    /// Its status (the process's, or the one the node set when it stopped or failed it).
    pub status: RunnerStatus,
    /// Whether its process runs, so that commands can reach it.
    pub process: bool,
    /// Commands already sent.
    pub sent: BTreeSet<LifecycleCommand>,
    /// Requests queued or running on it.
    pub queued: usize,
    /// Whether its model file is on this node's disk.
    pub model_ready: bool,
    /// Its process was ended by the step deadline (see [`RunnerRecord::hung`]).
    pub hung: bool,
}

impl From<&RunnerFacts> for RunnerRecord {
    /// The record a node publishes for its runner.
    fn from(r: &RunnerFacts) -> RunnerRecord {
        RunnerRecord {
            epoch: r.epoch,
            rank: r.rank,
            status: r.status.clone(),
            queued: r.queued,
            model_ready: r.model_ready,
            hung: r.hung,
        }
    }
}

/// A model as this node finds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelFile {
    /// Where this node looks for it (for messages).
    pub path: String,
    /// Whether it is there.
    pub ready: bool,
    /// Whether this node can fetch it when it is not there, and its fetches.
    pub fetch: Fetch,
}

/// This node's side of the picture: its runners by instance id, and its models by the
/// reference intents name them with (`Intent::model`). A reference missing from `models` is
/// a model this node does not have.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LocalRunners {
    /// Runners by instance id.
    pub runners: BTreeMap<String, RunnerFacts>,
    /// Models by reference.
    pub models: BTreeMap<String, ModelFile>,
}

/// One thing the node must do.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// Write this node's record `key` (JSON text).
    WriteRecord {
        /// The record key.
        key: String,
        /// Its value, as JSON text.
        value: String,
    },
    /// Remove this node's record `key`.
    RemoveRecord {
        /// The record key.
        key: String,
    },
    /// Write `next` as this node's `instance/<id>`: a rank's node died.
    Replace {
        /// The next epoch's record (boxed: it is far larger than the other effects).
        next: Box<InstanceRecord>,
        /// The rank nodes found dead.
        dead: Vec<String>,
    },
    /// Stop the runner of `instance` and forget it (stale: gone, other epoch, other rank).
    DropRunner {
        /// The instance id.
        instance: String,
    },
    /// Start a runner process for this node's rank.
    CreateRunner {
        /// The instance id.
        instance: String,
        /// Its epoch.
        epoch: u32,
        /// This node's rank.
        rank: usize,
        /// The ring size.
        ranks: usize,
        /// The model reference.
        model: String,
    },
    /// Tell the runner to join the ring.
    Connect {
        /// The instance id.
        instance: String,
        /// This node's rank.
        rank: usize,
        /// One address list per rank (see [`ring_hosts`]).
        hosts: Vec<Vec<String>>,
    },
    /// Tell the runner to load its layers.
    Load {
        /// The instance id.
        instance: String,
        /// This node's rank.
        rank: usize,
        /// Its half-open layer range.
        layers: (usize, usize),
        /// The placement's sharding.
        sharding: Sharding,
    },
    /// Tell the runner to warm up.
    WarmUp {
        /// The instance id.
        instance: String,
        /// This node's rank.
        rank: usize,
    },
    /// Stop the runner's process, keeping its entry with `status`.
    StopRunner {
        /// The instance id.
        instance: String,
        /// The status it keeps.
        status: RunnerStatus,
        /// Why.
        reason: ShutdownReason,
    },
    /// Fetch part `part` of model `model` to this node (idempotent: the executor starts one
    /// download per (model, part) and ignores the effect while it runs or once it is done).
    Download {
        /// The model reference (a Hugging Face model id).
        model: String,
        /// The part this node's rank reads.
        part: Part,
    },
    /// Fail this node's rank before (or instead of) starting: stop the runner if there is
    /// one, else record a runner entry that is failed.
    MarkFailed {
        /// The instance id.
        instance: String,
        /// Its epoch.
        epoch: u32,
        /// This node's rank.
        rank: usize,
        /// The model reference.
        model: String,
        /// What went wrong, for the user.
        reason: String,
    },
}

impl Effect {
    /// The command this effect sends, if any (the executor adds it to the runner's `sent`).
    pub fn command(&self) -> Option<LifecycleCommand> {
        match self {
            Effect::Connect { .. } => Some(LifecycleCommand::Connect),
            Effect::Load { .. } => Some(LifecycleCommand::Load),
            Effect::WarmUp { .. } => Some(LifecycleCommand::WarmUp),
            _ => None,
        }
    }
}

/// Rank `rank`'s ring view as the runner protocol takes it: one address list per rank.
pub fn ring_hosts(placement: &Placement, rank: usize) -> Vec<Vec<String>> {
    placement.ranks[rank]
        .hosts
        .iter()
        .map(|h| vec![h.clone()])
        .collect()
}

/// One pass of decisions (see the module docs): pure in the snapshot and this node's runners.
pub fn reconcile(
    snapshot: &Snapshot,
    local: &LocalRunners,
    placements: &PlacementCache,
) -> Vec<Effect> {
    let me = snapshot.me.as_str();
    let instances = snapshot.instances(placements);
    let mut effects = Vec::new();

    // 1. Re-place instances that lost a rank's node or whose ring hung; keep a copy of every
    //    instance this node holds a rank of.
    for (id, view) in &instances {
        let dead = view.dead_ranks(snapshot);
        if dead.is_empty() && !has_hung_rank(view, snapshot, local.runners.get(id)) {
            let key = view.record.key();
            let own_text = snapshot.authors.get(me).and_then(|a| a.records.get(&key));
            // A rank's node keeps a copy; a node that holds an outdated copy (the side of a
            // healed partition, a creator left out) replaces it, so no stale copy lingers to
            // compete with a later epoch.
            // Not while settling: right after a peer returns, the effective copy may be a
            // passing one (a cut-off side's first epoch, before its later ones arrive), and
            // copying it would make it everyone's.
            if !snapshot.settling && (view.rank_of(me).is_some() || own_text.is_some()) {
                let own = own_text.and_then(|t| serde_json::from_str::<InstanceRecord>(t).ok());
                if own.as_ref() != Some(&view.record) {
                    if let Ok(value) = serde_json::to_string(&view.record) {
                        effects.push(Effect::WriteRecord { key, value });
                    }
                }
            }
            continue;
        }
        if snapshot.settling && view.record.excluded.iter().any(|n| n == me) {
            // This node was left out of the instance: it is the side of a partition that was
            // cut off, or it restarted. Right after it hears from the others again, it still
            // takes the ones whose news has not arrived yet for dead, and would re-place the
            // instance on whatever it has heard from. The nodes that hold the ranks decide.
            continue;
        }
        let mut left_out = view.dead_inputs(snapshot);
        left_out.extend(dead.iter().cloned());
        effects.push(Effect::Replace {
            next: Box::new(view.record.replaced(&left_out)),
            dead: dead.into_iter().collect(),
        });
    }

    // 2. This node's own records of deleted instances: its copies go at once, its deletions
    //    once no copy is left and newer ones are [`KEEP_DELETIONS`] (see there why).
    let deleted = snapshot.deleted();
    let copies = snapshot.instance_copies();
    if let Some(own) = snapshot.authors.get(me) {
        let mut settled: Vec<(u64, &String)> = Vec::new();
        for (key, text) in &own.records {
            if let Some(id) = key.strip_prefix(INSTANCE_PREFIX) {
                if deleted.contains(id) {
                    effects.push(Effect::RemoveRecord { key: key.clone() });
                }
            } else if let Some(id) = key.strip_prefix(DELETED_PREFIX) {
                if !copies.contains_key(id) {
                    let seq = serde_json::from_str::<DeletedRecord>(text).map_or(0, |d| d.seq);
                    settled.push((seq, key));
                }
            }
        }
        settled.sort();
        let excess = settled.len().saturating_sub(KEEP_DELETIONS);
        effects.extend(
            settled[..excess]
                .iter()
                .map(|(_, key)| Effect::RemoveRecord {
                    key: (*key).clone(),
                }),
        );
    }

    // 3. Stale runners. Not while settling, unless the instance is gone: right after a peer
    //    returns, the effective copy may be a passing one (the cut-off side's epoch, before
    //    the larger side's news arrives), and dropping for it killed the larger side's ring
    //    8 ms after the heal (partition_under_load: both sides' runners stopped, the instance
    //    failed). Once settled, the loser's runners go.
    let stale: BTreeSet<&str> = local
        .runners
        .iter()
        .filter(|(id, r)| match instances.get(*id) {
            None => true,
            Some(_) if snapshot.settling => false,
            Some(v) => v.record.epoch != r.epoch || v.rank_of(me) != Some(r.rank),
        })
        .map(|(id, _)| id.as_str())
        .collect();
    effects.extend(stale.iter().map(|id| Effect::DropRunner {
        instance: id.to_string(),
    }));

    // 4. This node's ranks.
    for (id, view) in &instances {
        let (Some(rank), Ok(placement)) = (view.rank_of(me), &view.placement) else {
            continue;
        };
        // While settling, a runner of another epoch or rank is kept (step 3): leave it be
        // rather than drive it as this view's runner.
        if snapshot.settling
            && local
                .runners
                .get(id)
                .is_some_and(|r| r.epoch != view.record.epoch || r.rank != rank)
        {
            continue;
        }
        let reference = &view.record.intent.model;
        let model = local.models.get(reference);
        let runner = local
            .runners
            .get(id)
            .filter(|_| !stale.contains(id.as_str()));
        let mine = runner.map(|r| r.status.clone());
        let n_layers = view.record.intent.input.model.n_layers as usize;
        let part = Part::of_rank(placement, rank, n_layers);
        let fetched = model.zip(part.as_ref()).and_then(|(m, p)| m.fetch.part(p));
        let ready = match model {
            Some(m) if m.fetch == Fetch::No => m.ready,
            Some(_) => fetched == Some(&FetchState::Done),
            None => false,
        };
        let plan = view.plan_input(snapshot, rank, mine.as_ref(), ready);
        let instance = id.clone();
        let ring_size = placement.ranks.len();
        match next_action(&plan) {
            Action::Wait => {}
            Action::CreateRunner => effects.push(Effect::CreateRunner {
                instance,
                epoch: view.record.epoch,
                rank,
                ranks: ring_size,
                model: reference.clone(),
            }),
            Action::Download => match (model.map(|m| &m.fetch), part, fetched) {
                (Some(Fetch::Hub(_)), Some(part), Some(FetchState::Failed(why))) => {
                    effects.push(Effect::MarkFailed {
                        instance,
                        epoch: view.record.epoch,
                        rank,
                        model: reference.clone(),
                        reason: format!(
                            "downloading {} of model {reference} on node {} failed: {why}",
                            part.label(),
                            short(me)
                        ),
                    })
                }
                (Some(Fetch::Hub(_)), Some(part), _) => effects.push(Effect::Download {
                    model: reference.clone(),
                    part,
                }),
                _ => effects.push(Effect::MarkFailed {
                    instance,
                    epoch: view.record.epoch,
                    rank,
                    model: reference.clone(),
                    reason: format!(
                        "model file {} is not on node {}; models other than `default` and \
                         Hugging Face model ids must be at the same path on every node of the \
                         instance",
                        model.map_or(reference.as_str(), |m| m.path.as_str()),
                        short(me)
                    ),
                }),
            },
            action @ (Action::Connect | Action::Load | Action::WarmUp) => {
                let Some(runner) = runner.filter(|r| r.process) else {
                    continue;
                };
                let r = &placement.ranks[rank];
                let effect = match action {
                    Action::Connect => Effect::Connect {
                        instance,
                        rank,
                        hosts: ring_hosts(placement, rank),
                    },
                    Action::Load => Effect::Load {
                        instance,
                        rank,
                        layers: (r.start_layer as usize, r.end_layer as usize),
                        sharding: placement.sharding,
                    },
                    // A ring of one warms up inside `Load`.
                    _ if ring_size > 1 => Effect::WarmUp { instance, rank },
                    _ => continue,
                };
                let command = effect.command().expect("a runner command");
                if !runner.sent.contains(&command) {
                    effects.push(effect);
                }
            }
            Action::ShutDown(reason) => {
                if runner.is_some() {
                    effects.push(Effect::StopRunner {
                        instance,
                        status: RunnerStatus::Shutdown,
                        reason,
                    });
                }
            }
        }
    }
    effects
}

/// The `runner/<id>` records this node must write or remove so that the state shows its
/// runners: `published` is what it last wrote (key → JSON text). Records that did not change
/// are not written again.
pub fn publish(local: &LocalRunners, published: &BTreeMap<String, String>) -> Vec<Effect> {
    let mut effects = Vec::new();
    let mut wanted = BTreeSet::new();
    for (id, r) in &local.runners {
        let record = RunnerRecord::from(r);
        let Ok(value) = serde_json::to_string(&record) else {
            continue;
        };
        let key = format!("{RUNNER_PREFIX}{id}");
        wanted.insert(key.clone());
        if published.get(&key) != Some(&value) {
            effects.push(Effect::WriteRecord { key, value });
        }
    }
    effects.extend(
        published
            .keys()
            .filter(|k| !wanted.contains(*k))
            .map(|key| Effect::RemoveRecord { key: key.clone() }),
    );
    effects
}

#[cfg(test)]
#[path = "reconcile_tests.rs"]
mod tests;
