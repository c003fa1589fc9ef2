//! Timing a streamed chat as `shoal bench` reports it: the first generated text, the last, and
//! the usage the server counted, taken from the events of the stream ([`StreamTiming`]) into
//! one measured request ([`Sample`]).

use crate::sse::{parse_chunk, SseEvent};
use serde_json::{json, Value};
use std::time::Duration;

/// One streamed request, timed by the client from the moment it sent the request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// `usage.prompt_tokens`: the prompt after the chat template.
    pub prompt_tokens: u64,
    /// `usage.completion_tokens`.
    pub completion_tokens: u64,
    /// Seconds until the first generated text arrived (prefill plus one step plus HTTP).
    pub ttft_s: f64,
    /// Seconds from the first generated text to the last.
    pub decode_s: f64,
}

impl Sample {
    /// Prompt tokens per second: prompt tokens over the time to the first token.
    pub fn prompt_tps(&self) -> Option<f64> {
        (self.ttft_s > 0.0).then(|| self.prompt_tokens as f64 / self.ttft_s)
    }

    /// Generation tokens per second: the tokens after the first over the time they took.
    pub fn generation_tps(&self) -> Option<f64> {
        (self.completion_tokens >= 2 && self.decode_s > 0.0)
            .then(|| (self.completion_tokens - 1) as f64 / self.decode_s)
    }

    /// The sample as a row of `shoal bench --json-out`.
    pub fn to_json(self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "ttft_s": self.ttft_s,
            "decode_s": self.decode_s,
            "prompt_tps": self.prompt_tps(),
            "generation_tps": self.generation_tps(),
        })
    }
}

/// What a chat stream told so far.
#[derive(Debug, Default)]
pub struct StreamTiming {
    first_text: Option<Duration>,
    last_text: Option<Duration>,
    finish_reason: Option<String>,
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    text_chunks: u64,
}

impl StreamTiming {
    /// Takes one event arriving at `at`; `Ok(true)` at `[DONE]`.
    pub fn on_event(&mut self, event: SseEvent, at: Duration) -> Result<bool, String> {
        let data = match event {
            SseEvent::Done => return Ok(true),
            SseEvent::Data(data) => data,
        };
        let chunk = parse_chunk(&data)?;
        if !chunk.content.is_empty() {
            self.first_text.get_or_insert(at);
            self.last_text = Some(at);
            self.text_chunks += 1;
        }
        if chunk.finish_reason.is_some() {
            self.finish_reason = chunk.finish_reason;
            // The finish chunk follows the last token at once; it bounds the decode time
            // even when the last token decoded to no text.
            if self.first_text.is_some() {
                self.last_text = Some(at);
            }
        }
        self.prompt_tokens = chunk.prompt_tokens.or(self.prompt_tokens);
        self.completion_tokens = chunk.completion_tokens.or(self.completion_tokens);
        Ok(false)
    }

    /// The sample, once the stream ended well; an error names what was missing.
    pub fn finish(self) -> Result<Sample, String> {
        if self.finish_reason.is_none() {
            return Err("the chat stream ended without a finish_reason".into());
        }
        let (Some(first), Some(last)) = (self.first_text, self.last_text) else {
            return Err("the chat stream carried no text".into());
        };
        let prompt_tokens = self.prompt_tokens.ok_or(
            "the chat stream carried no usage (the server ignored stream_options.include_usage)",
        )?;
        Ok(Sample {
            prompt_tokens,
            completion_tokens: self.completion_tokens.unwrap_or(self.text_chunks),
            ttft_s: first.as_secs_f64(),
            decode_s: (last - first).as_secs_f64(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sse::SseEvent;
    use std::time::Duration;

    fn data(v: &str) -> SseEvent {
        SseEvent::Data(v.into())
    }

    #[test]
    fn a_stream_is_timed_from_first_to_last_text() {
        let ms = Duration::from_millis;
        let mut t = StreamTiming::default();
        let events = [
            (
                data(r#"{"choices":[{"delta":{"role":"assistant"}}]}"#),
                ms(5),
            ),
            (data(r#"{"choices":[{"delta":{"content":"A"}}]}"#), ms(100)),
            (data(r#"{"choices":[{"delta":{"content":"B"}}]}"#), ms(150)),
            (data(r#"{"choices":[{"delta":{"content":"C"}}]}"#), ms(200)),
            (
                data(r#"{"choices":[{"delta":{},"finish_reason":"length"}]}"#),
                ms(201),
            ),
            (
                data(r#"{"choices":[],"usage":{"prompt_tokens":128,"completion_tokens":3}}"#),
                ms(202),
            ),
        ];
        for (event, at) in events {
            assert!(!t.on_event(event, at).unwrap());
        }
        assert!(t.on_event(SseEvent::Done, ms(203)).unwrap());
        let s = t.finish().unwrap();
        assert_eq!((s.prompt_tokens, s.completion_tokens), (128, 3));
        assert!((s.ttft_s - 0.1).abs() < 1e-9);
        assert!((s.decode_s - 0.101).abs() < 1e-9);
    }

    #[test]
    fn streams_without_the_needed_parts_are_errors() {
        let mut t = StreamTiming::default();
        t.on_event(
            data(r#"{"choices":[{"delta":{"content":"A"}}]}"#),
            Duration::ZERO,
        )
        .unwrap();
        assert!(t.finish().unwrap_err().contains("finish_reason"));
        let mut t = StreamTiming::default();
        t.on_event(
            data(r#"{"choices":[{"delta":{"content":"A"}, "finish_reason":"stop"}]}"#),
            Duration::ZERO,
        )
        .unwrap();
        assert!(t.finish().unwrap_err().contains("usage"));
        let mut t = StreamTiming::default();
        let e = t
            .on_event(
                data(r#"{"error":{"message":"instance lost"}}"#),
                Duration::ZERO,
            )
            .unwrap_err();
        assert!(e.contains("instance lost"), "{e}");
    }
}
