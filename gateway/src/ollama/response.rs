//! Ollama's answer shapes: chat and generate answers (whole, or NDJSON lines ending with a
//! `done: true` line carrying the counts and durations), the model lists, and errors
//! (`{"error": "..."}`).
//!
//! Durations are nanoseconds measured by this node's gateway: `load_duration` until the
//! instance accepted the request (the model is already loaded on the cluster, so this is
//! routing, forwarding and tokenizing), `prompt_eval_duration` from then to the first token
//! (queueing and prefill), `eval_duration` from the first token to the end, and
//! `total_duration` the whole request.
//!
//! Log-probabilities (`logprobs: true`, `top_logprobs: N`) go in each line's `logprobs`, one
//! entry per token (`{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}`, as
//! Ollama spells them); a token with no text of its own (part of a character) goes with the
//! next line that has text, or the last.

use crate::backend::{FinishReason, ModelInfo, TokenLogprob, ToolCall};
use crate::error::ApiError;
use crate::generation::{Encoder, Ending, Timings};
use bytes::Bytes;
use serde_json::{json, Map, Value};
use std::time::{SystemTime, UNIX_EPOCH};

/// The Ollama API version whose shapes this gateway answers in (`GET /api/version`); apps
/// that gate features on the server's version read it.
pub const OLLAMA_API_VERSION: &str = "0.12.0";

/// Ollama's error body.
pub fn error_json(e: &ApiError) -> Value {
    json!({ "error": e.client_message() })
}

/// Which endpoint an answer is for: chat answers carry a `message`, generate a `response`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Chat,
    Generate,
}

/// One answer line (or the whole answer): `text` as the message or response, `thinking`
/// (the model's reasoning) when there is some, the chat message's `tool_calls` (`{"function":
/// {"name", "arguments": {...}}}`), and the closing fields when `end` is given.
pub fn answer_json(
    shape: Shape,
    model: &str,
    (text, thinking): (&str, &str),
    tool_calls: &[ToolCall],
    end: Option<(&Ending, &Timings)>,
) -> Value {
    let mut out = Map::new();
    out.insert("model".into(), json!(model));
    out.insert("created_at".into(), json!(rfc3339(SystemTime::now())));
    match shape {
        Shape::Chat => {
            let mut message = json!({"role": "assistant", "content": text});
            if !thinking.is_empty() {
                message["thinking"] = json!(thinking);
            }
            if !tool_calls.is_empty() {
                let calls: Vec<Value> = tool_calls
                    .iter()
                    .map(|c| {
                        let arguments = serde_json::from_str::<Value>(&c.arguments)
                            .ok()
                            .filter(Value::is_object)
                            .unwrap_or_else(|| json!({}));
                        json!({"function": {"name": c.name, "arguments": arguments}})
                    })
                    .collect();
                message["tool_calls"] = json!(calls);
            }
            out.insert("message".into(), message);
        }
        Shape::Generate => {
            out.insert("response".into(), json!(text));
            if !thinking.is_empty() {
                out.insert("thinking".into(), json!(thinking));
            }
        }
    }
    out.insert("done".into(), json!(end.is_some()));
    if let Some((ending, t)) = end {
        let ns = |from: tokio::time::Instant, to: tokio::time::Instant| {
            u64::try_from(to.saturating_duration_since(from).as_nanos()).unwrap_or(u64::MAX)
        };
        let first = t.first_token.unwrap_or(t.ended);
        let reason = match ending.finish_reason {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        };
        out.insert("done_reason".into(), json!(reason));
        out.insert("total_duration".into(), json!(ns(t.received, t.ended)));
        out.insert("load_duration".into(), json!(ns(t.received, t.accepted)));
        // Ollama has no field for prompt tokens a cache held: the count is the whole prompt.
        out.insert("prompt_eval_count".into(), json!(ending.prompt_tokens));
        out.insert("prompt_eval_duration".into(), json!(ns(t.accepted, first)));
        out.insert("eval_count".into(), json!(ending.completion_tokens));
        out.insert("eval_duration".into(), json!(ns(first, t.ended)));
    }
    Value::Object(out)
}

/// `answer` with `logprobs`, Ollama's list of the tokens' log-probabilities.
pub fn with_logprobs(mut answer: Value, logprobs: &[TokenLogprob]) -> Value {
    let entries: Vec<Value> = logprobs
        .iter()
        .map(crate::openai::response::token_logprob_json)
        .collect();
    answer["logprobs"] = json!(entries);
    answer
}

/// The answer to a generate call with an empty prompt: the model is loaded (it is, on the
/// cluster), nothing is generated.
pub fn load_json(model: &str) -> Value {
    json!({
        "model": model,
        "created_at": rfc3339(SystemTime::now()),
        "response": "",
        "done": true,
        "done_reason": "load",
    })
}

/// An NDJSON stream of one answer.
pub struct NdjsonEncoder {
    shape: Shape,
    model: String,
    /// Tokens' log-probabilities not sent yet.
    logprobs: Vec<TokenLogprob>,
}

impl NdjsonEncoder {
    /// The stream of an answer of `shape` from `model`.
    pub fn new(shape: Shape, model: String) -> NdjsonEncoder {
        NdjsonEncoder {
            shape,
            model,
            logprobs: Vec::new(),
        }
    }

    /// `answer` with the log-probabilities not sent yet, if there are any.
    fn unsent_logprobs(&mut self, answer: Value) -> Value {
        if self.logprobs.is_empty() {
            return answer;
        }
        with_logprobs(answer, &std::mem::take(&mut self.logprobs))
    }
}

impl Encoder for NdjsonEncoder {
    fn content_type(&self) -> &'static str {
        "application/x-ndjson"
    }

    fn start(&mut self, _prompt_tokens: u32) -> Vec<Bytes> {
        Vec::new()
    }

    fn delta(&mut self, text: &str, logprob: Option<&TokenLogprob>) -> Vec<Bytes> {
        self.logprobs.extend(logprob.cloned());
        if text.is_empty() {
            return Vec::new();
        }
        let answer = answer_json(self.shape, &self.model, (text, ""), &[], None);
        vec![line(&self.unsent_logprobs(answer))]
    }

    fn reasoning(&mut self, text: &str) -> Vec<Bytes> {
        vec![line(&answer_json(
            self.shape,
            &self.model,
            ("", text),
            &[],
            None,
        ))]
    }

    fn tool_call(&mut self, index: usize, call: &ToolCall) -> Vec<Bytes> {
        self.tool_call_end(index, call)
    }

    // Ollama's API has no argument deltas: a call comes whole, as one line, at its end.
    fn tool_call_start(&mut self, _index: usize, _id: &str, _name: &str) -> Vec<Bytes> {
        Vec::new()
    }

    fn tool_call_arguments(&mut self, _index: usize, _fragment: &str) -> Vec<Bytes> {
        Vec::new()
    }

    fn tool_call_end(&mut self, _index: usize, call: &ToolCall) -> Vec<Bytes> {
        vec![line(&answer_json(
            self.shape,
            &self.model,
            ("", ""),
            std::slice::from_ref(call),
            None,
        ))]
    }

    fn streams_arguments(&self) -> bool {
        false
    }

    fn finish(&mut self, ending: &Ending, timings: &Timings) -> Vec<Bytes> {
        let answer = answer_json(
            self.shape,
            &self.model,
            ("", ""),
            &[],
            Some((ending, timings)),
        );
        vec![line(&self.unsent_logprobs(answer))]
    }

    fn fail(&mut self, error: &ApiError) -> Vec<Bytes> {
        vec![line(&error_json(error))]
    }

    fn keep_alive(&self) -> Option<Bytes> {
        None
    }
}

fn line(value: &Value) -> Bytes {
    let mut out = serde_json::to_vec(value).unwrap_or_default();
    out.push(b'\n');
    Bytes::from(out)
}

/// A model as `/api/tags`, `/api/ps` and `/api/show` describe it. shoal does not know a
/// model's size or quantization here, so those fields are empty rather than made up.
fn model_entry(m: &ModelInfo) -> Map<String, Value> {
    let mut out = Map::new();
    out.insert("name".into(), json!(m.id));
    out.insert("model".into(), json!(m.id));
    out.insert(
        "modified_at".into(),
        json!(rfc3339(
            UNIX_EPOCH + std::time::Duration::from_secs(m.created)
        )),
    );
    out.insert("size".into(), json!(0));
    out.insert("digest".into(), json!(digest(&m.id)));
    out.insert("details".into(), details());
    out
}

fn details() -> Value {
    json!({"parent_model": "", "format": "", "family": "", "families": [],
           "parameter_size": "", "quantization_level": ""})
}

/// `GET /api/tags`: every model the cluster knows.
pub fn tags_json(models: &[ModelInfo]) -> Value {
    let list: Vec<Value> = models.iter().map(|m| model_entry(m).into()).collect();
    json!({ "models": list })
}

/// `GET /api/ps`: the models with a ready instance, which stay loaded until deleted.
pub fn ps_json(models: &[ModelInfo]) -> Value {
    let list: Vec<Value> = models
        .iter()
        .filter(|m| m.ready)
        .map(|m| {
            let mut e = model_entry(m);
            e.remove("modified_at");
            e.insert("expires_at".into(), json!("9999-12-31T23:59:59Z"));
            e.insert("size_vram".into(), json!(0));
            e.into()
        })
        .collect();
    json!({ "models": list })
}

/// `POST /api/show`.
pub fn show_json(m: &ModelInfo) -> Value {
    json!({
        "modelfile": "",
        "parameters": "",
        "template": "",
        "details": details(),
        "model_info": {},
        "capabilities": capabilities(m),
        "modified_at": rfc3339(UNIX_EPOCH + std::time::Duration::from_secs(m.created)),
    })
}

/// What `/api/show` says a model can do: `completion`, and `vision` for one that accepts
/// images (as Ollama lists it, so clients know they may attach images).
fn capabilities(m: &ModelInfo) -> Vec<&str> {
    let extra = m.shape.iter().flat_map(|s| s.capabilities.iter());
    std::iter::once("completion")
        .chain(extra.map(String::as_str))
        .collect()
}

/// A stable 64-hex-digit digest of a model id (FNV-1a, four lanes): Ollama clients key
/// models by digest, and the same id must give the same digest on every node.
fn digest(id: &str) -> String {
    (0u64..4)
        .map(|lane| {
            let mut h = 0xcbf2_9ce4_8422_2325u64 ^ lane;
            for b in id.bytes() {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
            format!("{h:016x}")
        })
        .collect()
}

/// RFC 3339 in UTC with microseconds, as Ollama's `created_at`.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days to civil date (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_micros()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn dates() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000000Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_709_251_200) + Duration::from_micros(5);
        assert_eq!(rfc3339(t), "2024-03-01T00:00:00.000005Z");
        let t = UNIX_EPOCH + Duration::from_secs(951_782_400 - 1);
        assert_eq!(rfc3339(t), "2000-02-28T23:59:59.000000Z");
    }

    #[test]
    fn lines_carry_their_tokens_logprobs_with_bytes() {
        let mut e = NdjsonEncoder::new(Shape::Generate, "m".into());
        let token = |bytes: Vec<u8>| TokenLogprob {
            token: "\u{FFFD}".into(),
            logprob: -0.25,
            top: vec![("\u{FFFD}".into(), -0.25)],
            bytes: vec![bytes.clone(), bytes],
        };
        // "€" in two tokens: the first has no text and goes with the second's line.
        assert!(e.delta("", Some(&token(vec![0xe2]))).is_empty());
        let lines = e.delta("€", Some(&token(vec![0x82, 0xac])));
        let v: Value = serde_json::from_slice(&lines[0]).unwrap();
        assert_eq!(v["response"], "€");
        let logprobs = v["logprobs"].as_array().unwrap();
        assert_eq!(logprobs.len(), 2, "{v}");
        assert_eq!(logprobs[0]["bytes"], json!([0xe2]));
        assert_eq!(logprobs[1]["top_logprobs"][0]["bytes"], json!([0x82, 0xac]));
        // Nothing asked, nothing added.
        let plain = e.delta("x", None);
        let v: Value = serde_json::from_slice(&plain[0]).unwrap();
        assert!(v.get("logprobs").is_none(), "{v}");
    }

    #[test]
    fn closing_line_has_counts_and_durations() {
        let now = tokio::time::Instant::now();
        let t = Timings {
            received: now,
            accepted: now + Duration::from_millis(1),
            first_token: Some(now + Duration::from_millis(3)),
            ended: now + Duration::from_millis(10),
        };
        let ending = Ending {
            finish_reason: FinishReason::Length,
            stop_sequence: None,
            prompt_tokens: 4,
            completion_tokens: 2,
            cached_tokens: 0,
            tool_calls: 0,
        };
        let v = answer_json(Shape::Chat, "m", ("", ""), &[], Some((&ending, &t)));
        assert_eq!(v["done"], true);
        assert_eq!(v["done_reason"], "length");
        assert_eq!(v["total_duration"], 10_000_000);
        assert_eq!(v["load_duration"], 1_000_000);
        assert_eq!(v["prompt_eval_duration"], 2_000_000);
        assert_eq!(v["eval_duration"], 7_000_000);
        assert_eq!(
            (v["prompt_eval_count"].clone(), v["eval_count"].clone()),
            (4.into(), 2.into())
        );
        assert_eq!(digest("a"), digest("a"));
        assert_ne!(digest("a"), digest("b"));
        assert_eq!(digest("a").len(), 64);
    }
}
