//! Reasoning: models that think (Qwen3, DeepSeek-R1 distills) open their answer with
//! `<think>…</think>`. The gateway splits that off the generated text as it streams, so that
//! each API can put it in its own reasoning field (`reasoning_content`, `thinking` blocks,
//! reasoning items, Ollama's `thinking`) and the answer's text holds only the answer.
//!
//! Only a `<think>` at the very start of the output (after whitespace) opens reasoning; a
//! `<think>` later in the text is text. Text that may still be the start of a tag is held
//! back until it is known, so no client sees half a tag.
//!
//! Some templates open the thought themselves: DeepSeek-R1 distills end the prompt with
//! `<think>\n`, Qwen3's thinking models and DeepSeek V3.1 in thinking mode with `<think>`.
//! The model's output then starts *inside* the thought and only closes it; the node that
//! renders the prompt tells so ([`prompt_opens_thought`]), and the splitter starts in
//! reasoning ([`ThinkSplitter::in_thought`]).

use crate::text_scan::held_suffix;

/// The tags most families use; MiniMax M3 writes `<mm:think>…</mm:think>`
/// ([`ThinkSplitter::with_tags`]).
pub const OPEN: &str = "<think>";
pub const CLOSE: &str = "</think>";

/// A piece of the output: reasoning or answer text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Reasoning(String),
    Text(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace seen yet.
    Start,
    Thinking,
    Answer,
}

/// Splits streamed text into reasoning and answer.
#[derive(Debug, Clone)]
pub struct ThinkSplitter {
    /// The opening and closing tags.
    open: &'static str,
    close: &'static str,
    state: State,
    pending: String,
    /// Drop whitespace until something else comes (right after a tag: formatting).
    skip_space: bool,
}

impl Default for ThinkSplitter {
    fn default() -> ThinkSplitter {
        ThinkSplitter {
            open: OPEN,
            close: CLOSE,
            state: State::Start,
            pending: String::new(),
            skip_space: false,
        }
    }
}

/// Whether a rendered prompt leaves the assistant's turn inside an open thought: it ends
/// with `<think>` (or MiniMax M3's `<mm:think>`, and whitespace), so the output starts in
/// reasoning.
pub fn prompt_opens_thought(prompt: &str) -> bool {
    let end = prompt.trim_end();
    end.ends_with(OPEN) || end.ends_with(MINIMAX_M3_TAGS.0) || end.ends_with(KIMI_K3_TAGS.0)
}

/// MiniMax M3's reasoning tags.
pub const MINIMAX_M3_TAGS: (&str, &str) = ("<mm:think>", "</mm:think>");

/// Kimi K3's thinking channel ([`crate::xtml_channels`]); its template opens it in the
/// prompt unless thinking is off.
pub const KIMI_K3_TAGS: (&str, &str) = ("<|open|>think<|sep|>", "<|close|>think<|sep|>");

impl ThinkSplitter {
    /// A splitter for an output that starts inside the thought (the prompt opened it): all
    /// is reasoning until `</think>`.
    pub fn in_thought() -> ThinkSplitter {
        ThinkSplitter {
            state: State::Thinking,
            skip_space: true,
            ..ThinkSplitter::default()
        }
    }

    /// The same splitter for a family whose reasoning tags are `(open, close)`.
    pub fn with_tags(self, (open, close): (&'static str, &'static str)) -> ThinkSplitter {
        ThinkSplitter {
            open,
            close,
            ..self
        }
    }

    /// Feeds the next delta; returns what can be sent now.
    pub fn push(&mut self, delta: &str) -> Vec<Piece> {
        self.pending.push_str(delta);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Start => {
                    let trimmed = self.pending.trim_start();
                    if let Some(rest) = trimmed.strip_prefix(self.open) {
                        self.pending = rest.to_string();
                        self.state = State::Thinking;
                        self.skip_space = true;
                        continue;
                    }
                    if trimmed.is_empty() || self.open.starts_with(trimmed) {
                        return out;
                    }
                    self.state = State::Answer;
                }
                State::Thinking => {
                    if !self.skip_leading_space() {
                        return out;
                    }
                    if let Some(at) = self.pending.find(self.close) {
                        let reasoning = self.pending[..at].trim_end().to_string();
                        let rest = self.pending[at + self.close.len()..].to_string();
                        push(&mut out, Piece::Reasoning(reasoning));
                        self.pending = rest;
                        self.state = State::Answer;
                        self.skip_space = true;
                        continue;
                    }
                    // Hold a possible start of the tag, and the whitespace before it (it is
                    // dropped if the tag follows).
                    let tag = self.pending.len() - held_suffix(&self.pending, self.close);
                    let cut = self.pending[..tag].trim_end().len();
                    let now: String = self.pending.drain(..cut).collect();
                    push(&mut out, Piece::Reasoning(now));
                    return out;
                }
                State::Answer => {
                    if !self.skip_leading_space() {
                        return out;
                    }
                    let now = std::mem::take(&mut self.pending);
                    push(&mut out, Piece::Text(now));
                    return out;
                }
            }
        }
    }

    /// While skipping whitespace, drops it from `pending`; false if nothing else is left.
    fn skip_leading_space(&mut self) -> bool {
        if self.skip_space {
            let start = self.pending.len() - self.pending.trim_start().len();
            self.pending.drain(..start);
            if self.pending.is_empty() {
                return false;
            }
            self.skip_space = false;
        }
        true
    }

    /// The end of the output: whatever was held back.
    pub fn finish(&mut self) -> Vec<Piece> {
        let rest = std::mem::take(&mut self.pending);
        let mut out = Vec::new();
        match self.state {
            State::Thinking => push(&mut out, Piece::Reasoning(rest)),
            State::Start | State::Answer => push(&mut out, Piece::Text(rest)),
        }
        out
    }
}

fn push(out: &mut Vec<Piece>, piece: Piece) {
    let empty = match &piece {
        Piece::Reasoning(t) | Piece::Text(t) => t.is_empty(),
    };
    if !empty {
        out.push(piece);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn split(deltas: &[&str]) -> (String, String) {
        let mut s = ThinkSplitter::default();
        let mut pieces: Vec<Piece> = deltas.iter().flat_map(|d| s.push(d)).collect();
        pieces.extend(s.finish());
        let (mut r, mut t) = (String::new(), String::new());
        for p in pieces {
            match p {
                Piece::Reasoning(x) => r.push_str(&x),
                Piece::Text(x) => t.push_str(&x),
            }
        }
        (r, t)
    }

    #[test]
    fn thinking_then_answer() {
        assert_eq!(
            split(&["<thi", "nk>\nhmm, ", "2+2</th", "ink>\n\n4"]),
            ("hmm, 2+2".into(), "4".into())
        );
        assert_eq!(
            split(&["plain ", "answer"]),
            ("".into(), "plain answer".into())
        );
        assert_eq!(split(&["  <", "b>bold"]), ("".into(), "  <b>bold".into()));
        assert_eq!(
            split(&["4 <think>x</think>"]),
            ("".into(), "4 <think>x</think>".into())
        );
        assert_eq!(split(&["<think>cut off"]), ("cut off".into(), "".into()));
        assert_eq!(split(&["<thi"]), ("".into(), "<thi".into()));
    }

    fn split_open(deltas: &[&str]) -> (String, String) {
        let mut s = ThinkSplitter::in_thought();
        let mut pieces: Vec<Piece> = deltas.iter().flat_map(|d| s.push(d)).collect();
        pieces.extend(s.finish());
        let (mut r, mut t) = (String::new(), String::new());
        for p in pieces {
            match p {
                Piece::Reasoning(x) => r.push_str(&x),
                Piece::Text(x) => t.push_str(&x),
            }
        }
        (r, t)
    }

    #[test]
    fn prompts_that_open_the_thought() {
        // DeepSeek-R1 distills, Qwen3 thinking models, DeepSeek V3.1 in thinking mode.
        assert!(prompt_opens_thought("<｜User｜>Hi<｜Assistant｜><think>\n"));
        assert!(prompt_opens_thought("<|im_start|>assistant\n<think>"));
        // Qwen3 with thinking off closes it; other templates never open it.
        assert!(!prompt_opens_thought(
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        ));
        assert!(!prompt_opens_thought("<|im_start|>assistant\n"));
        // Kimi K3 opens its thinking channel; with thinking off, the response channel.
        assert!(prompt_opens_thought(
            "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>"
        ));
        assert!(!prompt_opens_thought(
            "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>"
        ));
        assert!(!prompt_opens_thought(""));
    }

    #[test]
    fn output_that_starts_inside_the_thought() {
        assert_eq!(
            split_open(&["Okay, 2+2", " is 4.\n</th", "ink>\n\nIt is 4."]),
            ("Okay, 2+2 is 4.".into(), "It is 4.".into())
        );
        // A `<think>` the model writes anyway is part of the thought, as written.
        assert_eq!(
            split_open(&["\n<think>x</think>y"]),
            ("<think>x".into(), "y".into())
        );
        // Cut off before closing: all reasoning.
        assert_eq!(
            split_open(&["still thinking"]),
            ("still thinking".into(), "".into())
        );
        assert_eq!(split_open(&["</think>\n\nHi"]), ("".into(), "Hi".into()));
    }

    proptest! {
        /// An output that starts in the thought splits the same whatever its deltas.
        #[test]
        fn open_split_does_not_depend_on_deltas(
            think in "[a-z <>/\n]{0,12}", answer in "[a-z <>/]{0,12}",
            cuts in proptest::collection::vec(0usize..40, 0..6),
        ) {
            let text = format!("{think}</think>{answer}");
            let mut cuts: Vec<usize> = cuts.into_iter().filter(|c| *c <= text.len()).collect();
            cuts.sort();
            cuts.dedup();
            let mut deltas = Vec::new();
            let mut last = 0;
            for c in cuts { deltas.push(&text[last..c]); last = c; }
            deltas.push(&text[last..]);
            prop_assert_eq!(split_open(&deltas), split_open(&[text.as_str()]));
        }

        /// Whatever the split into deltas, the result is the same as for the whole text.
        #[test]
        fn split_does_not_depend_on_deltas(
            think in "[a-z <>/]{0,12}", answer in "[a-z <>/]{0,12}",
            cuts in proptest::collection::vec(0usize..40, 0..6),
        ) {
            let text = format!("<think>{think}</think>{answer}");
            let mut cuts: Vec<usize> = cuts.into_iter().filter(|c| *c <= text.len()).collect();
            cuts.sort();
            cuts.dedup();
            let mut deltas = Vec::new();
            let mut last = 0;
            for c in cuts { deltas.push(&text[last..c]); last = c; }
            deltas.push(&text[last..]);
            prop_assert_eq!(split(&deltas), split(&[text.as_str()]));
        }
    }
}
