//! Relaying: one request's runner events (the runner protocol's own [`Event`]s, as the
//! scheduler routes them) into the gateway's stream of [`ChatEvent`]s.

use gateway::{ApiError, ChatEvent, FinishReason, TokenLogprob};
use placement::RunnerStatus;
use wire::request::TokenLogprobs;
use wire::runner::Event;

/// Relays a runner's events for one request into the gateway's stream.
pub async fn relay(
    mut events: tokio::sync::mpsc::UnboundedReceiver<Event>,
    tx: gateway::ChatEventSender,
    want_logprobs: bool,
) {
    while let Some(event) = events.recv().await {
        let item = match event {
            Event::Token {
                text,
                logprob,
                top_logprobs,
                ..
            } => {
                let logprob = want_logprobs.then(|| token_logprob(&text, logprob, top_logprobs));
                Ok(ChatEvent::Token { text, logprob })
            }
            Event::Cached { tokens, .. } => Ok(ChatEvent::Cached {
                tokens: u32::try_from(tokens).unwrap_or(u32::MAX),
            }),
            Event::Done { completion, .. } => Ok(ChatEvent::Done {
                finish_reason: match completion.finish_reason {
                    wire::request::FinishReason::Length => FinishReason::Length,
                    wire::request::FinishReason::Stop | wire::request::FinishReason::Cancelled => {
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

/// The gateway's view of a token's log probability: with `top_logprobs` asked, the token's own
/// text and its alternatives as the runner decoded them; otherwise the text it streams.
fn token_logprob(text: &str, logprob: f32, top: Option<TokenLogprobs>) -> TokenLogprob {
    match top {
        Some(t) => {
            // Bytes travel only when the runner sent them (older runners do not).
            let bytes = if t.bytes.is_empty() {
                Vec::new()
            } else {
                std::iter::once(t.bytes)
                    .chain(t.top.iter().map(|a| a.bytes.clone()))
                    .collect()
            };
            TokenLogprob {
                token: t.text,
                logprob,
                top: t.top.into_iter().map(|a| (a.text, a.logprob)).collect(),
                bytes,
            }
        }
        None => TokenLogprob {
            token: text.to_owned(),
            logprob,
            ..Default::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::request::TopLogprob;

    #[test]
    fn a_tokens_alternatives_reach_the_gateway_in_order() {
        let top = TokenLogprobs {
            text: " Paris".into(),
            bytes: b" Paris".to_vec(),
            top: vec![
                TopLogprob {
                    token: 9,
                    text: " Paris".into(),
                    logprob: -0.1,
                    bytes: b" Paris".to_vec(),
                },
                TopLogprob {
                    token: 4,
                    text: "\u{FFFD}".into(),
                    logprob: -2.5,
                    bytes: vec![0xe2],
                },
            ],
        };
        let l = token_logprob("", -0.1, Some(top));
        assert_eq!(l.token, " Paris");
        assert_eq!(l.logprob, -0.1);
        assert_eq!(
            l.top,
            vec![(" Paris".to_string(), -0.1), ("\u{FFFD}".to_string(), -2.5)]
        );
        assert_eq!(
            (l.token_bytes(), l.top_bytes(1)),
            (&b" Paris"[..], &[0xe2][..])
        );
        let plain = token_logprob("Pa", -0.3, None);
        assert_eq!((plain.token.as_str(), plain.top.len()), ("Pa", 0));
    }
}
