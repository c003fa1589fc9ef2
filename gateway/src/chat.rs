//! `POST /v1/chat/completions`: runs a chat through the backend ([`crate::generation`]) and
//! answers it whole or as SSE chunks.

use crate::backend::{Backend, TokenLogprob, ToolCall};
use crate::body::{json_response, GatewayBody};
use crate::error::ApiError;
use crate::generation::{accept, sse_data, Ctx, Encoder, Ending, Timings};
use crate::openai::request::{parse_chat_request, ParsedChat};
use crate::openai::response::{
    chunk_json, completion_json, finish_reason_str, tool_call_arguments_json, tool_call_json,
    tool_call_start_json, usage_chunk_json, AnswerParts, ChunkDelta, CompletionMeta, Usage,
};
use bytes::Bytes;
use hyper::{Response, StatusCode};
use tokio::time::Instant;

/// Handles one chat completion request body.
pub async fn chat_completions(
    backend: &dyn Backend,
    body: &[u8],
    ctx: &Ctx,
) -> Result<Response<GatewayBody>, ApiError> {
    let received = Instant::now();
    let ParsedChat {
        request,
        stream,
        include_usage,
    } = parse_chat_request(body)?;
    let meta = CompletionMeta::new(&request.model);
    let want_logprobs = request.sampling.logprobs.is_some();
    let accepted = accept(backend, request, ctx, received, Some(&meta.id)).await?;
    if stream {
        return Ok(accepted.stream(ChunkEncoder {
            meta,
            include_usage,
        }));
    }
    let answer = accepted.collect().await?;
    let usage = Usage {
        prompt_tokens: answer.ending.prompt_tokens,
        completion_tokens: answer.ending.completion_tokens,
        cached_tokens: answer.ending.cached_tokens,
    };
    let lp = want_logprobs.then_some(answer.logprobs.as_slice());
    let value = completion_json(
        &meta,
        AnswerParts {
            text: &answer.text,
            reasoning: &answer.reasoning,
            tool_calls: &answer.tool_calls,
        },
        answer.ending.finish_reason,
        lp,
        usage,
    );
    Ok(json_response(StatusCode::OK, &value))
}

/// `chat.completion.chunk`s: a first chunk with the role, one per text delta, one with the
/// finish reason, the usage chunk when asked, then `data: [DONE]`.
pub(crate) struct ChunkEncoder {
    pub(crate) meta: CompletionMeta,
    pub(crate) include_usage: bool,
}

impl ChunkEncoder {
    /// A chunk carrying one `tool_calls` item.
    fn tool_delta(&self, item: serde_json::Value) -> Vec<Bytes> {
        let delta = ChunkDelta {
            tool_call: Some(item),
            ..ChunkDelta::default()
        };
        vec![sse_data(&chunk_json(&self.meta, delta))]
    }
}

impl Encoder for ChunkEncoder {
    fn content_type(&self) -> &'static str {
        "text/event-stream"
    }

    fn start(&mut self, _prompt_tokens: u32) -> Vec<Bytes> {
        let first = ChunkDelta {
            role: true,
            content: Some(""),
            ..ChunkDelta::default()
        };
        vec![sse_data(&chunk_json(&self.meta, first))]
    }

    fn delta(&mut self, text: &str, logprob: Option<&TokenLogprob>) -> Vec<Bytes> {
        let delta = ChunkDelta {
            content: Some(text),
            logprobs: logprob.map(std::slice::from_ref),
            ..ChunkDelta::default()
        };
        vec![sse_data(&chunk_json(&self.meta, delta))]
    }

    fn reasoning(&mut self, text: &str) -> Vec<Bytes> {
        let delta = ChunkDelta {
            reasoning: Some(text),
            ..ChunkDelta::default()
        };
        vec![sse_data(&chunk_json(&self.meta, delta))]
    }

    /// A call that was not streamed comes in one delta.
    fn tool_call(&mut self, index: usize, call: &ToolCall) -> Vec<Bytes> {
        self.tool_delta(tool_call_json(call, Some(index)))
    }

    fn tool_call_start(&mut self, index: usize, id: &str, name: &str) -> Vec<Bytes> {
        self.tool_delta(tool_call_start_json(index, id, name))
    }

    fn tool_call_arguments(&mut self, index: usize, fragment: &str) -> Vec<Bytes> {
        self.tool_delta(tool_call_arguments_json(index, fragment))
    }

    fn tool_call_end(&mut self, _index: usize, _call: &ToolCall) -> Vec<Bytes> {
        Vec::new()
    }

    fn finish(&mut self, ending: &Ending, _timings: &Timings) -> Vec<Bytes> {
        let mut frames = vec![sse_data(&chunk_json(
            &self.meta,
            ChunkDelta {
                finish_reason: Some(finish_reason_str(ending.finish_reason, ending.tool_calls)),
                ..ChunkDelta::default()
            },
        ))];
        if self.include_usage {
            let usage = Usage {
                prompt_tokens: ending.prompt_tokens,
                completion_tokens: ending.completion_tokens,
                cached_tokens: ending.cached_tokens,
            };
            frames.push(sse_data(&usage_chunk_json(&self.meta, usage)));
        }
        frames.push(Bytes::from_static(b"data: [DONE]\n\n"));
        frames
    }

    fn fail(&mut self, error: &ApiError) -> Vec<Bytes> {
        vec![
            sse_data(&error.to_json()),
            Bytes::from_static(b"data: [DONE]\n\n"),
        ]
    }

    fn keep_alive(&self) -> Option<Bytes> {
        Some(Bytes::from_static(b": keep-alive\n\n"))
    }
}
