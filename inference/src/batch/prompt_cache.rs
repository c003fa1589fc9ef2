//! The prompt cache: the KV state of earlier requests, kept so that a new request whose
//! prompt starts the same way (the next turn of a chat, an agent's shared system prompt)
//! skips the prefill of that prefix.
//!
//! Entries are keyed by the tokens whose positions they hold. A lookup finds the entry with
//! the longest common prefix with the new prompt (at most one token short of the whole
//! prompt: the last one must run to give the logits of the first new token) and hands out a
//! copy of its state; the entry stays (MLX arrays are immutable and shared, so the copy costs
//! nothing until the new sequence appends, and then one copy of the buffers). Entries are
//! evicted least recently used first, so the cache never holds more than its capacity in
//! positions, nor more than the caller's room ([`PromptCache::insert`],
//! [`PromptCache::shrink_to`]): the batcher keeps cache and running sequences together
//! within the instance's KV budget, and running sequences always win.
//!
//! Generic over what an entry holds (the batcher keeps [`crate::kv_cache::KvCache`]s) so
//! the bookkeeping can be tested on its own.

pub use wire::runner::env::PROMPT_CACHE_ENV;

/// The prompt cache's capacity in positions for an instance whose KV budget is `kv_tokens`:
/// [`PROMPT_CACHE_ENV`] if set (0 disables the cache), else half the budget.
pub fn prompt_cache_tokens(kv_tokens: usize) -> usize {
    std::env::var(PROMPT_CACHE_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(kv_tokens / 2)
}

struct Entry<E> {
    tokens: Vec<u32>,
    value: E,
    /// When it was last stored or handed out (a logical clock).
    used: u64,
}

/// An LRU of token prefixes and their state, bounded in positions (see the module docs).
pub struct PromptCache<E> {
    capacity: usize,
    entries: Vec<Entry<E>>,
    clock: u64,
    hits: u64,
    reused: u64,
}

/// A cached prefix handed out by [`PromptCache::lookup`].
#[derive(Debug, Clone, PartialEq)]
pub struct Hit<E> {
    /// Leading tokens of the prompt the state covers (the state may hold more positions:
    /// the caller keeps only these).
    pub tokens: usize,
    /// A copy of the entry's state.
    pub value: E,
}

impl<E: Clone> PromptCache<E> {
    /// An empty cache holding at most `capacity` positions (0: it keeps nothing).
    pub fn new(capacity: usize) -> PromptCache<E> {
        PromptCache {
            capacity,
            entries: Vec::new(),
            clock: 0,
            hits: 0,
            reused: 0,
        }
    }

    /// The most positions it holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Whether it keeps anything at all.
    pub fn enabled(&self) -> bool {
        self.capacity > 0
    }

    /// Positions held now, all entries together.
    pub fn tokens(&self) -> usize {
        self.entries.iter().map(|e| e.tokens.len()).sum()
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Lookups that reused something, and the positions they reused, since it was made.
    pub fn stats(&self) -> (u64, u64) {
        (self.hits, self.reused)
    }

    /// The entry sharing the longest prefix with `prompt`, that prefix capped at `limit`
    /// tokens; `None` when no entry shares a first token. The entry becomes the most recently
    /// used.
    pub fn lookup(&mut self, prompt: &[u32], limit: usize) -> Option<Hit<E>> {
        self.lookup_usable(prompt, limit, |_, _| true)
    }

    /// [`PromptCache::lookup`] among the entries whose state can be cut to the shared prefix
    /// (`usable(state, prefix)`): a sliding layer's state can be cut only a few positions
    /// short of its end, so the longest shared prefix may be unusable where a shorter one, of
    /// another entry, is not.
    pub fn lookup_usable(
        &mut self,
        prompt: &[u32],
        limit: usize,
        usable: impl Fn(&E, usize) -> bool,
    ) -> Option<Hit<E>> {
        let limit = limit.min(prompt.len());
        let (best, n) = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, common_prefix(&e.tokens, &prompt[..limit])))
            .filter(|&(i, n)| n > 0 && usable(&self.entries[i].value, n))
            .max_by_key(|&(i, n)| (n, self.entries[i].used))?;
        self.clock += 1;
        let e = &mut self.entries[best];
        e.used = self.clock;
        self.hits += 1;
        self.reused += n as u64;
        Some(Hit {
            tokens: n,
            value: e.value.clone(),
        })
    }

    /// Keeps `value`, the state of `tokens`, within `room` positions (and the capacity),
    /// evicting the least recently used entries for it. Entries that are a prefix of `tokens`
    /// go (the new one answers every lookup they would); nothing is stored when an entry
    /// already extends `tokens` (that one is refreshed instead) or when `tokens` alone does
    /// not fit.
    pub fn insert(&mut self, tokens: Vec<u32>, value: E, room: usize) {
        let bound = self.capacity.min(room);
        if tokens.is_empty() || tokens.len() > bound {
            self.shrink_to(bound);
            return;
        }
        self.clock += 1;
        if let Some(e) = self
            .entries
            .iter_mut()
            .find(|e| e.tokens.starts_with(&tokens))
        {
            e.used = self.clock;
            self.shrink_to(bound);
            return;
        }
        self.entries.retain(|e| !tokens.starts_with(&e.tokens));
        self.shrink_to(bound - tokens.len());
        self.entries.push(Entry {
            tokens,
            value,
            used: self.clock,
        });
    }

    /// Evicts least recently used entries until at most `tokens` positions are held.
    pub fn shrink_to(&mut self, tokens: usize) {
        let mut held = self.tokens();
        while held > tokens {
            let Some(oldest) = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.used)
                .map(|(i, _)| i)
            else {
                return;
            };
            held -= self.entries.swap_remove(oldest).tokens.len();
        }
    }

    /// Drops every entry.
    pub fn clear(&mut self) {
        self.entries.clear();
    }
}

/// Length of the common prefix of `a` and `b`.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn toks(r: std::ops::Range<u32>) -> Vec<u32> {
        r.collect()
    }

    /// A cache of two entries: `0..10` ("ten"), and `0..4` then 99, 98 ("four").
    fn ten_and_four() -> PromptCache<&'static str> {
        let mut c = PromptCache::new(1000);
        c.insert(toks(0..10), "ten", 1000);
        c.insert(
            toks(0..4).into_iter().chain([99, 98]).collect(),
            "four",
            1000,
        );
        c
    }

    #[test]
    fn the_longest_prefix_wins_and_stops_one_short_of_the_prompt() {
        let mut c = ten_and_four();
        let prompt = toks(0..30);
        let hit = c.lookup(&prompt, prompt.len() - 1).unwrap();
        assert_eq!((hit.tokens, hit.value), (10, "ten"));
        // The prompt is exactly the entry: one token must still run.
        let hit = c.lookup(&toks(0..10), 9).unwrap();
        assert_eq!((hit.tokens, hit.value), (9, "ten"));
        let hit = c.lookup(&[0, 1, 2, 3, 99, 5], 5).unwrap();
        assert_eq!((hit.tokens, hit.value), (5, "four"));
        assert_eq!(c.lookup(&[7, 0, 1], 2), None);
        assert_eq!(c.stats(), (3, 24));
    }

    #[test]
    fn an_entry_that_cannot_be_cut_to_the_prefix_leaves_the_hit_to_another() {
        let mut c = ten_and_four();
        // "ten" shares 8 tokens but can only be cut to 9 or more (a sliding layer's state).
        let usable = |e: &&str, n: usize| *e != "ten" || n >= 9;
        let hit = c.lookup_usable(&toks(0..8), 8, usable).unwrap();
        assert_eq!((hit.tokens, hit.value), (4, "four"));
        let hit = c.lookup_usable(&toks(0..9), 9, usable).unwrap();
        assert_eq!((hit.tokens, hit.value), (9, "ten"));
        assert_eq!(c.lookup_usable(&toks(0..8), 8, |_, _| false), None);
    }

    #[test]
    fn eviction_is_least_recently_used_and_bounded_by_capacity_and_room() {
        let mut c: PromptCache<u32> = PromptCache::new(100);
        c.insert(toks(0..40), 1, 1000);
        c.insert(toks(100..140), 2, 1000);
        assert_eq!(c.tokens(), 80);
        // Using the first makes the second the oldest.
        assert!(c.lookup(&toks(0..50), 49).is_some());
        c.insert(toks(200..240), 3, 1000);
        assert_eq!(c.tokens(), 80);
        assert_eq!(c.lookup(&toks(100..140), 39), None, "the oldest went");
        assert!(c.lookup(&toks(0..40), 39).is_some());
        // Less room than capacity: the caller's room bounds it.
        c.insert(toks(300..330), 4, 50);
        assert!(c.tokens() <= 50);
        assert_eq!(c.lookup(&toks(300..330), 29).unwrap().value, 4);
        // Too big to fit at all: not stored, and what fits stays.
        c.insert(toks(400..520), 5, 1000);
        assert_eq!(c.lookup(&toks(400..520), 119), None);
        c.shrink_to(0);
        assert!(c.is_empty());
    }

    #[test]
    fn a_longer_turn_replaces_its_prefix_and_a_shorter_one_is_not_stored() {
        let mut c: PromptCache<u32> = PromptCache::new(1000);
        c.insert(toks(0..20), 1, 1000);
        c.insert(toks(0..50), 2, 1000);
        assert_eq!(c.len(), 1);
        assert_eq!(c.tokens(), 50);
        c.insert(toks(0..30), 3, 1000);
        assert_eq!(c.len(), 1);
        assert_eq!(
            c.lookup(&toks(0..60), 59).unwrap(),
            Hit {
                tokens: 50,
                value: 2
            }
        );
    }

    #[test]
    fn a_disabled_cache_keeps_nothing() {
        let mut c: PromptCache<u32> = PromptCache::new(0);
        assert!(!c.enabled());
        c.insert(toks(0..5), 1, 1000);
        assert!(c.is_empty());
        assert_eq!(c.lookup(&toks(0..5), 4), None);
    }

    proptest! {
        /// Whatever is stored and looked up, the cache stays within its bounds and every hit
        /// is a true common prefix within the limit.
        #[test]
        fn bounds_and_hits_are_honest(
            ops in prop::collection::vec(
                (prop::collection::vec(0u32..4, 0..40), any::<bool>(), 0usize..200), 1..60),
            capacity in 0usize..150,
        ) {
            let mut c: PromptCache<Vec<u32>> = PromptCache::new(capacity);
            for (tokens, store, room) in ops {
                if store {
                    c.insert(tokens.clone(), tokens, room);
                    prop_assert!(c.tokens() <= capacity.min(room));
                } else {
                    let limit = tokens.len().saturating_sub(1);
                    if let Some(hit) = c.lookup(&tokens, limit) {
                        prop_assert!(hit.tokens >= 1 && hit.tokens <= limit);
                        prop_assert_eq!(&hit.value[..hit.tokens], &tokens[..hit.tokens]);
                    }
                }
                prop_assert!(c.tokens() <= capacity);
            }
        }
    }
}
