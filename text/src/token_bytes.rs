//! The bytes a token stands for. A token decoded alone is text, and a token that holds part
//! of a multi-byte character (the first two bytes of "€", say) decodes to U+FFFD: its text
//! says nothing of its bytes. The APIs' `bytes` fields (OpenAI's `logprobs.content[].bytes`,
//! Ollama's `logprobs[].bytes`) exist so that a client can join such tokens into the
//! character, so each token reports its real bytes: a byte-level BPE vocabulary's piece mapped
//! back through GPT-2's byte-to-character table, or a SentencePiece byte token's `<0xHH>`.

use crate::tokenizer::Tokenizer;
use tokenizers::decoders::DecoderWrapper;

impl Tokenizer {
    /// The bytes token `id` stands for: its text decoded alone where that is whole UTF-8,
    /// else the bytes its vocabulary piece encodes (empty for an id the tokenizer does not
    /// know).
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.bytes_of_decoded(id, self.decode(&[id], false).unwrap_or_default())
    }

    /// [`Tokenizer::token_bytes`] of a token already decoded alone to `text`.
    pub fn bytes_of_decoded(&self, id: u32, text: String) -> Vec<u8> {
        if !text.contains('\u{FFFD}') {
            return text.into_bytes();
        }
        let Some(piece) = self.inner.id_to_token(id) else {
            return text.into_bytes();
        };
        if let Some(byte) = byte_token(&piece) {
            return vec![byte];
        }
        let byte_level = matches!(self.inner.get_decoder(), Some(DecoderWrapper::ByteLevel(_)));
        if byte_level {
            if let Some(bytes) = piece.chars().map(byte_of_char).collect::<Option<Vec<u8>>>() {
                return bytes;
            }
        }
        text.into_bytes()
    }
}

/// A SentencePiece byte-fallback token (`<0xE2>`) as its byte.
fn byte_token(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok())?
}

/// The byte that GPT-2's byte-level alphabet spells as `c`: the printable bytes `!`..=`~`,
/// `¡`..=`¬` and `®`..=`ÿ` as themselves, and the other 68 bytes, in order, as U+0100 onwards.
fn byte_of_char(c: char) -> Option<u8> {
    let printable = |b: u32| matches!(b, 0x21..=0x7e | 0xa1..=0xac | 0xae..=0xff);
    let code = c as u32;
    if printable(code) {
        return u8::try_from(code).ok();
    }
    let n = code.checked_sub(0x100)?;
    (0u32..=0xff)
        .filter(|b| !printable(*b))
        .nth(n as usize)
        .and_then(|b| u8::try_from(b).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_alphabet_maps_back_to_bytes() {
        assert_eq!(byte_of_char('a'), Some(b'a'));
        // A space is the 33rd non-printable byte (0x00..=0x20): 'Ġ' = U+0120.
        assert_eq!(byte_of_char('\u{120}'), Some(b' '));
        assert_eq!(byte_of_char('\u{100}'), Some(0));
        // 0xE2 (the first byte of "€") is printable in the alphabet: 'â'.
        assert_eq!(byte_of_char('â'), Some(0xe2));
        // 0xAD is not printable: the 68th and last of the others, U+0143.
        assert_eq!(byte_of_char('\u{143}'), Some(0xad));
        assert_eq!(byte_of_char('\u{144}'), None);
        assert_eq!(byte_of_char('€'), None);
        let every: Vec<u8> = (0u32..0x200)
            .filter_map(char::from_u32)
            .filter_map(byte_of_char)
            .collect();
        let mut sorted = every.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!((every.len(), sorted.len()), (256, 256), "a bijection");
    }

    #[test]
    fn byte_tokens_read_as_their_byte() {
        assert_eq!(byte_token("<0xE2>"), Some(0xe2));
        assert_eq!(byte_token("<0x0A>"), Some(b'\n'));
        assert_eq!(byte_token("<0xE>"), None);
        assert_eq!(byte_token("<s>"), None);
    }
}
