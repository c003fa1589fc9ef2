//! Local chat: a request for an instance whose rank 0 is on this node runs on its runner here.

use crate::node::Node;
use control::short;
use gateway::{ApiError, CancellationToken, ChatRequest, ChatStream, ErrorKind};
use inference::Prompt;

/// Runs `request` on instance `id`'s rank-0 runner on this node: renders and tokenizes the
/// prompt, queues the generation, and relays its events. A runner whose batch and queue are
/// full answers 429 with `Retry-After` ([`ApiError::busy`]).
pub async fn chat_here(
    node: &Node,
    id: &str,
    request: ChatRequest,
    cancel: CancellationToken,
) -> Result<ChatStream, ApiError> {
    let me = node.context.node_id();
    let Some((runner, model)) = node.runners.ready_rank0(id) else {
        return Err(ApiError::new(
            ErrorKind::Unavailable,
            format!(
                "instance `{id}` is not ready on node {} (its rank 0); retry",
                short(&me)
            ),
        )
        .with_code("no_instance"));
    };
    let facts = node.models.facts(&model, &me).await?;
    let want_logprobs = request.sampling.logprobs.is_some();
    let (generate, form) =
        tokio::task::spawn_blocking(move || prompt::generate_request(&request, &facts))
            .await
            .map_err(|e| ApiError::internal(format!("building the prompt failed: {e}")))??;
    let prompt_tokens = match &generate.prompt {
        Prompt::Tokens(ids) => ids.len() as u32,
        _ => 0,
    };
    let events = runner.generate(generate, cancel).map_err(ApiError::busy)?;
    let (tx, stream) = ChatStream::channel(prompt_tokens, 64);
    let stream = stream.with_form(form);
    tokio::spawn(runners::relay::relay(events, tx, want_logprobs));
    // The queue length changed: publish it soon.
    node.wake.notify_one();
    Ok(stream)
}
