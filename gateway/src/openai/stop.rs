//! Stop strings, enforced on streamed text: text that could be the start of a stop string is
//! held back until it is known not to be one, so a client never sees part of a stop string,
//! even when it is split across tokens.

/// Scans text deltas for the first occurrence of any stop string.
#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
}

/// What one delta produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopScan {
    /// Text safe to send now (possibly empty).
    pub emit: String,
    /// A stop string matched: `emit` ends right before it and generation should end.
    pub stopped: bool,
    /// The stop string that matched (the earliest; the first listed on a tie).
    pub matched: Option<String>,
}

impl StopMatcher {
    /// A matcher for these stop strings; empty strings are ignored.
    pub fn new(stops: &[String]) -> StopMatcher {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            pending: String::new(),
        }
    }

    /// Feeds the next delta.
    pub fn push(&mut self, delta: &str) -> StopScan {
        self.pending.push_str(delta);
        if self.stops.is_empty() {
            return StopScan {
                emit: std::mem::take(&mut self.pending),
                stopped: false,
                matched: None,
            };
        }
        let first_match = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|(at, _)| *at);
        if let Some((at, stop)) = first_match {
            let matched = Some(stop.clone());
            let emit = self.pending[..at].to_string();
            self.pending.clear();
            return StopScan {
                emit,
                stopped: true,
                matched,
            };
        }
        let hold = self.longest_held_suffix();
        let cut = self.pending.len() - hold;
        let emit = self.pending[..cut].to_string();
        self.pending.replace_range(..cut, "");
        StopScan {
            emit,
            stopped: false,
            matched: None,
        }
    }

    /// Text held back when generation ends without a match: it was not a stop string after all.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// Length in bytes of the longest suffix of `pending` that is a proper prefix of a stop
    /// string (always at a character boundary).
    fn longest_held_suffix(&self) -> usize {
        let text = self.pending.as_str();
        text.char_indices()
            .map(|(i, _)| &text[i..])
            .find(|suffix| self.stops.iter().any(|s| s.starts_with(suffix)))
            .map_or(0, str::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn run(stops: &[&str], deltas: &[&str]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops);
        let mut out = String::new();
        for d in deltas {
            let scan = m.push(d);
            out.push_str(&scan.emit);
            if scan.stopped {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn stop_split_across_deltas_is_cut() {
        assert_eq!(
            run(&["END"], &["hello E", "N", "D more"]),
            ("hello ".into(), true)
        );
    }

    #[test]
    fn near_miss_is_released() {
        assert_eq!(
            run(&["END"], &["hello EN", "x"]),
            ("hello ENx".into(), false)
        );
        assert_eq!(run(&["END"], &["EN"]), ("EN".into(), false));
    }

    #[test]
    fn earliest_of_several_wins() {
        assert_eq!(run(&["b", "a"], &["xxab"]), ("xx".into(), true));
    }

    #[test]
    fn multibyte_text_is_safe() {
        assert_eq!(run(&["é!"], &["café", "!"]), ("caf".into(), true));
        assert_eq!(run(&["ü"], &["日本", "語"]), ("日本語".into(), false));
    }

    proptest! {
        /// Whatever the split, the output equals the text cut at the first stop string.
        #[test]
        fn matches_whole_text_scan(text in "[abc ]{0,40}", stop in "[abc]{1,3}", cuts in proptest::collection::vec(0usize..40, 0..6)) {
            let mut cuts: Vec<usize> = cuts.into_iter().filter(|c| *c <= text.len()).collect();
            cuts.sort();
            cuts.dedup();
            let mut deltas = Vec::new();
            let mut last = 0;
            for c in cuts { deltas.push(&text[last..c]); last = c; }
            deltas.push(&text[last..]);
            let expected = match text.find(&stop) {
                Some(at) => (text[..at].to_string(), true),
                None => (text.clone(), false),
            };
            prop_assert_eq!(run(&[stop.as_str()], &deltas), expected);
        }
    }
}
