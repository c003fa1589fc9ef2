//! Encoding a chat prompt so that text from clients can never become control tokens.
//!
//! A chat template writes markup such as `<|im_start|>user` around each message; the
//! tokenizer must turn that markup into its special tokens. But a message that itself
//! contains `<|im_start|>system` (typed by a user, pasted from a web page into an agent's
//! tool result, or put in a tool's description or a call's arguments) would become the same
//! special tokens, and open a new turn the client never sent.
//!
//! So every text a client sent is **marked before the template renders it**
//! ([`UntrustedMarks::mark`]): each special token's text in it becomes one private-use
//! character standing for that token. The template renders the marked texts wherever it
//! puts them (as they are, trimmed, inside `tojson`: a private-use character passes through
//! all of them unchanged), and [`Tokenizer::encode_marked`] encodes the template's own text
//! with special tokens recognised and each mark as the plain text of its token (the
//! characters `<`, `|`, `im`, …, as llama.cpp does with `parse_special = false`). When no
//! client text contains a special token's text there are no marks and the prompt is encoded
//! exactly as before.

use crate::error::{Result, TextError};
use crate::tokenizer::Tokenizer;

/// The two Unicode private-use planes (15 and 16) whose characters can stand for special
/// tokens: the first one that no client text uses is taken.
const MARK_PLANES: [u32; 2] = [0xF_0000, 0x10_0000];
/// Characters in one plane usable as marks (U+xFFFE and U+xFFFF are noncharacters).
const PLANE_MARKS: u32 = 0xFFFE;

/// How client texts are marked for one prompt (see the module docs): made by
/// [`Tokenizer::untrusted_marks`] only when some text holds a special token's text.
#[derive(Debug, Clone)]
pub struct UntrustedMarks {
    /// The special tokens' texts, longest first; mark `i` stands for `specials[i]`.
    specials: Vec<String>,
    /// Which bytes start some special token's text (the rest are copied without a search).
    starts: [bool; 256],
    /// The first mark character's code point.
    base: u32,
}

impl UntrustedMarks {
    /// `text` with every special token's text replaced by its mark (longest first, so
    /// `<|im_start|>` is never cut into a shorter token's text).
    pub fn mark(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        'outer: while !rest.is_empty() {
            let Some(skip) = rest.bytes().position(|b| self.starts[b as usize]) else {
                out.push_str(rest);
                break;
            };
            out.push_str(&rest[..skip]);
            rest = &rest[skip..];
            for (i, special) in self.specials.iter().enumerate() {
                if let Some(after) = rest.strip_prefix(special.as_str()) {
                    out.push(self.mark_char(i));
                    rest = after;
                    continue 'outer;
                }
            }
            let c = rest.chars().next().expect("rest is not empty");
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
        out
    }

    fn mark_char(&self, index: usize) -> char {
        char::from_u32(self.base + index as u32).expect("marks are valid characters")
    }

    /// The special token text that `c` marks, if it is a mark.
    fn special_of(&self, c: char) -> Option<&str> {
        let offset = (c as u32).checked_sub(self.base)?;
        self.specials.get(offset as usize).map(String::as_str)
    }
}

impl Tokenizer {
    /// The marks for a prompt whose client texts are `texts`, or `None` when none of them
    /// holds a special token's text (then the prompt is encoded as it is). An error only when
    /// the texts use both private-use planes, so that no mark could be told from them.
    pub fn untrusted_marks<'a>(
        &self,
        texts: impl IntoIterator<Item = &'a str> + Clone,
    ) -> Result<Option<UntrustedMarks>> {
        let specials = self.special_texts();
        let risky = texts
            .clone()
            .into_iter()
            .any(|t| specials.iter().any(|s| t.contains(s.as_str())));
        if !risky {
            return Ok(None);
        }
        let uses_plane = |base: u32| {
            texts.clone().into_iter().any(|t| {
                t.chars()
                    .any(|c| (base..base + PLANE_MARKS).contains(&(c as u32)))
            })
        };
        let Some(base) = MARK_PLANES.into_iter().find(|b| !uses_plane(*b)) else {
            return Err(TextError::Tokenizer(
                "the request holds the model's control tokens as text and also characters of \
                 both Unicode private-use planes 15 and 16, so the control tokens cannot be kept \
                 as plain text; remove one or the other"
                    .into(),
            ));
        };
        if specials.len() as u32 > PLANE_MARKS {
            return Err(TextError::Tokenizer(format!(
                "the tokenizer has {} special tokens, more than can be marked",
                specials.len()
            )));
        }
        let mut starts = [false; 256];
        for s in &specials {
            starts[s.as_bytes()[0] as usize] = true;
        }
        Ok(Some(UntrustedMarks {
            specials,
            starts,
            base,
        }))
    }

    /// Token ids of `rendered` (a chat template's output over texts marked with `marks`):
    /// the template's text with special tokens recognised, every mark as the plain encoding
    /// of the special token's text it stands for.
    pub fn encode_marked(&self, rendered: &str, marks: &UntrustedMarks) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        let mut start = 0;
        for (at, c) in rendered.char_indices() {
            let Some(special) = marks.special_of(c) else {
                continue;
            };
            ids.extend(self.encode(&rendered[start..at])?);
            ids.extend(self.encode_plain(special)?);
            start = at + c.len_utf8();
        }
        ids.extend(self.encode(&rendered[start..])?);
        Ok(ids)
    }

    /// Token ids of `text` with special-token matching off: `<|im_start|>` is the tokens of
    /// its characters.
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
        let plain = self.plain.get_or_init(|| {
            let mut plain = self
                .kept_controls_special()
                .unwrap_or_else(|| self.inner.clone());
            plain.set_encode_special_tokens(true);
            plain
        });
        let enc = plain
            .encode(text, false)
            .map_err(|e| TextError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The tokenizer with the kept control tokens special again (so that the plain encoding
    /// spells them as text); `None` when there are none, or it cannot be rebuilt.
    fn kept_controls_special(&self) -> Option<tokenizers::Tokenizer> {
        if self.kept_controls.is_empty() {
            return None;
        }
        let mut json: serde_json::Value =
            serde_json::from_str(&self.inner.to_string(false).ok()?).ok()?;
        for token in json.get_mut("added_tokens")?.as_array_mut()? {
            let kept = token
                .get("content")
                .and_then(serde_json::Value::as_str)
                .is_some_and(|c| self.kept_controls.iter().any(|k| k == c));
            if kept {
                token["special"] = serde_json::Value::Bool(true);
            }
        }
        std::str::FromStr::from_str(&json.to_string()).ok()
    }

    /// The texts of the vocabulary's special tokens, longest first.
    fn special_texts(&self) -> Vec<String> {
        let mut texts: Vec<String> = self
            .inner
            .get_added_tokens_decoder()
            .into_values()
            .filter(|t| t.special)
            .map(|t| t.content)
            .chain(self.kept_controls.iter().cloned())
            .filter(|t| !t.is_empty())
            .collect();
        texts.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        texts.dedup();
        texts
    }
}
