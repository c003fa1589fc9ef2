//! Generation: the one loop that turns a request into a completion over any [`Forward`],
//! with prompt checks, sampling (on the device for greedy requests, one step ahead), stop
//! tokens and strings, streaming and cancellation. Loading lives in [`crate::loader`].

use crate::config::ModelConfig;
use crate::error::{InferenceError, Result};
use crate::request::{Completion, GenerateRequest, Prompt, TokenEvent};
use crate::sampling::Sampler;
use crate::sequence::SequenceOutput;
use crate::sequence_forward::{Forward, StepInput};
use crate::tokenizer::Tokenizer;
use std::ops::ControlFlow;
use std::time::Instant;

/// The prompt as token ids.
pub fn prompt_ids(tokenizer: &Tokenizer, prompt: &Prompt) -> Result<Vec<u32>> {
    match prompt {
        Prompt::Text(t) => Ok(tokenizer.encode_prompt(t)?),
        Prompt::Chat(messages) => {
            let text = tokenizer.apply_chat_template(messages, true)?;
            Ok(tokenizer.encode(&text)?)
        }
        Prompt::Tokens(ids) => Ok(ids.clone()),
    }
}

/// Checks a request before any work starts (so a distributed forward never begins a step it
/// cannot finish): sampling parameters, an empty or too long prompt, token ids (of the prompt
/// and of `logit_bias`) outside the vocabulary. Returns the prompt's token ids.
pub fn check_request(
    config: &ModelConfig,
    tokenizer: &Tokenizer,
    request: &GenerateRequest,
) -> Result<Vec<u32>> {
    request.sampling.validate()?;
    request.sampling.check_vocab(config.vocab_size)?;
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

/// The sampler of `request`: its sampling parameters, and its output constraint compiled
/// over the tokenizer's vocabulary (an unenforceable one is the request's error).
pub fn sampler_for(
    config: &ModelConfig,
    tokenizer: &Tokenizer,
    request: &GenerateRequest,
) -> Result<Sampler> {
    let sampler = Sampler::new(request.sampling.clone());
    match &request.constraint {
        None => Ok(sampler),
        Some(constraint) => {
            let grammar = tokenizer
                .grammar_compiler(config.vocab_size)?
                .start(constraint)?;
            Ok(sampler.with_grammar(grammar))
        }
    }
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
    if !request.images.is_empty() {
        // Only the batcher splices images (see `crate::vision`): never dropped in silence.
        return Err(InferenceError::InvalidRequest(
            "images are run through the batched runner, not a single-sequence generation".into(),
        ));
    }
    let prompt = check_request(forward.config(), tokenizer, request)?;
    let context_length = forward.config().max_position_embeddings;
    let max_tokens = request.max_tokens.min(context_length - prompt.len());
    let mut sampler = sampler_for(forward.config(), tokenizer, request)?;
    let mut context = prompt.clone();
    let mut output = SequenceOutput::new(request, prompt.len(), max_tokens);
    if max_tokens == 0 {
        return output.finish(tokenizer, &mut on_token);
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
    let prompt_seconds = start.elapsed().as_secs_f64();
    let decode_start = Instant::now();
    loop {
        let s = match pending.take() {
            Some(choice) => {
                if output.generated() + 1 < max_tokens {
                    pending = forward.greedy_on_device(StepInput::Device(&choice.token))?;
                }
                choice.read()?
            }
            None => sampler.sample(&logits, &context, output.generated())?,
        };
        let token = s.token;
        context.push(token);
        if output.push(tokenizer, s, &mut on_token)? {
            break;
        }
        if pending.is_none() {
            logits = forward.forward(&[token])?;
        }
    }
    let c = output.completion_mut();
    c.prompt_seconds = prompt_seconds;
    c.generation_seconds = decode_start.elapsed().as_secs_f64();
    output.finish(tokenizer, &mut on_token)
}
