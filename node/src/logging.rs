//! The node's log: stderr, filtered by `RUST_LOG` (else by `-v`), with repeats of one
//! warning from mDNS discovery held back.
//!
//! Without a multicast route, the mDNS library warns on every query it fails to send, about
//! three times a second (850 lines in five minutes, probed 2026-12-04), burying everything
//! else. A warning or error from discovery is shown once per call site per
//! [`REPEAT_WINDOW`]; the rest of the log is untouched.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a discovery warning from one call site stays quiet after it was shown.
pub const REPEAT_WINDOW: Duration = Duration::from_secs(60);

/// The log targets whose repeated warnings are held back.
const NOISY_TARGETS: [&str; 1] = ["swarm_discovery"];

/// When each call site last got through.
#[derive(Default)]
struct Repeats {
    shown: BTreeMap<(String, u32), Instant>,
}

impl Repeats {
    /// Whether the event at `site` may show at `now`.
    fn allow(&mut self, site: (String, u32), now: Instant) -> bool {
        match self.shown.get(&site) {
            Some(&last) if now.duration_since(last) < REPEAT_WINDOW => false,
            _ => {
                self.shown.insert(site, now);
                true
            }
        }
    }
}

/// Whether `meta` is a warning or error of discovery (held back when it repeats).
fn noisy(meta: &tracing::Metadata<'_>) -> bool {
    meta.is_event()
        && *meta.level() <= tracing::Level::WARN
        && NOISY_TARGETS.iter().any(|t| meta.target().starts_with(t))
}

/// Sets up the log (see the module docs).
pub fn init(verbose: u8) {
    use tracing::subscriber::Interest;
    use tracing_subscriber::filter::{dynamic_filter_fn, FilterExt};
    use tracing_subscriber::prelude::*;
    use tracing_subscriber::{fmt, EnvFilter};
    // `shoal` selects the binary's events and this crate's (`shoal_node::…`): directives match
    // targets by prefix.
    let default = match verbose {
        0 => "info",
        1 => "info,shoal=debug,mesh=debug,gateway=debug,inference=debug,placement=debug",
        _ => "debug,shoal=trace,mesh=trace,gateway=trace,inference=trace,placement=trace",
    };
    let levels = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let repeats = Mutex::new(Repeats::default());
    // Decided per event for the noisy targets (the answer changes with time), and once per
    // call site for everything else.
    let quiet = dynamic_filter_fn(move |meta, _| {
        if !noisy(meta) {
            return true;
        }
        let site = (
            meta.file().unwrap_or(meta.target()).to_owned(),
            meta.line().unwrap_or(0),
        );
        repeats
            .lock()
            .map(|mut r| r.allow(site, Instant::now()))
            .unwrap_or(true)
    })
    .with_callsite_filter(|meta| {
        if noisy(meta) {
            Interest::sometimes()
        } else {
            Interest::always()
        }
    });
    tracing_subscriber::registry()
        .with(
            fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(levels.and(quiet)),
        )
        .init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_site_shows_once_per_window() {
        let mut r = Repeats::default();
        let t0 = Instant::now();
        let site = || ("socket.rs".to_string(), 490);
        assert!(r.allow(site(), t0));
        assert!(!r.allow(site(), t0 + Duration::from_millis(300)));
        assert!(!r.allow(site(), t0 + REPEAT_WINDOW - Duration::from_millis(1)));
        // Another call site is its own.
        assert!(r.allow(("socket.rs".to_string(), 464), t0 + Duration::from_secs(1)));
        assert!(r.allow(site(), t0 + REPEAT_WINDOW));
    }
}
