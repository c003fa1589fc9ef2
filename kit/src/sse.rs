//! A minimal reader of the server-sent events a chat stream sends (`data: {...}` events, `:`
//! comments, `data: [DONE]`), and what one chat chunk says. Bytes arrive in arbitrary pieces
//! (a piece may end mid-line or mid-character), so the reader keeps what is incomplete until
//! the rest comes. Bad input is an error, never a panic.

use serde_json::Value;

/// Longest line accepted: a chunk of one token is a few hundred bytes; a megabyte without a
/// newline is not an event stream.
pub const MAX_LINE: usize = 1 << 20;

/// One complete event.
#[derive(Debug, Clone, PartialEq)]
pub enum SseEvent {
    /// The `data` of an event, its lines joined by `\n`.
    Data(String),
    /// `data: [DONE]`: the stream is over.
    Done,
}

/// Turns byte pieces into events.
#[derive(Debug, Default)]
pub struct SseReader {
    /// Bytes of the line not yet ended.
    partial: Vec<u8>,
    /// `data` lines of the event not yet ended.
    data: Vec<String>,
}

impl SseReader {
    /// A reader at the start of a stream.
    pub fn new() -> SseReader {
        SseReader::default()
    }

    /// Feeds the next piece of the body; returns the events it completed, in order.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<SseEvent>, String> {
        let mut events = Vec::new();
        let mut rest = bytes;
        while let Some(at) = rest.iter().position(|&b| b == b'\n') {
            self.partial.extend_from_slice(&rest[..at]);
            rest = &rest[at + 1..];
            let mut line = std::mem::take(&mut self.partial);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            let line = String::from_utf8(line)
                .map_err(|_| "the event stream holds a line that is not UTF-8".to_string())?;
            if let Some(event) = self.line(&line) {
                events.push(event);
            }
        }
        self.partial.extend_from_slice(rest);
        if self.partial.len() > MAX_LINE {
            return Err(format!(
                "the event stream sent a line longer than {MAX_LINE} bytes"
            ));
        }
        Ok(events)
    }

    /// Whether the stream stopped in the middle of an event.
    pub fn has_partial_event(&self) -> bool {
        !self.partial.is_empty() || !self.data.is_empty()
    }

    fn line(&mut self, line: &str) -> Option<SseEvent> {
        if line.is_empty() {
            if self.data.is_empty() {
                return None;
            }
            let data = std::mem::take(&mut self.data).join("\n");
            return Some(if data.trim() == "[DONE]" {
                SseEvent::Done
            } else {
                SseEvent::Data(data)
            });
        }
        if line.starts_with(':') {
            return None; // a comment (keep-alive)
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        if field == "data" {
            self.data
                .push(value.strip_prefix(' ').unwrap_or(value).to_string());
        }
        // Other fields (event, id, retry) mean nothing to a chat stream.
        None
    }
}

/// What one `chat.completion.chunk` carries that the bench needs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChunkInfo {
    /// Generated text in this chunk (may be empty).
    pub content: String,
    /// Set on the last chunk of the choice.
    pub finish_reason: Option<String>,
    /// `usage.prompt_tokens`, on the usage chunk.
    pub prompt_tokens: Option<u64>,
    /// `usage.completion_tokens`, on the usage chunk.
    pub completion_tokens: Option<u64>,
}

/// Reads one event's data as a chat chunk. An error event (`{"error": {...}}`) or data that
/// is not a JSON object is an `Err` naming what came.
pub fn parse_chunk(data: &str) -> Result<ChunkInfo, String> {
    let value: Value = serde_json::from_str(data).map_err(|e| {
        format!(
            "the stream sent data that is not JSON ({e}): {}",
            clip(data)
        )
    })?;
    if !value.is_object() {
        return Err(format!(
            "the stream sent data that is not a JSON object: {}",
            clip(data)
        ));
    }
    if let Some(error) = value.get("error") {
        let message = error
            .get("message")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| error.to_string());
        return Err(format!("the stream ended with an error: {message}"));
    }
    let choice = value.get("choices").and_then(|c| c.get(0));
    let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
    let usage = value.get("usage");
    Ok(ChunkInfo {
        content: text(
            choice
                .and_then(|c| c.get("delta"))
                .and_then(|d| d.get("content")),
        )
        .unwrap_or_default(),
        finish_reason: text(choice.and_then(|c| c.get("finish_reason"))),
        prompt_tokens: usage
            .and_then(|u| u.get("prompt_tokens"))
            .and_then(Value::as_u64),
        completion_tokens: usage
            .and_then(|u| u.get("completion_tokens"))
            .and_then(Value::as_u64),
    })
}

/// The start of a long text, for error messages.
fn clip(text: &str) -> String {
    match text.char_indices().nth(200) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn events_split_anywhere_come_out_whole() {
        let stream = b": keep-alive\n\ndata: {\"a\":1}\n\ndata: x\r\ndata: y\r\n\r\nevent: e\ndata: [DONE]\n\n";
        let expected = vec![
            SseEvent::Data("{\"a\":1}".into()),
            SseEvent::Data("x\ny".into()),
            SseEvent::Done,
        ];
        for size in 1..stream.len() {
            let mut reader = SseReader::new();
            let mut events = Vec::new();
            for piece in stream.chunks(size) {
                events.extend(reader.push(piece).unwrap());
            }
            assert_eq!(events, expected, "pieces of {size} bytes");
            assert!(!reader.has_partial_event());
        }
    }

    #[test]
    fn a_cut_off_event_is_noticed() {
        let mut reader = SseReader::new();
        assert!(reader.push(b"data: {\"a\"").unwrap().is_empty());
        assert!(reader.has_partial_event());
    }

    #[test]
    fn a_character_split_across_pieces_survives() {
        let text = "data: {\"c\":\"é\"}\n\n".as_bytes();
        let at = text.iter().position(|&b| b >= 0x80).unwrap() + 1;
        let mut reader = SseReader::new();
        assert!(reader.push(&text[..at]).unwrap().is_empty());
        assert_eq!(
            reader.push(&text[at..]).unwrap(),
            vec![SseEvent::Data("{\"c\":\"é\"}".into())]
        );
    }

    #[test]
    fn bad_bytes_and_endless_lines_are_errors() {
        assert!(SseReader::new().push(b"data: \xff\xfe\n").is_err());
        let mut reader = SseReader::new();
        let long = vec![b'a'; MAX_LINE + 1];
        assert!(reader.push(&long).is_err());
    }

    #[test]
    fn chunks_give_text_finish_and_usage() {
        let c = parse_chunk(
            r#"{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hi"}}]}"#,
        )
        .unwrap();
        assert_eq!(c.content, "Hi");
        assert_eq!(c.finish_reason, None);
        let c = parse_chunk(r#"{"choices":[{"delta":{},"finish_reason":"length"}]}"#).unwrap();
        assert_eq!(c.finish_reason.as_deref(), Some("length"));
        let c =
            parse_chunk(r#"{"choices":[],"usage":{"prompt_tokens":130,"completion_tokens":64}}"#)
                .unwrap();
        assert_eq!(
            (c.prompt_tokens, c.completion_tokens),
            (Some(130), Some(64))
        );
    }

    #[test]
    fn error_events_and_garbage_are_errors_that_say_what_came() {
        let e = parse_chunk(r#"{"error":{"message":"instance lost: rank 1 died"}}"#).unwrap_err();
        assert!(e.contains("instance lost: rank 1 died"), "{e}");
        assert!(parse_chunk("not json").unwrap_err().contains("not JSON"));
        assert!(parse_chunk("[1,2]").unwrap_err().contains("object"));
    }

    proptest! {
        #[test]
        fn any_bytes_in_any_pieces_never_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..600),
            size in 1usize..64,
        ) {
            let mut reader = SseReader::new();
            for piece in bytes.chunks(size) {
                match reader.push(piece) {
                    Ok(events) => {
                        for event in events {
                            if let SseEvent::Data(d) = event {
                                let _ = parse_chunk(&d);
                            }
                        }
                    }
                    Err(_) => break,
                }
            }
        }
    }
}
