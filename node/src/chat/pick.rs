//! Load balancing: which instance serves a chat for a model.

use crate::node::Node;
use control::InstanceView;
use gateway::ApiError;

/// The ready instance of `model` with the fewest queued requests (this node's first on a
/// tie, then the smallest id): its id and its rank-0 node. Queues are this node's own
/// counts for its runners and the published `queued` of other nodes' runners.
///
/// Errors: an unknown model is `model_not_found` (listing the models), a known model without
/// a ready instance `no_instance` (saying why when every instance failed).
pub fn pick_instance(node: &Node, model: &str) -> Result<(String, String), ApiError> {
    let snapshot = &node.context.snapshot();
    let (placements, models, runners) = (&node.placements, &node.models, &node.runners);
    let me = snapshot.me.clone();
    let candidates: Vec<InstanceView> = snapshot
        .instances(placements)
        .into_values()
        .filter(|v| models.spec_of(&v.record.intent.model).answers_to(model))
        .collect();
    if candidates.is_empty() {
        return Err(match models.resolve(model) {
            Some(_) => ApiError::no_instance(model),
            None => models.not_found(model, snapshot, placements, &|id| runners.status(id)),
        });
    }
    let mut failures = Vec::new();
    let mut best: Option<((usize, bool, String), String)> = None;
    for view in &candidates {
        let id = view.record.id().to_string();
        let mine = runners.status(&id);
        if !view.is_ready(snapshot, mine.as_ref()) {
            if let Some(f) = view.failure(snapshot, mine.as_ref()) {
                failures.push(format!("{id}: {f}"));
            }
            continue;
        }
        let Ok(placement) = &view.placement else {
            continue;
        };
        let rank0 = placement.ranks[0].node.clone();
        let load = if rank0 == me {
            runners.load(&id)
        } else {
            snapshot.runner(&rank0, &id).map_or(0, |r| r.queued)
        };
        let key = (load, rank0 != me, id);
        if best.as_ref().is_none_or(|(k, _)| key < *k) {
            best = Some((key, rank0));
        }
    }
    if let Some(((_, _, id), rank0)) = best {
        return Ok((id, rank0));
    }
    let mut e = ApiError::no_instance(model);
    if failures.len() == candidates.len() {
        e.message = format!(
            "every instance of model `{model}` failed ({}); delete it with DELETE \
             /instance/{{id}} and create a new one with POST /place_instance \
             {{\"model_id\": \"{model}\"}}",
            failures.join("; ")
        );
    }
    Err(e)
}
