//! Prompts of about `pp` tokens without a tokenizer on the client: a user message of repeated
//! words (one token each in the BPE and SentencePiece vocabularies of Llama- and Qwen-family
//! models), whose word count is corrected from what the server reports as
//! `usage.prompt_tokens` until the templated prompt has the asked size.

/// The word repeated; " the" is a single token in every common LLM vocabulary.
const WORD: &str = "the";

/// Attempts at correcting the word count before settling for the closest.
pub const MAX_CALIBRATION_ROUNDS: usize = 4;

/// The user message of `words` words.
pub fn build_prompt(words: usize) -> String {
    let mut text = String::with_capacity(words * (WORD.len() + 1));
    for i in 0..words {
        if i > 0 {
            text.push(' ');
        }
        text.push_str(WORD);
    }
    text
}

/// The word count to try next, given that `words` words made a prompt of `got` tokens and
/// `target` are wanted: the difference, at one token per word. Never below one word.
pub fn next_word_count(words: usize, got: u64, target: u64) -> usize {
    let next = words as i64 + (target as i64 - got as i64);
    next.max(1) as usize
}

/// A first guess, before the server has counted anything: the chat template adds a few
/// tokens (SmolLM2's adds about a dozen).
pub fn first_word_count(target: u64) -> usize {
    (target.saturating_sub(12)).max(1) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_have_the_asked_word_count() {
        assert_eq!(build_prompt(0), "");
        assert_eq!(build_prompt(1), "the");
        assert_eq!(build_prompt(3), "the the the");
        assert_eq!(build_prompt(100).split(' ').count(), 100);
    }

    #[test]
    fn corrections_converge_at_one_token_per_word() {
        // A server whose template adds 17 tokens.
        let count = |words: usize| words as u64 + 17;
        let target = 128;
        let mut words = first_word_count(target);
        for _ in 0..MAX_CALIBRATION_ROUNDS {
            words = next_word_count(words, count(words), target);
        }
        assert_eq!(count(words), 128);
        assert_eq!(next_word_count(5, 40, 10), 1, "never below one word");
        assert_eq!(first_word_count(4), 1);
    }
}
