//! Choosing the next token from logits: penalties, temperature, top-k, top-p, min-p, and a
//! seeded random generator so that a seeded request always gives the same text.

use crate::error::{InferenceError, Result};
use std::collections::BTreeMap;

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
}

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
        }
    }
}

impl SamplingParams {
    /// Rejects values outside their meaningful ranges.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(InferenceError::InvalidRequest(m.to_owned()));
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
        Ok(())
    }
}

/// SplitMix64: a small, fast, seedable generator (enough for sampling; not for secrets).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator with this seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Picks tokens for one request.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
}

/// The chosen token and its log-probability under the model (before penalties/temperature).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampled {
    /// Token id.
    pub token: u32,
    /// `log softmax(logits)[token]`.
    pub logprob: f32,
}

fn log_softmax_at(logits: &[f32], index: usize) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    (logits[index] - max) - sum.ln() as f32
}

impl Sampler {
    /// A sampler for validated parameters.
    pub fn new(params: SamplingParams) -> Sampler {
        let seed = params.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
        });
        Sampler {
            params,
            rng: Rng::new(seed),
        }
    }

    /// True when sampling never looks at anything but the argmax.
    pub fn is_greedy(&self) -> bool {
        let p = &self.params;
        p.temperature == 0.0
            && p.repetition_penalty == 1.0
            && p.presence_penalty == 0.0
            && p.frequency_penalty == 0.0
    }

    /// Chooses the next token. `context` is the prompt followed by the generated tokens,
    /// `generated` the number of generated tokens at its end.
    pub fn sample(&mut self, logits: &[f32], context: &[u32], generated: usize) -> Sampled {
        let p = &self.params;
        let mut adjusted: Option<Vec<f32>> = None;
        if p.repetition_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            let mut l = logits.to_vec();
            if p.repetition_penalty != 1.0 {
                let recent = &context[context.len().saturating_sub(p.repetition_context)..];
                let mut seen: Vec<u32> = recent.to_vec();
                seen.sort_unstable();
                seen.dedup();
                for t in seen {
                    if let Some(v) = l.get_mut(t as usize) {
                        *v = if *v > 0.0 {
                            *v / p.repetition_penalty
                        } else {
                            *v * p.repetition_penalty
                        };
                    }
                }
            }
            if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
                let mut counts: BTreeMap<u32, usize> = BTreeMap::new();
                for &t in &context[context.len().saturating_sub(generated)..] {
                    *counts.entry(t).or_default() += 1;
                }
                for (t, n) in counts {
                    if let Some(v) = l.get_mut(t as usize) {
                        *v -= p.presence_penalty + p.frequency_penalty * n as f32;
                    }
                }
            }
            adjusted = Some(l);
        }
        let scores: &[f32] = adjusted.as_deref().unwrap_or(logits);
        let token = if p.temperature == 0.0 {
            argmax(scores)
        } else {
            self.draw(scores)
        };
        Sampled {
            token: token as u32,
            logprob: log_softmax_at(logits, token),
        }
    }

    fn draw(&mut self, scores: &[f32]) -> usize {
        let p = &self.params;
        // Candidates sorted by score, most likely first (ties by id, for determinism).
        let mut order: Vec<usize> = (0..scores.len())
            .filter(|&i| scores[i].is_finite())
            .collect();
        if order.is_empty() {
            return argmax(scores);
        }
        order.sort_unstable_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
        if p.top_k > 0 && p.top_k < order.len() {
            order.truncate(p.top_k);
        }
        let max = scores[order[0]] / p.temperature;
        let mut probs: Vec<f64> = order
            .iter()
            .map(|&i| ((scores[i] / p.temperature - max) as f64).exp())
            .collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= total);
        let mut keep = probs.len();
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            for (i, &q) in probs.iter().enumerate() {
                acc += q;
                if acc >= p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
        }
        if p.min_p > 0.0 {
            let floor = probs[0] * p.min_p as f64;
            keep = keep.min(probs.iter().take_while(|&&q| q >= floor).count().max(1));
        }
        let kept = &probs[..keep];
        let total: f64 = kept.iter().sum();
        let mut r = self.rng.next_f64() * total;
        for (i, &q) in kept.iter().enumerate() {
            if r < q {
                return order[i];
            }
            r -= q;
        }
        order[keep - 1]
    }
}

/// Index of the largest value (the first one on ties).
pub fn argmax(values: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
        let mut p = SamplingParams {
            seed: Some(7),
            ..Default::default()
        };
        f(&mut p);
        p
    }

    #[test]
    fn greedy_takes_the_argmax_and_reports_its_logprob() {
        let mut s = Sampler::new(params(|_| {}));
        let out = s.sample(&[0.0, 2.0, 1.0], &[], 0);
        assert_eq!(out.token, 1);
        let want = 2.0 - (1f64 + 2f64.exp() + 1f64.exp()).ln() as f32;
        assert!((out.logprob - want).abs() < 1e-6);
    }

    #[test]
    fn top_k_one_is_greedy_whatever_the_temperature() {
        let mut s = Sampler::new(params(|p| {
            p.temperature = 5.0;
            p.top_k = 1;
        }));
        for _ in 0..50 {
            assert_eq!(s.sample(&[0.1, 0.3, 0.2], &[], 0).token, 1);
        }
    }

    #[test]
    fn min_p_and_top_p_cut_the_tail() {
        let logits = [10.0, 9.9, 0.0, -1.0];
        let mut s = Sampler::new(params(|p| {
            p.temperature = 1.0;
            p.min_p = 0.5;
        }));
        let mut s2 = Sampler::new(params(|p| {
            p.temperature = 1.0;
            p.top_p = 0.5;
        }));
        for _ in 0..200 {
            assert!(s.sample(&logits, &[], 0).token < 2);
            assert_eq!(s2.sample(&logits, &[], 0).token, 0);
        }
    }

    #[test]
    fn same_seed_same_tokens_and_all_tokens_reachable() {
        let logits = [1.0, 1.0, 1.0, 1.0];
        let run = |seed| {
            let mut s = Sampler::new(params(|p| {
                p.temperature = 1.0;
                p.seed = Some(seed);
            }));
            (0..64)
                .map(|_| s.sample(&logits, &[], 0).token)
                .collect::<Vec<_>>()
        };
        assert_eq!(run(3), run(3));
        assert_ne!(run(3), run(4));
        let mut seen = run(3);
        seen.sort();
        seen.dedup();
        assert_eq!(seen, vec![0, 1, 2, 3]);
    }

    #[test]
    fn penalties_change_the_greedy_choice() {
        let logits = [2.0, 1.9, -1.0];
        let mut rep = Sampler::new(params(|p| p.repetition_penalty = 1.5));
        assert_eq!(rep.sample(&logits, &[0], 0).token, 1);
        let mut pres = Sampler::new(params(|p| p.presence_penalty = 0.5));
        assert_eq!(pres.sample(&logits, &[5, 0], 1).token, 1);
        // The prompt does not count for presence: token 0 only appears before the generated part.
        assert_eq!(pres.sample(&logits, &[0, 5], 1).token, 0);
        let mut freq = Sampler::new(params(|p| p.frequency_penalty = 0.06));
        assert_eq!(freq.sample(&logits, &[0], 1).token, 0);
        assert_eq!(freq.sample(&logits, &[0, 0], 2).token, 1);
    }

    #[test]
    fn bad_parameters_are_rejected() {
        assert!(params(|p| p.temperature = -1.0).validate().is_err());
        assert!(params(|p| p.top_p = 0.0).validate().is_err());
        assert!(params(|p| p.min_p = 2.0).validate().is_err());
        assert!(params(|p| p.repetition_penalty = 0.0).validate().is_err());
        assert!(params(|_| {}).validate().is_ok());
    }
}
