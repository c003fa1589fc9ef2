//! A request's sampling parameters (OpenAI's names and meanings) and their bounds: data the
//! gateway's request, the runner protocol and the sampler share, checked where it is read.
//! The sampler that applies them is `text::sampling`.

use std::collections::BTreeMap;

/// A sampling parameter out of its range: the message says which and why. It prints as
/// `inference`'s `InvalidRequest` error does (`invalid request: …`), which it becomes there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid request: {0}")]
pub struct InvalidRequest(pub String);

/// Sampling parameters of a request (OpenAI's names and meanings).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// 0 means greedy (always the most likely token).
    pub temperature: f32,
    /// Keep the smallest set of tokens whose probabilities sum to at least this (1 = off).
    pub top_p: f32,
    /// Keep only the `top_k` most likely tokens (0 = off).
    pub top_k: usize,
    /// Drop tokens less likely than `min_p` times the most likely one (0 = off).
    pub min_p: f32,
    /// Seed of the random generator (None: seeded from the clock).
    pub seed: Option<u64>,
    /// Divides positive (multiplies negative) logits of tokens seen in the last
    /// `repetition_context` tokens (1 = off).
    pub repetition_penalty: f32,
    /// How many recent tokens (prompt and generated) the repetition penalty looks at.
    pub repetition_context: usize,
    /// Subtracted from the logit of every token already generated (0 = off).
    pub presence_penalty: f32,
    /// Subtracted once per earlier occurrence in the generated text (0 = off).
    pub frequency_penalty: f32,
    /// How many of the most likely tokens to report at each step with their
    /// log-probabilities (OpenAI's `top_logprobs`; 0 = none, at most [`MAX_TOP_LOGPROBS`]).
    pub top_logprobs: usize,
    /// Added to a token's logit after the penalties, before temperature and the cut-offs
    /// (OpenAI's `logit_bias`: token id → bias in [-100, 100], at most [`MAX_LOGIT_BIAS`]
    /// entries; +100 all but forces a token, -100 all but bans it). The log-probabilities reported stay the model's own,
    /// unbiased ones (as OpenAI reports them, and as penalties and temperature leave them),
    /// so a forced token may report a low log-probability and be absent from `top_logprobs`.
    #[serde(deserialize_with = "crate::token_map::deserialize")]
    pub logit_bias: BTreeMap<u32, f32>,
}

/// Most alternatives [`SamplingParams::top_logprobs`] may ask for (OpenAI's cap).
pub const MAX_TOP_LOGPROBS: usize = 20;
/// Most entries [`SamplingParams::logit_bias`] may hold (OpenAI's cap).
pub const MAX_LOGIT_BIAS: usize = 300;
/// Largest bias magnitude [`SamplingParams::logit_bias`] accepts (OpenAI's range).
pub const MAX_BIAS: f32 = 100.0;

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            seed: None,
            repetition_penalty: 1.0,
            repetition_context: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            top_logprobs: 0,
            logit_bias: BTreeMap::new(),
        }
    }
}

impl SamplingParams {
    /// Rejects values outside their meaningful ranges.
    pub fn validate(&self) -> Result<(), InvalidRequest> {
        let bad = |m: &str| Err(InvalidRequest(m.to_owned()));
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad("temperature must be a finite number >= 0");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p must be in (0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p must be in [0, 1]");
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return bad("repetition_penalty must be > 0");
        }
        if !self.presence_penalty.is_finite() || !self.frequency_penalty.is_finite() {
            return bad("presence and frequency penalties must be finite");
        }
        if self.top_logprobs > MAX_TOP_LOGPROBS {
            return Err(InvalidRequest(format!(
                "top_logprobs must be at most {MAX_TOP_LOGPROBS}, not {}",
                self.top_logprobs
            )));
        }
        if self.logit_bias.len() > MAX_LOGIT_BIAS {
            return Err(InvalidRequest(format!(
                "logit_bias may hold at most {MAX_LOGIT_BIAS} tokens, not {}",
                self.logit_bias.len()
            )));
        }
        if let Some((t, b)) = self
            .logit_bias
            .iter()
            .find(|(_, b)| !(-MAX_BIAS..=MAX_BIAS).contains(*b))
        {
            return Err(InvalidRequest(format!(
                "logit_bias of token {t} is {b}; each bias must be in [-{MAX_BIAS}, {MAX_BIAS}]"
            )));
        }
        Ok(())
    }

    /// Rejects [`SamplingParams::logit_bias`] token ids outside a vocabulary of `vocab` tokens.
    pub fn check_vocab(&self, vocab: usize) -> Result<(), InvalidRequest> {
        match self.logit_bias.keys().find(|&&t| t as usize >= vocab) {
            Some(t) => Err(InvalidRequest(format!(
                "logit_bias names token {t}, outside the vocabulary of {vocab} tokens (ids 0 to {})",
                vocab.saturating_sub(1)
            ))),
            None => Ok(()),
        }
    }
}
