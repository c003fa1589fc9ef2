//! Relaying: one request's runner events (the runner protocol's own [`Event`]s, as the
//! scheduler routes them) into the gateway's stream of [`ChatEvent`]s.

use gateway::{ApiError, ChatEvent, FinishReason, TokenLogprob};
use inference::runner::protocol::Event;
use placement::RunnerStatus;

/// Relays a runner's events for one request into the gateway's stream.
pub async fn relay(
    mut events: tokio::sync::mpsc::UnboundedReceiver<Event>,
    tx: gateway::ChatEventSender,
    want_logprobs: bool,
) {
    while let Some(event) = events.recv().await {
        let item = match event {
            Event::Token { text, logprob, .. } => {
                let logprob = want_logprobs.then(|| TokenLogprob {
                    token: text.clone(),
                    logprob,
                    top: vec![],
                });
                Ok(ChatEvent::Token { text, logprob })
            }
            Event::Cached { tokens, .. } => Ok(ChatEvent::Cached {
                tokens: u32::try_from(tokens).unwrap_or(u32::MAX),
            }),
            Event::Done { completion, .. } => Ok(ChatEvent::Done {
                finish_reason: match completion.finish_reason {
                    inference::FinishReason::Length => FinishReason::Length,
                    inference::FinishReason::Stop | inference::FinishReason::Cancelled => {
                        FinishReason::Stop
                    }
                },
                completion_tokens: completion.tokens.len() as u32,
            }),
            Event::State(RunnerStatus::Failed { reason }) => Err(ApiError::instance_lost(reason)),
            Event::Error { message, .. } => Err(ApiError::internal(format!(
                "the model could not generate: {message}"
            ))),
            // The scheduler sends a request no other state.
            Event::State(_) | Event::Stepped => continue,
        };
        let last = !matches!(item, Ok(ChatEvent::Token { .. } | ChatEvent::Cached { .. }));
        if tx.send(item).await.is_err() || last {
            // Gateway gone (dropping `events` cancels the request) or stream complete.
            return;
        }
    }
    let _ = tx
        .send(Err(ApiError::instance_lost(
            "the runner's supervisor stopped",
        )))
        .await;
}
