//! Choosing the next token from logits: logit bias, penalties, temperature, top-k, top-p,
//! min-p, and a seeded random generator so that a seeded request always gives the same text;
//! and the most likely tokens of each step with their log-probabilities (`top_logprobs`).

use crate::constraint::Grammar;
use crate::error::Result;
use std::collections::BTreeMap;
use wire::sampling::SamplingParams;

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
    /// The output constraint's state, when the request has one.
    grammar: Option<Grammar>,
}

/// The chosen token and its log-probability under the model (before bias, penalties and
/// temperature), with the most likely tokens when asked.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    /// Token id.
    pub token: u32,
    /// `log softmax(logits)[token]`.
    pub logprob: f32,
    /// The [`SamplingParams::top_logprobs`] most likely tokens and their log-probabilities,
    /// most likely first (empty when not asked).
    pub top: Vec<(u32, f32)>,
}

/// The lowest log-probability reported: OpenAI's "very unlikely" value, which also stands
/// for `-inf` (a masked logit), so that every reported value is a finite JSON number.
pub const MIN_LOGPROB: f32 = -9999.0;

/// `log softmax` value `l - norm`, at least [`MIN_LOGPROB`] (and never NaN).
fn logprob_of(l: f32, norm: f32) -> f32 {
    let v = l - norm;
    if v >= MIN_LOGPROB {
        v
    } else {
        MIN_LOGPROB
    }
}

/// `log sum exp(logits)`, the normaliser of `log softmax` (a NaN logit left out).
fn log_normaliser(logits: &[f32]) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits
        .iter()
        .filter(|l| !l.is_nan())
        .map(|&l| ((l - max) as f64).exp())
        .sum();
    max + sum.ln() as f32
}

/// The `k` most likely tokens of `logits` and their log-probabilities (`log softmax`),
/// most likely first, ties by lower id (so the first is the greedy choice, [`argmax`]);
/// fewer than `k` when the vocabulary is smaller. Selection is a partial sort, O(vocab).
pub fn top_logprobs(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    top_logprobs_under(logits, k, log_normaliser(logits))
}

/// [`top_logprobs`] with the normaliser already computed.
fn top_logprobs_under(logits: &[f32], k: usize, norm: f32) -> Vec<(u32, f32)> {
    let k = k.min(logits.len());
    if k == 0 {
        return Vec::new();
    }
    // NaN sorts last (as the least likely), whatever its sign.
    let key = |i: usize| {
        let l = logits[i];
        if l.is_nan() {
            f32::NEG_INFINITY
        } else {
            l
        }
    };
    let order = |a: &usize, b: &usize| key(*b).total_cmp(&key(*a)).then(a.cmp(b));
    let mut ids: Vec<usize> = (0..logits.len()).collect();
    if k < ids.len() {
        ids.select_nth_unstable_by(k - 1, order);
        ids.truncate(k);
    }
    ids.sort_unstable_by(order);
    ids.into_iter()
        .map(|i| (i as u32, logprob_of(logits[i], norm)))
        .collect()
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
            grammar: None,
        }
    }

    /// The same sampler, choosing only tokens `grammar` allows (see [`Sampler::sample`]).
    pub fn with_grammar(mut self, grammar: Grammar) -> Sampler {
        self.grammar = Some(grammar);
        self
    }

    /// The output constraint's state, when there is one (to compute its next mask ahead).
    pub fn grammar_mut(&mut self) -> Option<&mut Grammar> {
        self.grammar.as_mut()
    }

    /// True when sampling never looks at anything but the argmax of the model's logits (and
    /// reports nothing else about them).
    pub fn is_greedy(&self) -> bool {
        let p = &self.params;
        p.temperature == 0.0
            && p.repetition_penalty == 1.0
            && p.presence_penalty == 0.0
            && p.frequency_penalty == 0.0
            && p.top_logprobs == 0
            && p.logit_bias.is_empty()
            && self.grammar.is_none()
    }

    /// Chooses the next token. `context` is the prompt followed by the generated tokens,
    /// `generated` the number of generated tokens at its end.
    ///
    /// The logits pass, in this order: the repetition penalty, the presence and frequency
    /// penalties, `logit_bias`, then the output constraint's mask (every token its grammar
    /// does not allow becomes `-inf`), then temperature and the top-k, top-p and min-p
    /// cut-offs (or the argmax, when greedy). The mask comes after the bias so that no bias
    /// can bring back a token the grammar forbids, and before the cut-offs so that they pick
    /// among allowed tokens only (top-p's nucleus is then a nucleus of what may be written).
    /// The chosen token is committed to the grammar. The log-probabilities reported stay the
    /// model's own. Errors come only from the constraint (see [`Grammar::mask`]).
    pub fn sample(&mut self, logits: &[f32], context: &[u32], generated: usize) -> Result<Sampled> {
        let p = &self.params;
        let mut adjusted: Option<Vec<f32>> = None;
        if !p.logit_bias.is_empty()
            || p.repetition_penalty != 1.0
            || p.presence_penalty != 0.0
            || p.frequency_penalty != 0.0
            || self.grammar.is_some()
        {
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
            for (&t, &b) in &p.logit_bias {
                if let Some(v) = l.get_mut(t as usize) {
                    *v += b;
                }
            }
            if let Some(grammar) = self.grammar.as_mut() {
                grammar.mask(&mut l)?;
            }
            adjusted = Some(l);
        }
        let scores: &[f32] = adjusted.as_deref().unwrap_or(logits);
        let token = if p.temperature == 0.0 {
            argmax(scores)
        } else {
            self.draw(scores)
        };
        if let Some(grammar) = self.grammar.as_mut() {
            grammar.commit(token as u32)?;
        }
        let norm = log_normaliser(logits);
        Ok(Sampled {
            token: token as u32,
            logprob: logprob_of(logits[token], norm),
            top: top_logprobs_under(logits, self.params.top_logprobs, norm),
        })
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
        let out = s.sample(&[0.0, 2.0, 1.0], &[], 0).unwrap();
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
            assert_eq!(s.sample(&[0.1, 0.3, 0.2], &[], 0).unwrap().token, 1);
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
            assert!(s.sample(&logits, &[], 0).unwrap().token < 2);
            assert_eq!(s2.sample(&logits, &[], 0).unwrap().token, 0);
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
                .map(|_| s.sample(&logits, &[], 0).unwrap().token)
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
        assert_eq!(rep.sample(&logits, &[0], 0).unwrap().token, 1);
        let mut pres = Sampler::new(params(|p| p.presence_penalty = 0.5));
        assert_eq!(pres.sample(&logits, &[5, 0], 1).unwrap().token, 1);
        // The prompt does not count for presence: token 0 only appears before the generated part.
        assert_eq!(pres.sample(&logits, &[0, 5], 1).unwrap().token, 0);
        let mut freq = Sampler::new(params(|p| p.frequency_penalty = 0.06));
        assert_eq!(freq.sample(&logits, &[0], 1).unwrap().token, 0);
        assert_eq!(freq.sample(&logits, &[0, 0], 2).unwrap().token, 1);
    }

    #[test]
    fn bad_parameters_are_rejected() {
        assert!(params(|p| p.temperature = -1.0).validate().is_err());
        assert!(params(|p| p.top_p = 0.0).validate().is_err());
        assert!(params(|p| p.min_p = 2.0).validate().is_err());
        assert!(params(|p| p.repetition_penalty = 0.0).validate().is_err());
        assert!(params(|_| {}).validate().is_ok());
        let msg = |p: SamplingParams| p.validate().unwrap_err().to_string();
        assert!(msg(params(|p| p.top_logprobs = 21)).contains("at most 20"));
        assert!(params(|p| p.top_logprobs = 20).validate().is_ok());
        assert!(msg(params(|p| p.logit_bias = [(5, 100.5)].into())).contains("[-100, 100]"));
        assert!(msg(params(|p| p.logit_bias = [(5, f32::NAN)].into())).contains("token 5"));
        let many = params(|p| p.logit_bias = (0..301).map(|t| (t, 1.0)).collect());
        assert!(msg(many).contains("at most 300"));
        let edge = params(|p| p.logit_bias = [(0, -100.0), (9, 100.0)].into());
        assert!(edge.validate().is_ok());
        assert!(edge.check_vocab(10).is_ok());
        let err = edge.check_vocab(9).unwrap_err().to_string();
        assert!(
            err.contains("token 9") && err.contains("vocabulary of 9"),
            "{err}"
        );
    }

    /// The plain reference: log-softmax in f64, every token sorted by logit (ties by id).
    fn reference_top(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let norm = max
            + logits
                .iter()
                .map(|&l| (l as f64 - max).exp())
                .sum::<f64>()
                .ln();
        let mut all: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, (l as f64 - norm) as f32))
            .collect();
        all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        all.truncate(k);
        all
    }

    #[test]
    fn top_logprobs_match_a_full_sort() {
        let mut rng = Rng::new(11);
        for vocab in [1usize, 2, 7, 100, 1000] {
            // Few distinct values, so that ties are common.
            let logits: Vec<f32> = (0..vocab)
                .map(|_| (rng.next_u64() % 13) as f32 * 0.75 - 4.0)
                .collect();
            for k in [0usize, 1, 3, 20, vocab, vocab + 5] {
                let got = top_logprobs(&logits, k);
                let want = reference_top(&logits, k);
                assert_eq!(got.len(), k.min(vocab), "vocab {vocab} k {k}");
                for (g, w) in got.iter().zip(&want) {
                    assert_eq!(g.0, w.0, "vocab {vocab} k {k}: {got:?} vs {want:?}");
                    assert!((g.1 - w.1).abs() < 1e-5, "{g:?} vs {w:?}");
                }
                if let Some(first) = got.first() {
                    assert_eq!(first.0 as usize, argmax(&logits));
                }
            }
        }
    }

    #[test]
    fn top_logprobs_ties_go_to_the_lower_id_and_masked_tokens_read_very_unlikely() {
        let logits = [1.0, 3.0, 3.0, f32::NEG_INFINITY, 3.0, f32::NAN];
        let top = top_logprobs(&logits, 6);
        let ids: Vec<u32> = top.iter().map(|t| t.0).collect();
        assert_eq!(ids, vec![1, 2, 4, 0, 3, 5]);
        assert!(top[3].1 > MIN_LOGPROB && top[0].1 < 0.0, "{top:?}");
        assert_eq!((top[4].1, top[5].1), (MIN_LOGPROB, MIN_LOGPROB));
        let total: f32 = top.iter().map(|t| t.1.exp()).sum();
        assert!(total <= 1.0 + 1e-6 && total > 0.0, "{total}");
    }

    #[test]
    fn the_sampled_token_reports_its_top_logprobs_and_is_the_first_when_greedy() {
        let logits = [0.5, 2.0, -1.0, 1.5];
        let mut s = Sampler::new(params(|p| p.top_logprobs = 3));
        assert!(!s.is_greedy(), "top_logprobs needs the logits on the host");
        let out = s.sample(&logits, &[], 0).unwrap();
        assert_eq!(out.token, 1);
        let ids: Vec<u32> = out.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, vec![1, 3, 0]);
        assert_eq!(out.top[0].1, out.logprob);
        assert!(out.top.iter().all(|t| t.1 <= 0.0));
        let plain = Sampler::new(params(|_| {}))
            .sample(&logits, &[], 0)
            .unwrap();
        assert!(plain.top.is_empty());
        assert_eq!(plain.logprob, out.logprob);
    }

    #[test]
    fn logit_bias_forces_and_bans_but_logprobs_stay_unbiased() {
        let logits = [0.5, 2.0, -1.0, 1.5];
        let mut force = Sampler::new(params(|p| {
            p.logit_bias = [(2, 100.0)].into();
            p.top_logprobs = 2;
        }));
        assert!(!force.is_greedy());
        let out = force.sample(&logits, &[], 0).unwrap();
        assert_eq!(out.token, 2);
        assert_eq!(out.logprob, top_logprobs(&logits, 4)[3].1);
        assert_eq!(out.top, top_logprobs(&logits, 2));
        let mut ban = Sampler::new(params(|p| p.logit_bias = [(1, -100.0)].into()));
        assert_eq!(ban.sample(&logits, &[], 0).unwrap().token, 3);
        // With temperature, a banned token is never drawn and a forced one always is.
        let mut hot = Sampler::new(params(|p| {
            p.temperature = 1.0;
            p.logit_bias = [(1, -100.0), (3, -100.0), (0, -100.0)].into();
        }));
        for _ in 0..100 {
            assert_eq!(hot.sample(&logits, &[], 0).unwrap().token, 2);
        }
        // Ids past the logits (a vocabulary padded differently) are ignored, never a panic.
        let mut past = Sampler::new(params(|p| p.logit_bias = [(99, 100.0)].into()));
        assert_eq!(past.sample(&logits, &[], 0).unwrap().token, 1);
    }
}
