//! The vocabulary as llguidance sees it: a [`toktrie::TokTrie`] over the bytes each token
//! stands for, built from the model's own tokenizer (not `toktrie_hf_tokenizers`, which pins
//! another `tokenizers` than the workspace's). Control tokens (`<|im_end|>`) are spelled with
//! toktrie's special-token marker byte, so that a grammar never produces them as text; so are
//! the tool-call markup tokens ([`TOOL_MARKUP_TOKENS`]) a vocabulary holds, special or not
//! (harmony's `<|channel|>` is kept ordinary for decoding, DeepSeek publishes its tool markers
//! as ordinary): inside a forced call's JSON string they would end the call for its parser,
//! and a grammar names them where they belong (`ctl_N` rules, [`super::resolve_controls`]).

use crate::tokenizer::{Tokenizer, TOOL_MARKUP_TOKENS};
use std::sync::Arc;
use toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};

impl Tokenizer {
    /// The token environment of this tokenizer for llguidance: every id up to the largest
    /// the vocabulary knows (at least `logits` of them, the model's padded vocabulary), each
    /// as its bytes, with the model's end tokens as the trie's end tokens.
    pub(crate) fn grammar_env(&self, logits: usize) -> TokEnv {
        let special: std::collections::HashSet<u32> = self
            .inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special || TOOL_MARKUP_TOKENS.contains(&t.content.as_str()))
            .map(|(id, _)| id)
            .collect();
        let known = self
            .inner
            .get_vocab(true)
            .values()
            .map(|&id| id as usize + 1)
            .max()
            .unwrap_or(0);
        let size = known.max(logits).max(1);
        let words: Vec<Vec<u8>> = (0..size as u32)
            .map(|id| {
                let Some(piece) = self.inner.id_to_token(id) else {
                    return Vec::new();
                };
                if special.contains(&id) {
                    let mut marked = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    marked.extend_from_slice(piece.as_bytes());
                    return marked;
                }
                self.grammar_bytes(id, &piece)
            })
            .collect();
        let ends: Vec<u32> = self
            .eos_token_ids
            .iter()
            .copied()
            .filter(|&t| (t as usize) < size)
            .collect();
        let info = TokRxInfo::new(size as u32, ends.first().copied().unwrap_or(0));
        let mut trie = TokTrie::from(&info, &words);
        if !ends.is_empty() {
            trie = trie.with_eos_tokens(&ends);
        }
        Arc::new(ApproximateTokEnv::new(trie))
    }

    /// The bytes of ordinary token `id` (vocabulary spelling `piece`) in running text: its
    /// [`Tokenizer::token_bytes`], except that a SentencePiece piece keeps the leading space
    /// its `▁` stands for (decoded alone, that space is dropped).
    fn grammar_bytes(&self, id: u32, piece: &str) -> Vec<u8> {
        let bytes = self.token_bytes(id);
        if piece.starts_with('\u{2581}') && !bytes.starts_with(b" ") {
            return piece.replace('\u{2581}', " ").into_bytes();
        }
        bytes
    }
}
