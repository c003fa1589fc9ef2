//! Chat routing, in one place: [`route`] picks the instance of the requested model by load
//! ([`pick`]: the ready instance with the fewest queued requests), then runs it here when
//! this node holds its rank 0 ([`local`]: render the prompt with the `prompt` crate, queue it
//! on the runner, relay the runner's events (`runners::relay`)), else forwards it to the node that
//! does ([`forward`], whose server half enters [`local`] on that node).

pub mod forward;
pub mod local;
pub mod pick;

use crate::node::Node;
use control::short;
use gateway::{ApiError, CancellationToken, ChatRequest, ChatStream};

/// Routes one chat: pick → local | forward.
pub async fn route(
    node: &Node,
    request: ChatRequest,
    cancel: CancellationToken,
) -> Result<ChatStream, ApiError> {
    let (id, rank0) = pick::pick_instance(node, &request.model)?;
    if rank0 == node.context.node_id() {
        local::chat_here(node, &id, request, cancel).await
    } else {
        tracing::debug!(instance = %id, node = %short(&rank0), "forwarding a chat");
        forward::forward(node, rank0, id, request, cancel).await
    }
}
