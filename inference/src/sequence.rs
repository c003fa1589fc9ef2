//! What happens to each token one sequence produces, however it was computed (alone by
//! [`crate::generate::generate`] or in a batch by [`crate::batch::Batcher`]): end tokens,
//! stop strings, `max_tokens`, incremental detokenizing, streaming, and the completion it
//! builds. One implementation, so a request behaves the same alone and in a batch.

use crate::detokenizer::{StopCheck, StopMatcher, StreamDecoder};
use crate::error::Result;
use crate::request::{
    Completion, FinishReason, GenerateRequest, TokenEvent, TokenLogprobs, TopLogprob,
};
use crate::sampling::Sampled;
use crate::tokenizer::Tokenizer;
use std::ops::ControlFlow;

/// The output side of one sequence.
pub struct SequenceOutput {
    decoder: StreamDecoder,
    stops: StopMatcher,
    out: Completion,
    max_tokens: usize,
    ignore_eos: bool,
    stop_token_ids: Vec<u32>,
    stopped_by_string: bool,
    /// The request's `top_logprobs` (0: its tokens report no alternatives).
    top_logprobs: usize,
}

impl SequenceOutput {
    /// The output of `request`, whose prompt has `prompt_tokens` tokens, generating at most
    /// `max_tokens` (already bounded by the context).
    pub fn new(request: &GenerateRequest, prompt_tokens: usize, max_tokens: usize) -> Self {
        SequenceOutput {
            decoder: StreamDecoder::new(),
            stops: StopMatcher::new(&request.stop),
            out: Completion {
                text: String::new(),
                tokens: vec![],
                logprobs: vec![],
                finish_reason: FinishReason::Length,
                prompt_tokens,
                cached_tokens: 0,
                prompt_seconds: 0.0,
                generation_seconds: 0.0,
            },
            max_tokens,
            ignore_eos: request.ignore_eos,
            stop_token_ids: request.stop_token_ids.clone(),
            stopped_by_string: false,
            top_logprobs: request.sampling.top_logprobs,
        }
    }

    /// The completion so far (its timings are the caller's to fill in).
    pub fn completion_mut(&mut self) -> &mut Completion {
        &mut self.out
    }

    /// Tokens generated so far.
    pub fn generated(&self) -> usize {
        self.out.tokens.len()
    }

    /// Takes the next sampled token, streaming its text through `on_token`. Returns whether
    /// the sequence is over (an end token, a stop string, `max_tokens`, or `on_token` asked
    /// to stop).
    pub fn push(
        &mut self,
        tokenizer: &Tokenizer,
        s: Sampled,
        on_token: &mut dyn FnMut(TokenEvent<'_>) -> ControlFlow<()>,
    ) -> Result<bool> {
        self.out.tokens.push(s.token);
        self.out.logprobs.push(s.logprob);
        let is_end = (!self.ignore_eos && tokenizer.eos_token_ids.contains(&s.token))
            || self.stop_token_ids.contains(&s.token);
        if is_end {
            self.out.finish_reason = FinishReason::Stop;
            return Ok(true);
        }
        let piece = self.decoder.push(tokenizer, s.token)?;
        let (emit, stopped) = match self.stops.push(&piece) {
            StopCheck::Continue(t) => (t, false),
            StopCheck::Stop(t) => (t, true),
        };
        let top = (self.top_logprobs > 0).then(|| token_logprobs(tokenizer, &s));
        if on_token(TokenEvent {
            token: s.token,
            text: &emit,
            logprob: s.logprob,
            top_logprobs: top.as_ref(),
        })
        .is_break()
        {
            self.out.finish_reason = FinishReason::Cancelled;
            return Ok(true);
        }
        if stopped {
            self.stopped_by_string = true;
            self.out.finish_reason = FinishReason::Stop;
            return Ok(true);
        }
        Ok(self.out.tokens.len() >= self.max_tokens)
    }

    /// Ends the sequence because its caller cancelled it.
    pub fn cancel(&mut self) {
        self.out.finish_reason = FinishReason::Cancelled;
    }

    /// The completion: flushes an incomplete character and any text held back for a possible
    /// stop string through `on_token` (unless a stop string or a cancel ended it).
    pub fn finish(
        mut self,
        tokenizer: &Tokenizer,
        on_token: &mut dyn FnMut(TokenEvent<'_>) -> ControlFlow<()>,
    ) -> Result<Completion> {
        if !self.stopped_by_string && self.out.finish_reason != FinishReason::Cancelled {
            let tail = self.decoder.finish(tokenizer)?;
            let rest = match self.stops.push(&tail) {
                StopCheck::Stop(t) => t,
                StopCheck::Continue(t) => t + &self.stops.finish(),
            };
            if !rest.is_empty() {
                let _ = on_token(TokenEvent {
                    token: *self.out.tokens.last().unwrap_or(&0),
                    text: &rest,
                    logprob: 0.0,
                    top_logprobs: None,
                });
            }
        }
        self.out.text = self.stops.text().to_owned();
        Ok(self.out)
    }
}

/// The sampled token's own text and bytes and its alternatives' (each decoded alone; an id
/// the tokenizer does not know, in a vocabulary padded past it, reads as empty text).
fn token_logprobs(tokenizer: &Tokenizer, s: &Sampled) -> TokenLogprobs {
    let text_and_bytes = |id: u32| {
        let text = tokenizer.decode(&[id], false).unwrap_or_default();
        (text.clone(), tokenizer.bytes_of_decoded(id, text))
    };
    let (text, bytes) = text_and_bytes(s.token);
    TokenLogprobs {
        text,
        bytes,
        top: s
            .top
            .iter()
            .map(|&(token, logprob)| {
                let (text, bytes) = text_and_bytes(token);
                TopLogprob {
                    token,
                    text,
                    logprob,
                    bytes,
                }
            })
            .collect(),
    }
}
