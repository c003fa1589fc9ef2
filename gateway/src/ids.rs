//! Ids of answers (`chatcmpl-...`, `msg_...`, `resp_...`): unique per node process (the time
//! in microseconds and a counter), so that logs and clients can tell requests apart.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A fresh id suffix and the current Unix time in seconds (the answer's `created`).
pub fn unique() -> (String, u64) {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed) & 0xff_ffff;
    (format!("{:x}{n:06x}", now.as_micros()), now.as_secs())
}
