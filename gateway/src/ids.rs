//! Ids of answers (`chatcmpl-...`, `msg_...`, `resp_...`): unique per node process (the time
//! in microseconds and a counter), so that logs and clients can tell requests apart; and not
//! guessable (64 bits from a key drawn at random when the process starts), because an id is
//! what `POST /v1/cancel/{id}` stops: with only the time and a counter, one client could stop
//! another's generation by guessing.

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// A fresh id suffix and the current Unix time in seconds (the answer's `created`).
pub fn unique() -> (String, u64) {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    // SipHash under a key the standard library draws from the OS once per process: a keyed
    // pseudo-random function of the counter, so no two ids share their random part and none
    // can be derived from another.
    static KEY: OnceLock<RandomState> = OnceLock::new();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let secret = KEY.get_or_init(RandomState::new).hash_one(count);
    let n = count & 0xff_ffff;
    (
        format!("{:x}{n:06x}{secret:016x}", now.as_micros()),
        now.as_secs(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_differ_and_carry_64_unguessable_bits() {
        let (a, _) = unique();
        let (b, _) = unique();
        assert_ne!(a, b);
        // The random parts of consecutive ids share nothing predictable.
        let tail = |s: &str| u64::from_str_radix(&s[s.len() - 16..], 16).unwrap();
        assert_ne!(tail(&a), tail(&b));
        assert_ne!(tail(&a).wrapping_add(1), tail(&b));
        assert!(a.len() >= 16 + 6 + 10, "{a}");
    }
}
