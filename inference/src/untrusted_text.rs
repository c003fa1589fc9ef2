//! Encoding a chat prompt so that text from clients can never become control tokens.
//!
//! A chat template writes markup such as `<|im_start|>user` around each message; the
//! tokenizer must turn that markup into its special tokens. But a message that itself
//! contains `<|im_start|>system` (typed by a user, or pasted from a web page into an agent's
//! tool result) would become the same special tokens, and open a new turn the client never
//! sent. So the rendered prompt is encoded in pieces: the template's own text with special
//! tokens recognised, every message's text with them off (as plain text, as llama.cpp does
//! with `parse_special = false`). When no message contains a special token's text, the
//! whole prompt is encoded at once and nothing changes.

use crate::error::{InferenceError, Result};
use crate::tokenizer::Tokenizer;

impl Tokenizer {
    /// Token ids of `rendered` (a chat template's output), where each of `contents` (the
    /// messages' texts, in the order the template writes them) is encoded with special
    /// tokens off. A content that holds a special token's text but that the template wrote
    /// changed (so it cannot be found to keep apart) is refused with an error that says so.
    pub fn encode_chat(&self, rendered: &str, contents: &[&str]) -> Result<Vec<u32>> {
        let specials = self.special_texts();
        let risky = |text: &str| specials.iter().find(|s| text.contains(s.as_str())).cloned();
        if !contents.iter().any(|c| risky(c).is_some()) {
            return self.encode(rendered);
        }
        let mut ids = Vec::new();
        let mut cursor = 0;
        for content in contents {
            let Some(special) = risky(content) else {
                continue;
            };
            let rest = &rendered[cursor..];
            let found = rest
                .find(*content)
                .map(|at| (at, content.len()))
                .or_else(|| {
                    let trimmed = content.trim();
                    rest.find(trimmed).map(|at| (at, trimmed.len()))
                });
            let Some((at, len)) = found else {
                return Err(InferenceError::Tokenizer(format!(
                    "a message contains the model's control token `{special}`, and the chat \
                     template rewrites that message, so it cannot be kept as plain text; \
                     remove the token from the message"
                )));
            };
            ids.extend(self.encode(&rest[..at])?);
            ids.extend(self.encode_plain(&rest[at..at + len])?);
            cursor += at + len;
        }
        ids.extend(self.encode(&rendered[cursor..])?);
        Ok(ids)
    }

    /// Token ids of `text` with special-token matching off: `<|im_start|>` is the tokens of
    /// its characters.
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
        let plain = self.plain.get_or_init(|| {
            let mut plain = self.inner.clone();
            plain.set_encode_special_tokens(true);
            plain
        });
        let enc = plain
            .encode(text, false)
            .map_err(|e| InferenceError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The texts of the vocabulary's special tokens, longest first.
    fn special_texts(&self) -> Vec<String> {
        let mut texts: Vec<String> = self
            .inner
            .get_added_tokens_decoder()
            .into_values()
            .filter(|t| t.special)
            .map(|t| t.content)
            .filter(|t| !t.is_empty())
            .collect();
        texts.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        texts
    }
}
