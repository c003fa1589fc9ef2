//! Generation: the one loop that turns a request into a completion over any [`Forward`],
//! with prompt checks, sampling (on the device for greedy requests, one step ahead), stop
//! tokens and strings, streaming and cancellation. Loading lives in [`crate::loader`].

use crate::config::ModelConfig;
use crate::detokenizer::{StopCheck, StopMatcher, StreamDecoder};
use crate::error::{InferenceError, Result};
use crate::forward::{Forward, StepInput};
use crate::request::{Completion, FinishReason, GenerateRequest, Prompt, TokenEvent};
use crate::sampling::Sampler;
use crate::tokenizer::Tokenizer;
use std::ops::ControlFlow;
use std::time::Instant;

/// The prompt as token ids.
pub fn prompt_ids(tokenizer: &Tokenizer, prompt: &Prompt) -> Result<Vec<u32>> {
    match prompt {
        Prompt::Text(t) => tokenizer.encode_prompt(t),
        Prompt::Chat(messages) => {
            let text = tokenizer.apply_chat_template(messages, true)?;
            tokenizer.encode(&text)
        }
        Prompt::Tokens(ids) => Ok(ids.clone()),
    }
}

/// Checks a request before any work starts (so a distributed forward never begins a step it
/// cannot finish): sampling parameters, an empty or too long prompt, token ids outside the
/// vocabulary. Returns the prompt's token ids.
pub fn check_request(
    config: &ModelConfig,
    tokenizer: &Tokenizer,
    request: &GenerateRequest,
) -> Result<Vec<u32>> {
    request.sampling.validate()?;
    let prompt = prompt_ids(tokenizer, &request.prompt)?;
    if prompt.is_empty() {
        return Err(InferenceError::InvalidRequest("the prompt is empty".into()));
    }
    let context_length = config.max_position_embeddings;
    if prompt.len() >= context_length {
        return Err(InferenceError::PromptTooLong {
            prompt_tokens: prompt.len(),
            context_length,
        });
    }
    if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= config.vocab_size) {
        return Err(InferenceError::InvalidRequest(format!(
            "token id {bad} is outside the vocabulary of {}",
            config.vocab_size
        )));
    }
    Ok(prompt)
}

/// Generates a completion of `request` over `forward` (see [`crate::Engine::generate`]): the one
/// generation loop, whatever runs the model. The sequence is reset first; the prompt is
/// prefilled in chunks of `forward.max_chunk()` tokens.
pub fn generate(
    forward: &mut dyn Forward,
    tokenizer: &Tokenizer,
    request: &GenerateRequest,
    mut on_token: impl FnMut(TokenEvent<'_>) -> ControlFlow<()>,
) -> Result<Completion> {
    let prompt = check_request(forward.config(), tokenizer, request)?;
    let context_length = forward.config().max_position_embeddings;
    let max_tokens = request.max_tokens.min(context_length - prompt.len());
    let mut sampler = Sampler::new(request.sampling.clone());
    let mut context = prompt.clone();
    let mut out = Completion {
        text: String::new(),
        tokens: vec![],
        logprobs: vec![],
        finish_reason: FinishReason::Length,
        prompt_tokens: prompt.len(),
        prompt_seconds: 0.0,
        generation_seconds: 0.0,
    };
    if max_tokens == 0 {
        return Ok(out);
    }
    let start = Instant::now();
    forward.reset()?;
    let chunks: Vec<&[u32]> = prompt.chunks(forward.max_chunk().max(1)).collect();
    let (last_chunk, earlier) = chunks.split_last().expect("the prompt is not empty");
    let mut logits = Vec::new();
    for chunk in earlier {
        logits = forward.forward(chunk)?;
    }
    // Greedy requests choose on the device and run one step ahead (see
    // `Forward::greedy_on_device`); others bring the logits to the host sampler.
    let mut pending = if sampler.is_greedy() {
        forward.greedy_on_device(StepInput::Host(last_chunk))?
    } else {
        None
    };
    match &pending {
        Some(choice) => choice.wait()?,
        None => logits = forward.forward(last_chunk)?,
    }
    out.prompt_seconds = start.elapsed().as_secs_f64();
    let decode_start = Instant::now();
    let mut decoder = StreamDecoder::new();
    let mut stops = StopMatcher::new(&request.stop);
    let mut stopped_by_string = false;
    loop {
        let s = match pending.take() {
            Some(choice) => {
                if out.tokens.len() + 1 < max_tokens {
                    pending = forward.greedy_on_device(StepInput::Device(&choice.token))?;
                }
                choice.read()?
            }
            None => sampler.sample(&logits, &context, out.tokens.len()),
        };
        context.push(s.token);
        out.tokens.push(s.token);
        out.logprobs.push(s.logprob);
        let is_end = (!request.ignore_eos && tokenizer.eos_token_ids.contains(&s.token))
            || request.stop_token_ids.contains(&s.token);
        if is_end {
            out.finish_reason = FinishReason::Stop;
            break;
        }
        let piece = decoder.push(tokenizer, s.token)?;
        let (emit, stopped) = match stops.push(&piece) {
            StopCheck::Continue(t) => (t, false),
            StopCheck::Stop(t) => (t, true),
        };
        if on_token(TokenEvent {
            token: s.token,
            text: &emit,
            logprob: s.logprob,
        })
        .is_break()
        {
            out.finish_reason = FinishReason::Cancelled;
            break;
        }
        if stopped {
            stopped_by_string = true;
            out.finish_reason = FinishReason::Stop;
            break;
        }
        if out.tokens.len() >= max_tokens {
            break;
        }
        if pending.is_none() {
            logits = forward.forward(&[s.token])?;
        }
    }
    out.generation_seconds = decode_start.elapsed().as_secs_f64();
    if !stopped_by_string && out.finish_reason != FinishReason::Cancelled {
        // Flush an incomplete character and any text held back for a possible stop string.
        let tail = decoder.finish(tokenizer)?;
        let rest = match stops.push(&tail) {
            StopCheck::Stop(t) => t,
            StopCheck::Continue(t) => t + &stops.finish(),
        };
        if !rest.is_empty() {
            let _ = on_token(TokenEvent {
                token: *out.tokens.last().unwrap_or(&0),
                text: &rest,
                logprob: 0.0,
            });
        }
    }
    out.text = stops.text().to_owned();
    Ok(out)
}
