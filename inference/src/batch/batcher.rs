//! The continuous-batching loop: many requests, one forward pass per step.
//!
//! Every [`Batcher::step`] runs each active sequence's next tokens together: one token for
//! each decoding sequence, and chunks of the prompts of sequences still in prefill within what
//! is left of the step's token budget ([`BatchForward::step_tokens`]), so a long prompt
//! joining never stalls the streams already running. Requests join ([`Batcher::submit`]) and
//! leave (finished, or [`Batcher::cancel`]led) between any two steps. Each sequence keeps its
//! own sampler (and seed, `logit_bias` and `top_logprobs`), stop strings, `max_tokens` and
//! log-probabilities, and its own KV cache, so a request gives the same tokens alone or in a
//! batch: its logits differ only by float rounding (a batch's rows go through operations of
//! other shapes). On the CPU with 4- or 8-bit weights and `SHOAL_QMM=int8`, where decode-sized
//! products round x to int8 (`crate::cpu_kernels`), such a rounding difference can move an x across a rounding
//! step, so its logits may differ by up to that rounding's own size (about half a logit of order 25
//! on the SmolLM2 fixture) and a near tie may go the other way.
//!
//! Limits ([`BatchLimits`]): at most `max_sequences` run at once; the others wait in arrival
//! order. The KV cache of all running sequences stays within `kv_tokens` positions: a waiting
//! request is admitted only when its prompt fits beside the running ones, and when decoding
//! would outgrow the budget the most recently admitted sequence is preempted: its cache is
//! dropped and it waits at the head of the queue, to be prefilled again (prompt and the tokens
//! it generated) when room returns, continuing exactly where it stopped.
//!
//! With a prompt cache ([`Batcher::with_prompt_cache`], over a forward that
//! [`BatchForward::keeps_caches`]), a request joining starts from the cached state of the
//! longest prefix it shares with an earlier one ([`BatchEvent::Cached`] says how many of its
//! prompt tokens), and a request that ends leaves its state there. The cache lives in the
//! room the running sequences leave within `kv_tokens`: it is cut before any sequence waits
//! or is preempted for lack of room.

use super::batch_forward::{BatchForward, BatchPart};
use super::prompt_cache::PromptCache;
use super::slot_kv::Slot;
use crate::constraint::Grammar;
use crate::error::{InferenceError, Result};
use crate::generate::{check_request, sampler_for};
use crate::kv_cache::KvCache;
use crate::memory::KvGrowth;
use crate::request::{Completion, GenerateRequest, TokenEvent, TokenLogprobs};
use crate::sampling::Sampler;
use crate::sequence::SequenceOutput;
use crate::tokenizer::Tokenizer;
use crate::vision::{PromptImages, VisionTower};
use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::time::Instant;

/// How much one batcher takes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    /// Sequences decoded together at most.
    pub max_sequences: usize,
    /// KV-cache positions of all running sequences together at most (one sequence alone may
    /// always use the whole context).
    pub kv_tokens: usize,
}

/// What happened to one request in a step.
#[derive(Debug, Clone, PartialEq)]
pub enum BatchEvent {
    /// Leading tokens of the request's prompt whose state came from the prompt cache
    /// (before its first token, and only when there were some).
    Cached {
        /// How many.
        tokens: usize,
    },
    /// A generated token.
    Token {
        /// Token id.
        token: u32,
        /// New text (may be empty).
        text: String,
        /// Its log-probability.
        logprob: f32,
        /// Its own text and the most likely tokens, when the request asked for them.
        top_logprobs: Option<TokenLogprobs>,
    },
    /// The request finished (its last event).
    Done(Completion),
    /// The request failed (its last event).
    Failed {
        /// What went wrong.
        message: String,
        /// The ring to the other ranks broke (the instance cannot go on).
        ring_lost: bool,
    },
}

/// One request in the batcher.
struct Sequence {
    id: u64,
    slot: Option<Slot>,
    /// Prompt, then the generated tokens.
    context: Vec<u32>,
    /// Positions of `context` in the slot's cache.
    fed: usize,
    sampler: Sampler,
    output: SequenceOutput,
    cancelled: bool,
    admitted: Option<Instant>,
    first_token: Option<Instant>,
    /// Tokens in the prompt (`context` grows past it).
    prompt_len: usize,
    /// The prompt's images, ready to splice (see [`crate::vision`]).
    images: Option<PromptImages>,
}

impl Sequence {
    /// Tokens still to run before its next token can be sampled.
    fn pending(&self) -> usize {
        self.context.len() - self.fed
    }

    /// The first `n` positions of `context` as the prompt cache keys them: image positions by
    /// their image's content hash (see [`PromptImages::cache_key`]).
    fn cache_key(&self, n: usize) -> Vec<u32> {
        let context = &self.context[..n.min(self.context.len())];
        match &self.images {
            Some(images) => images.cache_key(context),
            None => context.to_vec(),
        }
    }
}

/// Continuous batching over a [`BatchForward`] (see the module docs).
pub struct Batcher<'a> {
    forward: Box<dyn BatchForward + 'a>,
    tokenizer: &'a Tokenizer,
    limits: BatchLimits,
    waiting: VecDeque<Sequence>,
    active: Vec<Sequence>,
    /// Events of requests that ended outside a step (nothing to generate, cancelled).
    ended: Vec<(u64, BatchEvent)>,
    /// Ended requests' states, for the next ones (see the module docs).
    cache: Option<&'a mut PromptCache<KvCache>>,
    /// What a sequence of some length holds, in the budget's positions.
    growth: KvGrowth,
    /// Steps run and tokens sampled so far.
    stats: BatchStats,
    /// The model's vision tower, where requests may hold images.
    vision: Option<&'a VisionTower>,
}

/// What a batcher has done: the evidence that sequences share steps (a batcher that ran one
/// sequence per step would have as many decode steps as tokens), which the runner logs when
/// a batch ends and a test on a real node reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// Forward passes run (prompt chunks and decoding).
    pub steps: u64,
    /// Forward passes that sampled at least one token.
    pub decode_steps: u64,
    /// Tokens sampled, all sequences together.
    pub tokens: u64,
}

impl<'a> Batcher<'a> {
    /// A batcher over `forward` within `limits` (and the forward's own maximum).
    pub fn new(
        forward: Box<dyn BatchForward + 'a>,
        tokenizer: &'a Tokenizer,
        limits: BatchLimits,
    ) -> Batcher<'a> {
        let max = limits.max_sequences.clamp(1, forward.max_sequences());
        let growth = KvGrowth::of(forward.config());
        Batcher {
            forward,
            tokenizer,
            limits: BatchLimits {
                max_sequences: max,
                kv_tokens: limits.kv_tokens,
            },
            waiting: VecDeque::new(),
            active: Vec::new(),
            ended: Vec::new(),
            cache: None,
            growth,
            stats: BatchStats::default(),
            vision: None,
        }
    }

    /// Takes requests with images, their features made by `tower` (a forward whose first
    /// rank embeds here; without a tower such requests are refused).
    pub fn with_vision(mut self, tower: Option<&'a VisionTower>) -> Batcher<'a> {
        self.vision = tower;
        self
    }

    /// Steps run and tokens sampled so far.
    pub fn stats(&self) -> BatchStats {
        self.stats
    }

    /// Reuses and fills `cache` (see the module docs); ignored when the forward cannot take
    /// caches out, or when the cache is disabled.
    pub fn with_prompt_cache(mut self, cache: &'a mut PromptCache<KvCache>) -> Batcher<'a> {
        if self.forward.keeps_caches() && cache.enabled() {
            self.cache = Some(cache);
        }
        self
    }

    /// Takes request `id`: checked now (a bad request is refused here), run from the next
    /// step on.
    pub fn submit(&mut self, id: u64, request: &GenerateRequest) -> Result<()> {
        let prompt = check_request(self.forward.config(), self.tokenizer, request)?;
        let sampler = sampler_for(self.forward.config(), self.tokenizer, request)?;
        // The images' features are made once, now: a bad image fails its request only.
        let images = match (&request.images[..], self.vision) {
            ([], _) => None,
            (images, Some(tower)) => Some(tower.encode(&prompt, images)?),
            (_, None) => {
                return Err(InferenceError::InvalidRequest(
                    "this model has no vision tower here: it does not accept images".into(),
                ))
            }
        };
        let context_length = self.forward.config().max_position_embeddings;
        let max_tokens = request.max_tokens.min(context_length - prompt.len());
        let output = SequenceOutput::new(request, prompt.len(), max_tokens);
        if max_tokens == 0 {
            let completion = output.finish(self.tokenizer, &mut |_| ControlFlow::Continue(()))?;
            self.ended.push((id, BatchEvent::Done(completion)));
            return Ok(());
        }
        self.waiting.push_back(Sequence {
            id,
            slot: None,
            prompt_len: prompt.len(),
            context: prompt,
            fed: 0,
            sampler,
            output,
            cancelled: false,
            admitted: None,
            first_token: None,
            images,
        });
        Ok(())
    }

    /// Cancels request `id` (it ends, `cancelled`, at the next step). False if unknown.
    pub fn cancel(&mut self, id: u64) -> bool {
        let mut found = false;
        for s in self.waiting.iter_mut().chain(self.active.iter_mut()) {
            if s.id == id {
                s.cancelled = true;
                found = true;
            }
        }
        found
    }

    /// Whether nothing is waiting, running or left to report.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.active.is_empty() && self.ended.is_empty()
    }

    /// Requests running now.
    pub fn running(&self) -> usize {
        self.active.len()
    }

    /// Requests waiting for room.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// KV positions the running sequences hold (or will once their prompts are in), as the
    /// budget counts them ([`KvGrowth::positions`]).
    pub fn kv_in_use(&self) -> usize {
        self.active
            .iter()
            .map(|s| self.growth.positions(s.context.len()))
            .sum()
    }

    /// The limits in force.
    pub fn limits(&self) -> BatchLimits {
        self.limits
    }

    /// Runs one step (see the module docs) and returns what happened to each request, in
    /// order. An error is fatal for every request in flight: the caller ends them with
    /// [`Batcher::fail_all`].
    pub fn step(&mut self) -> Result<Vec<(u64, BatchEvent)>> {
        let mut events = std::mem::take(&mut self.ended);
        self.drop_cancelled(&mut events)?;
        self.admit(&mut events);
        self.preempt();
        let room = self.limits.kv_tokens.saturating_sub(self.kv_in_use());
        if let Some(cache) = self.cache.as_deref_mut() {
            cache.shrink_to(room);
        }
        // Decoding sequences take one token each; prompts share what is left.
        let mut budget = self.forward.step_tokens().max(1);
        let mut plan: Vec<(usize, usize)> = Vec::new();
        for (i, s) in self.active.iter().enumerate() {
            if s.pending() == 1 {
                plan.push((i, 1));
                budget = budget.saturating_sub(1);
            }
        }
        for (i, s) in self.active.iter().enumerate() {
            if s.pending() > 1 && budget > 0 {
                let n = s.pending().min(budget);
                plan.push((i, n));
                budget -= n;
            }
        }
        plan.sort_unstable();
        if plan.is_empty() {
            return Ok(events);
        }
        let logits = self.run_step(&plan)?;
        self.stats.steps += 1;
        let mut logits = logits.into_iter();
        let mut finished = Vec::new();
        let mut failed = Vec::new();
        let mut sampled_here = 0;
        for &(i, n) in &plan {
            let s = &mut self.active[i];
            s.fed += n;
            if s.pending() > 0 {
                continue;
            }
            let Some(row) = logits.next() else {
                return Err(InferenceError::InvalidRequest(
                    "a step returned fewer logits than asked".into(),
                ));
            };
            // Only an output constraint fails here: it ends its own request, not the batch.
            let sampled = match s.sampler.sample(&row, &s.context, s.output.generated()) {
                Ok(sampled) => sampled,
                Err(e) => {
                    failed.push((i, e.to_string()));
                    continue;
                }
            };
            sampled_here += 1;
            s.context.push(sampled.token);
            let now = Instant::now();
            if s.first_token.is_none() {
                s.first_token = Some(now);
                let admitted = s.admitted.unwrap_or(now);
                s.output.completion_mut().prompt_seconds = (now - admitted).as_secs_f64();
            }
            let id = s.id;
            let done = s
                .output
                .push(self.tokenizer, sampled, &mut |t: TokenEvent<'_>| {
                    events.push((id, token_event(t)));
                    ControlFlow::Continue(())
                })?;
            if done {
                finished.push(i);
            }
        }
        self.stats.tokens += sampled_here;
        self.stats.decode_steps += u64::from(sampled_here > 0);
        let mut leaving: Vec<(usize, Option<String>)> = finished
            .into_iter()
            .map(|i| (i, None))
            .chain(failed.into_iter().map(|(i, m)| (i, Some(m))))
            .collect();
        leaving.sort_unstable_by_key(|&(i, _)| std::cmp::Reverse(i));
        for (i, failure) in leaving {
            let mut s = self.active.remove(i);
            match failure {
                None => self.end(s, &mut events)?,
                Some(message) => {
                    if let Some(slot) = s.slot.take() {
                        self.forward.close(slot);
                    }
                    let ring_lost = false;
                    events.push((s.id, BatchEvent::Failed { message, ring_lost }));
                }
            }
        }
        Ok(events)
    }

    /// Runs the forward pass of `plan` (sequence index, tokens to feed). The output
    /// constraints' masks for the rows that will sample are computed meanwhile on other
    /// threads, so that constrained rows cost the step little more than unconstrained ones.
    fn run_step(&mut self, plan: &[(usize, usize)]) -> Result<Vec<Vec<f32>>> {
        let mut parts: Vec<BatchPart<'_>> = Vec::with_capacity(plan.len());
        let mut grammars: Vec<&mut Grammar> = Vec::new();
        let mut planned = plan.iter().peekable();
        for (i, s) in self.active.iter_mut().enumerate() {
            let Some(&&(at, n)) = planned.peek() else {
                break;
            };
            if at != i {
                continue;
            }
            planned.next();
            let wants_logits = n == s.pending();
            let Sequence {
                slot,
                context,
                fed,
                sampler,
                images,
                ..
            } = s;
            parts.push(BatchPart {
                slot: slot.expect("an active sequence has a slot"),
                tokens: &context[*fed..*fed + n],
                wants_logits,
                images: images
                    .as_ref()
                    .map_or_else(Vec::new, |i| i.runs(*fed..*fed + n)),
                mrope: images.as_ref().and_then(|i| i.mrope().cloned()),
            });
            if let Some(grammar) = sampler.grammar_mut().filter(|_| wants_logits) {
                grammars.push(grammar);
            }
        }
        let forward = &mut self.forward;
        if grammars.is_empty() {
            return forward.step(&parts);
        }
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let per_thread = grammars.len().div_ceil(threads.clamp(1, 8));
        std::thread::scope(|scope| {
            for chunk in grammars.chunks_mut(per_thread) {
                scope.spawn(move || chunk.iter_mut().for_each(|g| g.prepare()));
            }
            forward.step(&parts)
        })
    }

    /// Ends every request (waiting or running) with `message`: after a failed step.
    pub fn fail_all(&mut self, message: &str, ring_lost: bool) -> Vec<(u64, BatchEvent)> {
        let mut events = std::mem::take(&mut self.ended);
        for s in self.active.drain(..).chain(self.waiting.drain(..)) {
            if let Some(slot) = s.slot {
                self.forward.close(slot);
            }
            events.push((
                s.id,
                BatchEvent::Failed {
                    message: message.to_owned(),
                    ring_lost,
                },
            ));
        }
        events
    }

    fn drop_cancelled(&mut self, events: &mut Vec<(u64, BatchEvent)>) -> Result<()> {
        let mut i = 0;
        while i < self.active.len() {
            if self.active[i].cancelled {
                let mut s = self.active.remove(i);
                s.output.cancel();
                self.end(s, events)?;
            } else {
                i += 1;
            }
        }
        let (cancelled, kept): (Vec<_>, Vec<_>) = self.waiting.drain(..).partition(|s| s.cancelled);
        self.waiting = kept.into();
        for mut s in cancelled {
            s.output.cancel();
            self.end(s, events)?;
        }
        Ok(())
    }

    /// Admits waiting requests while there is room (see the module docs), each from the
    /// longest cached prefix of its context when there is one.
    fn admit(&mut self, events: &mut Vec<(u64, BatchEvent)>) {
        while self.active.len() < self.limits.max_sequences {
            let Some(next) = self.waiting.front() else {
                return;
            };
            let need = self.growth.positions(next.context.len() + 1);
            if !self.active.is_empty() && self.kv_in_use() + need > self.limits.kv_tokens {
                return;
            }
            let mut s = self.waiting.pop_front().expect("checked above");
            // At least the last token runs, for the logits of the next one.
            // A sliding layer may no longer hold what the prefix's next query sees.
            let hit = self
                .cache
                .as_deref_mut()
                .and_then(|c| {
                    let key = s.cache_key(s.context.len());
                    c.lookup_usable(&key, s.context.len() - 1, KvCache::can_truncate)
                })
                .and_then(|mut hit| hit.value.truncate(hit.tokens).then_some(hit));
            let opened = match hit {
                Some(hit) => {
                    let opened = self.forward.open_from(hit.value);
                    if opened.is_ok() {
                        s.fed = hit.tokens;
                    }
                    opened.or_else(|_| self.forward.open())
                }
                None => self.forward.open(),
            };
            match opened {
                Ok(slot) => s.slot = Some(slot),
                Err(e) => {
                    // Cannot happen within `max_sequences`; the request waits rather than fail.
                    tracing::warn!(%e, "no slot for a waiting request");
                    self.waiting.push_front(s);
                    return;
                }
            }
            if s.admitted.is_none() {
                s.admitted = Some(Instant::now());
                let cached = s.fed.min(s.prompt_len);
                s.output.completion_mut().cached_tokens = cached;
                if cached > 0 {
                    events.push((s.id, BatchEvent::Cached { tokens: cached }));
                }
            }
            self.active.push(s);
        }
    }

    /// Preempts the most recently admitted sequences while the running ones would outgrow
    /// the KV budget (one sequence alone is never preempted).
    fn preempt(&mut self) {
        let room = self.limits.kv_tokens.saturating_sub(self.kv_in_use() + 1);
        if let Some(cache) = self.cache.as_deref_mut() {
            cache.shrink_to(room);
        }
        while self.active.len() > 1 && self.kv_in_use() + 1 > self.limits.kv_tokens {
            let mut s = self.active.pop().expect("more than one");
            if let Some(slot) = s.slot.take() {
                self.forward.close(slot);
            }
            s.fed = 0;
            tracing::debug!(id = s.id, "preempted to stay within the KV budget");
            self.waiting.push_front(s);
        }
    }

    fn end(&mut self, mut s: Sequence, events: &mut Vec<(u64, BatchEvent)>) -> Result<()> {
        if let Some(slot) = s.slot.take() {
            // `s` has left `active`: the room is what the others leave.
            let room = self.limits.kv_tokens.saturating_sub(self.kv_in_use());
            match self.cache.as_deref_mut() {
                Some(cache) => match self.forward.take(slot) {
                    Some(mut kv) if kv.len() == s.fed && s.fed > 0 => match kv.compact() {
                        // Kept at the size of its positions, as the budget counts it.
                        Ok(()) => cache.insert(s.cache_key(s.fed), kv, room),
                        Err(e) => {
                            tracing::warn!(%e, "compacting a cache for the prompt cache failed");
                            cache.shrink_to(room);
                        }
                    },
                    _ => cache.shrink_to(room),
                },
                None => self.forward.close(slot),
            }
        }
        if let Some(first) = s.first_token {
            s.output.completion_mut().generation_seconds = first.elapsed().as_secs_f64();
        }
        let id = s.id;
        let completion = s.output.finish(self.tokenizer, &mut |t: TokenEvent<'_>| {
            events.push((id, token_event(t)));
            ControlFlow::Continue(())
        })?;
        events.push((id, BatchEvent::Done(completion)));
        Ok(())
    }
}

fn token_event(t: TokenEvent<'_>) -> BatchEvent {
    BatchEvent::Token {
        token: t.token,
        text: t.text.to_owned(),
        logprob: t.logprob,
        top_logprobs: t.top_logprobs.cloned(),
    }
}
