//! Streaming detokenization: turns tokens into text pieces as they arrive without ever
//! emitting half a UTF-8 character (byte-level tokens can split a character), and holds back
//! text that might be the start of a stop string.

use crate::error::Result;
use crate::tokenizer::Tokenizer;

/// Incremental decoder of one generation.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    ids: Vec<u32>,
    /// Start of the window decoded for context.
    prefix: usize,
    /// Tokens up to here have been turned into emitted text.
    read: usize,
}

impl StreamDecoder {
    /// A decoder with no tokens yet.
    pub fn new() -> StreamDecoder {
        StreamDecoder::default()
    }

    /// Adds a token; returns the new complete text, possibly empty while a character is
    /// still incomplete.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<String> {
        self.ids.push(id);
        let before = tokenizer.decode(&self.ids[self.prefix..self.read], true)?;
        let now = tokenizer.decode(&self.ids[self.prefix..], true)?;
        if now.ends_with('\u{FFFD}') || now.len() <= before.len() || !now.starts_with(&before) {
            if now.len() > before.len() && !now.starts_with(&before) && !now.ends_with('\u{FFFD}') {
                // Decoding is not prefix-stable here (rare normalisation): restart the window.
                let delta = now.get(before.len()..).unwrap_or("").to_owned();
                self.prefix = self.read;
                self.read = self.ids.len();
                return Ok(delta);
            }
            return Ok(String::new());
        }
        let delta = now[before.len()..].to_owned();
        self.prefix = self.read;
        self.read = self.ids.len();
        Ok(delta)
    }

    /// Whatever is left at the end (an incomplete character comes out as U+FFFD).
    pub fn finish(&mut self, tokenizer: &Tokenizer) -> Result<String> {
        let before = tokenizer.decode(&self.ids[self.prefix..self.read], true)?;
        let now = tokenizer.decode(&self.ids[self.prefix..], true)?;
        self.prefix = self.ids.len();
        self.read = self.ids.len();
        Ok(now.get(before.len()..).unwrap_or("").to_owned())
    }
}

/// Finds stop strings in streamed text and decides how much of it is safe to emit.
#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    text: String,
    emitted: usize,
}

/// What the matcher says after a piece of text.
#[derive(Debug, PartialEq, Eq)]
pub enum StopCheck {
    /// Emit this text and go on.
    Continue(String),
    /// A stop string was found: emit this (the text before it) and stop.
    Stop(String),
}

impl StopMatcher {
    /// A matcher for these stop strings (empty ones are ignored).
    pub fn new(stops: &[String]) -> StopMatcher {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            ..Default::default()
        }
    }

    /// Adds generated text.
    pub fn push(&mut self, piece: &str) -> StopCheck {
        let search_from = self.emitted;
        self.text.push_str(piece);
        let found = self
            .stops
            .iter()
            .filter_map(|s| {
                self.text[search_from..]
                    .find(s.as_str())
                    .map(|i| i + search_from)
            })
            .min();
        if let Some(at) = found {
            let out = self.text[self.emitted..at].to_owned();
            self.text.truncate(at);
            self.emitted = at;
            return StopCheck::Stop(out);
        }
        // Hold back the longest tail that could still become a stop string.
        let mut hold = 0;
        for s in &self.stops {
            for (len, _) in s.char_indices().skip(1) {
                if len > hold && self.text.ends_with(&s[..len]) {
                    hold = len;
                }
            }
        }
        let safe = self.text.len() - hold;
        let out = self.text[self.emitted..safe.max(self.emitted)].to_owned();
        self.emitted = safe.max(self.emitted);
        StopCheck::Continue(out)
    }

    /// Releases any held-back text (generation ended without a stop string).
    pub fn finish(&mut self) -> String {
        let out = self.text[self.emitted..].to_owned();
        self.emitted = self.text.len();
        out
    }

    /// All text accepted so far (without the stop string).
    pub fn text(&self) -> &str {
        &self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_strings_across_pieces() {
        let mut m = StopMatcher::new(&["</end>".to_owned()]);
        assert_eq!(m.push("Hello </"), StopCheck::Continue("Hello ".into()));
        assert_eq!(m.push("en"), StopCheck::Continue(String::new()));
        assert_eq!(m.push("d> more"), StopCheck::Stop(String::new()));
        assert_eq!(m.text(), "Hello ");
    }

    #[test]
    fn held_text_is_released_when_it_cannot_match() {
        let mut m = StopMatcher::new(&["ab".to_owned()]);
        assert_eq!(m.push("xa"), StopCheck::Continue("x".into()));
        assert_eq!(m.push("c"), StopCheck::Continue("ac".into()));
        assert_eq!(m.push("a"), StopCheck::Continue(String::new()));
        assert_eq!(m.finish(), "a");
    }

    #[test]
    fn multibyte_text_is_never_split() {
        let mut m = StopMatcher::new(&["é!".to_owned()]);
        assert_eq!(m.push("café"), StopCheck::Continue("caf".into()));
        assert_eq!(m.push("?"), StopCheck::Continue("é?".into()));
    }
}
