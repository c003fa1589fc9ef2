//! Kimi K3 writes its turn in XTML channels, as its chat template renders an assistant's
//! message: `<|open|>think<|sep|>` thought `<|close|>think<|sep|>`, then
//! `<|open|>response<|sep|>` answer `<|close|>response<|sep|>`, then an optional
//! `<|open|>tools<|sep|>` section of calls, and `<|close|>message<|sep|>` before the
//! end-of-message token. The thought's tags are the reasoning splitter's
//! ([`crate::reasoning::KIMI_K3_TAGS`]) and the tools section is the call parser's; the
//! response channel's tags and the message's close carry nothing a client should see, so
//! [`ChannelTags`] drops them from the answer's text as it streams.

use crate::text_scan::held_suffix;

/// The tags around K3's answer that are structure, not text.
pub const KIMI_K3_SCAFFOLD: &[&str] = &[
    "<|open|>response<|sep|>",
    "<|close|>response<|sep|>",
    "<|close|>message<|sep|>",
];

/// Drops a fixed set of tags from streamed text; text that may still become one is held
/// back until the next piece tells.
#[derive(Debug, Clone)]
pub struct ChannelTags {
    tags: &'static [&'static str],
    pending: String,
}

impl ChannelTags {
    /// A filter that drops each of `tags` wherever it appears whole.
    pub fn new(tags: &'static [&'static str]) -> ChannelTags {
        ChannelTags {
            tags,
            pending: String::new(),
        }
    }

    /// The next piece of text; what can be released now, without the tags.
    pub fn push(&mut self, text: &str) -> String {
        self.pending.push_str(text);
        let mut out = String::new();
        while let Some((at, len)) = self
            .tags
            .iter()
            .filter_map(|tag| self.pending.find(tag).map(|at| (at, tag.len())))
            .min()
        {
            out.push_str(&self.pending[..at]);
            self.pending.drain(..at + len);
        }
        let held = self
            .tags
            .iter()
            .map(|tag| held_suffix(&self.pending, tag))
            .max()
            .unwrap_or(0);
        let release = self.pending.len() - held;
        out.extend(self.pending.drain(..release));
        out
    }

    /// The end of the text: what was held back (a tag's start that never completed is text).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn through(pieces: &[&str]) -> String {
        let mut tags = ChannelTags::new(KIMI_K3_SCAFFOLD);
        let mut out: String = pieces.iter().map(|p| tags.push(p)).collect();
        out.push_str(&tags.finish());
        out
    }

    #[test]
    fn the_response_channel_and_message_close_are_dropped_wherever_they_split() {
        let turn =
            "<|open|>response<|sep|>It is sunny.<|close|>response<|sep|><|close|>message<|sep|>";
        assert_eq!(through(&[turn]), "It is sunny.");
        let chars: Vec<String> = turn.chars().map(String::from).collect();
        let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(through(&pieces), "It is sunny.");
        // Other tags and a tag's unfinished start stay text.
        assert_eq!(
            through(&["a <|open|>tools<|sep|> b <|close|>resp"]),
            "a <|open|>tools<|sep|> b <|close|>resp"
        );
    }
}
