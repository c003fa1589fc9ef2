//! Each API's stream writer on a call whose arguments stream: the argument deltas, joined,
//! are the call's final arguments (parsed, the JSON the model wrote), in the API's own events.

use crate::anthropic::response::MessagesEncoder;
use crate::backend::FinishReason;
use crate::chat::ChunkEncoder;
use crate::generation::{Encoder, Ending, Timings};
use crate::ollama::response::{NdjsonEncoder, Shape};
use crate::openai::response::CompletionMeta;
use crate::responses::response::{ResponseMeta, ResponsesEncoder};
use crate::tools::ToolCall;
use bytes::Bytes;
use serde_json::{json, Value};

const PIECES: [&str; 3] = ["{\"ci", "ty\": \"Zü", "rich\", \"days\": 2}"];

/// Writes text, then one call streamed in `PIECES`, then the end; the frames' JSON bodies.
fn write(encoder: &mut dyn Encoder) -> Vec<Value> {
    let call = ToolCall {
        id: "a1B2c3D4e".into(),
        name: "get_weather".into(),
        arguments: PIECES.concat(),
    };
    let mut frames: Vec<Bytes> = encoder.start(5);
    frames.extend(encoder.delta("Let me look.", None));
    frames.extend(encoder.tool_call_start(0, &call.id, &call.name));
    for piece in PIECES {
        frames.extend(encoder.tool_call_arguments(0, piece));
    }
    frames.extend(encoder.tool_call_end(0, &call));
    let now = tokio::time::Instant::now();
    let ending = Ending {
        finish_reason: FinishReason::Stop,
        stop_sequence: None,
        prompt_tokens: 5,
        completion_tokens: 9,
        cached_tokens: 0,
        tool_calls: 1,
    };
    let timings = Timings {
        received: now,
        accepted: now,
        first_token: Some(now),
        ended: now,
    };
    frames.extend(encoder.finish(&ending, &timings));
    frames
        .iter()
        .flat_map(|f| {
            let text = String::from_utf8_lossy(f).to_string();
            text.lines()
                .map(|l| l.strip_prefix("data: ").unwrap_or(l).to_string())
                .filter_map(|l| serde_json::from_str::<Value>(&l).ok())
                .collect::<Vec<_>>()
        })
        .collect()
}

fn want() -> Value {
    json!({"city": "Zürich", "days": 2})
}

fn parsed(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"))
}

#[test]
fn openai_chat_chunks_stream_the_arguments() {
    let mut e = ChunkEncoder {
        meta: CompletionMeta::new("m"),
        include_usage: false,
    };
    let bodies = write(&mut e);
    let deltas: Vec<&Value> = bodies
        .iter()
        .filter_map(|b| b.pointer("/choices/0/delta/tool_calls/0"))
        .collect();
    assert_eq!(deltas.len(), 1 + PIECES.len(), "{bodies:?}");
    // The first names the call; the others carry the index and a piece only.
    assert_eq!(deltas[0]["id"], "a1B2c3D4e");
    assert_eq!(deltas[0]["type"], "function");
    assert_eq!(deltas[0]["function"]["name"], "get_weather");
    assert!(deltas[1..]
        .iter()
        .all(|d| d.get("id").is_none() && d["function"].get("name").is_none() && d["index"] == 0));
    let joined: String = deltas
        .iter()
        .map(|d| d["function"]["arguments"].as_str().unwrap())
        .collect();
    assert_eq!(parsed(&joined), want());
    let finish = bodies
        .iter()
        .find_map(|b| b.pointer("/choices/0/finish_reason"));
    assert_eq!(finish, Some(&json!("tool_calls")));
}

#[test]
fn anthropic_tool_use_streams_input_json_deltas() {
    let mut e = MessagesEncoder::new("msg_1".into(), "m".into());
    let bodies = write(&mut e);
    let kinds: Vec<String> = bodies
        .iter()
        .map(|b| {
            let kind = b["type"].as_str().unwrap_or_default();
            match b
                .pointer("/content_block/type")
                .or(b.pointer("/delta/type"))
            {
                Some(t) => format!("{kind}:{}", t.as_str().unwrap_or_default()),
                None => kind.to_string(),
            }
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "message_start",
            "ping",
            "content_block_start:text",
            "content_block_delta:text_delta",
            "content_block_stop",
            "content_block_start:tool_use",
            "content_block_delta:input_json_delta",
            "content_block_delta:input_json_delta",
            "content_block_delta:input_json_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    let start = &bodies[5]["content_block"];
    assert_eq!(
        (
            start["id"].as_str(),
            start["name"].as_str(),
            &start["input"]
        ),
        (Some("a1B2c3D4e"), Some("get_weather"), &json!({}))
    );
    let joined: String = bodies
        .iter()
        .filter_map(|b| b.pointer("/delta/partial_json").and_then(Value::as_str))
        .collect();
    assert_eq!(parsed(&joined), want());
    assert_eq!(bodies[10]["delta"]["stop_reason"], "tool_use");
}

#[test]
fn responses_function_call_streams_argument_deltas() {
    let mut e = ResponsesEncoder::new(ResponseMeta::new("m"));
    let bodies = write(&mut e);
    let of = |kind: &str| -> Vec<&Value> { bodies.iter().filter(|b| b["type"] == kind).collect() };
    let deltas = of("response.function_call_arguments.delta");
    assert_eq!(deltas.len(), PIECES.len());
    assert!(deltas.iter().all(|d| d["item_id"] == "fc_a1B2c3D4e"));
    let joined: String = deltas
        .iter()
        .map(|d| d["delta"].as_str().unwrap())
        .collect();
    assert_eq!(parsed(&joined), want());
    let done = of("response.function_call_arguments.done");
    assert_eq!(done[0]["arguments"], joined.as_str());
    let added = of("response.output_item.added");
    assert_eq!(added[1]["item"]["status"], "in_progress");
    let item = &of("response.output_item.done")[1]["item"];
    assert_eq!(
        (item["name"].as_str(), item["arguments"].as_str()),
        (Some("get_weather"), Some(joined.as_str()))
    );
    let last = of("response.completed");
    assert_eq!(
        last[0]["response"]["output"][1]["arguments"],
        joined.as_str()
    );
}

#[test]
fn ollama_sends_the_call_whole() {
    let mut e = NdjsonEncoder::new(Shape::Chat, "m".into());
    assert!(!e.streams_arguments());
    let bodies = write(&mut e);
    let calls: Vec<&Value> = bodies
        .iter()
        .filter_map(|b| b.pointer("/message/tool_calls/0"))
        .collect();
    assert_eq!(calls.len(), 1, "{bodies:?}");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert_eq!(calls[0]["function"]["arguments"], want());
}
