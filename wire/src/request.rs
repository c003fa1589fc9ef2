//! What a caller asks for and gets back: the prompt, the request's controls, streamed tokens
//! and the finished completion (also the runner protocol's payloads).

use crate::chat::{ChatImage, ChatMessage};
use crate::constraint::OutputConstraint;
use crate::sampling::SamplingParams;

/// What to generate from.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Prompt {
    /// Plain text, tokenized as is (BOS added if the model wants it).
    Text(String),
    /// Chat messages, rendered with the model's chat template.
    Chat(Vec<ChatMessage>),
    /// Token ids, used as they are.
    Tokens(Vec<u32>),
}

/// A generation request.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GenerateRequest {
    /// The prompt.
    pub prompt: Prompt,
    /// How to choose tokens.
    #[serde(default)]
    pub sampling: SamplingParams,
    /// At most this many new tokens (also bounded by the context).
    pub max_tokens: usize,
    /// Generation stops before any of these strings (which are not returned).
    #[serde(default)]
    pub stop: Vec<String>,
    /// Generation stops at these tokens, in addition to the model's end tokens.
    #[serde(default)]
    pub stop_token_ids: Vec<u32>,
    /// Keep going past the model's end tokens (for benchmarks).
    #[serde(default)]
    pub ignore_eos: bool,
    /// What the output must match (a JSON Schema, any JSON object, a grammar): decoded under
    /// it, see [`crate::constraint`]. Left out of the runner protocol's JSON when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constraint: Option<OutputConstraint>,
    /// The images of the prompt, in the order their image-token runs appear in it: the
    /// encoded files (base64 in the runner protocol's JSON), not pixels, because they are far
    /// smaller and only rank 0's runner turns them into features (see `inference::vision`). Left
    /// out of the JSON when there are none (a text request's frame is unchanged).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<ChatImage>,
}

impl GenerateRequest {
    /// A greedy request for `prompt` with at most `max_tokens` new tokens.
    pub fn new(prompt: Prompt, max_tokens: usize) -> GenerateRequest {
        GenerateRequest {
            prompt,
            sampling: SamplingParams::default(),
            max_tokens,
            stop: vec![],
            stop_token_ids: vec![],
            ignore_eos: false,
            constraint: None,
            images: Vec::new(),
        }
    }
}

/// One generated token as it streams out.
#[derive(Debug, Clone, Copy)]
pub struct TokenEvent<'a> {
    /// Token id.
    pub token: u32,
    /// New text it completes (may be empty while a character or a possible stop string is
    /// incomplete).
    pub text: &'a str,
    /// Its log-probability under the model.
    pub logprob: f32,
    /// Its own text and the most likely tokens, when the request asked for
    /// [`crate::sampling::SamplingParams::top_logprobs`].
    pub top_logprobs: Option<&'a TokenLogprobs>,
}

/// One of the most likely tokens at a step.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TopLogprob {
    /// Token id.
    pub token: u32,
    /// The token's text, decoded alone (special tokens spelled out).
    pub text: String,
    /// Its log-probability under the model (unbiased, before penalties and temperature).
    pub logprob: f32,
    /// The bytes it stands for (`text::Tokenizer::token_bytes`), which differ from
    /// `text`'s when it holds part of a multi-byte character (absent from older runners).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bytes: Vec<u8>,
}

/// What a generated token reports for a request that asked for `top_logprobs`: what OpenAI's
/// `logprobs.content[]` needs beyond the sampled token's log-probability.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TokenLogprobs {
    /// The sampled token's own text, decoded alone as the alternatives are (the event's text
    /// is what the token completes, which differs when a character spans tokens or a stop
    /// string holds text back), so that the sampled token reads the same in both lists.
    pub text: String,
    /// The bytes the sampled token stands for (see [`TopLogprob::bytes`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bytes: Vec<u8>,
    /// The most likely tokens, most likely first (ties by lower id).
    pub top: Vec<TopLogprob>,
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An end token or stop string.
    Stop,
    /// `max_tokens` or the context was reached.
    Length,
    /// The caller cancelled.
    Cancelled,
}

/// The result of a generation.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Completion {
    /// The generated text (without stop strings or end tokens).
    pub text: String,
    /// The generated tokens (an end token that stopped generation included).
    pub tokens: Vec<u32>,
    /// Log-probability of each generated token.
    pub logprobs: Vec<f32>,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Leading prompt tokens whose state came from the prompt cache (not computed again).
    #[serde(default)]
    pub cached_tokens: usize,
    /// Seconds to process the prompt (time to the first token's logits).
    pub prompt_seconds: f64,
    /// Seconds of decoding after the first token.
    pub generation_seconds: f64,
}

impl Completion {
    /// Tokens generated.
    pub fn completion_tokens(&self) -> usize {
        self.tokens.len()
    }
    /// Prompt tokens per second.
    pub fn prompt_tps(&self) -> f64 {
        self.prompt_tokens as f64 / self.prompt_seconds.max(1e-9)
    }
    /// Generated tokens per second (tokens after the first, over the decode time).
    pub fn generation_tps(&self) -> f64 {
        self.tokens.len().saturating_sub(1) as f64 / self.generation_seconds.max(1e-9)
    }
}
