//! Instances at the API: creating one (place it on the live nodes, write the intent),
//! deleting one (write this node's deletion record), previewing every placement of a model,
//! and each instance's answer (`GET /instance/{id}`, the shape of [`gateway::exo::Instance`]);
//! and the live nodes' profiles and verified edges as placement takes them, read out of the
//! snapshot ([`placement_nodes`]).
//!
//! **Instances are intents in the state** (see [`control::intent`]): `POST /place_instance`
//! computes a placement from the live nodes and the model's card, and writes the intent
//! under this node's `instance/<id>`; `DELETE /instance/{id}` on any node writes that node's
//! `deleted/<id>`. Every node computes every placement from the intents ([`control::view`]).

use crate::node::Node;
use control::{
    instance_slug, DeletedRecord, InstanceRecord, InstanceView, Intent, Snapshot, DELETED_PREFIX,
    INSTANCE_PREFIX,
};
use gateway::exo::{self, Instance, InstancePreviews, NodeMemory, Preview};
use gateway::{ApiError, ErrorKind};
use mesh::probe::{EdgeRecord, EDGE_PREFIX};
use mesh::profile::{HostProfile, PROFILE_KEY};
use models::ModelSpec;
use placement::Edge;
use placement::{CollectiveBackend, Input, PlaceError, Request, RunnerStatus, Sharding};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;

/// A placement failure as an API error: bad input is the client's (400), the rest is the
/// cluster's capacity (503), each with the placement's stable code.
pub fn place_error(e: &PlaceError) -> ApiError {
    let kind = match e {
        PlaceError::InvalidInput { .. } => ErrorKind::InvalidRequest,
        _ => ErrorKind::Unavailable,
    };
    ApiError::new(kind, format!("cannot place the instance: {e}")).with_code(e.code())
}

/// `instance_not_found`, pointing at `GET /state`.
pub fn instance_not_found(id: &str) -> ApiError {
    ApiError::new(
        ErrorKind::NotFound,
        format!("no instance `{id}`; see GET /state for the instances"),
    )
    .with_code("instance_not_found")
}

/// What to create: the fields of `POST /place_instance` and `POST /instance`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewInstance {
    /// The model, as a user names it.
    pub model: String,
    /// How to split it.
    pub sharding: Sharding,
    /// How its nodes talk.
    pub backend: CollectiveBackend,
    /// At least this many nodes.
    pub min_nodes: u32,
    /// Nodes it must run on.
    pub required_nodes: Vec<String>,
}

/// The instances as one node sees them: its context (the state, its writes), its models, its
/// runners and its downloads (a model id placed here that is not downloaded yet is fetched
/// first).
pub struct Instances<'a> {
    /// The node.
    pub node: &'a Node,
}

impl Instances<'_> {
    /// This node's runner status by instance id.
    fn mine(&self) -> impl Fn(&str) -> Option<RunnerStatus> + '_ {
        |id| self.node.runners.status(id)
    }

    /// The placement input for `spec` on the live nodes now, each node's free memory less
    /// what the live instances hold there ([`control::commitments`]).
    pub async fn placement_input(
        &self,
        spec: &ModelSpec,
        request: Request,
    ) -> Result<Input, ApiError> {
        let facts = self
            .node
            .models
            .facts(spec, &self.node.context.node_id())
            .await?;
        let snapshot = self.node.context.snapshot();
        let (mut nodes, edges) = placement_nodes(&snapshot);
        let instances = snapshot.instances(&self.node.placements);
        let loaded = |view: &InstanceView, rank: usize| {
            let Ok(placement) = &view.placement else {
                return false;
            };
            let node = &placement.ranks[rank].node;
            let status = if *node == snapshot.me {
                self.node.runners.status(view.record.id())
            } else {
                snapshot
                    .runner(node, view.record.id())
                    .filter(|r| r.epoch == view.record.epoch && r.rank == rank)
                    .map(|r| r.status)
            };
            status.is_some_and(|s| s.holds_memory())
        };
        let held = control::commitments::committed_memory(instances.values(), loaded);
        control::commitments::without_committed(&mut nodes, &held);
        let model = facts.card(&spec.id);
        if let Ok(id) = hub::ModelId::parse(&spec.reference) {
            let held = models::sources::held_weight_bytes(&snapshot, &id);
            models::sources::prefer_holders(&mut nodes, &model.id, &held, facts.bytes_on_disk);
        }
        Ok(Input {
            nodes,
            edges,
            model,
            request,
        })
    }

    /// Creates an instance: places it on the live nodes and writes the intent, under an id
    /// made of the model, this node, its generation and the next number of the node's
    /// `next_instance` (which counts this start's instances). Answers the instance as
    /// `GET /instance/{id}` shows it.
    pub async fn create(&self, new: NewInstance) -> Result<Instance, ApiError> {
        let snapshot = self.node.context.snapshot();
        self.fetch_if_missing(&new.model).await?;
        let Some(spec) = self.node.models.resolve(&new.model) else {
            return Err(self.node.models.not_found(
                &new.model,
                &snapshot,
                &self.node.placements,
                &self.mine(),
            ));
        };
        let me = self.node.context.node_id();
        let n = self.node.next_instance.fetch_add(1, Ordering::SeqCst);
        let id = format!(
            "{}-{}-{:x}-{n}",
            instance_slug(&spec.id),
            &me[..8.min(me.len())],
            self.node.context.generation()
        );
        let request = Request {
            sharding: new.sharding,
            backend: new.backend,
            min_nodes: new.min_nodes,
            required_nodes: new.required_nodes,
            instance_id: id.clone(),
        };
        let input = self.placement_input(&spec, request).await?;
        let record = InstanceRecord::new(Intent {
            instance_id: id.clone(),
            model: spec.reference.clone(),
            model_id: spec.id.clone(),
            created_by: me,
            input,
        });
        let placement = self
            .node
            .placements
            .place(&record)
            .map_err(|e| place_error(&e))?;
        let value = serde_json::to_value(&record)
            .map_err(|e| ApiError::internal(format!("encoding the intent: {e}")))?;
        self.node
            .context
            .write(&format!("{INSTANCE_PREFIX}{id}"), &value)
            .map_err(|e| {
                ApiError::new(
                    ErrorKind::Unavailable,
                    format!("cannot record the instance in the state: {e}"),
                )
            })?;
        tracing::info!(instance = %id, model = %spec.id, ranks = placement.ranks.len(), "instance placed");
        let snapshot = self.node.context.snapshot();
        let view = InstanceView {
            record,
            placement: Ok(placement),
        };
        Ok(self.answer(&view, &snapshot))
    }

    /// Instance `id` as the API shows it.
    pub fn get(&self, id: &str) -> Result<Instance, ApiError> {
        let snapshot = self.node.context.snapshot();
        let view = snapshot
            .instances(&self.node.placements)
            .remove(id)
            .ok_or_else(|| instance_not_found(id))?;
        Ok(self.answer(&view, &snapshot))
    }

    /// Deletes instance `id` (writes this node's deletion record, drops its own copy);
    /// answers it as it was.
    pub fn delete(&self, id: &str) -> Result<Instance, ApiError> {
        let answer = self.get(id)?;
        let record = serde_json::to_value(DeletedRecord {
            instance_id: id.to_string(),
            seq: self.node.context.snapshot().next_deletion_seq(),
        })
        .map_err(|e| ApiError::internal(e.to_string()))?;
        self.node
            .context
            .write(&format!("{DELETED_PREFIX}{id}"), &record)
            .map_err(|e| {
                ApiError::new(
                    ErrorKind::Unavailable,
                    format!("cannot record the deletion in the state: {e}"),
                )
            })?;
        self.node.context.remove(&format!("{INSTANCE_PREFIX}{id}"));
        tracing::info!(instance = %id, "instance deleted");
        Ok(answer)
    }

    /// Every instance, by id, as the API shows it.
    pub fn all(&self) -> BTreeMap<String, Instance> {
        let snapshot = self.node.context.snapshot();
        snapshot
            .instances(&self.node.placements)
            .values()
            .map(|v| (v.record.id().to_string(), self.answer(v, &snapshot)))
            .collect()
    }

    /// The instance as the API shows it: intent, placement (or why none), and each rank's
    /// runner.
    pub fn answer(&self, view: &InstanceView, snapshot: &Snapshot) -> Instance {
        let id = view.record.id();
        let mine = self.node.runners.status(id);
        let intent = &view.record.intent;
        let spec = self.node.models.spec_of(&intent.model);
        let statuses = view.rank_statuses(snapshot, mine.as_ref());
        let (placement, error) = exo::placement_or_error(view.placement.as_ref());
        let request = &view.record.placement_input().request;
        let ranks = match &view.placement {
            Ok(p) => p
                .ranks
                .iter()
                .zip(&statuses)
                .enumerate()
                .map(|(rank, (r, (_, record)))| exo::Rank {
                    rank,
                    node: r.node.clone(),
                    start_layer: r.start_layer,
                    end_layer: r.end_layer,
                    runner: record.as_ref().map(|r| r.status.clone()),
                    queued_requests: record.as_ref().map(|r| r.queued),
                    download: snapshot
                        .authors
                        .get(&r.node)
                        .and_then(|a| {
                            a.rank_download(
                                &intent.model,
                                request.sharding,
                                (r.start_layer, r.end_layer),
                            )
                        })
                        .and_then(|d| serde_json::to_value(d).ok()),
                })
                .collect(),
            Err(_) => vec![],
        };
        let runners: BTreeMap<String, RunnerStatus> = statuses
            .iter()
            .filter_map(|(node, r)| r.as_ref().map(|r| (node.clone(), r.status.clone())))
            .collect();
        let failure = view.failure(snapshot, mine.as_ref());
        let status = view.status(snapshot, mine.as_ref());
        let queued = statuses
            .first()
            .and_then(|(_, r)| r.as_ref().map(|r| r.queued));
        Instance {
            instance_id: id.to_string(),
            model_id: intent.model_id.clone(),
            model: intent.model.clone(),
            model_path: spec.path.display().to_string(),
            sharding: request.sharding,
            instance_meta: request.backend,
            min_nodes: intent.input.request.min_nodes,
            created_by: intent.created_by.clone(),
            epoch: view.record.epoch,
            excluded: view.record.excluded.clone(),
            status,
            failure,
            placement,
            error,
            ranks,
            runners,
            runner_pid: self.node.runners.pid(id),
            queued_requests: queued,
        }
    }

    /// Fetches the configuration, tokenizer and index of a Hugging Face model id that is not
    /// in this node's cache (not its weights: placing reads only the configuration), so that
    /// placing `org/name` needs no `shoal download` first; each rank's node then fetches the
    /// weight files of its own layers when it sees the instance. Placing a model again retries
    /// this node's failed downloads of it.
    async fn fetch_if_missing(&self, model: &str) -> Result<(), ApiError> {
        if !hub::ModelId::looks_like_id(model) {
            return Ok(());
        }
        self.node.downloads.forget_failures(model);
        if self.node.models.resolve(model).is_some() {
            return Ok(());
        }
        self.node
            .downloads
            .fetch_support(model, self.node.cluster())
            .await
            .map_err(|e| {
                let snapshot = self.node.context.snapshot();
                let available =
                    self.node
                        .models
                        .ids(&snapshot, &self.node.placements, &self.mine());
                ApiError::new(
                    gateway::ErrorKind::Unavailable,
                    format!(
                        "cannot download model `{model}`: {e}; models available here: {}",
                        available.join(", ")
                    ),
                )
                .with_code("model_download_failed")
            })
    }

    /// `GET /instance/previews`: every sharding × backend × node count for `model`, with the
    /// live nodes' memory.
    pub async fn previews(&self, model: &str) -> Result<InstancePreviews, ApiError> {
        let Some(spec) = self.node.models.resolve(model) else {
            let snapshot = self.node.context.snapshot();
            return Err(self.node.models.not_found(
                model,
                &snapshot,
                &self.node.placements,
                &self.mine(),
            ));
        };
        let base = self
            .placement_input(
                &spec,
                Request {
                    sharding: Sharding::Pipeline,
                    backend: CollectiveBackend::Ring,
                    min_nodes: 1,
                    required_nodes: vec![],
                    instance_id: placement::DEFAULT_INSTANCE_ID.into(),
                },
            )
            .await?;
        let nodes = base
            .nodes
            .iter()
            .map(|n| NodeMemory {
                node: n.id.clone(),
                ram_available: n.ram_available,
                ram_total: n.ram_total,
            })
            .collect();
        let previews = previews_for(&spec, &base);
        let facts = self
            .node
            .models
            .facts(&spec, &self.node.context.node_id())
            .await?;
        Ok(InstancePreviews {
            model_id: spec.id.clone(),
            model: base.model,
            shape: facts.shape.clone(),
            nodes,
            previews,
        })
    }
}

/// Every combination's placement (or why none) on `base`'s nodes ([`placement::previews`]),
/// as the API shows it.
fn previews_for(spec: &ModelSpec, base: &Input) -> Vec<Preview> {
    placement::previews(base)
        .into_iter()
        .map(|p| {
            let (placement, error) = exo::placement_or_error(p.placed.as_ref());
            Preview {
                model_id: spec.id.clone(),
                sharding: p.sharding,
                instance_meta: p.backend,
                node_count: p.node_count,
                placement,
                error,
            }
        })
        .collect()
}

/// The live nodes' profiles and the edges between them, as placement takes them.
pub fn placement_nodes(snapshot: &Snapshot) -> (Vec<placement::NodeProfile>, Vec<Edge>) {
    let live: BTreeSet<&str> = snapshot
        .authors
        .iter()
        .filter(|(id, a)| a.alive || **id == snapshot.me)
        .map(|(id, _)| id.as_str())
        .collect();
    let mut nodes = Vec::new();
    let mut edges = Vec::new();
    for (id, author) in &snapshot.authors {
        if !live.contains(id.as_str()) {
            continue;
        }
        let Some(profile) = author
            .records
            .get(PROFILE_KEY)
            .and_then(|p| serde_json::from_str::<HostProfile>(p).ok())
        else {
            continue;
        };
        nodes.push(profile.placement_profile(id));
        for edge in author
            .records
            .range(EDGE_PREFIX.to_string()..)
            .take_while(|(k, _)| k.starts_with(EDGE_PREFIX))
            .filter_map(|(_, v)| {
                serde_json::from_str::<EdgeRecord>(v)
                    .ok()?
                    .placement_edge(id)
            })
        {
            if live.contains(edge.to.as_str()) {
                edges.push(edge);
            }
        }
    }
    (nodes, edges)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_errors_map_to_statuses() {
        let e = place_error(&PlaceError::NoRingWithEnoughMemory {
            needed: 2,
            available: 1,
            min_nodes: 1,
        });
        assert_eq!(e.status().as_u16(), 503);
        assert_eq!(e.code.as_deref(), Some("no_ring_with_enough_memory"));
        let e = place_error(&PlaceError::InvalidInput {
            field: "nodes".into(),
            reason: "x".into(),
        });
        assert_eq!(e.status().as_u16(), 400);
    }

    #[test]
    fn the_fixture_is_placed_by_what_its_runner_holds_not_its_file() {
        let path = models::locate::default_model_path();
        let facts = facts::read(&path).expect("the SmolLM2 fixture");
        let card = facts.card("default");
        assert!(facts.bytes_on_disk < 110_000_000, "{}", facts.bytes_on_disk);
        // Weights as the CPU runs them (its Q4_1 and Q8_0 repacked with their f16 scales: the
        // file's 98 MB; 538 MB as f32), 8192 positions of KV (377 MB), a runner's overhead
        // (160 MB).
        assert_eq!(facts.memory.weights, 98_346_240);
        assert_eq!(facts.memory.kv_budget, 8192 * 46_080);
        assert_eq!(card.storage_bytes, facts.memory.total());
        assert!(card.storage_bytes > 600_000_000);
    }

    #[test]
    fn placement_input_comes_from_live_profiles_and_edges() {
        use control::fixture::{author, json};
        use mesh::interfaces::Interface;
        use placement::{ComputeBackend, InterfaceKind, Link};
        let profile = |ip: &str| HostProfile {
            name: "h".into(),
            os: "linux".into(),
            os_version: "6".into(),
            cpu: "x".into(),
            cpu_cores: 2,
            memory_total: 8 << 30,
            memory_available: 4 << 30,
            backends: vec![ComputeBackend::MlxCpu],
            gpus: vec![],
            interfaces: vec![Interface::new(
                "eth0",
                ip.parse().unwrap(),
                24,
                InterfaceKind::Ethernet,
            )],
            api_port: 52415,
            version: "0.1.0".into(),
            protocol: 1,
        };
        let edge = |from: &str, to: &str, ip: &str| EdgeRecord {
            edge: Edge {
                from: from.into(),
                to: to.into(),
                link: Link::Ip(ip.parse().unwrap()),
            },
            remote_interface: "eth0".into(),
            remote_kind: InterfaceKind::Ethernet,
            local_interface: Some("eth0".into()),
            local_kind: Some(InterfaceKind::Ethernet),
        };
        let snap = Snapshot {
            settling: false,
            me: "a".into(),
            authors: [
                (
                    "a".to_string(),
                    author(
                        true,
                        &[
                            (PROFILE_KEY.into(), json(&profile("10.0.0.1"))),
                            ("edge/b/10.0.0.2".into(), json(&edge("a", "b", "10.0.0.2"))),
                            ("edge/c/10.0.0.3".into(), json(&edge("a", "c", "10.0.0.3"))),
                        ],
                    ),
                ),
                (
                    "b".to_string(),
                    author(
                        true,
                        &[
                            (PROFILE_KEY.into(), json(&profile("10.0.0.2"))),
                            ("edge/a/10.0.0.1".into(), json(&edge("b", "a", "10.0.0.1"))),
                        ],
                    ),
                ),
                (
                    "c".to_string(),
                    author(false, &[(PROFILE_KEY.into(), json(&profile("10.0.0.3")))]),
                ),
            ]
            .into(),
        };
        let (nodes, edges) = placement_nodes(&snap);
        let ids: Vec<&str> = nodes.iter().map(|n| n.id.as_str()).collect();
        assert_eq!(ids, ["a", "b"], "dead node c is left out");
        assert_eq!(nodes[0].ram_available, 4 << 30);
        assert_eq!(nodes[0].backends, vec![ComputeBackend::MlxCpu]);
        assert_eq!(
            edges,
            vec![
                Edge {
                    from: "a".into(),
                    to: "b".into(),
                    link: Link::Ip("10.0.0.2".parse().unwrap())
                },
                Edge {
                    from: "b".into(),
                    to: "a".into(),
                    link: Link::Ip("10.0.0.1".parse().unwrap())
                },
            ]
        );
    }
}
