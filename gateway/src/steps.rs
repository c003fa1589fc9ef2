//! The gateway's own guarantees over a backend's events, whatever the backend does: stop
//! strings cut the text (and end generation), `max_tokens` is never exceeded, a cancelled
//! generation ends as a stop, and a stream that ends without `Done` is a lost instance,
//! never a hang. [`crate::generation`] drives every API's answers through it.

use crate::backend::{ChatEvent, FinishReason, TokenLogprob};
use crate::error::ApiError;
use crate::openai::stop::StopMatcher;

/// What the gateway makes of one backend event.
#[derive(Debug, PartialEq)]
pub(crate) enum Step {
    /// Text (possibly empty while a stop string may be starting) to send.
    Delta {
        text: String,
        logprob: Option<TokenLogprob>,
    },
    /// Generation is over; `text` is the last of it.
    Finished {
        text: String,
        logprob: Option<TokenLogprob>,
        finish_reason: FinishReason,
        stop_sequence: Option<String>,
        completion_tokens: u32,
        /// Prompt tokens the engine took from its prompt cache.
        cached_tokens: u32,
    },
    /// The instance failed; the error says why.
    Failed(ApiError),
}

/// The gateway's own guarantees over a backend's events: stop strings, `max_tokens`, and an
/// end to every stream.
#[derive(Debug)]
pub(crate) struct Generation {
    stop: StopMatcher,
    max_tokens: Option<u32>,
    tokens: u32,
    want_logprobs: bool,
    cached_tokens: u32,
}

impl Generation {
    pub(crate) fn new(stop: &[String], max_tokens: Option<u32>, want_logprobs: bool) -> Generation {
        Generation {
            stop: StopMatcher::new(stop),
            max_tokens,
            tokens: 0,
            want_logprobs,
            cached_tokens: 0,
        }
    }

    /// The event that ends a cancelled generation: a stop after the tokens so far.
    pub(crate) fn cancelled(&self) -> ChatEvent {
        ChatEvent::Done {
            finish_reason: FinishReason::Stop,
            completion_tokens: self.tokens,
        }
    }

    pub(crate) fn step(&mut self, event: Option<Result<ChatEvent, ApiError>>) -> Step {
        match event {
            Some(Ok(ChatEvent::Token { text, logprob })) => {
                self.tokens = self.tokens.saturating_add(1);
                let logprob = logprob.filter(|_| self.want_logprobs);
                let scan = self.stop.push(&text);
                if scan.stopped {
                    return Step::Finished {
                        text: scan.emit,
                        logprob,
                        finish_reason: FinishReason::Stop,
                        stop_sequence: scan.matched,
                        completion_tokens: self.tokens,
                        cached_tokens: self.cached_tokens,
                    };
                }
                if self.max_tokens.is_some_and(|max| self.tokens >= max) {
                    let mut text = scan.emit;
                    text.push_str(&self.stop.finish());
                    return Step::Finished {
                        text,
                        logprob,
                        finish_reason: FinishReason::Length,
                        stop_sequence: None,
                        completion_tokens: self.tokens,
                        cached_tokens: self.cached_tokens,
                    };
                }
                Step::Delta {
                    text: scan.emit,
                    logprob,
                }
            }
            Some(Ok(ChatEvent::Cached { tokens })) => {
                self.cached_tokens = tokens;
                Step::Delta {
                    text: String::new(),
                    logprob: None,
                }
            }
            Some(Ok(ChatEvent::Done {
                finish_reason,
                completion_tokens,
            })) => Step::Finished {
                text: self.stop.finish(),
                logprob: None,
                finish_reason,
                stop_sequence: None,
                completion_tokens: completion_tokens.max(self.tokens),
                cached_tokens: self.cached_tokens,
            },
            Some(Err(e)) => Step::Failed(e),
            None => Step::Failed(ApiError::instance_lost(
                "the generation ended without finishing",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(t: &str) -> Option<Result<ChatEvent, ApiError>> {
        Some(Ok(ChatEvent::Token {
            text: t.into(),
            logprob: None,
        }))
    }

    #[test]
    fn max_tokens_ends_with_length() {
        let mut g = Generation::new(&[], Some(2), false);
        assert!(matches!(g.step(token("a")), Step::Delta { .. }));
        match g.step(token("b")) {
            Step::Finished {
                text,
                finish_reason,
                completion_tokens,
                ..
            } => {
                assert_eq!(text, "b");
                assert_eq!(finish_reason, FinishReason::Length);
                assert_eq!(completion_tokens, 2);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn stop_string_ends_with_stop_and_cut_text() {
        let mut g = Generation::new(&["##".into(), "zz".into()], None, false);
        assert_eq!(
            g.step(token("ab#")),
            Step::Delta {
                text: "ab".into(),
                logprob: None
            }
        );
        match g.step(token("#cd")) {
            Step::Finished {
                text,
                finish_reason,
                stop_sequence,
                ..
            } => {
                assert_eq!(text, "");
                assert_eq!(finish_reason, FinishReason::Stop);
                assert_eq!(stop_sequence.as_deref(), Some("##"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn cached_tokens_reach_the_end_even_when_the_gateway_ends_first() {
        let mut g = Generation::new(&[], Some(1), false);
        assert_eq!(
            g.step(Some(Ok(ChatEvent::Cached { tokens: 40 }))),
            Step::Delta {
                text: String::new(),
                logprob: None
            }
        );
        match g.step(token("a")) {
            Step::Finished { cached_tokens, .. } => assert_eq!(cached_tokens, 40),
            other => panic!("{other:?}"),
        }
        // Without the event, none.
        let mut g = Generation::new(&[], None, false);
        let done = Some(Ok(ChatEvent::Done {
            finish_reason: FinishReason::Stop,
            completion_tokens: 0,
        }));
        assert!(matches!(
            g.step(done),
            Step::Finished {
                cached_tokens: 0,
                ..
            }
        ));
    }

    #[test]
    fn closed_stream_is_a_lost_instance() {
        let mut g = Generation::new(&[], None, false);
        match g.step(None) {
            Step::Failed(e) => assert_eq!(e.code.as_deref(), Some("instance_lost")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn done_flushes_held_text() {
        let mut g = Generation::new(&["xyz".into()], None, false);
        assert_eq!(
            g.step(token("ax")),
            Step::Delta {
                text: "a".into(),
                logprob: None
            }
        );
        let done = Some(Ok(ChatEvent::Done {
            finish_reason: FinishReason::Stop,
            completion_tokens: 1,
        }));
        match g.step(done) {
            Step::Finished {
                text,
                stop_sequence,
                ..
            } => {
                assert_eq!(text, "x");
                assert_eq!(stop_sequence, None);
            }
            other => panic!("{other:?}"),
        }
    }
}
